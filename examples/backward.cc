// Training: keep residuals in the forward, reuse them in the backward.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "gdn/gdn.h"

int main() {
  const std::int64_t T = 100, Hk = 2, Hv = 4, Dk = 64, Dv = 64;
  std::vector<float> q(T * Hk * Dk, 0.1f), k(T * Hk * Dk, 0.2f), v(T * Hv * Dv, 1.0f);
  std::vector<float> g(T * Hv, -0.5f), beta(T * Hv, 0.9f), d_o(T * Hv * Dv, 0.01f);

  gdn::ForwardInputs in;
  in.q = gdn::TensorView(q.data(), {T, Hk, Dk});
  in.k = gdn::TensorView(k.data(), {T, Hk, Dk});
  in.v = gdn::TensorView(v.data(), {T, Hv, Dv});
  in.g = gdn::TensorView(g.data(), {T, Hv});
  in.beta = gdn::TensorView(beta.data(), {T, Hv});
  gdn::ForwardOptions options;
  options.use_qk_l2norm = true;

  // Residuals::all keeps chunk_states and t_inv; Residuals::t_inv or none trade memory for a
  // rebuild in the backward (same gradients, bit for bit).
  gdn::ForwardResult fwd = gdn::chunk_gated_delta_rule_fwd(in, options, gdn::Residuals::all);
  std::printf("residuals: %lld bytes\n",
              static_cast<long long>(
                  gdn::residual_bytes(gdn::forward_shape(in, options), gdn::Residuals::all)));

  gdn::BackwardInputs bin = gdn::BackwardInputs::from(in);
  bin.d_o = gdn::TensorView(d_o.data(), {T, Hv, Dv});
  bin.chunk_states = fwd.chunk_states.view();
  bin.t_inv = fwd.t_inv.view();
  gdn::BackwardResult grads = gdn::chunk_gated_delta_rule_bwd(bin, options);
  std::printf("dq[0] = %g, dg[0] = %g, dbeta[0] = %g\n", grads.dq.data<float>()[0],
              grads.dg.data<float>()[0], grads.dbeta.data<float>()[0]);
  return 0;
}
