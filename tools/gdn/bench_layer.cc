// bench_layer.cc: `gdn bench --op layer` (the fused layer op at the Qwen3-Next and
// Qwen3.5-397B shapes) and `gdn bench --op conv` (its conv1d + SiLU against a memcpy of the
// same bytes). Validate, then time, as `gdn bench` does (bench_command.cc).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "args.h"
#include "bench/cost_model.h"
#include "bench/error_stats.h"
#include "bench_noise.h"
#include "bench_util.h"
#include "commands.h"
#include "common/kernel_problem.h"
#include "cpu/kernels.h"
#include "cpu/layer.h"
#include "gdn/gdn.h"
#include "inputs.h"
#include "sysinfo.h"

namespace gdn::cli {

const char* const kBenchLayerHelp = R"HELP(usage: gdn bench --op layer [options]

Times the fused layer op (conv1d + SiLU + gates + L2 norm + gated delta rule; float32, or with
--dtype bf16 / f16 16-bit activations qkv, a, b, out and their gradients, float32 parameters,
states and arithmetic) at the model shapes below, one sequence of each length: the forward (no residuals kept) and the
backward from the residuals a forward kept (chunk_states and T^-1, untimed forward; t_inv or
none instead when the problem would not fit in the available memory, which the output says).
For each: median latency with min and max, us per token*head, GFLOP/s from the cost model
(bench/cost_model.h: the gated delta rule's forward or backward, plus the conv's
multiply-adds, 3x in the backward: recomputed, dx, d weight), %% of the fp32 FMA
peak measured in the same run, the process's peak RSS during the case, the bytes of
residuals, and beside each the gated delta rule alone on the same shape and residuals, timed
in the same run (core ms; x core is the layer's median over it). Before timing, every case
is checked against the float64 reference on a slice (the
first tokens, the first key head and its value heads); a failed check stops the benchmark.

models (conv K = 4, no conv bias, Dk = Dv = 128):
  qwen3-next     Hk = 16, Hv = 32, D = 8192
  qwen3.5-397b   Hk = 16, Hv = 64, D = 12288

options:
%s
%s

examples:
  gdn bench --op layer
  gdn bench --op layer --model qwen3-next --seq 8k --threads 1
  gdn bench --op layer --model qwen3-next --seq 8k --dtype bf16
  gdn bench --op layer --seq 64k --cases backward --json > layer.jsonl
)HELP";

const char* const kBenchConvHelp = R"HELP(usage: gdn bench --op conv [options]

Times the layer op's causal depthwise conv1d + SiLU kernel alone (float32, K taps, one
sequence, no conv bias): the forward (prefill), a decode step over a batch of sequences (one
token each, conv state in), and the backward (dx, d weight, d bias); beside a memcpy of the
conv's input bytes, measured in the same run: the conv reads and writes as many bytes as that
copy, so the copy is its floor. Each kernel is first checked against a float64 evaluation of
the same conv on the first tokens (the backward's dx; its d weight and d bias sum over every
token and are checked against the reference by the test suite, tests/cpu/layer_test.cc).

The default is the size ggml's conv + SiLU was measured at (docs/perf.md): 8192 channels x
8192 tokens, K = 4.

options:
%s
%s
The conv's cases report no %% of peak, so their noise is judged without the peak check.

examples:
  gdn bench --op conv
  gdn bench --op conv --threads 1 --json
  gdn bench --op conv --channels 12288 --seq 64k
)HELP";

