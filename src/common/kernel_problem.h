// kernel_problem.h: a validated forward problem, in the form every backend consumes.
//
// src/api/validate.cc is the only producer: after it returns, every pointer, stride, shape
// and option here is known to be consistent, so the reference and the CPU kernels never
// re-check anything. The struct holds raw pointers only (no std containers) because it is
// read from the per-ISA translation units, which must not instantiate library templates. It
// lives in src/common, below both its producer (src/api) and its readers (src/cpu,
// src/reference), so that no layer includes one above it.
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

struct ConvProblem;

struct ForwardProblem {
  ForwardShape shape;
  std::int64_t group = 1;  // value heads per key head, Hv / Hk
  double scale = 1.0;
  bool l2norm = false;
  int chunk_size = 64;
  int threads = 1;
  Algorithm algorithm = Algorithm::automatic;
  bool bf16_operands = false;  // MatmulPrecision::bf16

  const Sequence* seqs = nullptr;  // shape.num_seqs of them

  TokenTensor<const std::byte*> q, k, v, g, beta;
  MatrixTensor<const std::byte*> initial_state;

  TokenTensor<std::byte*> o;
  MatrixTensor<std::byte*> final_state, chunk_states, t_inv;

  // The fused layer op's forward (src/api/layer.cc): when set, q, k and v are the [q heads |
  // k heads | v heads] column views of conv->x (qkv), over the same sequences, and every row
  // the forward kernels read of them is the conv's output, SiLU(conv(x)), computed as they pack
  // it (src/cpu/conv1d-inl.h: conv_head_rows) with the conv kernel's arithmetic: no [T, D]
  // conv output is written or read back. Null: q, k and v are read as they are.
  const ConvProblem* conv = nullptr;
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

// The causal depthwise conv1d (+ SiLU) of the fused layer op and the conv op, over channels [0,
// channels) of packed sequences. x (qkv) and dx (d_qkv) are the caller's views (token and channel
// strides); everything else is a contiguous buffer of the compute type that src/cpu/layer.cc
// prepares: weight and its gradient transposed to [taps][cpad], bias [cpad] (zeros when absent),
// the conv states [N][taps - 1][channels], xh and dxh [tokens][channels].
struct ConvProblem {
  std::int64_t tokens = 0, channels = 0, taps = 0, cpad = 0;
  std::int64_t num_seqs = 0;
  const Sequence* seqs = nullptr;
  DType dtype = DType::f32;    // the compute dtype: every buffer
  DType x_dtype = DType::f32;  // of x and dx: the compute dtype, or bf16 / f16 (float32 compute)
  bool silu = true;            // out = SiLU(y), else y (gdn/conv.h)

  const std::byte* x = nullptr;
  std::int64_t x_token = 0, x_channel = 0;
  const std::byte* weight = nullptr;    // [taps][cpad]
  const std::byte* bias = nullptr;      // [cpad]
  const std::byte* state_in = nullptr;  // [N][taps - 1][channels], null: zeros
  // Forward only: when set, sequence s's conv state is block state_block[s] of state_in
  // (blocks of [taps - 1][channels], e.g. a pool's slots), and -1 means zeros. Blocks start
  // state_stride elements apart (0: (taps - 1) channels, packed): a pool's slot stride, which
  // may pad its slots (vLLM's pages).
  const std::int64_t* state_block = nullptr;
  std::int64_t state_stride = 0;
  // Forward with float32 compute only: state_in holds bf16 (a bf16 pool's slots, gdn/step.h),
  // each row widened as the kernel stages it.
  bool state_bf16 = false;

  std::byte* xh = nullptr;  // forward output [tokens][channels]

  const std::byte* dxh = nullptr;          // backward: cotangent of xh [tokens][channels]
  const std::byte* d_state_out = nullptr;  // [N][taps - 1][channels], null: zero
  std::byte* dx = nullptr;                 // [tokens][channels] view: token and channel strides
  std::int64_t dx_token = 0, dx_channel = 0;
  std::byte* dweight = nullptr;     // [taps][cpad]
  std::byte* dbias = nullptr;       // [cpad]
  std::byte* d_state_in = nullptr;  // [N][taps - 1][channels], null: not wanted
};

// The decodes of a serving step (gdn/step.h), after the conv: per sequence a window of one
// or more tokens whose recurrent state starts from a pool slot (or zeros) and is written, after
// each token t, into slot write_slot[s] + t (or token_slot's). Tokens are rows [token_start[s],
// token_start[s + 1]) of xh, g, beta and out. Work items are (sequence, value head, block of
// value columns); value columns are independent in the delta rule, so the split changes no
// result.
struct DecodeProblem {
  std::int64_t num_seqs = 0, hk = 0, hv = 0, dk = 0, dv = 0, channels = 0;
  std::int64_t vblocks = 1;        // value-column blocks per head
  DType dtype = DType::f32;        // of every buffer and out
  DType state_dtype = DType::f32;  // of the pool: dtype, or bf16 with float32 (gdn/step.h)
  double scale = 1.0;              // of q, after its L2 norm

  const std::int64_t* token_start = nullptr;  // [num_seqs + 1]
  const std::int64_t* write_slot = nullptr;   // [num_seqs]
  const std::int64_t* read_slot = nullptr;    // [num_seqs], -1: start from zeros
  // When set (vLLM's speculative layout), the slot written after token row r is token_slot[r]
  // instead of write_slot[s] + t: a block table's arbitrary slots.
  const std::int64_t* token_slot = nullptr;  // [tokens]

  const std::byte* xh = nullptr;    // [tokens][channels]: q heads | k heads | v heads
  const std::byte* g = nullptr;     // [tokens][hv], log decay
  const std::byte* beta = nullptr;  // [tokens][hv]

  std::byte* state = nullptr;    // the pool: slot x at state + x * slot_stride, [Hv][Dk][Dv]
                                 // elements of state_dtype, dense
  std::int64_t slot_stride = 0;  // elements from a slot to the next (at least Hv Dk Dv)
  std::byte* out = nullptr;  // element (token, h Dv + j) at out + token * out_token + (h Dv + j)
  std::int64_t out_token = 0, out_channel = 0;  // * out_channel
  // Items [r run, (r + 1) run) run on one thread, in order (cpu::decode): over a bf16 pool an
  // item prefetches the next item of its run as it rounds its own state (decode-inl.h).
  std::int64_t run = 1;
};

}  // namespace gdn::detail
