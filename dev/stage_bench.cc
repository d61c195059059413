// stage_bench.cc: lab harness timing each stage of the chunked forward on one chunk, with
// everything in cache (the AVX-512 variant, float32). Not part of the library or the test
// suite; build with -DGDN_BUILD_DEV=ON and run build/.../dev/stage_bench [--l2norm].
// The figures it prints are the per-stage breakdown quoted in docs/perf.md.
#define GDN_TARGET avx512
#define GDN_TARGET_ISA ::gdn::CpuIsa::avx512
#define GDN_VECTOR_BYTES 64
#define GDN_GEMM_MR 8
#define GDN_GEMM_NV 2
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/cost_model.h"
#include "cpu/target-inl.h"

int main(int argc, char** argv) {
  using namespace gdn;
  using namespace gdn::cpu;
  using namespace gdn::cpu::avx512;
  const std::int64_t T = 256, hk = 16, hv = 32, dk = 128, dv = 128, c = 64;
  const bool l2norm = argc > 1 && std::strcmp(argv[1], "--l2norm") == 0;
  std::vector<float> q(T * hk * dk), k(T * hk * dk), v(T * hv * dv), g(T * hv), beta(T * hv);
  for (std::size_t i = 0; i < q.size(); ++i)
    q[i] = k[i] = static_cast<float>((i * 37 % 101) - 50) / 50.0f;
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 7) / 7.0f;
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = -0.05f * static_cast<float>(i % 11), beta[i] = 0.5f;
  detail::Sequence seq{0, 0, T, 0};
  detail::ForwardProblem p;
  p.shape.hk = hk;
  p.shape.hv = hv;
  p.shape.dk = dk;
  p.shape.dv = dv;
  p.chunk_size = static_cast<int>(c);
  p.scale = 0.088;
  p.l2norm = l2norm;
  p.seqs = &seq;
  auto bytes = [](const float* x) { return reinterpret_cast<const std::byte*>(x); };
  p.q = {bytes(q.data()), DType::f32, 0, hk * dk, dk, 1};
  p.k = {bytes(k.data()), DType::f32, 0, hk * dk, dk, 1};
  p.v = {bytes(v.data()), DType::f32, 0, hv * dv, dv, 1};
  p.g = {bytes(g.data()), DType::f32, 0, hv, 1, 0};
  p.beta = {bytes(beta.data()), DType::f32, 0, hv, 1, 0};
  const ChunkedLayout l = chunked_layout(dk, dv, c, 1);
  auto* workspace =
      static_cast<std::byte*>(std::aligned_alloc(64, static_cast<std::size_t>(l.total) * 4));
  std::memset(workspace, 0, static_cast<std::size_t>(l.total) * 4);
  ChunkBuffers<float> b(workspace, l);

  double total = 0;
  auto time = [&](const char* name, double flops, auto&& stage) {
    std::vector<double> us;
    for (int trial = 0; trial < 7; ++trial) {
      const int reps = 500;
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) stage(r);
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          reps);
    }
    std::sort(us.begin(), us.end());
    total += us[3];
    std::printf("%-13s %7.2f us per chunk (median of 7)  %6.1f GFLOP/s\n", name, us[3],
                flops > 0 ? flops / us[3] * 1e-3 : 0.0);
  };
  const double n = static_cast<double>(c);
  std::printf("one chunk: C = %lld, Dk = Dv = %lld, float32, AVX-512, %s, in cache\n",
              static_cast<long long>(c), static_cast<long long>(dk),
              l2norm ? "l2norm" : "no l2norm");
  time("chunk_pack_qk", 0,
       [&](int r) { chunk_pack_qk<float, float>(p, seq, r % hk, (r / hk % 4) * c, c, l, b); });
  time("chunk_gram", 2 * n * n * dk, [&](int) { chunk_gram<float>(c, dk, l, b); });
  time("chunk_pack_v", 0,
       [&](int r) { chunk_pack_v<float, float>(p, seq, r % hv, (r / hv % 4) * c, c, l, b); });
  time("chunk_kkt", 0, [&](int) { chunk_kkt<float>(c, l, b); });
  time("solve_tril", n * n * n / 3, [&](int) { solve_tril<float>(c, l, b); });
  time("chunk_wy", 4 * n * dk * dv + n * (n + 1) * dv,
       [&](int) { chunk_wy<float>(c, dk, b.states, l, b); });
  time("chunk_output", n * (n + 1) * dv, [&](int) { chunk_output<float>(c, l, b); });
  time("chunk_state", 2 * n * dk * dv, [&](int) { chunk_state<float>(c, dk, b.states, l, b); });
  // The FMA peak of this variant on one core, measured in the same run (best of 5).
  double peak = 0;
  for (int trial = 0; trial < 5; ++trial) {
    const std::int64_t rounds = 20000000;
    const auto t0 = std::chrono::steady_clock::now();
    volatile float sink = fma_peak_loop(rounds);
    (void)sink;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    peak = std::max(peak, static_cast<double>(rounds) * kTable.fma_flops_per_round / s * 1e-9);
  }
  std::printf("fp32 FMA peak (1 core, measured now): %.1f GFLOP/s\n", peak);
  std::printf(
      "sum          %8.2f us per chunk = %.3f us per token*head; cost model %.2f MFLOP -> %.1f "
      "GFLOP/s\n",
      total, total / n, bench::chunked_forward_flops_per_chunk(n, dk, dv) * 1e-6,
      bench::chunked_forward_flops_per_chunk(n, dk, dv) / total * 1e-3);
  std::free(workspace);
  return 0;
}
