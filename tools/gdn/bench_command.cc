// bench_command.cc: `gdn bench`, the default benchmark (the project's main job).
//
// Validate, then time: every case is first checked against the float64 reference on a slice
// of its own output, then timed (one warm-up, then --repeats runs; median, min, max), and
// reported beside the fp32 FMA peak measured in the same run with the same threads.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "args.h"
#include "bench/cost_model.h"
#include "bench/error_stats.h"
#include "commands.h"
#include "cpu/kernels.h"
#include "gdn/gdn.h"
#include "sysinfo.h"

namespace gdn::cli {

const char* const kBenchHelp = R"HELP(usage: gdn bench [options]

Times the forward pass at one problem shape and prints, for the chunked forward (without and
with residuals) and the token-recurrence baseline: median latency with min and max over the
repeats, us per token*head, GFLOP/s from the cost model (bench/cost_model.h), %% of the fp32
FMA peak measured in the same run, bytes of residuals and the process's peak RSS. Before
timing, each case's output is checked against the float64 reference on a slice (the first
tokens of the first key head's value heads); a failed check stops the benchmark (exit 1).

The default is one Qwen3-Next GDN layer: Hk = 16, Hv = 32, Dk = Dv = 128, one sequence of
8192 tokens, float32, q and k L2-normalised in the kernel, all cores.

options:
%s
examples:
  gdn bench
  gdn bench --threads 1
  gdn bench --tokens 65536 --repeats 3
  gdn bench --hv 64 --seqs 4 --tokens 2048 --json > results.jsonl
)HELP";

namespace {

const std::vector<OptionSpec> kOptions = {
    {"tokens", "T", "tokens per sequence (default 8192)"},
    {"seqs", "N", "sequences, packed back to back (default 1)"},
    {"hk", "HK", "query/key heads (default 16)"},
    {"hv", "HV", "value heads, a multiple of HK (default 32)"},
    {"dk", "DK", "key head dim, 1 to 256 (default 128)"},
    {"dv", "DV", "value head dim, 1 to 256 (default 128)"},
    {"chunk-size", "C", "tokens per chunk, 1 to 256 (default 64)"},
    {"threads", "N", "worker threads, 0 = all cores (default 0)"},
    {"repeats", "R", "timed runs per case after one warm-up (default 5)"},
    {"isa", "ISA", "CPU variant: auto, generic, avx2 or avx512 (default auto)"},
    {"json", nullptr, "print one JSON object per case and nothing else on stdout"},
    {"help", nullptr, "show this help"},
};

// Deterministic, fast uniform numbers in [lo, hi) (splitmix64).
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  double uniform(double lo, double hi) {
    state_ += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return lo + (hi - lo) * static_cast<double>(z >> 11) * 0x1.0p-53;
  }

 private:
  std::uint64_t state_;
};

struct Case {
  const char* op;
  const char* impl;
  Algorithm algorithm;
  bool residuals;  // keep chunk_states and t_inv
  std::int64_t residual_bytes;
  double flops;  // cost model
};

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  std::int64_t peak_rss = 0;
};

// Progress goes to stderr when it is a terminal, one line rewritten in place.
void progress(const char* format, ...) __attribute__((format(printf, 1, 2)));
void progress(const char* format, ...) {
  static const bool tty = isatty(2);
  if (!tty) return;
  va_list args;
  va_start(args, format);
  std::fprintf(stderr, "\r\033[K");
  std::vfprintf(stderr, format, args);
  va_end(args);
}

Timing time_case(const Case& c, int repeats, const std::function<void()>& run) {
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
    progress("  %s %s%s: run %d/%d took %.2f ms", c.op, c.impl, c.residuals ? " +residuals" : "",
             r + 1, repeats, ms.back());
  }
  progress("%s", "");
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.min_ms = ms.front();
  t.max_ms = ms.back();
  t.median_ms =
      ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  return t;
}

}  // namespace

