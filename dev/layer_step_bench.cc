// layer_step_bench.cc: lab harness for a serving step's prefill against the gated delta rule
// alone (docs/perf_layer.md). One fresh prefill of T tokens through gdn::fused_gdn_step
// (Qwen3-Next heads by default, 16-bit or float32 activations, conv K = 4), and the chunked
// forward alone on column views of the same qkv (q, k, v in the activation dtype, as
// `gdn bench --op layer` times it), in alternating rounds: per round the CPU time of the
// process and the wall time of each call, their ratio, and the minor page faults of each call.
// Then one profiled run of each: where its time goes, stage by stage (src/cpu/profile.h). Not
// part of the library or the test suite; build with -DGDN_BUILD_DEV=ON.
//
//   layer_step_bench [--tokens 8192] [--threads 1] [--rounds 7] [--dtype bf16|f16|f32]
//                    [--pools f32|bf16] [--hk 16 --hv 32 --dk 128 --dv 128]
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "common/half_bits.h"
#include "cpu/profile.h"
#include "gdn/gdn.h"

namespace {

using namespace gdn;

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double wall_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Minor page faults of the process so far: a call that touches fresh memory pays the kernel's
// zeroing of every page (2 MiB each under transparent huge pages) in its own CPU time.
long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

struct Times {
  double cpu_ms, wall_ms;
  long faults;
};
template <class F>
Times timed(F&& f) {
  const long f0 = minor_faults();
  const double c0 = cpu_seconds(), w0 = wall_seconds();
  f();
  return {1e3 * (cpu_seconds() - c0), 1e3 * (wall_seconds() - w0), minor_faults() - f0};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A tensor of `dtype` filled with uniform values in [lo, hi).
Tensor random_tensor(DType dtype, std::initializer_list<std::int64_t> shape, double lo, double hi,
                     std::mt19937& rng) {
  Tensor t(dtype, shape);
  std::uniform_real_distribution<double> u(lo, hi);
  const std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = u(rng);
    if (dtype == DType::f32) {
      static_cast<float*>(t.raw())[i] = static_cast<float>(x);
    } else if (dtype == DType::bf16) {
      static_cast<std::uint16_t*>(t.raw())[i] = bf16_bits(static_cast<float>(x));
    } else {
      static_cast<std::uint16_t*>(t.raw())[i] = f16_bits(static_cast<float>(x));
    }
  }
  return t;
}

Tensor i64(std::initializer_list<std::int64_t> values) {
  Tensor t(DType::i64, {static_cast<std::int64_t>(values.size())});
  std::int64_t i = 0;
  for (std::int64_t x : values) t.data<std::int64_t>()[i++] = x;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t tokens = 8192, hk = 16, hv = 32, dk = 128, dv = 128;
  int threads = 1, rounds = 7;
  std::string dtype_arg = "bf16", pools_arg = "f32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string opt = argv[i];
    const char* val = argv[i + 1];
    if (opt == "--tokens")
      tokens = std::atoll(val);
    else if (opt == "--threads")
      threads = std::atoi(val);
    else if (opt == "--rounds")
      rounds = std::atoi(val);
    else if (opt == "--dtype")
      dtype_arg = val;
    else if (opt == "--pools")
      pools_arg = val;
    else if (opt == "--hk")
      hk = std::atoll(val);
    else if (opt == "--hv")
      hv = std::atoll(val);
    else if (opt == "--dk")
      dk = std::atoll(val);
    else if (opt == "--dv")
      dv = std::atoll(val);
    else {
      std::fprintf(stderr, "layer_step_bench: unknown option %s\n", opt.c_str());
      return 2;
    }
  }
  const DType dtype = dtype_arg == "f32"   ? DType::f32
                      : dtype_arg == "f16" ? DType::f16
                                           : DType::bf16;
  const DType pool_dtype = pools_arg == "bf16" ? DType::bf16 : DType::f32;
  const std::int64_t k = 4, qk = hk * dk, d = 2 * qk + hv * dv;
  std::mt19937 rng(7);
  const Tensor qkv = random_tensor(dtype, {tokens, d}, -1, 1, rng);
  const Tensor a = random_tensor(dtype, {tokens, hv}, -2, 2, rng);
  const Tensor b = random_tensor(dtype, {tokens, hv}, -2, 2, rng);
  const Tensor weight = random_tensor(DType::f32, {d, k}, -0.5, 0.5, rng);
  const Tensor A_log = random_tensor(DType::f32, {hv}, -1, 1, rng);
  const Tensor dt_bias = random_tensor(DType::f32, {hv}, -1, 1, rng);
  const Tensor qsl = i64({0, tokens}), slots = i64({1}), lens = i64({tokens}),
               dist = i64({0, 1, 1});
  Tensor conv_pool(pool_dtype, {2, k - 1, d}), rec_pool(pool_dtype, {2, hv, dk, dv});
  Tensor out(dtype, {tokens, hv * dv});
  StepOptions so;
  so.hk = hk;
  so.hv = hv;
  so.dk = dk;
  so.dv = dv;
  so.threads = threads;
  const StepInputs in{qkv.view(),   a.view(),       b.view(),    weight.view(), TensorView{},
                      A_log.view(), dt_bias.view(), qsl.view(),  slots.view(),  lens.view(),
                      dist.view(),  TensorView{},   TensorView{}};
  const StatePools pools{conv_pool.mutable_view(), rec_pool.mutable_view()};
  auto step = [&] { fused_gdn_step(in, pools, out.mutable_view(), so); };