namespace {

struct Model {
  const char* name;
  std::int64_t hk, hv, dk, dv;
};
constexpr Model kModels[] = {{"qwen3-next", 16, 32, 128, 128}, {"qwen3.5-397b", 16, 64, 128, 128}};
constexpr std::int64_t kTaps = 4;

const std::vector<OptionSpec> kLayerOptions = {
    {"op", "OP", "layer (this benchmark); core or conv for the others"},
    {"model", "M", "all, qwen3-next or qwen3.5-397b (default all)"},
    {"seq", "LIST", "tokens per case, comma separated, k suffix allowed (default 8k,64k)"},
    {"cases", "LIST", "all, forward or backward (default all)"},
    {"threads", "N", "worker threads, 0 = all cores (default 0)"},
    {"repeats", "R", "timed runs per case after one warm-up (default 3)"},
    {"isa", "ISA", "CPU variant: auto, generic, avx2, avx512 or avx512_bf16 (default auto)"},
    {"dtype", "T",
     "activations (qkv, a, b, out and their gradients): f32, bf16 or f16; parameters and "
     "states stay float32 (default f32)"},
    {"json", nullptr, "print one JSON object per case and nothing else on stdout"},
    {"help", nullptr, "show this help"},
};

const std::vector<OptionSpec> kConvOptions = {
    {"op", "OP", "conv (this benchmark); core or layer for the others"},
    {"channels", "D", "channels (default 8192)"},
    {"tokens", "T", "tokens (default 8192)"},
    {"seq", "T", "the same as --tokens; accepts a k suffix (8k, 64k)"},
    {"taps", "K", "conv taps, 1 to 8 (default 4)"},
    {"decode-seqs", "N", "sequences of the decode step (default 256)"},
    {"threads", "N", "worker threads, 0 = all cores (default 0)"},
    {"repeats", "R", "timed runs per case after one warm-up (default 10)"},
    {"isa", "ISA", "CPU variant: auto, generic, avx2, avx512 or avx512_bf16 (default auto)"},
    {"json", nullptr, "print one JSON object per case and nothing else on stdout"},
    {"help", nullptr, "show this help"},
};

// fp32 tolerance of the checks (docs/numerics.md).
constexpr double kTolerance = 1e-4;

void fill_uniform(Tensor& t, Random& rng, double lo, double hi) {
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(rng.uniform(lo, hi));
}

// MemAvailable from /proc/meminfo in bytes; 0 if unknown.
std::int64_t available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// One layer problem in float32: the inputs, and d_out for the backward.
struct LayerData {
  Model model{};
  std::int64_t tokens = 0, channels = 0;
  Tensor qkv, a, b, conv_weight, A_log, dt_bias, cu, d_out;
  LayerOptions options;
  LayerInputs inputs() const {
    return {qkv.view(),     a.view(), b.view(), conv_weight.view(), {}, A_log.view(),
            dt_bias.view(), {},       {},       cu.view()};
  }
};

// Inputs like a trained layer's: qkv and d_out uniform in [-1, 1), conv weights in
// [-1, 1) / sqrt(K), a and b in [-1, 1), A = exp(A_log) in [1, 16), dt = softplus(a + dt_bias)
// around [0.001, 0.1): decays g = -A dt between about -1.6 and 0 per token.
LayerData make_layer(const Model& m, std::int64_t tokens, bool backward, int threads, CpuIsa isa,
                     std::uint64_t seed) {
  LayerData d;
  d.model = m;
  d.tokens = tokens;
  d.channels = 2 * m.hk * m.dk + m.hv * m.dv;
  Random rng(seed);
  d.qkv = Tensor(DType::f32, {tokens, d.channels});
  d.a = Tensor(DType::f32, {tokens, m.hv});
  d.b = Tensor(DType::f32, {tokens, m.hv});
  d.conv_weight = Tensor(DType::f32, {d.channels, kTaps});
  d.A_log = Tensor(DType::f32, {m.hv});
  d.dt_bias = Tensor(DType::f32, {m.hv});
  d.cu = Tensor(DType::i64, {2});
  fill_uniform(d.qkv, rng, -1, 1);
  fill_uniform(d.a, rng, -1, 1);
  fill_uniform(d.b, rng, -1, 1);
  fill_uniform(d.conv_weight, rng, -0.5, 0.5);
  for (std::int64_t h = 0; h < m.hv; ++h) {
    d.A_log.data<float>()[h] = static_cast<float>(std::log(rng.uniform(1, 16)));
    d.dt_bias.data<float>()[h] = static_cast<float>(std::log(std::expm1(rng.uniform(0.001, 0.1))));
  }
  d.cu.data<std::int64_t>()[1] = tokens;
  if (backward) {
    d.d_out = Tensor(DType::f32, {tokens, m.hv * m.dv});
    fill_uniform(d.d_out, rng, -1, 1);
  }
  d.options.hk = m.hk;
  d.options.hv = m.hv;
  d.options.dk = m.dk;
  d.options.dv = m.dv;
  d.options.threads = threads;
  d.options.isa = isa;
  return d;
}

// The check slice: the first `tokens` tokens, key head 0 and its value heads, copied into a
// problem of its own (Hk = 1, Hv = Hv / Hk).
LayerData slice_of(const LayerData& d, std::int64_t tokens) {
  const Model& m = d.model;
  const std::int64_t group = m.hv / m.hk;
  LayerData s;
  s.model = m;
  s.options = d.options;
  s.model.hk = 1;
  s.model.hv = group;
  s.tokens = tokens;
  s.channels = 2 * m.dk + group * m.dv;
  std::vector<std::int64_t> source;  // channel of d behind each channel of the slice
  for (std::int64_t c = 0; c < m.dk; ++c) source.push_back(c);
  for (std::int64_t c = 0; c < m.dk; ++c) source.push_back(m.hk * m.dk + c);
  for (std::int64_t c = 0; c < group * m.dv; ++c) source.push_back(2 * m.hk * m.dk + c);
  s.qkv = Tensor(DType::f32, {tokens, s.channels});
  s.conv_weight = Tensor(DType::f32, {s.channels, kTaps});
  for (std::int64_t c = 0; c < s.channels; ++c) {
    const auto from = source[static_cast<std::size_t>(c)];
    for (std::int64_t t = 0; t < tokens; ++t) {
      s.qkv.data<float>()[t * s.channels + c] = d.qkv.data<float>()[t * d.channels + from];
    }
    for (std::int64_t i = 0; i < kTaps; ++i) {
      s.conv_weight.data<float>()[c * kTaps + i] = d.conv_weight.data<float>()[from * kTaps + i];
    }
  }
  auto columns = [&](const Tensor& x, std::int64_t width, std::int64_t keep) {
    Tensor y(DType::f32, {tokens, keep});
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::memcpy(y.data<float>() + t * keep, x.data<float>() + t * width, keep * sizeof(float));
    }
    return y;
  };
  s.a = columns(d.a, m.hv, group);
  s.b = columns(d.b, m.hv, group);
  if (d.d_out.present()) s.d_out = columns(d.d_out, m.hv * m.dv, group * m.dv);
  s.A_log = Tensor(DType::f32, {group});
  s.dt_bias = Tensor(DType::f32, {group});
  std::memcpy(s.A_log.raw(), d.A_log.raw(), group * sizeof(float));
  std::memcpy(s.dt_bias.raw(), d.dt_bias.raw(), group * sizeof(float));
  s.cu = Tensor(DType::i64, {2});
  s.cu.data<std::int64_t>()[1] = tokens;
  s.options.hk = 1;
  s.options.hv = group;
  return s;
}

