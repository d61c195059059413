// bench_command.cc: `gdn bench`, the default benchmark (the project's main job).
//
// Validate, then time: every case is first checked against the float64 reference on a slice
// of the problem, then timed (one warm-up, then --repeats runs; median, min, max), and
// reported beside the fp32 FMA peak measured in the same run with the same threads.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "args.h"
#include "bench/cost_model.h"
#include "bench/error_stats.h"
#include "bench_cases.h"
#include "bench_util.h"
#include "commands.h"
#include "cpu/kernels.h"
#include "cpu/profile.h"
#include "gdn/gdn.h"
#include "inputs.h"
#include "sysinfo.h"

namespace gdn::cli {

const char* const kBenchHelp = R"HELP(usage: gdn bench [options]

Times the gated delta rule's forward and backward passes at one problem shape (--op layer:
the whole fused layer op; --op conv: its conv1d + SiLU; --op step: serving steps of the layer
op over state-slot pools; --suite: the benchmark suite, these cases and a decode step at 8k and
64k tokens with 1 and all threads, plotted; each has its own --help). Cases: the chunked forward
without and with residuals, the token-recurrence baseline, and the chunked backward under each
remat policy (all: from kept chunk_states and t_inv; t_inv: rebuilding the chunk states;
none: rebuilding both; the forward that produced the residuals is not timed). For each: median
latency with min and max over the repeats, us per token*head, GFLOP/s from the cost model
(bench/cost_model.h), %% of the fp32 FMA peak measured in the same run, bytes of residuals
and the process's peak RSS during the case. Before timing, each case is checked against the
float64 reference on a slice of the problem (the first tokens of the first key head and its
value heads); a failed check stops the benchmark (exit 1).

The default is one Qwen3-Next GDN layer: Hk = 16, Hv = 32, Dk = Dv = 128, one sequence of
8192 tokens, float32, q and k L2-normalised in the kernel, all cores. --dtype bf16 or f16
times 16-bit activations (q, k, v, o, d_o and dq, dk, dv) with float32 gates, states, residuals
and arithmetic; their check tolerance adds twice the error of the reference's own output
rounded to that type (docs/numerics.md).
--matmul bf16 rounds the chunked cases' matrix operands to bf16 (the token-recurrence
baseline keeps float32): with the avx512_bf16 variant (the automatic choice on an AMD CPU with
AVX512_BF16; on an Intel Xeon vdpbf16ps issues at half the FMA rate and auto emulates: --isa
avx512_bf16 forces it) the products run on vdpbf16ps with float32 accumulation; other variants round on
float32 registers and multiply in float32, which gives the numerics of bf16 operands, not
their speed. Its check tolerance adds 6 times the error of the reference rounded to bf16
(docs/numerics.md, "bf16 matrix operands"). --matmul both times every case with float32
activations and operands, then with bf16 operands (and the --dtype activations), in one run,
and prints the ratios of their medians: the bf16 mode against the float32 forward.

options:
%s
%s

examples:
  gdn bench
  gdn bench --threads 1
  gdn bench --threads 1 --chunk-size 64
  gdn bench --dtype bf16 --threads 1
  gdn bench --matmul bf16 --threads 1 --cases forward
  gdn bench --matmul both --threads 1 --cases forward
  gdn bench --threads 1 --breakdown
  gdn bench --seq 64k --repeats 3
  gdn bench --cases backward --json > backward.jsonl
  gdn bench --cases forward-none,backward-all --threads 2
  gdn bench --hv 64 --seqs 4 --tokens 2048
  gdn bench --op layer --json
  gdn bench --op conv --threads 1
  gdn bench --op step --preset decode-1,decode-256
  gdn bench --suite --seq 8k --threads 1,all
)HELP";

