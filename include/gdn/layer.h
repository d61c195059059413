// gdn/layer.h: the fused GDN layer op, what a Qwen3-Next / Qwen3.5 model calls: causal
// depthwise conv1d + SiLU over the projected channels, the split into q, k, v, their L2 norm,
// the gates, and the gated delta rule (gdn/forward.h). Forward and backward. Same contract as
// Tokamax's fused_conv1d_gdn and MaxText's decoupled GDN; docs/math.md section 6.
//
//   y_t[c]  = sum_{i=0..K-1} conv_weight[c, i] x_{t-K+1+i}[c] + conv_bias[c]
//             (inputs before the sequence's first token come from its conv state, or are 0)
//   xh      = SiLU(y) = y sigmoid(y)
//   q, k, v = xh[:, 0:Hk Dk], xh[:, Hk Dk:2 Hk Dk], xh[:, 2 Hk Dk:D], as [T, H, Dk or Dv]
//   beta    = sigmoid(b),  g = -exp(A_log) softplus(a + dt_bias)
//   out     = gated delta rule (q, k, v, g, beta), q and k L2-normalised, scale Dk^-1/2
// with D = 2 Hk Dk + Hv Dv. The new conv state of a sequence is its last K - 1 raw (pre-conv)
// inputs, taken partly from its old conv state when the sequence is shorter than K - 1.
// Conv, SiLU, gates and softplus run in the compute precision (float32 for float32 inputs).
#pragma once

#include <cstdint>

#include "gdn/backward.h"
#include "gdn/forward.h"