double normalized_error(const Tensor& x, const Tensor& ref) {
  return bench::error_stats(
             x.numel(), [&](std::int64_t i) { return element_value(x, i); },
             [&](std::int64_t i) { return ref.data<double>()[i]; })
      .normalized();
}

// The forward's or backward's worst normalised error on the slice against the reference, and
// the tolerance: 1e-4, plus for 16-bit activations twice the largest error of the
// reference's own activation outputs rounded to that type (docs/numerics.md).
std::pair<double, double> check_layer(const LayerData& s, bool backward, Residuals kept) {
  const DType dtype = s.qkv.dtype();
  if (!backward) {
    const LayerForwardResult cpu = fused_gdn_fwd(s.inputs(), s.options);
    const LayerForwardResult ref = ref::fused_gdn_fwd(s.inputs(), s.options);
    return {std::max(normalized_error(cpu.out, ref.out),
                     normalized_error(cpu.recurrent_state_out, ref.recurrent_state_out)),
            kTolerance + 2 * rounding_error(ref.out, dtype)};
  }
  const LayerForwardResult res = fused_gdn_fwd(s.inputs(), s.options, kept);
  const LayerBackwardInputs in{s.inputs(), s.d_out.view(),          {},
                               {},         res.chunk_states.view(), res.t_inv.view()};
  const LayerBackwardResult cpu = fused_gdn_bwd(in, s.options);
  const LayerBackwardResult ref = ref::fused_gdn_bwd(in, s.options);
  double worst = 0, rounding = 0;
  for (const auto& [x, r] :
       {std::pair{&cpu.d_qkv, &ref.d_qkv}, std::pair{&cpu.d_a, &ref.d_a},
        std::pair{&cpu.d_b, &ref.d_b}, std::pair{&cpu.d_conv_weight, &ref.d_conv_weight},
        std::pair{&cpu.d_A_log, &ref.d_A_log}, std::pair{&cpu.d_dt_bias, &ref.d_dt_bias},
        std::pair{&cpu.d_recurrent_state, &ref.d_recurrent_state}}) {
    worst = std::max(worst, normalized_error(*x, *r));
    if (x->dtype() == dtype) rounding = std::max(rounding, rounding_error(*r, dtype));
  }
  return {worst, kTolerance + 2 * rounding};
}

const char* residuals_name(Residuals r) {
  return r == Residuals::all ? "all" : r == Residuals::t_inv ? "t_inv" : "none";
}

// One row of results, printed as JSON or kept for the table.
struct Row {
  std::string text;
};

// Times the gated delta rule alone at the layer's shape: q, k, v are column views of qkv
// (as the layer's are of xh), g and beta the layer's gates; the backward from the residuals
// `kept` (an untimed forward), its dq, dk, dv written into column views of one [T, D] array.
Timing time_core(const LayerData& d, bool backward, Residuals kept, int repeats,
                 const std::string& label) {
  const Model& m = d.model;
  const std::int64_t t = d.tokens, dd = d.channels, qk = m.hk * m.dk;
  Tensor g(DType::f32, {t, m.hv}), beta(DType::f32, {t, m.hv});
  for (std::int64_t h = 0; h < m.hv; ++h) {
    const double a_scale = std::exp(d.A_log.data<float>()[h]);
    for (std::int64_t i = 0; i < t; ++i) {
      const double z = element_value(d.a, i * m.hv + h) + d.dt_bias.data<float>()[h];
      g.data<float>()[i * m.hv + h] = static_cast<float>(-a_scale * std::log1p(std::exp(z)));
      beta.data<float>()[i * m.hv + h] =
          static_cast<float>(1 / (1 + std::exp(-element_value(d.b, i * m.hv + h))));
    }
  }
  // q, k, v: column views of qkv in its dtype (16-bit activations run the core in 16 bits).
  const DType dtype = d.qkv.dtype();
  const auto* x = static_cast<const char*>(d.qkv.raw());
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  auto columns = [&](std::int64_t first, std::int64_t heads, std::int64_t dim) {
    return TensorView(x + first * elem, dtype, 3, Dims{t, heads, dim, 0}, Dims{dd, dim, 1, 0});
  };
  const ForwardInputs in{columns(0, m.hk, m.dk),
                         columns(qk, m.hk, m.dk),
                         columns(2 * qk, m.hv, m.dv),
                         g.view(),
                         beta.view(),
                         {},
                         d.cu.view()};
  ForwardOptions options;
  options.use_qk_l2norm = true;
  options.threads = d.options.threads;
  options.isa = d.options.isa;
  if (!backward) {
    Tensor o(dtype, {t, m.hv, m.dv}), state(DType::f32, {1, m.hv, m.dk, m.dv});
    auto run = [&] {
      chunk_gated_delta_rule_fwd(in, {o.mutable_view(), state.mutable_view(), {}, {}}, options);
    };
    run();  // warm-up
    return time_runs(run, repeats, label);
  }
  const ForwardResult res = chunk_gated_delta_rule_fwd(in, options, kept);
  BackwardInputs bin = BackwardInputs::from(in);
  bin.d_o = TensorView(d.d_out.raw(), dtype, {t, m.hv, m.dv});
  bin.chunk_states = res.chunk_states.view();
  bin.t_inv = res.t_inv.view();
  Tensor dxh(dtype, {t, dd}), dg(DType::f32, {t, m.hv}), dbeta(DType::f32, {t, m.hv});
  auto* dx = static_cast<char*>(dxh.raw());
  auto dcolumns = [&](std::int64_t first, std::int64_t heads, std::int64_t dim) {
    return MutableTensorView(dx + first * elem, dtype, 3, Dims{t, heads, dim, 0},
                             Dims{dd, dim, 1, 0});
  };
  const BackwardOutputs out{dcolumns(0, m.hk, m.dk),      dcolumns(qk, m.hk, m.dk),
                            dcolumns(2 * qk, m.hv, m.dv), dg.mutable_view(),
                            dbeta.mutable_view(),         {}};
  auto run = [&] { chunk_gated_delta_rule_bwd(bin, out, options); };
  run();  // warm-up
  return time_runs(run, repeats, label);
}

}  // namespace

