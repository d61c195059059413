// ggml_decode_compare.cc: one decode token of the gated delta rule, one sequence, Qwen3-Next
// heads (Hk = 16, Hv = 32, Dk = Dv = 128): ggml's GATED_DELTA_NET CPU op (the peers' decode
// figure in docs/perf.md) against gdn's core op on the same values (the token
// recurrence, q and k L2-normalised inside; ggml's op takes them normalised), in one process,
// in alternating rounds. Each reads a 2 MiB state and writes a new one; a copy of the state is
// the floor. Built only with -DGDN_BUILD_DEV=ON -DGDN_GGML_DIR=<a ggml source tree>
// (docs/perf.md says which ggml was measured and how it was obtained).
//
// usage: ggml_decode_compare [rounds]   (100 tokens per round and implementation; default 9)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "gdn/gdn.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace {
constexpr int kHk = 16, kHv = 32, kD = 128;

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
void fill(float* p, std::int64_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  for (std::int64_t i = 0; i < n; ++i) p[i] = u(rng);
}
}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 9, per_round = 100;
  std::mt19937 rng(7);
  // ggml
  ggml_init_params params{64u << 20, nullptr, false};
  ggml_context* ctx = ggml_init(params);
  ggml_tensor* q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, kD, kHk, 1, 1);
  ggml_tensor* k = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, kD, kHk, 1, 1);
  ggml_tensor* v = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, kD, kHv, 1, 1);
  ggml_tensor* g = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, kHv, 1, 1);
  ggml_tensor* beta = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, kHv, 1, 1);
  ggml_tensor* s = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, kD, kD, kHv, 1);
  fill(static_cast<float*>(q->data), kD * kHk, rng, -0.1f, 0.1f);
  fill(static_cast<float*>(k->data), kD * kHk, rng, -0.1f, 0.1f);
  fill(static_cast<float*>(v->data), kD * kHv, rng, -1, 1);
  fill(static_cast<float*>(g->data), kHv, rng, -1, 0);
  fill(static_cast<float*>(beta->data), kHv, rng, 0, 1);
  fill(static_cast<float*>(s->data), std::int64_t{kD} * kD * kHv, rng, -0.1f, 0.1f);
  ggml_tensor* out = ggml_gated_delta_net(ctx, q, k, v, g, beta, s, 1);
  ggml_cgraph* gf = ggml_new_graph(ctx);
  ggml_build_forward_expand(gf, out);

  // gdn: the same values
  using gdn::MutableTensorView;
  using gdn::TensorView;
  const gdn::ForwardInputs in{TensorView(static_cast<const float*>(q->data), {1, kHk, kD}),
                              TensorView(static_cast<const float*>(k->data), {1, kHk, kD}),
                              TensorView(static_cast<const float*>(v->data), {1, kHv, kD}),
                              TensorView(static_cast<const float*>(g->data), {1, kHv}),
                              TensorView(static_cast<const float*>(beta->data), {1, kHv}),
                              TensorView(static_cast<const float*>(s->data), {1, kHv, kD, kD}),
                              {}};
  gdn::Tensor o(gdn::DType::f32, {1, kHv, kD}), ht(gdn::DType::f32, {1, kHv, kD, kD});
  for (int threads : {1, 2}) {
    gdn::ForwardOptions opt;
    opt.use_qk_l2norm = true;
    opt.threads = threads;
    std::vector<double> tg, tq;
    for (int r = 0; r < rounds; ++r) {
      for (int i = 0; i < per_round; ++i) {
        const double t0 = now_ms();
        ggml_graph_compute_with_ctx(ctx, gf, threads);
        tg.push_back(now_ms() - t0);
      }
      for (int i = 0; i < per_round; ++i) {
        const double t0 = now_ms();
        gdn::chunk_gated_delta_rule_fwd(in, {o.mutable_view(), ht.mutable_view(), {}, {}}, opt);
        tq.push_back(now_ms() - t0);
      }
    }
    // A copy of the state into another buffer: the bandwidth floor of reading and writing it.
    std::vector<float> dst(std::size_t{kD} * kD * kHv);
    std::vector<double> tc;
    for (int i = 0; i < rounds * per_round; ++i) {
      const double t0 = now_ms();
      std::copy(static_cast<const float*>(s->data), static_cast<const float*>(s->data) + dst.size(),
                dst.data());
      tc.push_back(now_ms() - t0);
    }
    std::printf(
        "%d thread%s: ggml GATED_DELTA_NET %.4f ms, gdn %.4f ms per token (ggml / gdn %.2fx); "
        "a copy of the state %.4f ms (1 thread)\n",
        threads, threads == 1 ? "" : "s", median(tg), median(tq), median(tg) / median(tq),
        median(tc));
  }
  ggml_free(ctx);
  return 0;
}