namespace gdn {

// The conv1d taps K the layer op accepts: 1 .. kMaxConvTaps.
inline constexpr int kMaxConvTaps = 8;

// The head layout, which the channel count alone does not determine.
struct LayerOptions {
  std::int64_t hk = 0, hv = 0, dk = 0, dv = 0;  // required; Hv a multiple of Hk
  // Of the gated delta rule: 1 to 256, or 0 for the tiling plan's (gdn/plan.h).
  int chunk_size = 64;
  int threads = 0;  // 0 = default_threads()
  CpuIsa isa = CpuIsa::automatic;
  // Of the gated delta rule's matrix products (gdn/forward.h).
  MatmulPrecision matmul_precision = MatmulPrecision::compute;
  // Check mode, as ForwardOptions::check_finite (gdn/forward.h): the first NaN or Inf of the
  // inputs (before anything is written) or the outputs (after) throws gdn::NonFiniteError;
  // a state output that is the view of its input (updated in place) is then put back as it
  // was. A serving step (gdn/step.h) checks qkv, a, b over its live tokens, the parameters
  // and the slots its live sequences read, then out over the live tokens and the slots it
  // wrote; when one of those is non-finite every slot it wrote is put back (out stays
  // written). Not the other slots: they belong to other sequences.
  bool check_finite = false;
};

// Inputs, packed layout (sequences back to back; cu_seqlens as in gdn/forward.h). One float
// dtype (f32 or f64) for every tensor except cu_seqlens; or 16-bit activations: qkv, a, b all
// bf16 or all f16, everything else float32 (docs/numerics.md "16-bit activations").
//   qkv              [T, D]   the projected, pre-conv channels [q heads | k heads | v heads]
//   a, b             [T, Hv]  gate logits
//   conv_weight      [D, K] or [D, 1, K], K from 1 to 8; tap K - 1 multiplies the current token
//   conv_bias        [D], optional
//   A_log, dt_bias   [Hv]
//   conv_state       [N, K - 1, D], optional: each sequence's last K - 1 inputs before it,
//                    oldest first (absent: zeros)
//   recurrent_state  [N, Hv, Dk, Dv], optional (absent: zeros)
//   cu_seqlens       int64 [N + 1], optional (absent: one sequence)
struct LayerInputs {
  TensorView qkv, a, b;
  TensorView conv_weight, conv_bias;
  TensorView A_log, dt_bias;
  TensorView conv_state, recurrent_state;
  TensorView cu_seqlens;
};

// Outputs (caller-owned; out in the dtype of qkv, the states and residuals in the compute
// dtype, float64 for f64 inputs, else float32):
//   out                  [T, Hv Dv], optional: without it the layer writes only the states
//                        and residuals asked for (gdn/forward.h, o); at least one output
//   conv_state_out       [N, K - 1, D], optional
//   recurrent_state_out  [N, Hv, Dk, Dv], optional (may be exactly the view of
//                        recurrent_state: updated in place)
//   chunk_states, t_inv  the gated delta rule's residuals (gdn/forward.h), optional
struct LayerOutputs {
  MutableTensorView out;
  MutableTensorView conv_state_out, recurrent_state_out;
  MutableTensorView chunk_states, t_inv;
};

// The shape of the layer's gated delta rule (tokens, sequences, the chunk size resolved when
// options.chunk_size is 0, total_chunks: the rows of chunk_states and t_inv), for allocating
// the outputs and residuals. Validates the inputs and options (gdn::InvalidArgument, as the op).
ForwardShape fused_gdn_shape(const LayerInputs& inputs, const LayerOptions& options);

void fused_gdn_fwd(const LayerInputs& inputs, const LayerOutputs& outputs,
                   const LayerOptions& options);

// Allocating form: out and both final states always; residuals per `residuals`.
struct LayerForwardResult {
  Tensor out, conv_state_out, recurrent_state_out, chunk_states, t_inv;
};
LayerForwardResult fused_gdn_fwd(const LayerInputs& inputs, const LayerOptions& options,
                                 Residuals residuals = Residuals::none);

// Backward inputs: the forward's, the cotangent of out, optional cotangents of the final
// states, and optional residuals of the gated delta rule (remat policies as in
// gdn/backward.h: whatever is absent is rebuilt).
struct LayerBackwardInputs {
  LayerInputs forward;
  TensorView d_out;                  // [T, Hv Dv], the dtype of qkv, required
  TensorView d_conv_state_out;       // [N, K - 1, D], the compute dtype, optional
  TensorView d_recurrent_state_out;  // [N, Hv, Dk, Dv], the compute dtype, optional
  TensorView chunk_states, t_inv;    // optional residuals
};

// Gradients (caller-owned, shaped and typed like their inputs):
//   d_qkv [T, D], d_a, d_b [T, Hv], d_conv_weight (the layout of conv_weight), d_A_log,
//   d_dt_bias [Hv] required; d_conv_bias [D] (only with conv_bias), d_conv_state
//   [N, K - 1, D] and d_recurrent_state [N, Hv, Dk, Dv] optional (gradients of the initial
//   states, also when the forward had none, i.e. zeros).
// Parameter gradients (conv weight and bias, A_log, dt_bias) are sums over all tokens, taken
// in a fixed order: bit-identical for any thread count.
struct LayerBackwardOutputs {
  MutableTensorView d_qkv, d_a, d_b;
  MutableTensorView d_conv_weight, d_conv_bias;
  MutableTensorView d_A_log, d_dt_bias;
  MutableTensorView d_conv_state, d_recurrent_state;
};

void fused_gdn_bwd(const LayerBackwardInputs& inputs, const LayerBackwardOutputs& outputs,
                   const LayerOptions& options);

struct LayerBackwardResult {
  Tensor d_qkv, d_a, d_b, d_conv_weight, d_conv_bias, d_A_log, d_dt_bias, d_conv_state,
      d_recurrent_state;
};
// Allocating form: every gradient (d_conv_bias only when conv_bias is given).
LayerBackwardResult fused_gdn_bwd(const LayerBackwardInputs& inputs, const LayerOptions& options);

namespace ref {
// The float64 reference of the whole op: conv, SiLU, gates in float64, then gdn::ref's token
// recurrence (forward) and its reverse mode (backward). Outputs must be f64; residuals in
// the inputs are ignored; same validation as the CPU op.
void fused_gdn_fwd(const LayerInputs& inputs, const LayerOutputs& outputs,
                   const LayerOptions& options);
LayerForwardResult fused_gdn_fwd(const LayerInputs& inputs, const LayerOptions& options);
void fused_gdn_bwd(const LayerBackwardInputs& inputs, const LayerBackwardOutputs& outputs,
                   const LayerOptions& options);
LayerBackwardResult fused_gdn_bwd(const LayerBackwardInputs& inputs, const LayerOptions& options);
}  // namespace ref

}  // namespace gdn