namespace {

const std::vector<OptionSpec> kOptions = {
    {"op", "OP",
     "core (default: the gated delta rule), layer (the fused layer op, see "
     "`gdn bench --op layer --help`), conv (its conv1d + SiLU) or step (serving steps over "
     "state-slot pools, `gdn bench --op step --help`)"},
    {"tokens", "T", "tokens per sequence (default 8192)"},
    {"seq", "T", "the same as --tokens; accepts a k suffix (8k, 64k)"},
    {"seqs", "N", "sequences, packed back to back (default 1)"},
    {"hk", "HK", "query/key heads (default 16)"},
    {"hv", "HV", "value heads, a multiple of HK (default 32)"},
    {"dk", "DK", "key head dim, 1 to 256 (default 128)"},
    {"dv", "DV", "value head dim, 1 to 256 (default 128)"},
    {"chunk-size", "C",
     "tokens per chunk, 1 to 256, or 0: the tiling plan's choice for this machine (default 0; "
     "`gdn plan` says which and why)"},
    {"threads", "N", "worker threads, 0 = all cores (default 0)"},
    {"repeats", "R", "timed runs per case after one warm-up (default 5)"},
    {"cases", "LIST",
     "all, forward, backward, or cases, comma separated: forward-none, forward-all (the chunked "
     "forward without and with residuals), recurrent, backward-all, backward-t_inv, "
     "backward-none (default all)"},
    {"isa", "ISA", "CPU variant: auto, generic, avx2, avx512 or avx512_bf16 (default auto)"},
    {"dtype", "T",
     "activations (q, k, v, o and their gradients): f32, bf16 or f16; gates, states and "
     "residuals stay float32 (default f32)"},
    {"matmul", "P",
     "operands of the matrix products: compute (default), bf16 (rounded to bf16, summed in "
     "float32; float32 inputs only; vdpbf16ps with the avx512_bf16 variant, else emulated) or "
     "both (compute, then bf16, in one run, with the ratios of their medians)"},
    {"breakdown", nullptr,
     "after timing, run each chunked case once more with per-stage clocks and print where its "
     "time goes (the JSON lines get a stages_ms object)"},
    {"json", nullptr, "print one JSON object per case and nothing else on stdout"},
    {"help", nullptr, "show this help"},
};

// The cases by name, in the order they run; --cases names them or a group (all, forward,
// backward).
const std::vector<std::string> kCaseNames = {"forward-none", "forward-all",    "recurrent",
                                             "backward-all", "backward-t_inv", "backward-none"};

bool case_in_group(const std::string& name, const std::string& group) {
  if (group == "all" || group == name) return true;
  const bool backward = name.rfind("backward-", 0) == 0;
  return group == (backward ? "backward" : "forward");
}

// --cases, checked: each comma-separated item a group or a case name.
std::string parse_cases(const std::string& text) {
  for (std::size_t begin = 0; begin <= text.size();) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    const bool known = item == "all" || item == "forward" || item == "backward" ||
                       std::find(kCaseNames.begin(), kCaseNames.end(), item) != kCaseNames.end();
    if (!known) {
      throw UsageError(
          "option '--cases': expected all, forward, backward or case names comma separated "
          "(forward-none, forward-all, recurrent, backward-all, backward-t_inv, "
          "backward-none); given '" +
          text + "' ('" + item + "' is none of them)");
    }
    begin = end + 1;
  }
  return text;
}

bool case_selected(const std::string& cases, const std::string& name) {
  for (std::size_t begin = 0; begin <= cases.size();) {
    const std::size_t end = std::min(cases.find(',', begin), cases.size());
    if (case_in_group(name, cases.substr(begin, end - begin))) return true;
    begin = end + 1;
  }
  return false;
}

// fp32 tolerance of the checks (docs/numerics.md).
constexpr double kTolerance = 1e-4;
// With bf16 operands, times the error of the reference rounded to bf16 (docs/numerics.md).
constexpr double kOperandFactor = 6;

// One measured case: `setup` allocates its outputs (and runs whatever untimed work it needs),
// `run` is what is timed, `check` compares with the float64 reference and returns the error,
// `teardown` frees what setup allocated.
struct Case {
  std::string op, impl, residuals;
  Residuals kept = Residuals::none;
  double flops = 0;
  std::int64_t residual_bytes = 0;
  double tolerance = kTolerance;
  std::function<void()> setup, run, teardown;
  std::function<double()> check;
};

// The largest normalised error of float32 tensors against their float64 references.
double max_error(const std::vector<std::pair<const Tensor*, const Tensor*>>& pairs) {
  double worst = 0;
  for (const auto& pair : pairs) {
    // Named copies: clang 14 cannot capture structured bindings in a lambda.
    const Tensor* x = pair.first;
    const Tensor* ref = pair.second;
    const double e = bench::error_stats(
                         x->numel(), [&](std::int64_t i) { return element_value(*x, i); },
                         [&](std::int64_t i) { return ref->data<double>()[i]; })
                         .normalized();
    worst = std::max(worst, e);
  }
  return worst;
}

