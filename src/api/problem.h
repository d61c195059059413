// problem.h: a validated forward problem, in the form every backend consumes.
//
// src/api/validate.cc is the only producer: after it returns, every pointer, stride, shape
// and option here is known to be consistent, so the reference and the CPU kernels never
// re-check anything. The struct holds raw pointers only (no std containers) because it is
// read from the per-ISA translation units, which must not instantiate library templates.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gdn/forward.h"

namespace gdn::detail {

// One sequence of a packed or batched batch.
struct Sequence {
  std::int64_t batch = 0;        // index along the batch dimension (batched layout), else 0
  std::int64_t start = 0;        // first token along the token dimension (packed), else 0
  std::int64_t length = 0;       // tokens
  std::int64_t first_chunk = 0;  // global index of its first chunk (residual layout)
};

// A token tensor (q, k, v, g, beta, o): element (sequence s, token t of s, head h, index d)
// lives at data + (s.batch * batch + (s.start + t) * token + h * head + d * dim) elements.
// g and beta have no last dimension (dim = 0).
template <class Pointer>
struct TokenTensor {
  Pointer data = nullptr;
  DType dtype = DType::f32;
  std::int64_t batch = 0, token = 0, head = 0, dim = 0;
};

// A [outer, Hv, rows, cols] tensor: states [N, Hv, Dk, Dv] (outer = sequence), chunk_states
// [total_chunks, Hv, Dk, Dv] and t_inv [total_chunks, Hv, C, C] (outer = chunk). Element
// (index, h, r, c) lives at data + (index * outer + h * head + r * row + c * col) elements.
template <class Pointer>
struct MatrixTensor {
  Pointer data = nullptr;  // null: absent
  DType dtype = DType::f32;
  std::int64_t outer = 0, head = 0, row = 0, col = 0;

  std::int64_t offset(std::int64_t index, std::int64_t h) const { return index * outer + h * head; }
};

struct ForwardProblem {
  ForwardShape shape;
  std::int64_t group = 1;  // value heads per key head, Hv / Hk
  double scale = 1.0;
  bool l2norm = false;
  int chunk_size = 64;
  int threads = 1;
  Algorithm algorithm = Algorithm::automatic;

  const Sequence* seqs = nullptr;  // shape.num_seqs of them

  TokenTensor<const std::byte*> q, k, v, g, beta;
  MatrixTensor<const std::byte*> initial_state;

  TokenTensor<std::byte*> o;
  MatrixTensor<std::byte*> final_state, chunk_states, t_inv;
};

// A validated backward problem: the forward's inputs and options in `fwd` (its output fields
// unused), the cotangents, the residuals the caller kept (null when absent) and the gradients.
struct BackwardProblem {
  ForwardProblem fwd;
  TokenTensor<const std::byte*> d_o;
  MatrixTensor<const std::byte*> d_final_state, chunk_states, t_inv;
  TokenTensor<std::byte*> dq, dk, dv, dg, dbeta;
  MatrixTensor<std::byte*> d_initial_state;
};

}  // namespace gdn::detail