int bench_layer_command(int argc, char** argv) {
  const Args args(kLayerOptions, argc, argv, 2);
  if (args.flag("help")) {
    std::printf(kBenchLayerHelp, describe_options(kLayerOptions).c_str(), noise_help().c_str());
    return 0;
  }
  const std::string model_name = args.choice("model", "all", {"all", "qwen3-next", "qwen3.5-397b"});
  std::vector<std::int64_t> lengths;
  {
    const std::string list = args.text("seq", "8k,64k");
    std::size_t start = 0;
    while (start <= list.size()) {
      const std::size_t comma = std::min(list.find(',', start), list.size());
      lengths.push_back(parse_token_count("seq", list.substr(start, comma - start)));
      start = comma + 1;
    }
  }
  const std::string which = args.choice("cases", "all", {"all", "forward", "backward"});
  int threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  const int repeats = static_cast<int>(args.integer("repeats", 3, 1, 1000));
  const bool json = args.flag("json");
  const CpuIsa isa = resolve_cpu_isa(isa_option(args));
  if (threads == 0) threads = default_threads();
  const std::string dtype_arg = args.choice("dtype", "f32", {"f32", "bf16", "f16"});
  const DType dtype = dtype_arg == "bf16"  ? DType::bf16
                      : dtype_arg == "f16" ? DType::f16
                                           : DType::f32;

  std::FILE* info = json ? stderr : stdout;
  std::fprintf(info, "gdn bench --op layer: fused layer op, %s, conv K = %lld, chunk 64\n",
               dtype == DType::f32 ? "f32" : (dtype_arg + " activations, float32 state").c_str(),
               static_cast<long long>(kTaps));
  std::fprintf(info, "machine: %s; ISA %s; %d thread%s\n", cpu_model_name().c_str(),
               cpu_isa_name(isa), threads, threads == 1 ? "" : "s");
  progress("  measuring the fp32 FMA peak...");
  const double peak = cpu::measure_fma_peak_gflops(isa, threads);
  progress("%s", "");
  std::fprintf(info, "fp32 FMA peak, measured now (%s, %d thread%s): %.1f GFLOP/s\n",
               cpu_isa_name(isa), threads, threads == 1 ? "" : "s", peak);
  NoiseWatch noise(isa);
  noise.start(threads, peak);

  std::vector<std::string> rows;
  for (const Model& m : kModels) {
    if (model_name != "all" && model_name != m.name) continue;
    for (const std::int64_t tokens : lengths) {
      const bool backward = which != "forward";
      progress("  %s, %lld tokens: generating inputs...", m.name, static_cast<long long>(tokens));
      LayerData d = make_layer(m, tokens, backward, threads, isa, 20261202);
      LayerData slice = slice_of(d, std::min<std::int64_t>(tokens, 3 * 64 + 5));
      for (LayerData* x : {&d, &slice}) {
        for (Tensor* t : {&x->qkv, &x->a, &x->b, &x->d_out}) *t = rounded_to(std::move(*t), dtype);
      }
      const std::int64_t tc = d.tokens * d.channels;
      const double conv_fwd = 2.0 * kTaps * static_cast<double>(tc);
      const double core_fwd = bench::over_chunks(tokens, 1, m.hv, 64, [&](double n) {
        return bench::chunked_forward_flops_per_chunk(n, m.dk, m.dv);
      });
      for (const bool bwd : {false, true}) {
        if (bwd ? which == "forward" : which == "backward") continue;
        // The residuals the backward starts from: all, unless the case would not fit.
        Residuals kept = Residuals::none;
        std::string note;
        if (bwd) {
          const std::int64_t chunks = (tokens + 63) / 64;
          const std::int64_t states = chunks * m.hv * m.dk * m.dv * 4;
          const std::int64_t t_inv = chunks * m.hv * 64 * 64 * 4;
          // Inputs and d_out are resident; the case adds d qkv, the op's xh and dxh, the
          // residuals, and the gates and small gradients.
          const std::int64_t base = 3 * tc * 4 + tokens * m.hv * 4 * 8;
          const std::int64_t available = available_memory();
          kept = Residuals::all;
          if (available > 0 && base + states + t_inv > available * 9 / 10) {
            kept = base + t_inv <= available * 9 / 10 ? Residuals::t_inv : Residuals::none;
            note = std::string("residuals ") + residuals_name(kept) +
                   ": chunk_states would not fit in the available memory";
          }
        }
        const double flops =
            bwd ? bench::over_chunks(tokens, 1, m.hv, 64,
                                     [&](double n) {
                                       return bench::chunked_backward_flops_per_chunk(n, m.dk,
                                                                                      m.dv) +
                                              (kept == Residuals::all
                                                   ? 0.0
                                                   : bench::rebuild_flops_per_chunk(
                                                         n, m.dk, m.dv, kept == Residuals::none));
                                     }) +
                      3 * conv_fwd  // the recomputed conv forward and the conv backward
                : core_fwd + conv_fwd;
        const std::string label = std::string(m.name) + " " + std::to_string(tokens) + " " +
                                  (bwd ? "backward" : "forward");
        progress("  %s: float64 reference on the check slice...", label.c_str());
        const auto [error, tolerance] = check_layer(slice, bwd, kept);
        progress("%s", "");
        std::fprintf(info,
                     "check: %s vs float64 reference (%lld tokens x %lld heads): error %.2e "
                     "(tolerance %.1e) %s\n",
                     label.c_str(), static_cast<long long>(slice.tokens),
                     static_cast<long long>(slice.model.hv), error, tolerance,
                     error <= tolerance ? "PASS" : "FAIL");
        if (!(error <= tolerance)) {
          std::fprintf(stderr,
                       "gdn bench: the layer %s does not match the float64 reference; not timing "
                       "it\n",
                       bwd ? "backward" : "forward");
          return 1;
        }
        if (!note.empty()) std::fprintf(info, "note: %s, %s\n", label.c_str(), note.c_str());

        reset_peak_rss();
        Timing t;
        std::int64_t residual_bytes = 0;
        if (!bwd) {
          Tensor out(dtype, {tokens, m.hv * m.dv}), state(DType::f32, {1, m.hv, m.dk, m.dv});
          const LayerOutputs outputs{out.mutable_view(), {}, state.mutable_view(), {}, {}};
          auto run = [&] { fused_gdn_fwd(d.inputs(), outputs, d.options); };
          run();  // warm-up
          t = time_runs(run, repeats, label);
        } else {
          progress("  %s: the forward that keeps the residuals...", label.c_str());
          LayerForwardResult res = fused_gdn_fwd(d.inputs(), d.options, kept);
          res.out = Tensor{};
          residual_bytes = static_cast<std::int64_t>(res.chunk_states.bytes() + res.t_inv.bytes());
          const LayerBackwardInputs in{d.inputs(), d.d_out.view(),          {},
                                       {},         res.chunk_states.view(), res.t_inv.view()};
          Tensor d_qkv(dtype, {tokens, d.channels}), d_a(dtype, {tokens, m.hv}),
              d_b(dtype, {tokens, m.hv}), d_w(DType::f32, {d.channels, kTaps}),
              d_a_log(DType::f32, {m.hv}), d_dt(DType::f32, {m.hv});
          const LayerBackwardOutputs outputs{d_qkv.mutable_view(),
                                             d_a.mutable_view(),
                                             d_b.mutable_view(),
                                             d_w.mutable_view(),
                                             {},
                                             d_a_log.mutable_view(),
                                             d_dt.mutable_view(),
                                             {},
                                             {}};
          auto run = [&] { fused_gdn_bwd(in, outputs, d.options); };
          run();  // warm-up
          t = time_runs(run, repeats, label);
        }
        t.peak_rss = peak_rss_bytes();
        NoiseVerdict verdict = noise.judge(label, t);
        const NoiseFigures figures = noise.last();
        // The baseline of the same run: the gated delta rule alone on the same shape, reading
        // q, k, v as the layer does (column views of a [T, D] array: qkv stands in for xh).
        progress("  %s: the gated delta rule alone...", label.c_str());
        const Timing core = time_core(d, bwd, kept, repeats, label + " (gated delta rule alone)");
        verdict.add("its baseline, the gated delta rule alone",
                    noise.judge(label + " (gated delta rule alone)", core));
        const double us_per = t.median_ms * 1e3 / static_cast<double>(tokens * m.hv);
        const double gflops = flops / (t.median_ms * 1e-3) * 1e-9;
        const std::string op = bwd ? std::string("layer-backward-") + residuals_name(kept)
                                   : std::string("layer-forward");
        if (json) {
          std::printf(
              "{\"op\": \"%s\", \"model\": \"%s\", \"residuals\": \"%s\", \"dtype\": \"%s\", "
              "\"isa\": \"%s\", \"threads\": %d, \"tokens\": %lld, \"seqs\": 1, \"hk\": %lld, "
              "\"hv\": %lld, \"dk\": %lld, \"dv\": %lld, \"channels\": %lld, \"taps\": %lld, "
              "\"chunk_size\": 64, \"repeats\": %d, \"median_ms\": %.4f, \"min_ms\": %.4f, "
              "\"max_ms\": %.4f, \"us_per_token_head\": %.5f, \"gflops\": %.2f, "
              "\"peak_gflops\": %.2f, \"pct_peak\": %.2f, \"residual_bytes\": %lld, "
              "\"peak_rss_bytes\": %lld, \"core_median_ms\": %.4f, \"vs_core\": %.3f, "
              "\"check_error\": %.3e, %s}\n",
              op.c_str(), m.name, bwd ? residuals_name(kept) : "none", dtype_name(dtype),
              cpu_isa_name(isa), threads, static_cast<long long>(tokens),
              static_cast<long long>(m.hk), static_cast<long long>(m.hv),
              static_cast<long long>(m.dk), static_cast<long long>(m.dv),
              static_cast<long long>(d.channels), static_cast<long long>(kTaps), repeats,
              t.median_ms, t.min_ms, t.max_ms, us_per, gflops, peak, 100 * gflops / peak,
              static_cast<long long>(residual_bytes), static_cast<long long>(t.peak_rss),
              core.median_ms, t.median_ms / core.median_ms, error,
              noise_json(figures, verdict).c_str());
          std::fflush(stdout);
        } else {
          char range[64], row[320];
          std::snprintf(range, sizeof range, "(%.1f - %.1f)", t.min_ms, t.max_ms);
          std::snprintf(row, sizeof row,
                        "%-13s %6lld  %-20s %10.1f %19s %11.3f %8.1f %6.1f%% %10.1f %10.1f %9.1f "
                        "%6.2fx%s\n",
                        m.name, static_cast<long long>(tokens), op.c_str(), t.median_ms, range,
                        us_per, gflops, 100 * gflops / peak,
                        static_cast<double>(residual_bytes) / (1 << 20),
                        static_cast<double>(t.peak_rss) / (1 << 20), core.median_ms,
                        t.median_ms / core.median_ms, verdict.noisy ? "  noisy" : "");
          rows.push_back(row);
        }
      }
    }
  }
  if (!json) {
    std::printf("\n%-13s %6s  %-20s %10s %19s %11s %8s %7s %10s %10s %9s %7s\n", "model", "tokens",
                "op", "median ms", "(min - max)", "us/tok*head", "GFLOP/s", "% peak", "resid MiB",
                "RSS MiB", "core ms", "x core");
    for (const std::string& row : rows) std::fputs(row.c_str(), stdout);
    std::printf(
        "\nus/tok*head is wall time / (tokens x value heads) with %d thread%s; per core multiply "
        "by %d.\ncore ms: the gated delta rule alone on the same shape and residuals, same run; "
        "x core: the layer op's median over it.\n",
        threads, threads == 1 ? "" : "s", threads);
  }
  noise.warn(info, "gdn bench --op layer");
  return 0;
}

