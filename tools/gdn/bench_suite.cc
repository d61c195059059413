// bench_suite.cc: `gdn bench --suite`, the benchmark suite of the CPU-speed issue:
// `gdn bench`'s cases (bench_command.cc) and the decode step of `gdn bench --op step`
// (bench_step.cc) over token counts, thread counts and activation dtypes in one process, each
// beside the fp32 FMA peak measured in the same run, then an SVG plot (svg_plot.h), the
// targets and the per-stage breakdown (bench_breakdown.cc).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "args.h"
#include "bench/cost_model.h"
#include "bench_cases.h"
#include "bench_noise.h"
#include "bench_util.h"
#include "commands.h"
#include "cpu/kernels.h"
#include "gdn/gdn.h"
#include "inputs.h"
#include "output_files.h"
#include "svg_plot.h"
#include "sysinfo.h"

namespace gdn::cli {

namespace {

const char* const kBf16Note =
    "bf16 and f16 rows: 16-bit activations (q, k, v, o, d_o, dq, dk, dv) with float32 gates, "
    "states, residuals and arithmetic (matrix products in fp32; bf16 matrix operands are "
    "`gdn bench --matmul both`), so their % of peak is of the fp32 FMA peak";

const char* const kSuiteHelp = R"HELP(usage: gdn bench --suite [options]

The benchmark suite in one process: at each token count, thread count and activation dtype
(--dtypes), the cases of `gdn bench` (the chunked forward without and with residuals, the token-recurrence
baseline, the chunked backward under each remat policy: all, t_inv, none), each checked
against the float64 reference first; and a decode-only serving step (gdn::fused_gdn_step,
one token per sequence, states in slots, as `gdn bench --op step`) at each batch. The shape is
Qwen3-Next's gated delta rule: Hk = 16, Hv = 32, Dk = Dv = 128, the tiling plan's chunk size
for this machine (`gdn plan`), q and k
L2-normalised in the kernel. The fp32 FMA peak is measured once per thread count, in the
same run. For each case: median latency with min and max, us per token*head, GFLOP/s (cost
model, bench/cost_model.h; the decode step counted as the token recurrence), %% of the peak,
bytes of residuals and the process's peak RSS during the case (--json: one JSON line per case
in `gdn bench`'s format; the decode lines have op "decode", tokens = seqs = the batch, and
also gbps, copy_gbps, vs_copy as `gdn bench --op step`). Then an SVG plot: latency against
tokens (log-log), memory by remat policy, %% of peak per op.

Last, the CPU-speed targets (per core: one thread, 8192 tokens) beside what the run measured,
and where the time of the one-thread float32 forward and backward (from full residuals) goes,
stage by stage: each chunked case at one thread in float32 runs once more with per-stage
clocks (`gdn bench --breakdown`; its JSON lines get a stages_ms object).

The 64k cases take minutes each on a few cores (about 8 GiB of memory); progress and an
estimate go to stderr.

%s.

options:
%s
%s
The peak check compares the peak measured after each case with the one before it (after the
previous case; the first case of each thread count: that thread count's peak).

examples:
  gdn bench --suite
  gdn bench --suite --seq 8k --threads 1,all --repeats 3
  gdn bench --suite --json --out /tmp/suite.svg > suite.jsonl
  gdn bench --suite --quick
)HELP";

const std::vector<OptionSpec> kSuiteOptions = {
    {"suite", nullptr, "run the suite (this benchmark)"},
    {"seq", "LIST", "token counts, comma separated, k suffix allowed (default 8k,64k)"},
    {"batches", "LIST", "decode batches in sequences, comma separated (default 1,64)"},
    {"threads", "LIST", "thread counts, comma separated, all = all cores (default 1,all)"},
    {"repeats", "R",
     "timed runs per case after one warm-up (default 3; the decode step: max(R, 20))"},
    {"isa", "ISA", "CPU variant: auto, generic, avx2, avx512 or avx512_bf16 (default auto)"},
    {"dtypes", "LIST",
     "activation dtypes of the forward and backward cases, comma separated: f32, bf16, f16 "
     "(default f32,bf16; the decode step is f32)"},
    {"json", nullptr, "print one JSON object per case and nothing else on stdout"},
    {"out", "FILE.svg", "where to write the plot (default gdn_suite.svg)"},
    {"quick", nullptr,
     "a tiny shape for tests: Hk = 2, Hv = 4, Dk = Dv = 32, --seq 128,256, --batches 1,4"},
    {"help", nullptr, "show this help"},
};

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    parts.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return parts;
}

