// problem.h: seeded test problems for the forward op, and the plain float32 baseline that
// sizes the tolerances (docs/numerics.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gdn/gdn.h"

namespace gdn::test {

struct ProblemSpec {
  std::vector<std::int64_t> lengths = {64};  // one entry per sequence (packed layout)
  std::int64_t hk = 2, hv = 2, dk = 32, dv = 32;
  DType dtype = DType::f32;
  bool initial_state = false;
  bool l2norm = false;  // inputs are raw (normalised in the kernel); else unit-norm q and k
  double g_lo = -1.0, g_hi = 0.0;  // g ~ uniform [g_lo, g_hi]
  double beta_lo = 0.0, beta_hi = 1.0;
  bool batched = false;  // [B, T, ...] layout (all lengths equal), no cu_seqlens
  std::uint64_t seed = 1;

  std::string name() const;  // for test failure messages
};

// The shape part of a spec, for parameterised tests.
struct Shape {
  std::vector<std::int64_t> lengths;
  std::int64_t hk, hv, dk, dv;
};
ProblemSpec spec_for(const Shape& shape, DType dtype = DType::f32);

struct Problem {
  ProblemSpec spec;
  Tensor q, k, v, g, beta, h0, cu_seqlens;
  ForwardInputs inputs() const;
  ForwardOptions options() const;  // l2norm from the spec, everything else default
};

Problem make_problem(const ProblemSpec& spec);

// splitmix64 uniform / normal numbers: the same stream on every machine.
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  double uniform(double lo = 0.0, double hi = 1.0);
  double normal();

 private:
  std::uint64_t state_;
};

// The token recurrence in plain float32 (scalar loops, no FMA contraction): the
// same-precision baseline whose error against the float64 reference sizes the tolerance of
// every float32 fast path. Returns o (f32, the shape of the problem's o) and final states.
ForwardResult baseline_f32(const Problem& problem, const ForwardOptions& options);

// The backward of the same plain float32 recurrence (reverse mode, every state kept; small
// problems only): the same-precision baseline of the backward's tolerances. d_o and d_ht
// (optional) in the problem's dtype; returns f32 gradients shaped like the inputs.
BackwardResult baseline_f32_bwd(const Problem& problem, const Tensor& d_o, const Tensor& d_ht,
                                const ForwardOptions& options);

// Cotangents for a problem: d_o like o and d_ht like the final states, normal, in its dtype.
struct Cotangents {
  Tensor d_o, d_ht;
};
Cotangents make_cotangents(const Problem& problem, std::uint64_t seed);

}  // namespace gdn::test
