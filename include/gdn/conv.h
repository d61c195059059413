// gdn/conv.h: the causal depthwise conv1d of the fused layer op (gdn/layer.h) on its own,
// forward and backward, with or without the SiLU: what the causal-conv1d package's
// causal_conv1d_fn and causal_conv1d_update compute, and what transformers' Qwen3-Next layer
// calls before the gated delta rule. The same kernels as the layer op's conv.
//
//   y_t[c]  = sum_{i=0..K-1} weight[c, i] x_{t-K+1+i}[c] + bias[c]
//             (inputs before a sequence's first token come from its initial state, or are 0)
//   out_t   = SiLU(y_t) = y_t sigmoid(y_t), or y_t (ConvActivation::none)
//
// The final state of a sequence is its last K - 1 raw inputs, taken partly from its initial
// state when it is shorter than K - 1: the initial state of the sequence's next call.
#pragma once

#include <cstdint>

#include "gdn/layer.h"
#include "gdn/runtime.h"
#include "gdn/tensor.h"

namespace gdn {

enum class ConvActivation { none, silu };

struct ConvOptions {
  ConvActivation activation = ConvActivation::silu;
  int threads = 0;  // 0 = default_threads(); results do not depend on it
  CpuIsa isa = CpuIsa::automatic;
};

// Inputs, packed layout (sequences back to back, as gdn/layer.h). x is f32, f64, bf16 or f16;
// everything else (but cu_seqlens) has the compute dtype: float64 for f64 x, else float32.
// Any strides.
//   x              [T, D]
//   weight         [D, K] or [D, 1, K], K from 1 to kMaxConvTaps; tap K - 1 multiplies the
//                  current token
//   bias           [D], optional
//   initial_state  [N, K - 1, D], optional: each sequence's K - 1 inputs before it, oldest
//                  first (absent: zeros)
//   cu_seqlens     int64 [N + 1], optional (absent: one sequence)
struct ConvInputs {
  TensorView x, weight, bias, initial_state, cu_seqlens;
};

// Outputs (caller-owned, any strides):
//   out          [T, D], the dtype of x
//   final_state  [N, K - 1, D], the compute dtype, optional (may be exactly the view of
//                initial_state: updated in place)
struct ConvOutputs {
  MutableTensorView out, final_state;
};

void causal_conv1d_fwd(const ConvInputs& inputs, const ConvOutputs& outputs,
                       const ConvOptions& options);

// Allocating form: out and the final state.
struct ConvForwardResult {
  Tensor out, final_state;
};
ConvForwardResult causal_conv1d_fwd(const ConvInputs& inputs, const ConvOptions& options = {});

// Backward inputs: the forward's, the cotangent of out, and optionally of the final state.
struct ConvBackwardInputs {
  ConvInputs forward;
  TensorView d_out;          // [T, D], the dtype of x, required
  TensorView d_final_state;  // [N, K - 1, D], the compute dtype, optional
};

// Gradients (caller-owned, shaped like their inputs, any strides): d_x [T, D] (the dtype of
// x) and d_weight (the layout of weight) required; d_bias [D] (only with a bias) and
// d_initial_state [N, K - 1, D] optional (also when the forward had no initial state).
// d_weight and d_bias are sums over all tokens in a fixed order: bit-identical for any
// thread count.
struct ConvBackwardOutputs {
  MutableTensorView d_x, d_weight, d_bias, d_initial_state;
};

void causal_conv1d_bwd(const ConvBackwardInputs& inputs, const ConvBackwardOutputs& outputs,
                       const ConvOptions& options);

struct ConvBackwardResult {
  Tensor d_x, d_weight, d_bias, d_initial_state;
};
// Allocating form: every gradient (d_bias only with a bias).
ConvBackwardResult causal_conv1d_bwd(const ConvBackwardInputs& inputs,
                                     const ConvOptions& options = {});

// A decode step of the conv on a pool of conv states, the pool updated in place (what the
// causal-conv1d package's causal_conv1d_update computes): sequence s's new tokens continue the
// raw inputs kept in its slot, and the slot then keeps its last S inputs, the new ones included.
//   x              [T, D] the sequences' new tokens, packed; f32, f64, bf16 or f16, any strides
//   weight, bias   as ConvInputs (the compute dtype)
//   cu_seqlens     int64 [N + 1], optional (absent: one sequence of T tokens)
//   state_indices  int64 [N], optional (absent: slot s for sequence s): distinct slots in
//                  [0, num_slots)
struct ConvUpdateInputs {
  TensorView x, weight, bias, cu_seqlens, state_indices;
};

// conv_state [num_slots, S, D], S >= K - 1: each slot's last S raw inputs, oldest first (the
// conv reads the last K - 1). f32, f64, bf16 or f16 whatever x's dtype: read into the compute
// dtype; each new input is stored rounded once to the pool's dtype. Read and written where it
// lies, slot by slot (no copy of the pool): each slot one dense block, channel-last ([S, D]
// row-major, strides (*, D, 1): the serving step's layout and vLLM's) or channel-first ([D, S]
// row-major, strides (*, 1, S): the package's [B, D, S] seen as [B, S, D]); the slot stride any
// number of elements from one slot up (0 with one slot), the base any aligned address, so a pool
// may be a strided view of padded pages (gdn/step.h). out [T, D]: x's dtype, any strides.
// A sequence with no token leaves its slot as it is. Other inner strides, slots that share
// memory, out or the pool sharing a byte with each other or an input, a slot out of range or
// used twice throw gdn::InvalidArgument before anything is written. Bit-identical to
// causal_conv1d_fwd from the slots' last K - 1 inputs, whatever the slot stride.
void conv_update(const ConvUpdateInputs& inputs, const MutableTensorView& conv_state,
                 const MutableTensorView& out, const ConvOptions& options = {});

namespace ref {
// The float64 reference: plain loops in float64, outputs f64, the same validation.
void causal_conv1d_fwd(const ConvInputs& inputs, const ConvOutputs& outputs,
                       const ConvOptions& options);
ConvForwardResult causal_conv1d_fwd(const ConvInputs& inputs, const ConvOptions& options = {});
void causal_conv1d_bwd(const ConvBackwardInputs& inputs, const ConvBackwardOutputs& outputs,
                       const ConvOptions& options);
ConvBackwardResult causal_conv1d_bwd(const ConvBackwardInputs& inputs,
                                     const ConvOptions& options = {});
}  // namespace ref

}  // namespace gdn