// One row of the suite (a core case or a decode step).
struct Row {
  std::string op, impl, residuals;  // op as in the JSON lines
  std::string dtype = "f32";        // of the activations
  int threads = 0;
  std::int64_t tokens = 0;
  Timing timing;
  double us_per = 0, gflops = 0, pct = 0;
  std::int64_t residual_bytes = 0;
  bool noisy = false;  // bench_noise.h
};

// The row's name in the table and the plot.
std::string label_of(const Row& r) {
  const std::string suffix = r.dtype == "f32" ? "" : " " + r.dtype;
  if (r.impl == "recurrent") return "baseline (recurrent)" + suffix;
  if (r.op == "forward" && r.residuals == "all") return "forward +residuals" + suffix;
  return r.op + suffix;
}

std::string threads_text(int n) { return std::to_string(n) + (n == 1 ? " thread" : " threads"); }

std::string tokens_text(std::int64_t t) {
  return t % 1024 == 0 ? std::to_string(t / 1024) + "k" : std::to_string(t);
}

// The CPU-speed targets (per core: one thread, one sequence of 8192 tokens, Qwen3-Next heads),
// each beside what this run measured and the same run's peak, then where the forward's and the
// backward's time goes (bench_breakdown.cc): the figures docs/perf.md quotes.
void print_targets(std::FILE* out, const std::vector<Row>& rows,
                   const std::vector<std::pair<CoreBenchConfig, CoreCaseResult>>& profiled,
                   bool quick) {
  if (profiled.empty()) return;  // no one-thread float32 run
  // The targets' token count when the suite ran it, else the first one it ran.
  std::int64_t tokens = profiled.front().first.tokens;
  for (const auto& [config, result] : profiled) {
    if (config.tokens == 8192) tokens = 8192;
  }
  auto find_row = [&](const std::string& op, const std::string& dtype) -> const Row* {
    for (const Row& r : rows) {
      if (r.threads == 1 && r.tokens == tokens && r.op == op && r.impl == "chunked" &&
          r.dtype == dtype) {
        return &r;
      }
    }
    return nullptr;
  };
  const std::pair<CoreBenchConfig, CoreCaseResult>* forward = nullptr;
  const std::pair<CoreBenchConfig, CoreCaseResult>* backward = nullptr;
  for (const auto& p : profiled) {
    if (p.first.tokens != tokens) continue;
    if (p.second.op == "forward" && p.second.residuals == "none") forward = &p;
    if (p.second.op == "backward" && p.second.residuals == "all") backward = &p;
  }
  std::fprintf(out, "\nthe CPU-speed targets: one thread, %s tokens%s\n",
               tokens_text(tokens).c_str(),
               quick            ? " (--quick: a tiny shape, not the targets' Qwen3-Next one)"
               : tokens != 8192 ? " (the targets are at 8k tokens: add 8k to --seq)"
                                : ", Qwen3-Next heads");
  std::fprintf(out, "%-52s %-24s %8s  %s\n", "target", "measured", "% peak", "met");
  auto line = [&](const char* target, const Row* r, double limit) {
    if (r == nullptr) {
      std::fprintf(out, "%-52s %-24s %8s  %s\n", target, "not run", "-", "-");
      return;
    }
    char measured[64];
    std::snprintf(measured, sizeof measured, "%.3f us/token*head", r->us_per);
    std::fprintf(out, "%-52s %-24s %7.1f%%  %s\n", target, measured, r->pct,
                 r->us_per <= limit ? "yes" : "no");
  };
  line("forward, float32: <= 1.0 us per token*head", find_row("forward", "f32"), 1.0);
  if (forward != nullptr) {
    const double fraction = products_fraction_of_peak(stage_rows(forward->first, forward->second),
                                                      forward->second.peak_gflops);
    char measured[64];
    std::snprintf(measured, sizeof measured, "%.1f GFLOP/s",
                  fraction * forward->second.peak_gflops);
    std::fprintf(out, "%-52s %-24s %7.1f%%  %s\n",
                 "forward's matrix products: >= 70% of the fp32 peak", measured, 100 * fraction,
                 fraction >= 0.70 ? "yes" : "no");
  }
  line("backward from full residuals, float32: <= 2.5 us", find_row("backward-all", "f32"), 2.5);
  const Row* fwd16 = find_row("forward", "bf16");
  const Row* bwd16 = find_row("backward-all", "bf16");
  auto bf16_line = [&](const char* target, const Row* r) {
    char measured[64] = "not run";
    if (r != nullptr) std::snprintf(measured, sizeof measured, "%.3f us/token*head", r->us_per);
    std::fprintf(out, "%-52s %-24s %8s  %s\n", target, measured, "-", "no: bf16 activations only");
  };
  bf16_line("forward, bf16 matrix operands: <= 0.55 us", fwd16);
  bf16_line("backward, bf16 mode: <= 1.4 us", bwd16);
  std::fprintf(out,
               "the suite's bf16 rows run 16-bit activations with float32 products; bf16 matrix "
               "operands (vdpbf16ps with the avx512_bf16 variant, else emulated on float32 "
               "registers) are timed beside float32 ones by `gdn bench --matmul both` "
               "(docs/perf.md).\n");
  for (const auto* p : {forward, backward}) {
    if (p != nullptr) print_breakdown(out, p->first, p->second);
  }
}

}  // namespace

