// The fused layer op, as a Qwen3-Next layer calls it in training: forward keeping the gated
// delta rule's residuals, then the backward from them. One sequence of T = 64 tokens, a small
// head layout (Hk = 2, Hv = 4, Dk = Dv = 32: D = 2 Hk Dk + Hv Dv = 256 channels), conv K = 4.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "gdn/gdn.h"

int main() {
  const std::int64_t T = 64, Hk = 2, Hv = 4, Dk = 32, Dv = 32, K = 4;
  const std::int64_t D = 2 * Hk * Dk + Hv * Dv;
  std::vector<float> qkv(T * D), a(T * Hv, 0.5f), b(T * Hv, 1.0f), conv_weight(D * K, 0.25f);
  std::vector<float> A_log(Hv, 0.0f), dt_bias(Hv, -2.0f), d_out(T * Hv * Dv, 1.0f);
  for (std::int64_t i = 0; i < T * D; ++i) qkv[i] = std::sin(0.1f * static_cast<float>(i));

  gdn::LayerInputs in;
  in.qkv = gdn::TensorView(qkv.data(), {T, D});  // [q heads | k heads | v heads], pre-conv
  in.a = gdn::TensorView(a.data(), {T, Hv});
  in.b = gdn::TensorView(b.data(), {T, Hv});
  in.conv_weight = gdn::TensorView(conv_weight.data(), {D, K});
  in.A_log = gdn::TensorView(A_log.data(), {Hv});
  in.dt_bias = gdn::TensorView(dt_bias.data(), {Hv});

  gdn::LayerOptions options;
  options.hk = Hk;
  options.hv = Hv;
  options.dk = Dk;
  options.dv = Dv;

  // Forward: out [T, Hv Dv], the final conv and recurrent states, and the residuals.
  gdn::LayerForwardResult fwd = gdn::fused_gdn_fwd(in, options, gdn::Residuals::all);
  std::printf("out[0, 0] = %f; conv state %lld x %lld x %lld\n", fwd.out.data<float>()[0],
              static_cast<long long>(fwd.conv_state_out.size(0)),
              static_cast<long long>(fwd.conv_state_out.size(1)),
              static_cast<long long>(fwd.conv_state_out.size(2)));

  // Backward from the kept residuals: every gradient a training step needs.
  gdn::LayerBackwardInputs bin;
  bin.forward = in;
  bin.d_out = gdn::TensorView(d_out.data(), {T, Hv * Dv});
  bin.chunk_states = fwd.chunk_states.view();
  bin.t_inv = fwd.t_inv.view();
  gdn::LayerBackwardResult grads = gdn::fused_gdn_bwd(bin, options);
  std::printf("d_qkv[0, 0] = %g, d_conv_weight[0, 3] = %g, d_A_log[0] = %g, d_dt_bias[0] = %g\n",
              grads.d_qkv.data<float>()[0], grads.d_conv_weight.data<float>()[3],
              grads.d_A_log.data<float>()[0], grads.d_dt_bias.data<float>()[0]);
  return 0;
}