int bench_command(int argc, char** argv) {
  const Args args(kOptions, argc, argv, 2);
  if (args.flag("help")) {
    std::printf(kBenchHelp, describe_options(kOptions).c_str());
    return 0;
  }
  const std::int64_t tokens = args.integer("tokens", 8192, 1, std::int64_t{1} << 24);
  const std::int64_t seqs = args.integer("seqs", 1, 1, 4096);
  const std::int64_t hk = args.integer("hk", 16, 1, 1024);
  const std::int64_t hv = args.integer("hv", 32, 1, 4096);
  const std::int64_t dk = args.integer("dk", 128, 1, 256);
  const std::int64_t dv = args.integer("dv", 128, 1, 256);
  const int chunk = static_cast<int>(args.integer("chunk-size", 64, 1, 256));
  const int repeats = static_cast<int>(args.integer("repeats", 5, 1, 1000));
  int threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  const bool json = args.flag("json");
  const std::string isa_name = args.choice("isa", "auto", {"auto", "generic", "avx2", "avx512"});
  if (hv % hk != 0) {
    throw UsageError("option '--hv': expected a multiple of --hk = " + std::to_string(hk) +
                     ", given " + std::to_string(hv));
  }
  const CpuIsa isa = resolve_cpu_isa(isa_name == "generic"  ? CpuIsa::generic
                                     : isa_name == "avx2"   ? CpuIsa::avx2
                                     : isa_name == "avx512" ? CpuIsa::avx512
                                                            : CpuIsa::automatic);
  if (threads == 0) threads = default_threads();
  const std::int64_t total = tokens * seqs;

  std::FILE* info = json ? stderr : stdout;
  std::fprintf(info,
               "gdn bench: forward, Hk=%lld Hv=%lld Dk=%lld Dv=%lld, %lld x %lld tokens, f32, "
               "chunk %d, l2norm\n",
               static_cast<long long>(hk), static_cast<long long>(hv), static_cast<long long>(dk),
               static_cast<long long>(dv), static_cast<long long>(seqs),
               static_cast<long long>(tokens), chunk);
  std::fprintf(info, "machine: %s; ISA %s; %d thread%s\n", cpu_model_name().c_str(),
               cpu_isa_name(isa), threads, threads == 1 ? "" : "s");

  // Inputs: q, k, v uniform in [-1, 1) (normalised in the kernel), g in [-2, 0) (decays
  // between 0.14 and 1 per token), beta in [0, 1).
  progress("  generating inputs...");
  Random rng(20261202);
  Tensor q(DType::f32, {total, hk, dk}), k(DType::f32, {total, hk, dk}),
      v(DType::f32, {total, hv, dv});
  Tensor g(DType::f32, {total, hv}), beta(DType::f32, {total, hv}), cu(DType::i64, {seqs + 1});
  for (Tensor* t : {&q, &k, &v}) {
    float* p = t->data<float>();
    for (std::int64_t i = 0; i < t->numel(); ++i) p[i] = static_cast<float>(rng.uniform(-1, 1));
  }
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    g.data<float>()[i] = static_cast<float>(rng.uniform(-2, 0));
    beta.data<float>()[i] = static_cast<float>(rng.uniform(0, 1));
  }
  for (std::int64_t s = 0; s <= seqs; ++s) cu.data<std::int64_t>()[s] = s * tokens;
  const ForwardInputs inputs{q.view(), k.view(), v.view(), g.view(), beta.view(), {}, cu.view()};

  ForwardOptions base;
  base.use_qk_l2norm = true;
  base.chunk_size = chunk;
  base.threads = threads;
  base.isa = isa;
  const ForwardShape shape = forward_shape(inputs, base);

  // The reference on the slice: the first tokens of sequence 0, key head 0 and its value heads.
  const std::int64_t group = hv / hk;
  const std::int64_t check_tokens = std::min<std::int64_t>(tokens, 3 * chunk + 5);
  const ForwardInputs slice{
      TensorView(q.data<float>(), {check_tokens, 1, dk}, {hk * dk, dk, 1}),
      TensorView(k.data<float>(), {check_tokens, 1, dk}, {hk * dk, dk, 1}),
      TensorView(v.data<float>(), {check_tokens, group, dv}, {hv * dv, dv, 1}),
      TensorView(g.data<float>(), {check_tokens, group}, {hv, 1}),
      TensorView(beta.data<float>(), {check_tokens, group}, {hv, 1}),
      {},
      {}};
  ForwardOptions ref_options = base;
  ref_options.threads = threads;
  progress("  float64 reference on the check slice...");
  const ForwardResult reference = ref::recurrent_fwd(slice, ref_options);
  progress("%s", "");

  // Every case writes into its own outputs, allocated for the case and freed after it (what a
  // framework would pass in), so that its peak RSS is inputs + its outputs + workspaces.
  struct Outputs {
    Tensor o, ht, chunk_states, t_inv;
  };
  std::unique_ptr<Outputs> out;
  auto allocate = [&](bool residuals) {
    out = std::make_unique<Outputs>();
    out->o = Tensor(DType::f32, 3, shape.o_sizes());
    out->ht = Tensor(DType::f32, 4, shape.state_sizes());
    if (residuals) {
      out->chunk_states = Tensor(DType::f32, 4, shape.chunk_states_sizes());
      out->t_inv = Tensor(DType::f32, 4, shape.t_inv_sizes());
    }
  };
  auto run = [&](Algorithm algorithm) {
    ForwardOptions options = base;
    options.algorithm = algorithm;
    chunk_gated_delta_rule_fwd(inputs,
                               {out->o.mutable_view(), out->ht.mutable_view(),
                                out->chunk_states.mutable_view(), out->t_inv.mutable_view()},
                               options);
  };
  auto check = [&]() {
    const float* o = out->o.data<float>();
    const double* r = reference.o.data<double>();
    const std::int64_t row = group * dv;
    return bench::error_stats(
               check_tokens * row, [&](std::int64_t i) { return o[(i / row) * hv * dv + i % row]; },
               [&](std::int64_t i) { return r[i]; })
        .normalized();
  };
  const double chunked_flops = bench::chunked_forward_flops(tokens, seqs, hv, dk, dv, chunk);
  const std::vector<Case> cases = {
      {"forward", "chunked", Algorithm::chunked, false, 0, chunked_flops},
      {"forward", "chunked", Algorithm::chunked, true, residual_bytes(shape, Residuals::all),
       chunked_flops},
      {"forward", "recurrent", Algorithm::recurrent, false, 0,
       bench::recurrent_forward_flops(total, hv, dk, dv)},
  };

  progress("  measuring the fp32 FMA peak...");
  const double peak = cpu::measure_fma_peak_gflops(isa, threads);
  progress("%s", "");
  std::fprintf(info, "fp32 FMA peak, measured now (%s, %d thread%s): %.1f GFLOP/s\n",
               cpu_isa_name(isa), threads, threads == 1 ? "" : "s", peak);

  // fp32 tolerance of the check: docs/numerics.md.
  constexpr double kTolerance = 1e-4;
  std::vector<Timing> timings;
  std::vector<std::string> rows;
  for (const Case& c : cases) {
    const char* residuals = c.residuals ? "all" : "none";
    reset_peak_rss();
    allocate(c.residuals);
    run(c.algorithm);  // the warm-up run, checked before anything is timed
    const double error = check();
    std::fprintf(
        info,
        "check: %s %s, residuals %s, vs float64 reference (%lld tokens x %lld heads): error %.2e "
        "(tolerance %.0e) %s\n",
        c.op, c.impl, residuals, static_cast<long long>(check_tokens),
        static_cast<long long>(group), error, kTolerance, error <= kTolerance ? "PASS" : "FAIL");
    if (!(error <= kTolerance)) {
      std::fprintf(
          stderr,
          "gdn bench: the %s %s output does not match the float64 reference; not timing it\n", c.op,
          c.impl);
      return 1;
    }
    Timing t = time_case(c, repeats, [&]() { run(c.algorithm); });
    t.peak_rss = peak_rss_bytes();
    out.reset();
    timings.push_back(t);
    const double us_per = t.median_ms * 1e3 / static_cast<double>(total * hv);
    const double gflops = c.flops / (t.median_ms * 1e-3) * 1e-9;
    if (json) {
      std::printf(
          "{\"op\": \"%s\", \"impl\": \"%s\", \"residuals\": \"%s\", \"dtype\": \"f32\", \"isa\": "
          "\"%s\", "
          "\"threads\": %d, \"tokens\": %lld, \"seqs\": %lld, \"hk\": %lld, \"hv\": %lld, \"dk\": "
          "%lld, "
          "\"dv\": %lld, \"chunk_size\": %d, \"repeats\": %d, \"median_ms\": %.4f, \"min_ms\": "
          "%.4f, "
          "\"max_ms\": %.4f, \"us_per_token_head\": %.5f, \"gflops\": %.2f, \"peak_gflops\": %.2f, "
          "\"pct_peak\": %.2f, \"residual_bytes\": %lld, \"peak_rss_bytes\": %lld, "
          "\"check_error\": %.3e}\n",
          c.op, c.impl, residuals, cpu_isa_name(isa), threads, static_cast<long long>(tokens),
          static_cast<long long>(seqs), static_cast<long long>(hk), static_cast<long long>(hv),
          static_cast<long long>(dk), static_cast<long long>(dv), chunk, repeats, t.median_ms,
          t.min_ms, t.max_ms, us_per, gflops, peak, 100 * gflops / peak,
          static_cast<long long>(c.residual_bytes), static_cast<long long>(t.peak_rss), error);
    } else {
      char range[64], row[256];
      std::snprintf(range, sizeof range, "(%.2f - %.2f)", t.min_ms, t.max_ms);
      std::snprintf(row, sizeof row,
                    "%-8s %-10s %-5s %11.2f %21s %12.3f %9.1f %6.1f%% %14.1f %13.1f\n", c.op,
                    c.impl, residuals, t.median_ms, range, us_per, gflops, 100 * gflops / peak,
                    static_cast<double>(c.residual_bytes) / (1 << 20),
                    static_cast<double>(t.peak_rss) / (1 << 20));
      rows.push_back(row);
    }
    std::fflush(stdout);
  }
  if (!json) {
    std::printf("\n%-8s %-10s %-5s %11s %21s %12s %9s %7s %14s %13s\n", "op", "impl", "resid",
                "median ms", "(min - max)", "us/tok*head", "GFLOP/s", "% peak", "residual MiB",
                "peak RSS MiB");
    for (const std::string& row : rows) std::fputs(row.c_str(), stdout);
    std::printf("\nchunked forward vs token recurrence: %.2fx %s (median)\n",
                std::max(timings[2].median_ms / timings[0].median_ms,
                         timings[0].median_ms / timings[2].median_ms),
                timings[0].median_ms <= timings[2].median_ms ? "faster" : "SLOWER");
    std::printf(
        "us/tok*head is wall time / (tokens x value heads) with %d thread%s; per core multiply by "
        "%d.\n",
        threads, threads == 1 ? "" : "s", threads);
  }
  return 0;
}

}  // namespace gdn::cli