int bench_suite_command(int argc, char** argv) {
  const Args args(kSuiteOptions, argc, argv, 2);
  if (args.flag("help")) {
    std::printf(kSuiteHelp, kBf16Note, describe_options(kSuiteOptions).c_str(),
                noise_help().c_str());
    return 0;
  }
  const bool quick = args.flag("quick");
  const bool json = args.flag("json");
  const int repeats = static_cast<int>(args.integer("repeats", 3, 1, 1000));
  const std::string out_path = args.text("out", "gdn_suite.svg");
  const CpuIsa isa = resolve_cpu_isa(isa_option(args));
  std::vector<std::int64_t> seqs, batches;
  for (const std::string& s : split(args.text("seq", quick ? "128,256" : "8k,64k"))) {
    seqs.push_back(parse_token_count("seq", s));
  }
  for (const std::string& s : split(args.text("batches", quick ? "1,4" : "1,64"))) {
    char* end = nullptr;
    const long long b = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || b < 1 || b > 4096) {
      throw UsageError("option '--batches': expected sequence counts in [1, 4096], given '" + s +
                       "'");
    }
    batches.push_back(b);
  }
  std::vector<int> thread_counts;
  for (const std::string& s : split(args.text("threads", "1,all"))) {
    int n = 0;
    if (s == "all") {
      n = default_threads();
    } else {
      char* end = nullptr;
      const long long v = std::strtoll(s.c_str(), &end, 10);
      if (s.empty() || *end != '\0' || v < 1 || v > 1024) {
        throw UsageError("option '--threads': expected thread counts in [1, 1024] or all, given '" +
                         s + "'");
      }
      n = static_cast<int>(v);
    }
    if (std::find(thread_counts.begin(), thread_counts.end(), n) == thread_counts.end()) {
      thread_counts.push_back(n);
    }
  }
  std::vector<DType> dtypes;
  for (const std::string& s : split(args.text("dtypes", "f32,bf16"))) {
    const DType d = s == "f32"    ? DType::f32
                    : s == "bf16" ? DType::bf16
                    : s == "f16"  ? DType::f16
                                  : DType::i64;
    if (d == DType::i64) {
      throw UsageError("option '--dtypes': expected f32, bf16 or f16, given '" + s + "'");
    }
    if (std::find(dtypes.begin(), dtypes.end(), d) == dtypes.end()) dtypes.push_back(d);
  }
  const std::int64_t hk = quick ? 2 : 16, hv = quick ? 4 : 32, dk = quick ? 32 : 128,
                     dv = quick ? 32 : 128;
  // The tiling plan's chunk size for this machine (what options.chunk_size = 0 runs).
  const int chunk = planned_chunk_size(hk, hv, dk, dv, DType::f32, isa);

  std::FILE* info = json ? stderr : stdout;
  std::string seq_list, batch_list, thread_list, dtype_list;
  for (DType d : dtypes)
    dtype_list += (dtype_list.empty() ? "" : ", ") + std::string(dtype_name(d));
  for (std::int64_t t : seqs) seq_list += (seq_list.empty() ? "" : ", ") + tokens_text(t);
  for (std::int64_t b : batches) batch_list += (batch_list.empty() ? "" : ", ") + std::to_string(b);
  for (int n : thread_counts) thread_list += (thread_list.empty() ? "" : ", ") + std::to_string(n);
  std::fprintf(info,
               "gdn bench --suite: Hk=%lld Hv=%lld Dk=%lld Dv=%lld, activations %s, chunk %d, "
               "l2norm; tokens %s; decode batches %s; threads %s; %d repeats\n",
               static_cast<long long>(hk), static_cast<long long>(hv), static_cast<long long>(dk),
               static_cast<long long>(dv), dtype_list.c_str(), chunk, seq_list.c_str(),
               batch_list.c_str(), thread_list.c_str(), repeats);
  const std::string machine = cpu_model_name();
  std::fprintf(info, "machine: %s; ISA %s\n", machine.c_str(), cpu_isa_name(isa));
  if (dtypes.size() > 1 || dtypes[0] != DType::f32) std::fprintf(info, "%s\n", kBf16Note);
  std::fflush(info);

  std::vector<Row> rows;
  NoiseWatch noise(isa);
  std::vector<std::pair<int, double>> peaks;
  std::vector<std::pair<CoreBenchConfig, CoreCaseResult>> profiled;  // for the breakdown
  const int steps =
      static_cast<int>(thread_counts.size() * (seqs.size() * dtypes.size() + batches.size()));
  int step = 0;
  for (const int threads : thread_counts) {
    std::fprintf(stderr, "gdn bench --suite: measuring the fp32 FMA peak (%s)...\n",
                 threads_text(threads).c_str());
    const double peak = cpu::measure_fma_peak_gflops(isa, threads);
    peaks.emplace_back(threads, peak);
    noise.start(threads, peak);
    std::fprintf(info, "fp32 FMA peak, measured now (%s, %s): %.1f GFLOP/s\n", cpu_isa_name(isa),
                 threads_text(threads).c_str(), peak);
    std::fflush(info);
    for (const std::int64_t tokens : seqs) {
      for (const DType dtype : dtypes) {
        // Estimate: the cases' cost-model FLOPs at half the peak, each run repeats + 1 times
        // (+1 for the untimed forward of the backward cases).
        const double fwd = bench::over_chunks(tokens, 1, hv, chunk, [&](double n) {
          return bench::chunked_forward_flops_per_chunk(n, dk, dv);
        });
        const double bwd = bench::over_chunks(tokens, 1, hv, chunk, [&](double n) {
          return bench::chunked_backward_flops_per_chunk(n, dk, dv) +
                 bench::rebuild_flops_per_chunk(n, dk, dv, false) * 2 / 3;
        });
        // The breakdown (one thread, float32) runs each chunked case once more.
        const bool profiled_step = threads == 1 && dtype == DType::f32;
        const double estimate = ((repeats + 1) * (3 * fwd + 3 * bwd) + 3 * fwd +
                                 (profiled_step ? 2 * fwd + 3 * bwd : 0.0)) /
                                    (0.5 * peak * 1e9) +
                                1;
        std::fprintf(
            stderr,
            "gdn bench --suite: [%d/%d] %s tokens, %s, %s: forward x2, baseline, backward x3 "
            "(estimate %.0f s)\n",
            ++step, steps, tokens_text(tokens).c_str(), threads_text(threads).c_str(),
            dtype_name(dtype), estimate);
        CoreBenchConfig config;
        config.tokens = tokens;
        config.hk = hk;
        config.hv = hv;
        config.dk = dk;
        config.dv = dv;
        config.chunk = chunk;
        config.repeats = repeats;
        config.threads = threads;
        config.isa = isa;
        config.dtype = dtype;
        config.json = json;
        config.table = false;
        config.info = stderr;
        config.peak_gflops = peak;
        config.noise = &noise;
        // One thread, float32: the targets' setting; one more run of each chunked case with
        // the stage clocks on, for the breakdown.
        config.breakdown = profiled_step;
        std::vector<CoreCaseResult> results;
        if (run_core_bench(config, &results) != 0) return 1;
        for (const CoreCaseResult& c : results) {
          if (!c.stage_ms.empty()) profiled.push_back({config, c});
          rows.push_back({c.op == "backward" ? "backward-" + c.residuals : c.op, c.impl,
                          c.residuals, dtype_name(dtype), threads, tokens, c.timing,
                          c.us_per_token_head, c.gflops, 100 * c.gflops / peak, c.residual_bytes,
                          c.verdict.noisy});
        }
      }
    }
    for (const std::int64_t batch : batches) {
      std::fprintf(stderr, "gdn bench --suite: [%d/%d] decode step of %lld sequences, %s\n", ++step,
                   steps, static_cast<long long>(batch), threads_text(threads).c_str());
      DecodeBenchConfig config;
      config.batch = batch;
      config.hk = hk;
      config.hv = hv;
      config.dk = dk;
      config.dv = dv;
      config.repeats = std::max(repeats, 20);
      config.threads = threads;
      config.isa = isa;
      config.info = stderr;
      config.noise = &noise;
      DecodeBenchResult d;
      if (run_decode_bench(config, &d) != 0) return 1;
      const Timing& t = d.timing;
      const double us_per = t.median_ms * 1e3 / static_cast<double>(batch * hv);
      const double gflops =
          bench::recurrent_forward_flops(batch, hv, dk, dv) / (t.median_ms * 1e-3) * 1e-9;
      rows.push_back({"decode", "step", "none", "f32", threads, batch, t, us_per, gflops,
                      100 * gflops / peak, 0, d.verdict.noisy});
      if (json) {
        std::printf(
            "{\"op\": \"decode\", \"impl\": \"step\", \"residuals\": \"none\", \"dtype\": "
            "\"f32\", \"isa\": \"%s\", \"threads\": %d, \"tokens\": %lld, \"seqs\": %lld, "
            "\"hk\": %lld, \"hv\": %lld, \"dk\": %lld, \"dv\": %lld, \"chunk_size\": %d, "
            "\"repeats\": %d, \"median_ms\": %.4f, \"min_ms\": %.4f, \"max_ms\": %.4f, "
            "\"us_per_token_head\": %.5f, \"gflops\": %.2f, \"peak_gflops\": %.2f, \"pct_peak\": "
            "%.2f, \"residual_bytes\": 0, \"peak_rss_bytes\": %lld, \"check_error\": %.3e, "
            "\"gbps\": %.2f, \"copy_gbps\": %.2f, \"vs_copy\": %.2f, %s}\n",
            cpu_isa_name(isa), threads, static_cast<long long>(batch),
            static_cast<long long>(batch), static_cast<long long>(hk), static_cast<long long>(hv),
            static_cast<long long>(dk), static_cast<long long>(dv), chunk, config.repeats,
            t.median_ms, t.min_ms, t.max_ms, us_per, gflops, peak, 100 * gflops / peak,
            static_cast<long long>(t.peak_rss), d.check_error, d.gbps, d.copy_gbps,
            100 * d.gbps / d.copy_gbps, noise_json(d.noise, d.verdict).c_str());
        std::fflush(stdout);
      }
    }
  }

  if (!json) {
    std::printf("\n%-26s %-8s %7s %11s %21s %12s %9s %7s %13s %13s\n", "op", "threads", "tokens",
                "median ms", "(min - max)", "us/tok*head", "GFLOP/s", "% peak", "residual MiB",
                "peak RSS MiB");
    for (const Row& r : rows) {
      char range[64];
      std::snprintf(range, sizeof range, "(%.2f - %.2f)", r.timing.min_ms, r.timing.max_ms);
      std::printf("%-26s %-8d %7s %11.3f %21s %12.3f %9.1f %6.1f%% %13.1f %13.1f%s\n",
                  label_of(r).c_str(), r.threads, tokens_text(r.tokens).c_str(), r.timing.median_ms,
                  range, r.us_per, r.gflops, r.pct,
                  static_cast<double>(r.residual_bytes) / (1 << 20),
                  static_cast<double>(r.timing.peak_rss) / (1 << 20), r.noisy ? "  noisy" : "");
    }
    std::printf(
        "\ndecode: one serving step of `tokens` sequences of one token each (tokens = "
        "batch); GFLOP/s counts the token recurrence.\n");
  }
  print_targets(info, rows, profiled, quick);
  noise.warn(info, "gdn bench --suite");

  // The plot.
  std::vector<std::string> labels;  // in the order of the rows
  for (const Row& r : rows) {
    if (std::find(labels.begin(), labels.end(), label_of(r)) == labels.end()) {
      labels.push_back(label_of(r));
    }
  }
  svg::Panel latency{svg::Panel::Kind::log_lines,
                     "latency vs tokens",
                     "tokens (decode: sequences of 1 token)",
                     "median ms",
                     {},
                     {}};
  for (std::size_t t = 0; t < thread_counts.size(); ++t) {
    for (std::size_t l = 0; l < labels.size(); ++l) {
      svg::Series s;
      s.name = labels[l] + ", " + std::to_string(thread_counts[t]) + " thr";
      s.color = static_cast<int>(l);
      s.dashed = t > 0;
      for (const Row& r : rows) {
        if (r.threads == thread_counts[t] && label_of(r) == labels[l]) {
          s.x.push_back(static_cast<double>(r.tokens));
          s.y.push_back(r.timing.median_ms);
        }
      }
      if (!s.x.empty()) latency.series.push_back(s);
    }
  }
  // Memory and % of peak at the largest token count and the last thread count.
  const std::int64_t big = *std::max_element(seqs.begin(), seqs.end());
  const int last = thread_counts.back();
  const std::string at = " (" + tokens_text(big) + " tokens, " + threads_text(last) + ")";
  svg::Panel memory{svg::Panel::Kind::bars, "memory by policy" + at, "remat policy", "MiB", {}, {}};
  svg::Series rss{"peak RSS MiB", {}, {}, 0, false}, resid{"residual MiB", {}, {}, 1, false};
  for (const Row& r : rows) {
    if (r.tokens == big && r.threads == last && r.dtype == "f32" &&
        r.op.rfind("backward-", 0) == 0) {
      memory.categories.push_back(r.residuals);
      rss.y.push_back(static_cast<double>(r.timing.peak_rss) / (1 << 20));
      resid.y.push_back(static_cast<double>(r.residual_bytes) / (1 << 20));
    }
  }
  memory.series = {rss, resid};
  svg::Panel percent{svg::Panel::Kind::bars,
                     "% of fp32 FMA peak (" + tokens_text(big) + " tokens)",
                     "op",
                     "% of peak",
                     {},
                     {}};
  // The float32 rows only: 16-bit rows run the same arithmetic (their latency is in the first
  // panel), and twice the bars would not leave room for their names.
  std::vector<std::string> bar_labels;
  for (const Row& r : rows) {
    if (r.dtype == "f32" &&
        std::find(bar_labels.begin(), bar_labels.end(), label_of(r)) == bar_labels.end()) {
      bar_labels.push_back(label_of(r));
    }
  }
  for (const std::string& l : bar_labels) {
    // Short names: the bars are narrow.
    std::string name = l == "baseline (recurrent)" ? "baseline"
                       : l == "forward +residuals" ? "fwd+res"
                                                   : l;
    if (name.rfind("baseline (recurrent)", 0) == 0) name = "baseline" + name.substr(20);
    if (name.rfind("forward +residuals", 0) == 0) name = "fwd+res" + name.substr(18);
    if (name.rfind("backward-", 0) == 0) name = "bwd-" + name.substr(9);
    percent.categories.push_back(name);
  }
  for (std::size_t t = 0; t < thread_counts.size(); ++t) {
    svg::Series s{threads_text(thread_counts[t]), {}, {}, static_cast<int>(t), false};
    for (const std::string& l : bar_labels) {
      double pct = 0;
      for (const Row& r : rows) {
        // The decode step at its largest batch, the others at the largest token count.
        const bool decode = r.op == "decode";
        const std::int64_t want = decode ? *std::max_element(batches.begin(), batches.end()) : big;
        if (r.threads == thread_counts[t] && label_of(r) == l && r.tokens == want) pct = r.pct;
      }
      s.y.push_back(pct);
    }
    percent.series.push_back(s);
  }
  std::string title = "gdn bench --suite, " + dtype_list + ", Hk=" + std::to_string(hk) +
                      " Hv=" + std::to_string(hv) + " Dk=" + std::to_string(dk) +
                      " Dv=" + std::to_string(dv) + " | " + machine + ", ISA " + cpu_isa_name(isa) +
                      " | peak";
  for (const auto& [n, p] : peaks) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " %.0f GFLOP/s (%d thr)", p, n);
    title += buf;
  }
  // Written whole, then renamed over out_path: a failed write leaves an existing plot as it was.
  OutputFiles svg_file;
  try {
    svg_file.write(out_path, {svg::render(title, {latency, memory, percent})});
    svg_file.commit();
  } catch (const OutputError& e) {
    std::fprintf(stderr, "gdn bench --suite: could not write %s\n", e.what());
    return 1;
  }
  std::error_code ignored;
  const std::filesystem::path where = std::filesystem::absolute(out_path, ignored);
  std::fprintf(info, "plot written to %s\n", where.empty() ? out_path.c_str() : where.c_str());
  return 0;
}

}  // namespace gdn::cli
