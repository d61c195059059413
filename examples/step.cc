// A serving step over state pools, as an inference engine calls it: one batch mixing a decode,
// a speculative decode window and a fresh prefill, each sequence in its own slot. Small head
// layout (Hk = 2, Hv = 4, Dk = Dv = 32: D = 256 channels), conv K = 4, 16 slots.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "gdn/gdn.h"

int main() {
  const std::int64_t Hk = 2, Hv = 4, Dk = 32, Dv = 32, K = 4, D = 2 * Hk * Dk + Hv * Dv;
  const std::int64_t slots = 16, T = 1 + 3 + 20;  // decode: 1 token, window: 3, prefill: 20
  std::vector<float> qkv(T * D), a(T * Hv, 0.5f), b(T * Hv, 1.0f), conv_weight(D * K, 0.25f);
  std::vector<float> A_log(Hv, 0.0f), dt_bias(Hv, -2.0f), out(T * Hv * Dv);
  for (std::int64_t i = 0; i < T * D; ++i) qkv[i] = std::sin(0.1f * static_cast<float>(i));
  // The pools, owned by the engine and updated in place (here: some earlier history).
  std::vector<float> conv_pool(slots * (K - 1) * D, 0.1f), state_pool(slots * Hv * Dk * Dv, 0.01f);

  // Sequence 0 decodes 1 token in slot 3; sequence 1 verifies a window of 3 tokens, starting
  // from slot 5 and writing the state after each token into slots 5, 6, 7; sequence 2 is a
  // fresh 20-token prefill into slot 9 (no history: whatever slot 9 holds is ignored).
  std::vector<std::int64_t> query_start_loc = {0, 1, 4, 24}, state_indices = {3, 5, 9};
  std::vector<std::int64_t> seq_lens = {57, 103, 20}, distribution = {2, 3, 3};

  gdn::StepInputs in;
  in.qkv = gdn::TensorView(qkv.data(), {T, D});
  in.a = gdn::TensorView(a.data(), {T, Hv});
  in.b = gdn::TensorView(b.data(), {T, Hv});
  in.conv_weight = gdn::TensorView(conv_weight.data(), {D, K});
  in.A_log = gdn::TensorView(A_log.data(), {Hv});
  in.dt_bias = gdn::TensorView(dt_bias.data(), {Hv});
  in.query_start_loc = gdn::TensorView(query_start_loc.data(), {3 + 1});
  in.state_indices = gdn::TensorView(state_indices.data(), {3});
  in.seq_lens = gdn::TensorView(seq_lens.data(), {3});
  in.distribution = gdn::TensorView(distribution.data(), {3});

  gdn::StatePools pools;
  pools.conv_state = gdn::MutableTensorView(conv_pool.data(), {slots, K - 1, D});
  pools.recurrent_state = gdn::MutableTensorView(state_pool.data(), {slots, Hv, Dk, Dv});

  gdn::StepOptions options;
  options.hk = Hk;
  options.hv = Hv;
  options.dk = Dk;
  options.dv = Dv;
  options.num_spec = 2;  // decode windows of up to 1 + 2 tokens

  gdn::fused_gdn_step(in, pools, gdn::MutableTensorView(out.data(), {T, Hv * Dv}), options);
  std::printf("out[0, 0] = %f; state of the window's last token: slot 7, S[0, 0, 0] = %f\n", out[0],
              state_pool[7 * Hv * Dk * Dv]);
  return 0;
}