// Gradients shaped and typed like the inputs (what a framework would pass to the backward).
BackwardResult allocate_grads(const ForwardInputs& in, const ForwardShape& shape) {
  BackwardResult r;
  r.dq = Tensor(in.q.dtype, in.q.rank, in.q.sizes);
  r.dk = Tensor(in.k.dtype, in.k.rank, in.k.sizes);
  r.dv = Tensor(in.v.dtype, in.v.rank, in.v.sizes);
  r.dg = Tensor(DType::f32, in.g.rank, in.g.sizes);
  r.dbeta = Tensor(DType::f32, in.beta.rank, in.beta.sizes);
  r.d_initial_state = Tensor(DType::f32, 4, shape.state_sizes());
  return r;
}

}  // namespace

int bench_command(int argc, char** argv) {
  // --op picks the benchmark; each parses its own options.
  std::string op = "core";
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--op" && i + 1 < argc) op = argv[i + 1];
    if (arg.rfind("--op=", 0) == 0) op = arg.substr(5);
  }
  if (op == "layer") return bench_layer_command(argc, argv);
  if (op == "conv") return bench_conv_command(argc, argv);
  if (op == "step") return bench_step_command(argc, argv);
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "--suite") return bench_suite_command(argc, argv);
  }
  const Args args(kOptions, argc, argv, 2);
  args.choice("op", "core", {"core", "layer", "conv", "step"});
  if (args.flag("help")) {
    std::printf(kBenchHelp, describe_options(kOptions).c_str(), noise_help().c_str());
    return 0;
  }
  const std::int64_t tokens = parse_tokens(args, 8192);
  const std::int64_t seqs = args.integer("seqs", 1, 1, 4096);
  const std::int64_t hk = args.integer("hk", 16, 1, 1024);
  const std::int64_t hv = args.integer("hv", 32, 1, 4096);
  const std::int64_t dk = args.integer("dk", 128, 1, 256);
  const std::int64_t dv = args.integer("dv", 128, 1, 256);
  const int requested_chunk = static_cast<int>(args.integer("chunk-size", 0, 0, 256));
  const int repeats = static_cast<int>(args.integer("repeats", 5, 1, 1000));
  int threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  const bool json = args.flag("json");
  const std::string which = parse_cases(args.text("cases", "all"));
  if (hv % hk != 0) {
    throw UsageError("option '--hv': expected a multiple of --hk = " + std::to_string(hk) +
                     ", given " + std::to_string(hv));
  }
  const CpuIsa isa = resolve_cpu_isa(isa_option(args));
  if (threads == 0) threads = default_threads();
  const std::string dtype_arg = args.choice("dtype", "f32", {"f32", "bf16", "f16"});
  const DType dtype = dtype_arg == "bf16"  ? DType::bf16
                      : dtype_arg == "f16" ? DType::f16
                                           : DType::f32;
  const int chunk =
      requested_chunk != 0 ? requested_chunk : planned_chunk_size(hk, hv, dk, dv, dtype, isa);

  const std::string matmul_arg = args.choice("matmul", "compute", {"compute", "bf16", "both"});
  const bool both = matmul_arg == "both";
  const MatmulPrecision matmul =
      matmul_arg == "bf16" || both ? MatmulPrecision::bf16 : MatmulPrecision::compute;
  std::FILE* info = json ? stderr : stdout;
  std::fprintf(info,
               "gdn bench: Hk=%lld Hv=%lld Dk=%lld Dv=%lld, %lld x %lld tokens, %s, chunk %d%s, "
               "l2norm%s\n",
               static_cast<long long>(hk), static_cast<long long>(hv), static_cast<long long>(dk),
               static_cast<long long>(dv), static_cast<long long>(seqs),
               static_cast<long long>(tokens),
               dtype == DType::f32 ? "f32"
               : both ? ("f32 then " + dtype_arg + " activations, float32 state").c_str()
                      : (dtype_arg + " activations, float32 state").c_str(),
               chunk, requested_chunk == 0 ? " (the tiling plan's)" : "",
               matmul != MatmulPrecision::bf16 ? ""
               : isa == CpuIsa::avx512_bf16
                   ? (both ? ", float32 then bf16 matrix operands (vdpbf16ps, float32 accumulation)"
                           : ", bf16 matrix operands (vdpbf16ps, float32 accumulation)")
                   : (both ? ", float32 then bf16 matrix operands (emulated: rounded on float32 "
                             "registers)"
                           : ", bf16 matrix operands (emulated: rounded on float32 registers)"));
  std::fprintf(info, "machine: %s; ISA %s; %d thread%s\n", cpu_model_name().c_str(),
               cpu_isa_name(isa), threads, threads == 1 ? "" : "s");

  CoreBenchConfig config;
  config.tokens = tokens;
  config.seqs = seqs;
  config.hk = hk;
  config.hv = hv;
  config.dk = dk;
  config.dv = dv;
  config.chunk = chunk;
  config.repeats = repeats;
  config.threads = threads;
  config.isa = isa;
  config.dtype = dtype;
  config.matmul = matmul;
  config.cases = which;
  config.json = json;
  config.info = info;
  config.breakdown = args.flag("breakdown");
  if (!both) return run_core_bench(config, nullptr);

  // One process, inputs from one seed, the float32 pass first: the ratio a host's drift
  // disturbs least. The first pass is always the float32 forward (float32 activations too).
  std::vector<CoreCaseResult> f32_rows, bf16_rows;
  NoiseWatch noise(isa);
  config.noise = &noise;
  config.matmul = MatmulPrecision::compute;
  config.dtype = DType::f32;
  if (!json) std::printf("\n-- float32 activations, float32 matrix operands --\n");
  if (run_core_bench(config, &f32_rows) != 0) return 1;
  config.matmul = MatmulPrecision::bf16;
  config.dtype = dtype;
  if (!json) std::printf("\n-- %s activations, bf16 matrix operands --\n", dtype_arg.c_str());
  if (run_core_bench(config, &bf16_rows) != 0) return 1;
  std::FILE* out = json ? stderr : stdout;
  std::fprintf(out, "\nbf16 matrix operands (%s activations) vs float32, same run (median):\n",
               dtype_arg.c_str());
  for (const CoreCaseResult& b : bf16_rows) {
    for (const CoreCaseResult& f : f32_rows) {
      if (f.op != b.op || f.impl != b.impl || f.residuals != b.residuals || f.impl != "chunked") {
        continue;
      }
      const double ratio = f.timing.median_ms / b.timing.median_ms;
      std::fprintf(out, "  %-8s %-8s %-6s %8.2f ms vs %8.2f ms: %.2fx %s\n", b.op.c_str(),
                   b.impl.c_str(), b.residuals.c_str(), b.timing.median_ms, f.timing.median_ms,
                   ratio >= 1 ? ratio : 1 / ratio, ratio >= 1 ? "faster" : "SLOWER");
    }
  }
  noise.warn(info, "gdn bench");
  return 0;
}

