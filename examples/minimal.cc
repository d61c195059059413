// One GDN forward on the CPU: 2 sequences packed into T = 100 tokens, Qwen3-Next head dims.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "gdn/gdn.h"

int main() {
  const std::int64_t T = 100, Hk = 2, Hv = 4, Dk = 128, Dv = 128;
  std::vector<float> q(T * Hk * Dk, 0.1f), k(T * Hk * Dk, 0.2f), v(T * Hv * Dv, 1.0f);
  std::vector<float> g(T * Hv, -0.5f), beta(T * Hv, 0.9f);
  std::vector<std::int64_t> cu_seqlens = {0, 60, 100};  // sequence boundaries

  gdn::ForwardInputs in;
  in.q = gdn::TensorView(q.data(), {T, Hk, Dk});
  in.k = gdn::TensorView(k.data(), {T, Hk, Dk});
  in.v = gdn::TensorView(v.data(), {T, Hv, Dv});
  in.g = gdn::TensorView(g.data(), {T, Hv});
  in.beta = gdn::TensorView(beta.data(), {T, Hv});
  in.cu_seqlens = gdn::TensorView(cu_seqlens.data(), {3});

  gdn::ForwardOptions options;
  options.use_qk_l2norm = true;  // as Qwen3-Next does

  // Allocating form; chunk_gated_delta_rule_fwd(in, outputs, options) writes into your buffers.
  gdn::ForwardResult r = gdn::chunk_gated_delta_rule_fwd(in, options);
  std::printf(
      "o[0, 0, 0] = %f; final states %lld x %lld x %lld x %lld\n", r.o.data<float>()[0],
      static_cast<long long>(r.final_state.size(0)), static_cast<long long>(r.final_state.size(1)),
      static_cast<long long>(r.final_state.size(2)), static_cast<long long>(r.final_state.size(3)));

  // The float64 reference (the token recurrence) of the same call.
  gdn::ForwardResult ref = gdn::ref::recurrent_fwd(in, options);
  std::printf("reference o[0, 0, 0] = %f\n", ref.o.data<double>()[0]);
  return 0;
}
