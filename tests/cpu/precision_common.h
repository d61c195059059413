// precision_common.h: what the 16-bit activation tests (precision_test.cc) and the bf16
// matrix-operand tests (bf16_operands_test.cc) share: conversions to and from 16 bits, the
// problems and their tolerances (docs/numerics.md).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "common/compare.h"
#include "common/isas.h"
#include "common/layer_problem.h"
#include "common/problem.h"

namespace gdn::precision_test {

using test::make_problem;
using test::Problem;
using test::ProblemSpec;

inline constexpr double kEpsF32 = 1.1920928955078125e-07;

inline double f32_tolerance(double baseline_error) { return 8.0 * (baseline_error + 8 * kEpsF32); }

inline std::vector<CpuIsa> compiled_isas() { return test::runnable_isas(); }

inline std::uint16_t half_bits(DType dtype, float x) {
  return dtype == DType::bf16 ? bf16_bits(x) : f16_bits(x);
}
inline float half_value(DType dtype, std::uint16_t bits) {
  return dtype == DType::bf16 ? bf16_value(bits) : f16_value(bits);
}

// A float32 tensor rounded to the 16-bit `dtype` (same shape).
inline Tensor to_half(const Tensor& x, DType dtype) {
  Tensor r(dtype, x.rank(), x.sizes());
  auto* out = static_cast<std::uint16_t*>(r.raw());
  for (std::int64_t i = 0; i < x.numel(); ++i) out[i] = half_bits(dtype, x.data<float>()[i]);
  return r;
}
// A float64 tensor rounded to float32.
inline Tensor to_f32(const Tensor& x) {
  Tensor r(DType::f32, x.rank(), x.sizes());
  for (std::int64_t i = 0; i < x.numel(); ++i)
    r.data<float>()[i] = static_cast<float>(x.data<double>()[i]);
  return r;
}

// A 16-bit tensor widened to float32, exactly.
inline Tensor widen(const Tensor& x) {
  Tensor r(DType::f32, x.rank(), x.sizes());
  const auto* in = static_cast<const std::uint16_t*>(x.raw());
  for (std::int64_t i = 0; i < x.numel(); ++i) r.data<float>()[i] = half_value(x.dtype(), in[i]);
  return r;
}

// The same problem twice: `half` with 16-bit q, k, v; `wide` with those values as float32.
// Gates and the initial state are float32 in both.
struct Pair {
  Problem half, wide;
};
inline Pair make_pair(const ProblemSpec& spec, DType dtype) {
  Pair p{make_problem(spec), make_problem(spec)};
  for (Tensor Problem::*x : {&Problem::q, &Problem::k, &Problem::v}) {
    p.half.*x = to_half(p.wide.*x, dtype);
    p.wide.*x = widen(p.half.*x);
  }
  return p;
}

inline BackwardInputs backward_inputs(const Problem& p, const Tensor& d_o, const Tensor& d_ht) {
  return {p.q.view(),  p.k.view(),          p.v.view(), p.g.view(),  p.beta.view(),
          p.h0.view(), p.cu_seqlens.view(), d_o.view(), d_ht.view(), {},
          {}};
}

inline ProblemSpec mixed_spec() {
  ProblemSpec spec;
  spec.lengths = {150, 1, 0, 64, 37};
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 32;
  spec.dv = 24;
  spec.initial_state = true;
  spec.l2norm = true;
  spec.g_lo = -3;
  return spec;
}

// The fused layer op with 16-bit qkv, a, b, out and their gradients; parameters, states and
// their gradients float32.
struct LayerRun {
  LayerForwardResult fwd;
  LayerBackwardResult bwd;
};
inline LayerBackwardInputs layer_backward_inputs(const test::LayerProblem& p) {
  return {p.inputs(), p.d_out.view(), p.d_conv_state_out.view(), p.d_recurrent_state_out.view(), {},
          {}};
}

// (name, tensor, activation?) of every output and gradient.
inline std::vector<std::tuple<const char*, const Tensor*, bool>> layer_outputs(const LayerRun& r) {
  return {{"out", &r.fwd.out, true},
          {"conv_state_out", &r.fwd.conv_state_out, false},
          {"recurrent_state_out", &r.fwd.recurrent_state_out, false},
          {"d_qkv", &r.bwd.d_qkv, true},
          {"d_a", &r.bwd.d_a, true},
          {"d_b", &r.bwd.d_b, true},
          {"d_conv_weight", &r.bwd.d_conv_weight, false},
          {"d_conv_bias", &r.bwd.d_conv_bias, false},
          {"d_A_log", &r.bwd.d_A_log, false},
          {"d_dt_bias", &r.bwd.d_dt_bias, false},
          {"d_conv_state", &r.bwd.d_conv_state, false},
          {"d_recurrent_state", &r.bwd.d_recurrent_state, false}};
}

inline double cosine(const Tensor& x, const Tensor& ref) {
  double dot = 0, nx = 0, nr = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double a = test::value_at(x, i), b = test::value_at(ref, i);
    dot += a * b;
    nx += a * a;
    nr += b * b;
  }
  return dot / std::sqrt(nx * nr);
}

// Layer tolerance: float32 results within 1e-4 of the reference on the same inputs (the layer's
// float32 tolerance, tests/cpu/layer_test.cc); 16-bit ones within that plus twice the error of
// the reference's own result rounded to the type. The A_log and dt_bias gradients: cosine at
// least 0.999 with the float64 reference on the inputs before rounding to 16 bits (what the
// 16-bit activations cost a training step, end to end).
inline constexpr double kLayerF32Tolerance = 1e-4;
inline constexpr double kMinParameterCosine = 0.999;

// Mixed lengths, both initial states: the layer case of the 16-bit and bf16-operand tests.
inline test::LayerSpec mixed_layer_spec() {
  test::LayerSpec spec;
  spec.lengths = {1, 2, 0, 300, 45};
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 16;
  spec.dv = 24;
  spec.conv_state = true;
  spec.recurrent_state = true;
  return spec;
}

}  // namespace gdn::precision_test