int run_core_bench(const CoreBenchConfig& config, std::vector<CoreCaseResult>* results) {
  const std::int64_t tokens = config.tokens, seqs = config.seqs, hk = config.hk, hv = config.hv,
                     dk = config.dk, dv = config.dv;
  const int chunk = config.chunk, repeats = config.repeats, threads = config.threads;
  const CpuIsa isa = config.isa;
  bool any_backward = false;
  for (const std::string& name : kCaseNames) {
    any_backward =
        any_backward || (name.rfind("backward-", 0) == 0 && case_selected(config.cases, name));
  }
  const bool json = config.json;
  std::FILE* info = config.info;
  const std::int64_t total = tokens * seqs;
  const DType dtype = config.dtype;

  // Inputs: q, k, v uniform in [-1, 1) (normalised in the kernel), g in [-2, 0) (decays
  // between 0.14 and 1 per token), beta in [0, 1); the cotangent d_o uniform in [-1, 1).
  // 16-bit activations: the same values rounded to the type.
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
  Tensor d_o;
  if (any_backward) {
    d_o = Tensor(DType::f32, {total, hv, dv});
    for (std::int64_t i = 0; i < d_o.numel(); ++i) {
      d_o.data<float>()[i] = static_cast<float>(rng.uniform(-1, 1));
    }
    d_o = rounded_to(std::move(d_o), dtype);
  }
  q = rounded_to(std::move(q), dtype);
  k = rounded_to(std::move(k), dtype);
  v = rounded_to(std::move(v), dtype);
  const ForwardInputs inputs{q.view(), k.view(), v.view(), g.view(), beta.view(), {}, cu.view()};

  ForwardOptions base;
  base.use_qk_l2norm = true;
  base.chunk_size = chunk;
  base.threads = threads;
  base.isa = isa;
  base.matmul_precision = config.matmul;
  const bool bf16_operands = config.matmul == MatmulPrecision::bf16;
  const ForwardShape shape = forward_shape(inputs, base);

  // The check slice: the first tokens of sequence 0, key head 0 and its value heads.
  const std::int64_t group = hv / hk;
  const std::int64_t check_tokens = std::min<std::int64_t>(tokens, 3 * chunk + 5);
  auto slice_of = [&](const Tensor& x, std::int64_t heads, std::int64_t dim) {
    return TensorView(x.raw(), x.dtype(), 3, Dims{check_tokens, heads, dim, 0},
                      Dims{x.sizes()[1] * dim, dim, 1, 0});
  };
  const ForwardInputs slice{slice_of(q, 1, dk),
                            slice_of(k, 1, dk),
                            slice_of(v, group, dv),
                            TensorView(g.data<float>(), {check_tokens, group}, {hv, 1}),
                            TensorView(beta.data<float>(), {check_tokens, group}, {hv, 1}),
                            {},
                            {}};
  progress("  float64 reference on the check slice...");
  const ForwardResult reference = ref::recurrent_fwd(slice, base);
  BackwardInputs slice_bwd;
  BackwardResult reference_grads;
  if (any_backward) {
    slice_bwd = {slice.q, slice.k, slice.v, slice.g, slice.beta, {}, {}, slice_of(d_o, group, dv),
                 {},      {},      {}};
    reference_grads = ref::recurrent_bwd(slice_bwd, base);
  }
  progress("%s", "");
  // 16-bit outputs: the rounding they cannot avoid, twice, on top of the float32 tolerance.
  // bf16 operands: 6 times the error of the reference rounded to bf16, for every output
  // (docs/numerics.md, "bf16 matrix operands").
  auto operand_term = [&](const Tensor& r) {
    return bf16_operands ? kOperandFactor * rounding_error(r, DType::bf16) : 0.0;
  };
  const double forward_tolerance =
      kTolerance + 2 * rounding_error(reference.o, dtype) + operand_term(reference.o);
  double backward_tolerance = kTolerance;
  if (any_backward) {
    for (const Tensor* r : {&reference_grads.dq, &reference_grads.dk, &reference_grads.dv}) {
      backward_tolerance = std::max(backward_tolerance,
                                    kTolerance + 2 * rounding_error(*r, dtype) + operand_term(*r));
    }
    for (const Tensor* r :
         {&reference_grads.dg, &reference_grads.dbeta, &reference_grads.d_initial_state}) {
      backward_tolerance = std::max(backward_tolerance, kTolerance + operand_term(*r));
    }
  }

  // Every case writes into its own outputs, allocated for the case and freed after it (what a
  // framework would pass in), so that its peak RSS is inputs + its outputs + workspaces.
  ForwardResult fwd_out;
  BackwardResult grads;
  std::vector<Case> cases;
  auto forward_case = [&](const char* impl, Algorithm algorithm, Residuals kept) {
    Case c;
    c.op = "forward";
    c.impl = impl;
    c.residuals = kept == Residuals::all ? "all" : "none";
    c.kept = kept;
    c.residual_bytes = residual_bytes(shape, kept);
    c.flops = algorithm == Algorithm::chunked
                  ? bench::over_chunks(
                        tokens, seqs, hv, chunk,
                        [&](double n) { return bench::chunked_forward_flops_per_chunk(n, dk, dv); })
                  : bench::recurrent_forward_flops(total, hv, dk, dv);
    c.tolerance = forward_tolerance;
    ForwardOptions options = base;
    options.algorithm = algorithm;
    // The token recurrence has no matrix products (and takes no bf16 operands).
    if (algorithm == Algorithm::recurrent) options.matmul_precision = MatmulPrecision::compute;
    c.setup = [&, kept]() {
      fwd_out = ForwardResult{};
      fwd_out.o = Tensor(dtype, 3, shape.o_sizes());
      fwd_out.final_state = Tensor(DType::f32, 4, shape.state_sizes());
      if (kept == Residuals::all) {
        fwd_out.chunk_states = Tensor(DType::f32, 4, shape.chunk_states_sizes());
        fwd_out.t_inv = Tensor(DType::f32, 4, shape.t_inv_sizes());
      }
    };
    c.run = [&, options]() {
      chunk_gated_delta_rule_fwd(
          inputs,
          {fwd_out.o.mutable_view(), fwd_out.final_state.mutable_view(),
           fwd_out.chunk_states.mutable_view(), fwd_out.t_inv.mutable_view()},
          options);
    };
    c.check = [&]() {
      const double* r = reference.o.data<double>();
      const std::int64_t row = group * dv;
      return bench::error_stats(
                 check_tokens * row,
                 [&](std::int64_t i) {
                   return element_value(fwd_out.o, (i / row) * hv * dv + i % row);
                 },
                 [&](std::int64_t i) { return r[i]; })
          .normalized();
    };
    c.teardown = [&]() { fwd_out = ForwardResult{}; };
    cases.push_back(std::move(c));
  };
  auto backward_case = [&](Residuals kept) {
    Case c;
    c.op = "backward";
    c.impl = "chunked";
    c.residuals = kept == Residuals::all ? "all" : kept == Residuals::t_inv ? "t_inv" : "none";
    c.kept = kept;
    c.residual_bytes = residual_bytes(shape, kept);
    c.tolerance = backward_tolerance;
    c.flops = bench::over_chunks(tokens, seqs, hv, chunk, [&](double n) {
      return bench::chunked_backward_flops_per_chunk(n, dk, dv) +
             (kept == Residuals::all
                  ? 0.0
                  : bench::rebuild_flops_per_chunk(n, dk, dv, kept == Residuals::none));
    });
    c.setup = [&, kept]() {
      // The residuals of this policy, by an untimed forward.
      ForwardOptions options = base;
      options.algorithm = Algorithm::chunked;
      fwd_out = chunk_gated_delta_rule_fwd(inputs, options, kept);
      fwd_out.o = Tensor{};
      grads = allocate_grads(inputs, shape);
    };
    c.run = [&]() {
      const BackwardInputs in{q.view(),
                              k.view(),
                              v.view(),
                              g.view(),
                              beta.view(),
                              {},
                              cu.view(),
                              d_o.view(),
                              {},
                              fwd_out.chunk_states.view(),
                              fwd_out.t_inv.view()};
      chunk_gated_delta_rule_bwd(in,
                                 {grads.dq.mutable_view(), grads.dk.mutable_view(),
                                  grads.dv.mutable_view(), grads.dg.mutable_view(),
                                  grads.dbeta.mutable_view(), grads.d_initial_state.mutable_view()},
                                 base);
    };
    c.check = [&, kept]() {
      // The same policy on the slice (its own residuals), against the reference backward.
      ForwardOptions options = base;
      options.algorithm = Algorithm::chunked;
      const ForwardResult res = chunk_gated_delta_rule_fwd(slice, options, kept);
      BackwardInputs in = slice_bwd;
      in.chunk_states = res.chunk_states.view();
      in.t_inv = res.t_inv.view();
      const BackwardResult r = chunk_gated_delta_rule_bwd(in, base);
      return max_error({{&r.dq, &reference_grads.dq},
                        {&r.dk, &reference_grads.dk},
                        {&r.dv, &reference_grads.dv},
                        {&r.dg, &reference_grads.dg},
                        {&r.dbeta, &reference_grads.dbeta},
                        {&r.d_initial_state, &reference_grads.d_initial_state}});
    };
    c.teardown = [&]() {
      fwd_out = ForwardResult{};
      grads = BackwardResult{};
    };
    cases.push_back(std::move(c));
  };
  const auto selected = [&](const char* name) { return case_selected(config.cases, name); };
  if (selected("forward-none")) forward_case("chunked", Algorithm::chunked, Residuals::none);
  if (selected("forward-all")) forward_case("chunked", Algorithm::chunked, Residuals::all);
  if (selected("recurrent")) forward_case("recurrent", Algorithm::recurrent, Residuals::none);
  if (selected("backward-all")) backward_case(Residuals::all);
  if (selected("backward-t_inv")) backward_case(Residuals::t_inv);
  if (selected("backward-none")) backward_case(Residuals::none);

  double peak = config.peak_gflops;
  if (!(peak > 0)) {
    progress("  measuring the fp32 FMA peak...");
    peak = cpu::measure_fma_peak_gflops(isa, threads);
    progress("%s", "");
    std::fprintf(info, "fp32 FMA peak, measured now (%s, %d thread%s): %.1f GFLOP/s\n",
                 cpu_isa_name(isa), threads, threads == 1 ? "" : "s", peak);
    if (bf16_operands) {
      // % peak stays the fp32 one; this is the ceiling the bf16-operand products could reach.
      // Where the CPU has vdpbf16ps but this run emulates, its peak says why the automatic
      // choice left it out (cpu::bf16_dot_runs_at_full_rate).
      const CpuIsa dot_isa = isa != CpuIsa::avx512_bf16 && cpu_isa_available(CpuIsa::avx512_bf16)
                                 ? CpuIsa::avx512_bf16
                                 : isa;
      const double dot = cpu::measure_bf16_dot_peak_gflops(dot_isa, threads);
      if (dot > 0) {
        std::fprintf(info,
                     "bf16 dot peak (vdpbf16ps), measured now (%s, %d thread%s): %.1f "
                     "GFLOP/s%s\n",
                     cpu_isa_name(dot_isa), threads, threads == 1 ? "" : "s", dot,
                     dot_isa == isa ? ""
                     : cpu::bf16_dot_runs_at_full_rate()
                         ? " (not used by this run; --isa avx512_bf16 runs it)"
                         : " (not used by this run: vdpbf16ps issues half as often as an FMA "
                           "on this CPU, so the automatic choice emulates; --isa avx512_bf16 "
                           "runs it)");
      }
    }
  }
  NoiseWatch own_noise(isa);
  NoiseWatch& noise = config.noise != nullptr ? *config.noise : own_noise;
  // A caller that gives both the watch and the peak has started the watch itself (the suite:
  // its watch then holds the peak measured after the previous case, the newer one).
  if (config.noise == nullptr || !(config.peak_gflops > 0)) noise.start(threads, peak);

  std::vector<Timing> timings;
  std::vector<CoreCaseResult> breakdowns;
  std::vector<std::string> rows;
  for (const Case& c : cases) {
    reset_peak_rss();
    c.setup();
    c.run();  // the warm-up run
    const double error = c.check();
    std::fprintf(info,
                 "check: %s %s, residuals %s, vs float64 reference (%lld tokens x %lld heads): "
                 "error %.2e (tolerance %.1e) %s\n",
                 c.op.c_str(), c.impl.c_str(), c.residuals.c_str(),
                 static_cast<long long>(check_tokens), static_cast<long long>(group), error,
                 c.tolerance, error <= c.tolerance ? "PASS" : "FAIL");
    if (!(error <= c.tolerance)) {
      std::fprintf(stderr,
                   "gdn bench: the %s %s result does not match the float64 reference; not timing "
                   "it\n",
                   c.op.c_str(), c.impl.c_str());
      return 1;
    }
    const std::string label = c.op + " " + c.impl + " (residuals " + c.residuals + ")";
    Timing t = time_runs(c.run, repeats, label);
    t.peak_rss = peak_rss_bytes();
    const NoiseVerdict verdict = noise.judge(label, t);
    const double us_per = t.median_ms * 1e3 / static_cast<double>(total * hv);
    const double gflops = c.flops / (t.median_ms * 1e-3) * 1e-9;
    CoreCaseResult result;
    result.op = c.op;
    result.impl = c.impl;
    result.residuals = c.residuals;
    result.timing = t;
    result.flops = c.flops;
    result.us_per_token_head = us_per;
    result.gflops = gflops;
    result.peak_gflops = peak;
    result.check_error = error;
    result.residual_bytes = c.residual_bytes;
    result.noise = noise.last();
    result.verdict = verdict;
    if (config.breakdown && c.impl == "chunked") {
      progress("  %s %s (residuals %s): one more run, profiled", c.op.c_str(), c.impl.c_str(),
               c.residuals.c_str());
      cpu::StageProfile profile;
      {
        const cpu::ScopedStageProfile scope(&profile);
        const std::int64_t start = cpu::stage_clock_ns();
        c.run();
        result.profiled_ms = static_cast<double>(cpu::stage_clock_ns() - start) * 1e-6;
      }
      progress("%s", "");
      for (const auto& ns : profile.ns) result.stage_ms.push_back(static_cast<double>(ns) * 1e-6);
    }
    c.teardown();
    timings.push_back(t);
    breakdowns.push_back(result);
    if (results != nullptr) results->push_back(result);
    if (json) {
      std::printf(
          "{\"op\": \"%s\", \"impl\": \"%s\", \"residuals\": \"%s\", \"dtype\": \"%s\", "
          "\"matmul\": \"%s\", \"isa\": \"%s\", \"threads\": %d, \"tokens\": %lld, \"seqs\": %lld, "
          "\"hk\": %lld, "
          "\"hv\": %lld, \"dk\": %lld, \"dv\": %lld, \"chunk_size\": %d, \"repeats\": %d, "
          "\"median_ms\": %.4f, \"min_ms\": %.4f, \"max_ms\": %.4f, \"us_per_token_head\": %.5f, "
          "\"gflops\": %.2f, \"peak_gflops\": %.2f, \"pct_peak\": %.2f, \"residual_bytes\": %lld, "
          "\"peak_rss_bytes\": %lld, \"check_error\": %.3e, %s%s%s}\n",
          (c.op == "backward" ? "backward-" + c.residuals : c.op).c_str(), c.impl.c_str(),
          c.residuals.c_str(), dtype_name(dtype),
          matmul_precision_name(c.impl == "recurrent" ? MatmulPrecision::compute : config.matmul),
          cpu_isa_name(isa), threads, static_cast<long long>(tokens), static_cast<long long>(seqs),
          static_cast<long long>(hk), static_cast<long long>(hv), static_cast<long long>(dk),
          static_cast<long long>(dv), chunk, repeats, t.median_ms, t.min_ms, t.max_ms, us_per,
          gflops, peak, 100 * gflops / peak, static_cast<long long>(c.residual_bytes),
          static_cast<long long>(t.peak_rss), error, noise_json(result.noise, verdict).c_str(),
          result.stage_ms.empty() ? "" : ", \"stages_ms\": ",
          result.stage_ms.empty() ? "" : breakdown_json(result).c_str());
    } else {
      char range[64], row[256];
      std::snprintf(range, sizeof range, "(%.2f - %.2f)", t.min_ms, t.max_ms);
      std::snprintf(row, sizeof row,
                    "%-9s %-10s %-6s %11.2f %21s %12.3f %9.1f %6.1f%% %14.1f %13.1f%s\n",
                    c.op.c_str(), c.impl.c_str(), c.residuals.c_str(), t.median_ms, range, us_per,
                    gflops, 100 * gflops / peak, static_cast<double>(c.residual_bytes) / (1 << 20),
                    static_cast<double>(t.peak_rss) / (1 << 20), verdict.noisy ? "  noisy" : "");
      rows.push_back(row);
    }
    std::fflush(stdout);
  }
  if (!json && config.table) {
    std::printf("\n%-9s %-10s %-6s %11s %21s %12s %9s %7s %14s %13s\n", "op", "impl", "resid",
                "median ms", "(min - max)", "us/tok*head", "GFLOP/s", "% peak", "residual MiB",
                "peak RSS MiB");
    for (const std::string& row : rows) std::fputs(row.c_str(), stdout);
    std::printf("\n");
    auto median_of = [&](const char* pass, const char* impl, const char* residuals) {
      for (std::size_t i = 0; i < cases.size(); ++i) {
        if (cases[i].op == pass && cases[i].impl == impl && cases[i].residuals == residuals) {
          return timings[i].median_ms;
        }
      }
      return 0.0;
    };
    const double fwd = median_of("forward", "chunked", "none");
    const double fwd_res = median_of("forward", "chunked", "all");
    const double rec = median_of("forward", "recurrent", "none");
    const double bwd = median_of("backward", "chunked", "all");
    if (fwd > 0 && rec > 0) {
      std::printf("chunked forward vs token recurrence: %.2fx %s (median)\n",
                  std::max(rec / fwd, fwd / rec), fwd <= rec ? "faster" : "SLOWER");
    }
    if (bwd > 0 && fwd_res > 0) {
      std::printf("backward from full residuals: %.2fx the forward that keeps them (median)\n",
                  bwd / fwd_res);
    }
    std::printf(
        "us/tok*head is wall time / (tokens x value heads) with %d thread%s; per core "
        "multiply by %d.\n",
        threads, threads == 1 ? "" : "s", threads);
    for (const CoreCaseResult& r : breakdowns) print_breakdown(stdout, config, r);
  }
  if (config.noise == nullptr) noise.warn(info, "gdn bench");
  return 0;
}

}  // namespace gdn::cli