  // The delta rule alone: q, k, v column views of qkv, the gates precomputed.
  Tensor g(DType::f32, {tokens, hv}), beta(DType::f32, {tokens, hv});
  auto value = [](const Tensor& t, std::int64_t i) {
    if (t.dtype() == DType::f32) return static_cast<double>(static_cast<const float*>(t.raw())[i]);
    const std::uint16_t bits = static_cast<const std::uint16_t*>(t.raw())[i];
    return static_cast<double>(t.dtype() == DType::bf16 ? detail::float_from_bf16(bits)
                                                        : detail::float_from_f16(bits));
  };
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t h = 0; h < hv; ++h) {
      const double z = value(a, t * hv + h) + static_cast<double>(dt_bias.data<float>()[h]);
      g.data<float>()[t * hv + h] =
          static_cast<float>(-std::exp(A_log.data<float>()[h]) * std::log1p(std::exp(z)));
      beta.data<float>()[t * hv + h] =
          static_cast<float>(1 / (1 + std::exp(-value(b, t * hv + h))));
    }
  }
  const auto* x = static_cast<const char*>(qkv.raw());
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  auto columns = [&](std::int64_t first, std::int64_t heads, std::int64_t dim) {
    return TensorView(x + first * elem, dtype, 3, Dims{tokens, heads, dim, 0}, Dims{d, dim, 1, 0});
  };
  const Tensor cu = i64({0, tokens});
  const ForwardInputs core_in{columns(0, hk, dk), columns(qk, hk, dk), columns(2 * qk, hv, dv),
                              g.view(),           beta.view(),         TensorView{},
                              cu.view()};
  ForwardOptions fo;
  fo.use_qk_l2norm = true;
  fo.threads = threads;
  Tensor o(dtype, {tokens, hv, dv}), state(DType::f32, {1, hv, dk, dv});
  auto core = [&] {
    chunk_gated_delta_rule_fwd(core_in, {o.mutable_view(), state.mutable_view(), {}, {}}, fo);
  };

  std::printf(
      "layer_step_bench: %lld tokens, Hk %lld Hv %lld Dk %lld Dv %lld, %s activations, "
      "%s pools, %d thread%s, %d rounds (CPU ms, wall ms)\n",
      static_cast<long long>(tokens), static_cast<long long>(hk), static_cast<long long>(hv),
      static_cast<long long>(dk), static_cast<long long>(dv), dtype_name(dtype),
      dtype_name(pool_dtype), threads, threads == 1 ? "" : "s", rounds);
  step();  // warm-up
  core();
  std::vector<double> core_cpu, step_cpu, core_wall, step_wall, ratio_cpu, ratio_wall;
  for (int r = 0; r < rounds; ++r) {
    const bool step_first = r % 2 == 1;  // alternate which goes first
    Times ts{}, tc{};
    if (step_first) ts = timed(step);
    tc = timed(core);
    if (!step_first) ts = timed(step);
    core_cpu.push_back(tc.cpu_ms);
    step_cpu.push_back(ts.cpu_ms);
    core_wall.push_back(tc.wall_ms);
    step_wall.push_back(ts.wall_ms);
    ratio_cpu.push_back(ts.cpu_ms / tc.cpu_ms);
    ratio_wall.push_back(ts.wall_ms / tc.wall_ms);
    std::printf(
        "round %d: core %.1f cpu %.1f wall  step %.1f cpu %.1f wall  ratio %.3f cpu %.3f "
        "wall  faults core %ld step %ld\n",
        r, tc.cpu_ms, tc.wall_ms, ts.cpu_ms, ts.wall_ms, ratio_cpu.back(), ratio_wall.back(),
        tc.faults, ts.faults);
  }
  auto summary = [](const char* name, const std::vector<double>& v) {
    std::printf("%-16s median %8.3f  min %8.3f  max %8.3f\n", name, median(v),
                *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
  };
  summary("core cpu ms", core_cpu);
  summary("step cpu ms", step_cpu);
  summary("step/core cpu", ratio_cpu);
  summary("core wall ms", core_wall);
  summary("step wall ms", step_wall);
  summary("step/core wall", ratio_wall);

  // One profiled run of each: the delta rule's stages (with their sum), then the layer's and the
  // step's.
  auto profiled = [&](const char* name, auto&& run) {
    cpu::StageProfile profile;
    Times tp{};
    {
      const cpu::ScopedStageProfile scope(&profile);
      tp = timed(run);
    }
    double core_ms = 0, total = 0;
    for (int i = 0; i < cpu::kStageCount; ++i) {
      const double ms = 1e-6 * static_cast<double>(profile.ns[i].load());
      total += ms;
      if (i < static_cast<int>(cpu::Stage::layer_conv)) core_ms += ms;
    }
    std::printf("profiled %s: %.1f ms wall, %.1f ms CPU, stages sum %.1f ms\n", name, tp.wall_ms,
                tp.cpu_ms, total);
    std::printf("  %-18s %9.1f ms\n", "delta rule", core_ms);
    for (int i = 0; i < cpu::kStageCount; ++i) {
      const double ms = 1e-6 * static_cast<double>(profile.ns[i].load());
      const bool layer = i >= static_cast<int>(cpu::Stage::layer_conv);
      if (ms > 0 || layer) {
        std::printf(layer ? "  %-18s %9.1f ms\n" : "    %-16s %9.1f ms\n",
                    cpu::stage_name(static_cast<cpu::Stage>(i)), ms);
      }
    }
    std::printf("  %-18s %9.1f ms\n", "(unstaged)", tp.wall_ms - total);
  };
  profiled("core", core);
  profiled("step", step);
  return 0;
}
