// gdn/backward.h: the backward pass of the core op (reverse mode of gdn/forward.h).
//
// Given the forward's inputs, the cotangent d_o of its output o and (optionally) the cotangent
// d_final_state of its final states, returns the gradients of
//     L = <d_o, o> + <d_final_state, final_state>
// with respect to q, k (before the in-kernel L2 norm when it is on), v, g, beta and the initial
// states. The CPU backward walks each sequence's chunks in reverse, carrying dS in the compute
// precision; what it needs of the forward comes from the residuals the caller kept (the remat
// policy) or is rebuilt:
//
//   residuals given          the backward
//   chunk_states + t_inv     repeats no state recurrence and no inversion
//   t_inv only               rebuilds the chunk states, reusing T^-1
//   none                     rebuilds the chunk states and T^-1
// A rebuild keeps, per thread, the states of its work item (a sequence and one key head's
// value heads): all of them when they fit in 32 MiB (one extra pass over the chunks), else a
// checkpoint every ceil(sqrt(chunks)) chunks plus one segment (two extra passes).
// In every case the chunk-local products with S (K S and V_new = A R) are recomputed, as in
// every public GDN backward. With residuals from chunk_gated_delta_rule_fwd's chunked
// algorithm (what Residuals::all gives by default) on the same ISA variant, all policies give
// bit-identical gradients, for any thread count. Residuals from the token recurrence
// (Algorithm::recurrent) or from the float64 reference are accepted too; they differ from
// the chunked forward's in the last bits, and so do the gradients.
// docs/math.md section 5 derives every formula.
#pragma once

#include "gdn/forward.h"

namespace gdn {

// Inputs: the forward's (same layouts, dtypes and rules as ForwardInputs), plus
//   d_o            [T, Hv, Dv] (batched: [B, T, Hv, Dv]), the dtype of q. Required.
//   d_final_state  [N, Hv, Dk, Dv], the compute dtype. Optional (absent: zero).
//   chunk_states   [total_chunks, Hv, Dk, Dv], compute dtype: the forward's residual. Optional.
//   t_inv          [total_chunks, Hv, C, C], compute dtype: the forward's residual. Optional.
// The residuals must come from a forward with the same inputs and options (chunk size, scale,
// L2 norm); nothing can check that.
struct BackwardInputs {
  TensorView q, k, v, g, beta;
  TensorView initial_state;
  TensorView cu_seqlens;
  TensorView d_o;
  TensorView d_final_state;
  TensorView chunk_states;
  TensorView t_inv;

  // The forward's inputs, as passed to chunk_gated_delta_rule_fwd.
  ForwardInputs forward() const { return {q, k, v, g, beta, initial_state, cu_seqlens}; }
  // Backward inputs holding the forward's inputs; set d_o (and the rest) afterwards.
  static BackwardInputs from(const ForwardInputs& in) {
    BackwardInputs b;
    b.q = in.q;
    b.k = in.k;
    b.v = in.v;
    b.g = in.g;
    b.beta = in.beta;
    b.initial_state = in.initial_state;
    b.cu_seqlens = in.cu_seqlens;
    return b;
  }
};

// Outputs (written by the call, caller-owned; same shapes and dtype as the matching input):
//   dq, dk [T, Hk, Dk]; dv [T, Hv, Dv]; dg, dbeta [T, Hv]  (batched layouts: with [B, T, ...]).
//   d_initial_state [N, Hv, Dk, Dv]: optional; the gradient of the initial states (also when
//   the forward had none, i.e. zeros).
// dq and dk of the value heads that share a key head are summed in a fixed order. Outputs must
// not overlap each other or any input.
struct BackwardOutputs {
  MutableTensorView dq, dk, dv, dg, dbeta;
  MutableTensorView d_initial_state;
};

// The backward pass on the CPU. Validates every argument first (gdn::InvalidArgument, nothing
// written). `options` must be the forward's (chunk_size, scale, use_qk_l2norm); threads and isa
// apply; algorithm is ignored (the backward is always chunked).
void chunk_gated_delta_rule_bwd(const BackwardInputs& inputs, const BackwardOutputs& outputs,
                                const ForwardOptions& options = {});

// The same, allocating its outputs (contiguous, each in its input's dtype: dq, dk, dv that of
// q; dg, dbeta and d_initial_state the compute dtype; d_initial_state always).
struct BackwardResult {
  Tensor dq, dk, dv, dg, dbeta, d_initial_state;
};
BackwardResult chunk_gated_delta_rule_bwd(const BackwardInputs& inputs,
                                          const ForwardOptions& options = {});

}  // namespace gdn