int bench_conv_command(int argc, char** argv) {
  const Args args(kConvOptions, argc, argv, 2);
  if (args.flag("help")) {
    std::printf(kBenchConvHelp, describe_options(kConvOptions).c_str(), noise_help().c_str());
    return 0;
  }
  const std::int64_t channels = args.integer("channels", 8192, 1, std::int64_t{1} << 20);
  const std::int64_t tokens = parse_tokens(args, 8192);
  const std::int64_t taps = args.integer("taps", 4, 1, kMaxConvTaps);
  const std::int64_t decode_seqs = args.integer("decode-seqs", 256, 1, 1 << 20);
  int threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  const int repeats = static_cast<int>(args.integer("repeats", 10, 1, 100000));
  const bool json = args.flag("json");
  const CpuIsa isa = resolve_cpu_isa(isa_option(args));
  if (threads == 0) threads = default_threads();
  const std::int64_t cpad = (channels + 15) / 16 * 16;

  std::FILE* info = json ? stderr : stdout;
  std::fprintf(
      info,
      "gdn bench --op conv: causal conv1d + SiLU, f32, %lld channels x %lld tokens, K = %lld\n",
      static_cast<long long>(channels), static_cast<long long>(tokens),
      static_cast<long long>(taps));
  std::fprintf(info, "machine: %s; ISA %s; %d thread%s\n", cpu_model_name().c_str(),
               cpu_isa_name(isa), threads, threads == 1 ? "" : "s");

  progress("  generating inputs...");
  Random rng(20261202);
  const std::int64_t prefill_rows = tokens, decode_rows = decode_seqs;
  Tensor x(DType::f32, {prefill_rows, channels}), xh(DType::f32, {prefill_rows, channels});
  Tensor dxh(DType::f32, {prefill_rows, channels}), dx(DType::f32, {prefill_rows, channels});
  Tensor weight(DType::f32, {taps, cpad}), bias(DType::f32, {cpad});
  Tensor dweight(DType::f32, {taps, cpad}), dbias(DType::f32, {cpad});
  Tensor dec_x(DType::f32, {decode_rows, channels}), dec_xh(DType::f32, {decode_rows, channels});
  Tensor dec_state(DType::f32, {decode_seqs, taps - 1 > 0 ? taps - 1 : 1, channels});
  fill_uniform(x, rng, -1, 1);
  fill_uniform(dxh, rng, -1, 1);
  fill_uniform(dec_x, rng, -1, 1);
  fill_uniform(dec_state, rng, -1, 1);
  for (std::int64_t i = 0; i < taps; ++i) {
    for (std::int64_t c = 0; c < channels; ++c) {
      weight.data<float>()[i * cpad + c] = static_cast<float>(rng.uniform(-0.5, 0.5));
    }
  }
  std::vector<detail::Sequence> prefill_seq = {{0, 0, tokens, 0}};
  std::vector<detail::Sequence> decode_seq;
  for (std::int64_t s = 0; s < decode_seqs; ++s) decode_seq.push_back({0, s, 1, 0});

  detail::ConvProblem p;
  p.tokens = tokens;
  p.channels = channels;
  p.taps = taps;
  p.cpad = cpad;
  p.num_seqs = 1;
  p.seqs = prefill_seq.data();
  p.dtype = DType::f32;
  p.x = static_cast<const std::byte*>(x.raw());
  p.x_token = channels;
  p.x_channel = 1;
  p.weight = static_cast<const std::byte*>(weight.raw());
  p.bias = static_cast<const std::byte*>(bias.raw());
  p.xh = static_cast<std::byte*>(xh.raw());
  p.dxh = static_cast<const std::byte*>(dxh.raw());
  p.dx = static_cast<std::byte*>(dx.raw());
  p.dx_token = channels;
  p.dx_channel = 1;
  p.dweight = static_cast<std::byte*>(dweight.raw());
  p.dbias = static_cast<std::byte*>(dbias.raw());
  detail::ConvProblem dec = p;
  dec.tokens = decode_seqs;
  dec.num_seqs = decode_seqs;
  dec.seqs = decode_seq.data();
  dec.x = static_cast<const std::byte*>(dec_x.raw());
  dec.xh = static_cast<std::byte*>(dec_xh.raw());
  dec.state_in = taps > 1 ? static_cast<const std::byte*>(dec_state.raw()) : nullptr;

  // The float64 evaluation of the conv on the first tokens: y, xh and (backward) dx of token t
  // and channel c, and the partial d weight over those tokens is not checked here (it sums
  // over every token; tests/cpu/layer_test.cc checks it against the reference).
  auto input = [&](const detail::ConvProblem& q, std::int64_t s, std::int64_t j,
                   std::int64_t c) -> double {
    const detail::Sequence& seq = q.seqs[s];
    if (j >= 0) return reinterpret_cast<const float*>(q.x)[(seq.start + j) * channels + c];
    if (q.state_in == nullptr) return 0;
    return reinterpret_cast<const float*>(
        q.state_in)[(s * (taps - 1) + taps - 1 + j) * channels + c];
  };
  auto pre = [&](const detail::ConvProblem& q, std::int64_t s, std::int64_t t, std::int64_t c) {
    double y = bias.data<float>()[c];
    for (std::int64_t i = 0; i < taps; ++i) {
      y += static_cast<double>(weight.data<float>()[i * cpad + c]) *
           input(q, s, t - taps + 1 + i, c);
    }
    return y;
  };
  auto sigmoid = [](double y) { return 1 / (1 + std::exp(-y)); };
  const std::int64_t check_tokens = std::min<std::int64_t>(tokens, 64);
  auto check_forward = [&](const detail::ConvProblem& q, std::int64_t seqs, std::int64_t per_seq) {
    std::vector<float> got;
    std::vector<double> want;
    for (std::int64_t s = 0; s < seqs; ++s) {
      for (std::int64_t t = 0; t < per_seq; ++t) {
        for (std::int64_t c = 0; c < channels; ++c) {
          const double y = pre(q, s, t, c);
          want.push_back(y * sigmoid(y));
          got.push_back(reinterpret_cast<const float*>(q.xh)[(q.seqs[s].start + t) * channels + c]);
        }
      }
    }
    return bench::error_stats(got.data(), want.data(), static_cast<std::int64_t>(got.size()))
        .normalized();
  };
  auto check_backward = [&]() {
    // dx_j = sum_i w[i] dy_(j+K-1-i), dy_t = dxh_t sigmoid'(...) (y sigmoid(y))'.
    std::vector<float> got;
    std::vector<double> want;
    const std::int64_t rows = std::min<std::int64_t>(tokens, check_tokens);
    for (std::int64_t j = 0; j < rows; ++j) {
      for (std::int64_t c = 0; c < channels; ++c) {
        double acc = 0;
        for (std::int64_t i = 0; i < taps; ++i) {
          const std::int64_t t = j + taps - 1 - i;
          if (t >= tokens) continue;
          const double y = pre(p, 0, t, c), sg = sigmoid(y);
          acc += static_cast<double>(weight.data<float>()[i * cpad + c]) *
                 dxh.data<float>()[t * channels + c] * sg * (1 + y * (1 - sg));
        }
        want.push_back(acc);
        got.push_back(dx.data<float>()[j * channels + c]);
      }
    }
    return bench::error_stats(got.data(), want.data(), static_cast<std::int64_t>(got.size()))
        .normalized();
  };

  struct ConvCase {
    std::string op;
    std::int64_t bytes;  // bytes the case must move at least: its inputs and outputs
    std::function<void()> run;
    std::function<double()> check;
  };
  const std::int64_t row_bytes = channels * 4;
  std::vector<ConvCase> cases = {
      {"memcpy", 2 * tokens * row_bytes,
       [&] { std::memcpy(xh.raw(), x.raw(), static_cast<std::size_t>(tokens * row_bytes)); },
       nullptr},
      {"conv-forward", 2 * tokens * row_bytes, [&] { cpu::conv_forward(p, isa, threads); },
       [&] { return check_forward(p, 1, check_tokens); }},
      {"conv-decode", 2 * decode_seqs * row_bytes + decode_seqs * (taps - 1) * row_bytes,
       [&] { cpu::conv_forward(dec, isa, threads); },
       [&] { return check_forward(dec, decode_seqs, 1); }},
      {"conv-backward", 3 * tokens * row_bytes, [&] { cpu::conv_backward(p, isa, threads); },
       check_backward},
  };
  std::vector<std::string> rows;
  double memcpy_ms = 0;
  NoiseWatch noise(isa);
  noise.start(threads, 0);  // no peak in this benchmark
  for (const ConvCase& c : cases) {
    c.run();  // warm-up
    double error = 0;
    if (c.check) {
      error = c.check();
      std::fprintf(info,
                   "check: %s vs float64 (first %lld tokens): error %.2e (tolerance %.0e) %s\n",
                   c.op.c_str(), static_cast<long long>(c.op == "conv-decode" ? 1 : check_tokens),
                   error, kTolerance, error <= kTolerance ? "PASS" : "FAIL");
      if (!(error <= kTolerance)) {
        std::fprintf(stderr, "gdn bench: %s does not match float64; not timing it\n", c.op.c_str());
        return 1;
      }
    }
    const Timing t = time_runs(c.run, repeats, c.op);
    const NoiseVerdict verdict = noise.judge(c.op, t);
    if (c.op == "memcpy") memcpy_ms = t.median_ms;
    const double gbps = static_cast<double>(c.bytes) / (t.median_ms * 1e-3) * 1e-9;
    const std::int64_t rows_of_case = c.op == "conv-decode" ? decode_seqs : tokens;
    if (json) {
      std::printf(
          "{\"op\": \"%s\", \"dtype\": \"f32\", \"isa\": \"%s\", \"threads\": %d, \"tokens\": "
          "%lld, \"channels\": %lld, \"taps\": %lld, \"repeats\": %d, \"median_ms\": %.4f, "
          "\"min_ms\": %.4f, \"max_ms\": %.4f, \"ns_per_token\": %.3f, \"gbytes_per_s\": %.2f, "
          "\"vs_memcpy\": %.3f, \"check_error\": %.3e, %s}\n",
          c.op.c_str(), cpu_isa_name(isa), threads, static_cast<long long>(rows_of_case),
          static_cast<long long>(channels), static_cast<long long>(taps), repeats, t.median_ms,
          t.min_ms, t.max_ms, t.median_ms * 1e6 / static_cast<double>(rows_of_case), gbps,
          memcpy_ms > 0 && c.op != "conv-decode" ? t.median_ms / memcpy_ms : 0.0, error,
          noise_json(noise.last(), verdict).c_str());
      std::fflush(stdout);
    } else {
      char range[64], ratio[32], row[256];
      std::snprintf(range, sizeof range, "(%.2f - %.2f)", t.min_ms, t.max_ms);
      std::snprintf(ratio, sizeof ratio, "%.2fx", memcpy_ms > 0 ? t.median_ms / memcpy_ms : 0.0);
      std::snprintf(row, sizeof row, "%-14s %8lld %10.3f %19s %12.1f %8.1f %11s%s\n", c.op.c_str(),
                    static_cast<long long>(rows_of_case), t.median_ms, range,
                    t.median_ms * 1e6 / static_cast<double>(rows_of_case), gbps,
                    c.op == "memcpy" || c.op == "conv-decode" ? "-" : ratio,
                    verdict.noisy ? "  noisy" : "");
      rows.push_back(row);
    }
  }
  if (!json) {
    std::printf("\n%-14s %8s %10s %19s %12s %8s %11s\n", "op", "tokens", "median ms", "(min - max)",
                "ns/token", "GB/s", "vs memcpy");
    for (const std::string& row : rows) std::fputs(row.c_str(), stdout);
    std::printf(
        "\nGB/s counts the bytes each case must move: input and output rows (and the conv "
        "states of the decode step; the backward reads x and dxh and writes dx).\n");
  }
  noise.warn(info, "gdn bench --op conv");
  return 0;
}

}  // namespace gdn::cli
