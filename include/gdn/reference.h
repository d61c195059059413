// gdn/reference.h: the float64 reference of the forward and backward passes (gdn::ref).
//
// Plain loops in float64, whatever the input dtype (inputs are converted up exactly). Same
// arguments, layouts and validation as gdn::chunk_gated_delta_rule_fwd, except that every
// output must be f64. `options.isa`, `options.algorithm` and `options.matmul_precision` are
// ignored (every product is float64); `options.threads`
// parallelises over (sequence, value head), which does not change a bit of the result.
//
//   recurrent_fwd: the token recurrence, the definition of the op. It can write chunk_states
//                  (the state entering every chunk of options.chunk_size tokens) but not t_inv.
//   chunked_fwd:   the chunked (WY) form exactly as written in docs/math.md: T, A = T^-1 by
//                  forward substitution, U = A diag(beta) V, W = A diag(beta exp(G)) K, ...
//                  It writes every output, residuals included.
#pragma once

#include "gdn/backward.h"
#include "gdn/forward.h"

namespace gdn::ref {

void recurrent_fwd(const ForwardInputs& inputs, const ForwardOutputs& outputs,
                   const ForwardOptions& options = {});
void chunked_fwd(const ForwardInputs& inputs, const ForwardOutputs& outputs,
                 const ForwardOptions& options = {});

// Allocating variants (f64 outputs). recurrent_fwd returns chunk_states but no t_inv when
// residuals are requested.
ForwardResult recurrent_fwd(const ForwardInputs& inputs, const ForwardOptions& options = {},
                            Residuals residuals = Residuals::none);
ForwardResult chunked_fwd(const ForwardInputs& inputs, const ForwardOptions& options = {},
                          Residuals residuals = Residuals::none);

// The backward pass by reverse-mode differentiation of the token recurrence (the definition),
// in float64: tests/reference checks it against central finite differences of recurrent_fwd.
// Residuals in `inputs` are ignored (everything is recomputed); every output must be f64;
// d_initial_state is optional. Same validation as gdn::chunk_gated_delta_rule_bwd.
void recurrent_bwd(const BackwardInputs& inputs, const BackwardOutputs& outputs,
                   const ForwardOptions& options = {});
BackwardResult recurrent_bwd(const BackwardInputs& inputs, const ForwardOptions& options = {});

}  // namespace gdn::ref
