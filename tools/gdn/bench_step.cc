// bench_step.cc: `gdn bench --op step`, one serving step of the fused layer op over pools of
// state slots (gdn/step.h): decode batches (beside a copy of the same states, their floor),
// speculative windows, prefills and mixed batches. Validate, then time, as `gdn bench` does
// (bench_command.cc).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "args.h"
#include "bench/error_stats.h"
#include "bench_cases.h"
#include "bench_step_data.h"
#include "bench_util.h"
#include "commands.h"
#include "gdn/gdn.h"
#include "gdn/step.h"
#include "inputs.h"
#include "sysinfo.h"

namespace gdn::cli {

const char* const kBenchStepHelp = R"HELP(usage: gdn bench --op step [options]

Times one serving step of the fused layer op (gdn::fused_gdn_step, float32 compute; --dtype
bf16 for bf16 activations, --pools bf16 for bf16 state pools; conv K = 4): a batch of
sequences over pools of state slots, each sequence reading its conv and recurrent state from
its slot (when it has history) and writing its new states back, as an inference engine calls
the layer at every step. For each preset: the step's median latency with min and
max (us), live tokens per second, and GB/s: the bytes the step must move at least (each
recurrent and conv state it reads once and writes once, the qkv, a, b rows it reads and the
out rows it writes) over the median. For the batches without prefills (decodes and
speculative windows, bound by memory) the same run also times a copy of the batch's
recurrent states from one buffer into another (the same threads): copy GB/s, and the step's
GB/s as a percentage of it (in --json: copy_gbps and vs_copy, that percentage; both null for
batches with prefills).

--pools f32,bf16 steps each preset over both kinds of pools in the same run: every round
times the float32 pools' step, then the bf16 pools' (--repeats each), and a pool's figure is
its lowest median of the --rounds rounds; a line per preset gives the speed-up of the bf16
pools (float32 median over bf16 median; in --json: speedup_vs_f32_pools on the bf16 line).

Timed repeats step the same batch again and again, updating the pools in place (the states
stay bounded: the gates decay). Before timing, the first run of every preset, on fresh pools,
is checked against the float64 reference (gdn::ref::fused_gdn_step) on a slice of the same
problem: key head 0 and its value heads, every sequence, every token, every slot; slots that
a sequence writes without reading hold NaN before the step. A failed check stops the
benchmark (exit 1).

presets (slot 0 is the null slot; decodes have a history of 4096 tokens):
%s
models (conv K = 4, no conv bias, Dk = Dv = 128):
  qwen3-next     Hk = 16, Hv = 32, D = 8192 (default)
  qwen3.5-397b   Hk = 16, Hv = 64, D = 12288
--hk, --hv, --dk, --dv give another shape (instead of --model).

options:
%s
%s
A step reports no %% of peak, so its noise is judged without the peak check; a batch without
prefills is judged with the copy of its states, its baseline.

examples:
  gdn bench --op step
  gdn bench --op step --preset decode-1,decode-256 --threads 1
  gdn bench --op step --model qwen3.5-397b --json > step.jsonl
  gdn bench --op step --preset decode-64,spec-64x4 --pools bf16
  gdn bench --op step --preset decode-16,decode-64 --dtype bf16 --pools f32,bf16 --rounds 5
)HELP";

namespace {

using namespace step_bench;

const Model kModels[] = {{"qwen3-next", 16, 32, 128, 128}, {"qwen3.5-397b", 16, 64, 128, 128}};

const Preset kPresets[] = {
    {"decode-1", "1 decode", 1, 1, {}, 0, 0},
    {"decode-8", "8 decodes", 8, 1, {}, 0, 0},
    {"decode-16", "16 decodes", 16, 1, {}, 0, 0},
    {"decode-64", "64 decodes", 64, 1, {}, 0, 0},
    {"decode-256", "256 decodes", 256, 1, {}, 0, 0},
    {"decode-64-of-512", "64 decodes at random slots of a pool of 512", 64, 1, {}, 0, 512},
    {"spec-64x4",
     "64 speculative decode windows of 4 tokens (num_spec 3), each reading slot "
     "state_indices + s % 4 of its 4",
     64,
     4,
     {},
     0,
     0},
    {"prefill-4x512",
     "4 fresh prefills of 512 tokens",
     0,
     1,
     {{512, 0}, {512, 0}, {512, 0}, {512, 0}},
     0,
     0},
    {"mixed-8",
     "8 decodes + fresh prefills of 128 and 128 + a continued prefill of 256 (history 1024), "
     "padded to 16 sequences and 768 tokens",
     8,
     1,
     {{128, 0}, {128, 0}, {256, 1024}},
     5,
     0},
    {"mixed-64-of-512",
     "64 decodes + prefills as mixed-8, at random slots of a pool of 512, no padding",
     64,
     1,
     {{128, 0}, {128, 0}, {256, 1024}},
     0,
     512},
};

// "  name              what", `what` wrapped at 96 columns.
std::string preset_list() {
  std::string text;
  for (const Preset& p : kPresets) {
    char name[32];
    std::snprintf(name, sizeof name, "  %-17s", p.name);
    std::string line = name;
    const std::string what = p.what;
    std::size_t start = 0;
    while (start < what.size()) {
      std::size_t end = std::min(what.find(' ', start), what.size());
      const std::string word = what.substr(start, end - start);
      if (line.size() + 1 + word.size() > 96) {
        text += line + "\n";
        line = std::string(19, ' ');
      }
      line += " " + word;
      start = end + 1;
    }
    text += line + "\n";
  }
  return text;
}

const std::vector<OptionSpec> kStepOptions = {
    {"op", "OP", "step (this benchmark); core, layer or conv for the others"},
    {"preset", "LIST", "all or presets, comma separated (default all)"},
    {"model", "M", "qwen3-next, qwen3.5-397b or all (default qwen3-next)"},
    {"hk", "HK", "query/key heads (another shape, with --hv, --dk, --dv)"},
    {"hv", "HV", "value heads, a multiple of HK"},
    {"dk", "DK", "key head dim, 1 to 256"},
    {"dv", "DV", "value head dim, 1 to 256"},
    {"threads", "N", "worker threads, 0 = all cores (default 0)"},
    {"repeats", "R", "timed steps per preset and round after the checked first one (default 20)"},
    {"rounds", "R", "timed rounds per preset; with --pools f32,bf16 they alternate (default 1)"},
    {"isa", "ISA", "CPU variant: auto, generic, avx2, avx512 or avx512_bf16 (default auto)"},
    {"dtype", "T", "activations (qkv, a, b, out): f32 or bf16 (default f32)"},
    {"pools", "LIST",
     "f32, bf16 or f32,bf16 (both, compared): the state pools' dtype (default f32; bf16: each "
     "state rounded once as it is written, gdn/step.h)"},
    {"json", nullptr, "print one JSON object per preset and nothing else on stdout"},
    {"help", nullptr, "show this help"},
};

// fp32 tolerance of the checks (docs/numerics.md). A bf16 slot or out row adds twice the error of
// the reference's own values rounded to bf16 (the one rounding it carries more).
constexpr double kTolerance = 1e-4;

// Copies the states at `from` (one pointer per state, `bytes` each) into `to`, back to back,
// with up to `threads` threads, each copying its share of the bytes of every state (one thread
// when small, where starting threads would cost more than the copy).
void parallel_copy(void* to, const std::vector<const void*>& from, std::int64_t bytes,
                   int threads) {
  const auto states = static_cast<std::int64_t>(from.size());
  const std::int64_t parts =
      std::clamp<std::int64_t>(states * bytes / (std::int64_t{4} << 20), 1, std::max(threads, 1));
  const std::int64_t piece = (bytes / parts + 63) / 64 * 64;
  auto copy_part = [&](std::int64_t p) {
    const std::int64_t begin = std::min(bytes, p * piece), end = std::min(bytes, begin + piece);
    for (std::int64_t s = 0; s < states; ++s) {
      std::memcpy(static_cast<std::byte*>(to) + s * bytes + begin,
                  static_cast<const std::byte*>(from[static_cast<std::size_t>(s)]) + begin,
                  static_cast<std::size_t>(end - begin));
    }
  };
  std::vector<std::thread> workers;
  for (std::int64_t p = 1; p < parts; ++p) workers.emplace_back(copy_part, p);
  copy_part(0);
  for (std::thread& w : workers) w.join();
}

// One preset's step over one kind of pools, on fresh pools: checked against the float64
// reference (the check line on `info`), then timed, round by round; batches without prefills
// also time a copy of their states.
struct StepMeasurement {
  StepData d;
  Tensor conv16, rec16;  // bf16 pools (--pools bf16), else absent
  Tensor out;
  std::string label;
  Timing timing;  // the round with the lowest median; min and max over every round
  double error = 0, gbps = 0, copy_gbps = 0;
  std::int64_t bytes = 0;
  NoiseFigures noise;  // with a watch: the step's figures and the verdict (with its copy's)
  NoiseVerdict verdict;

  bool bf16_pools() const { return rec16.present(); }
  StatePools pools() {
    return bf16_pools() ? StatePools{conv16.mutable_view(), rec16.mutable_view()} : d.pools();
  }
  void run() { fused_gdn_step(d.inputs(), pools(), out.mutable_view(), d.options); }
};

// Makes the preset's problem and runs its checked first step (also the warm-up): 1 when the
// check fails (said on stderr).
int prepare_step(const Preset& p, const Model& m, int threads, CpuIsa isa, DType dtype,
                 bool bf16_pools, std::FILE* info, StepMeasurement* result) {
  result->label = m.name + " " + p.name + (bf16_pools ? ", bf16 pools" : "");
  const std::string& label = result->label;
  progress("  %s: generating inputs...", label.c_str());
  result->d = make_step(p, m, threads, isa, dtype, 20261202);
  StepData& d = result->d;
  if (bf16_pools) {
    result->conv16 = bf16_copy(d.conv_state);
    result->rec16 = bf16_copy(d.recurrent_state);
  }
  progress("  %s: float64 reference on the check slice...", label.c_str());
  StepData s = slice_of(d);
  const Tensor ref_out = ref::fused_gdn_step(s.inputs(), s.pools(), s.options);
  progress("  %s: first step...", label.c_str());
  result->out = Tensor(dtype, {d.tokens, m.hv * m.dv});
  result->run();
  if (bf16_pools) {
    widen_into(result->conv16, d.conv_state);
    widen_into(result->rec16, d.recurrent_state);
  }
  Tensor out32(DType::f32, result->out.rank(), result->out.sizes());
  for (std::int64_t i = 0; i < out32.numel(); ++i)
    out32.data<float>()[i] = static_cast<float>(element_value(result->out, i));
  const double error = check_step(d, s, out32, ref_out);
  const double pools_rounding = bf16_pools
                                    ? std::max(rounding_error(s.conv_state, DType::bf16),
                                               rounding_error(s.recurrent_state, DType::bf16))
                                    : 0.0;
  const double tolerance =
      kTolerance + 2 * std::max(pools_rounding, rounding_error(ref_out, dtype));
  result->error = error;
  s = StepData{};
  progress("%s", "");
  std::fprintf(info,
               "check: %s vs float64 reference (%lld seqs, %lld tokens x %lld heads, "
               "%lld slots): error %.2e (tolerance %.1e) %s\n",
               label.c_str(), static_cast<long long>(d.seqs), static_cast<long long>(d.live_tokens),
               static_cast<long long>(m.hv / m.hk), static_cast<long long>(d.slots), error,
               tolerance, error <= tolerance ? "PASS" : "FAIL");
  if (!(error <= tolerance)) {
    std::fprintf(stderr,
                 "gdn bench: the step of preset %s does not match the float64 reference; not "
                 "timing it\n",
                 p.name);
    return 1;
  }
  return 0;
}

// `rounds` rounds, each timing `repeats` steps of every one of `steps` in turn (the same
// preset over other pools: alternating, so that a change of the machine's load falls on all).
void time_rounds(const std::vector<StepMeasurement*>& steps, int repeats, int rounds) {
  for (int round = 0; round < rounds; ++round) {
    for (StepMeasurement* sm : steps) {
      const Timing t = time_runs([&] { sm->run(); }, repeats, sm->label);
      Timing& best = sm->timing;
      if (round == 0) {
        best = t;
        continue;
      }
      const double lo = std::min(best.min_ms, t.min_ms), hi = std::max(best.max_ms, t.max_ms);
      if (t.median_ms < best.median_ms) best = t;
      best.min_ms = lo;
      best.max_ms = hi;
    }
  }
}

// After the rounds: the noise verdict, the bytes and GB/s, and for a batch without prefills,
// the copy of its states (its floor: the recurrent states it writes, from the pool into
// another buffer).
void finish_step(const Preset& p, const Model& m, int threads, int repeats, NoiseWatch* noise,
                 StepMeasurement* result) {
  const StepData& d = result->d;
  const Timing& t = result->timing;
  const bool bf16_pools = result->bf16_pools();
  if (noise != nullptr) {
    result->verdict = noise->judge(result->label, t);
    result->noise = noise->last();
  }
  // Bytes the step must move: states read and written, input rows, output rows.
  const std::int64_t channels = 2 * m.hk * m.dk + m.hv * m.dv;
  const std::int64_t pool_element = bf16_pools ? 2 : 4;
  const std::int64_t activation = static_cast<std::int64_t>(dtype_size(result->out.dtype()));
  const std::int64_t state_bytes = m.hv * m.dk * m.dv * pool_element;
  const std::int64_t conv_bytes = (kTaps - 1) * channels * pool_element;
  result->bytes = (d.states_read + d.states_written) * (state_bytes + conv_bytes) +
                  d.live_tokens * (channels + 2 * m.hv + m.hv * m.dv) * activation;
  result->gbps = static_cast<double>(result->bytes) / (t.median_ms * 1e-3) * 1e-9;
  if (!p.prefills.empty()) return;
  const std::int64_t copy_bytes = d.states_written * state_bytes;
  Tensor to(bf16_pools ? DType::bf16 : DType::f32, {d.states_written, m.hv, m.dk, m.dv});
  std::vector<const void*> from;  // the slots the step writes, where they are in the pool
  const auto* pool =
      static_cast<const std::byte*>(bf16_pools ? result->rec16.raw() : d.recurrent_state.raw());
  for (std::int64_t seq = 0; seq < d.decodes; ++seq) {
    const std::int64_t first = d.state_indices.data<std::int64_t>()[seq];
    for (std::int64_t w = 0; w <= d.options.num_spec; ++w) {
      from.push_back(pool + (first + w) * state_bytes);
    }
  }
  auto copy = [&] { parallel_copy(to.raw(), from, state_bytes, threads); };
  copy();  // warm-up
  const std::string label = result->label + " (copy of the states)";
  const Timing c = time_runs(copy, repeats, label);
  if (noise != nullptr) {
    result->verdict.add("its baseline, the copy of the states", noise->judge(label, c));
  }
  result->copy_gbps = 2.0 * static_cast<double>(copy_bytes) / (c.median_ms * 1e-3) * 1e-9;
}

int measure_step(const Preset& p, const Model& m, int threads, CpuIsa isa, int repeats,
                 std::FILE* info, NoiseWatch* noise, StepMeasurement* result) {
  if (prepare_step(p, m, threads, isa, DType::f32, false, info, result) != 0) return 1;
  time_rounds({result}, repeats, 1);
  finish_step(p, m, threads, repeats, noise, result);
  return 0;
}

}  // namespace

int bench_step_command(int argc, char** argv) {
  const Args args(kStepOptions, argc, argv, 2);
  if (args.flag("help")) {
    std::printf(kBenchStepHelp, preset_list().c_str(), describe_options(kStepOptions).c_str(),
                noise_help().c_str());
    return 0;
  }
  std::vector<const Preset*> presets;
  {
    const std::string list = args.text("preset", "all");
    std::size_t start = 0;
    while (start <= list.size()) {
      const std::size_t comma = std::min(list.find(',', start), list.size());
      const std::string name = list.substr(start, comma - start);
      start = comma + 1;
      if (name == "all") {
        for (const Preset& p : kPresets) presets.push_back(&p);
        continue;
      }
      const Preset* found = nullptr;
      for (const Preset& p : kPresets) found = name == p.name ? &p : found;
      if (found == nullptr) {
        std::string names = "all";
        for (const Preset& p : kPresets) names += std::string(", ") + p.name;
        throw UsageError("option '--preset': expected a comma-separated list of " + names +
                         "; given '" + name + "'");
      }
      presets.push_back(found);
    }
  }
  std::vector<Model> models;
  const bool custom = args.has("hk") || args.has("hv") || args.has("dk") || args.has("dv");
  if (custom) {
    if (args.has("model"))
      throw UsageError("option '--model' does not apply with --hk/--hv/--dk/--dv");
    Model m{"custom", args.integer("hk", 16, 1, 1024), args.integer("hv", 32, 1, 4096),
            args.integer("dk", 128, 1, 256), args.integer("dv", 128, 1, 256)};
    if (m.hv % m.hk != 0) {
      throw UsageError("option '--hv': expected a multiple of --hk = " + std::to_string(m.hk) +
                       ", given " + std::to_string(m.hv));
    }
    models.push_back(m);
  } else {
    const std::string name =
        args.choice("model", "qwen3-next", {"qwen3-next", "qwen3.5-397b", "all"});
    for (const Model& m : kModels) {
      if (name == "all" || name == m.name) models.push_back(m);
    }
  }
  int threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  const int repeats = static_cast<int>(args.integer("repeats", 20, 1, 100000));
  const bool json = args.flag("json");
  const CpuIsa isa = resolve_cpu_isa(isa_option(args));
  if (threads == 0) threads = default_threads();
  const int rounds = static_cast<int>(args.integer("rounds", 1, 1, 10000));
  const bool bf16 = args.choice("dtype", "f32", {"f32", "bf16"}) == "bf16";
  const DType dtype = bf16 ? DType::bf16 : DType::f32;
  const char* dtype_name = bf16 ? "bf16" : "f32";
  const std::string pools_arg =
      args.choice("pools", "f32", {"f32", "bf16", "f32,bf16", "bf16,f32"});
  std::vector<bool> bf16_pools;  // per kind of pools, in the order given
  for (std::size_t at = 0; at < pools_arg.size(); at += 4)
    bf16_pools.push_back(pools_arg[at] == 'b');
  const bool compare = bf16_pools.size() > 1;

  std::FILE* info = json ? stderr : stdout;
  std::fprintf(info,
               "gdn bench --op step: fused layer op step over state-slot pools, %s "
               "activations, %s pools, conv K = %lld, chunk 64\n",
               dtype_name, pools_arg.c_str(), static_cast<long long>(kTaps));
  std::fprintf(info, "machine: %s; ISA %s; %d thread%s; %d round%s of %d repeats\n",
               cpu_model_name().c_str(), cpu_isa_name(isa), threads, threads == 1 ? "" : "s",
               rounds, rounds == 1 ? "" : "s", repeats);

  NoiseWatch noise(isa);
  noise.start(threads, 0);  // no peak in this benchmark
  std::vector<std::string> rows, speedups;
  for (const Model& m : models) {
    const std::int64_t channels = 2 * m.hk * m.dk + m.hv * m.dv;
    std::fprintf(info, "model %s: Hk=%lld Hv=%lld Dk=%lld Dv=%lld, D = %lld\n", m.name.c_str(),
                 static_cast<long long>(m.hk), static_cast<long long>(m.hv),
                 static_cast<long long>(m.dk), static_cast<long long>(m.dv),
                 static_cast<long long>(channels));
    for (const Preset* p : presets) {
      std::vector<StepMeasurement> steps(bf16_pools.size());
      std::vector<StepMeasurement*> order;
      for (std::size_t i = 0; i < steps.size(); ++i) {
        if (prepare_step(*p, m, threads, isa, dtype, bf16_pools[i], info, &steps[i]) != 0) return 1;
        order.push_back(&steps[i]);
      }
      time_rounds(order, repeats, rounds);
      for (StepMeasurement& sm : steps) finish_step(*p, m, threads, repeats, &noise, &sm);
      // With both kinds of pools: the float32 pools' median over the bf16 pools'.
      double speedup = 0;
      if (compare) {
        const Timing& t32 = steps[bf16_pools[0] ? 1 : 0].timing;
        const Timing& t16 = steps[bf16_pools[0] ? 0 : 1].timing;
        speedup = t32.median_ms / t16.median_ms;
        char line[160];
        std::snprintf(line, sizeof line, "  %-13s %-17s %5.2fx  (f32 %.1f us, bf16 %.1f us)\n",
                      m.name.c_str(), p->name, speedup, t32.median_ms * 1e3, t16.median_ms * 1e3);
        speedups.push_back(line);
      }
      for (StepMeasurement& sm : steps) {
        const StepData& d = sm.d;
        const Timing& t = sm.timing;
        const double error = sm.error, gbps = sm.gbps, copy_gbps = sm.copy_gbps;
        const std::int64_t bytes = sm.bytes;
        const bool memory_bound = p->prefills.empty();
        const double tokens_per_s = static_cast<double>(d.live_tokens) / (t.median_ms * 1e-3);
        const char* pools_name = sm.bf16_pools() ? "bf16" : "f32";
        if (json) {
          char copy_fields[96] = "\"copy_gbps\": null, \"vs_copy\": null";
          if (memory_bound) {
            std::snprintf(copy_fields, sizeof copy_fields, "\"copy_gbps\": %.2f, \"vs_copy\": %.2f",
                          copy_gbps, 100 * gbps / copy_gbps);
          }
          char speedup_field[48] = "null";
          if (compare && sm.bf16_pools())
            std::snprintf(speedup_field, sizeof speedup_field, "%.3f", speedup);
          std::printf(
              "{\"op\": \"step\", \"preset\": \"%s\", \"model\": \"%s\", \"dtype\": \"%s\", "
              "\"pools\": \"%s\", \"isa\": \"%s\", \"threads\": %d, \"hk\": %lld, \"hv\": %lld, "
              "\"dk\": %lld, "
              "\"dv\": %lld, \"channels\": %lld, \"taps\": %lld, \"num_spec\": %lld, \"seqs\": "
              "%lld, \"decodes\": %lld, \"prefills\": %lld, \"tokens\": %lld, \"slots\": %lld, "
              "\"repeats\": %d, \"rounds\": %d, \"median_ms\": %.4f, \"min_ms\": %.4f, "
              "\"max_ms\": %.4f, \"tokens_per_s\": %.1f, \"bytes\": %lld, \"gbps\": %.2f, %s, "
              "\"speedup_vs_f32_pools\": %s, \"check_error\": %.3e, %s}\n",
              p->name, m.name.c_str(), dtype_name, pools_name, cpu_isa_name(isa), threads,
              static_cast<long long>(m.hk), static_cast<long long>(m.hv),
              static_cast<long long>(m.dk), static_cast<long long>(m.dv),
              static_cast<long long>(channels), static_cast<long long>(kTaps),
              static_cast<long long>(d.options.num_spec), static_cast<long long>(d.seqs),
              static_cast<long long>(d.decodes), static_cast<long long>(d.prefills),
              static_cast<long long>(d.live_tokens), static_cast<long long>(d.slots), repeats,
              rounds, t.median_ms, t.min_ms, t.max_ms, tokens_per_s, static_cast<long long>(bytes),
              gbps, copy_fields, speedup_field, error, noise_json(sm.noise, sm.verdict).c_str());
          std::fflush(stdout);
        } else {
          char range[64], copy_text[32] = "-", pct[32] = "-", row[320];
          std::snprintf(range, sizeof range, "(%.1f - %.1f)", t.min_ms * 1e3, t.max_ms * 1e3);
          if (memory_bound) {
            std::snprintf(copy_text, sizeof copy_text, "%.1f", copy_gbps);
            std::snprintf(pct, sizeof pct, "%.1f%%", 100 * gbps / copy_gbps);
          }
          std::snprintf(row, sizeof row,
                        "%-13s %-17s %-5s %5lld %6lld %5lld %11.1f %21s %11.0f %8.1f %9s %7s%s\n",
                        m.name.c_str(), p->name, pools_name, static_cast<long long>(d.seqs),
                        static_cast<long long>(d.live_tokens), static_cast<long long>(d.slots),
                        t.median_ms * 1e3, range, tokens_per_s, gbps, copy_text, pct,
                        sm.verdict.noisy ? "  noisy" : "");
          rows.push_back(row);
        }
      }
    }
  }
  if (!json) {
    std::printf("\n%-13s %-17s %-5s %5s %6s %5s %11s %21s %11s %8s %9s %7s\n", "model", "preset",
                "pools", "seqs", "tokens", "slots", "median us", "(min - max)", "tokens/s", "GB/s",
                "copy GB/s", "% copy");
    for (const std::string& row : rows) std::fputs(row.c_str(), stdout);
    std::printf(
        "\nGB/s: the bytes a step must move (each state read once and written once, qkv, a, b "
        "rows in, out rows out) over its median time, %d thread%s.\ncopy GB/s: a copy of the "
        "batch's recurrent states (written states) into another buffer, same run, same "
        "threads (batches without prefills).\n",
        threads, threads == 1 ? "" : "s");
    if (compare) {
      std::printf(
          "\nbf16 pools against float32 pools, same run, %d alternating round%s: speed-up = "
          "float32 median / bf16 median (each the lowest median of its rounds)\n",
          rounds, rounds == 1 ? "" : "s");
      for (const std::string& line : speedups) std::fputs(line.c_str(), stdout);
    }
  }
  noise.warn(info, "gdn bench --op step");
  return 0;
}

int run_decode_bench(const DecodeBenchConfig& config, DecodeBenchResult* result) {
  const std::string name = "decode-" + std::to_string(config.batch);
  const Preset preset{name.c_str(), "", config.batch, 1, {}, 0, 0};
  const Model model{"suite", config.hk, config.hv, config.dk, config.dv};
  reset_peak_rss();
  StepMeasurement sm;
  if (measure_step(preset, model, config.threads, config.isa, config.repeats, config.info,
                   config.noise, &sm) != 0) {
    return 1;
  }
  result->timing = sm.timing;
  result->timing.peak_rss = peak_rss_bytes();
  result->check_error = sm.error;
  result->gbps = sm.gbps;
  result->copy_gbps = sm.copy_gbps;
  result->bytes = sm.bytes;
  result->slots = sm.d.slots;
  result->noise = sm.noise;
  result->verdict = sm.verdict;
  result->tokens_per_s = static_cast<double>(sm.d.live_tokens) / (sm.timing.median_ms * 1e-3);
  return 0;
}

}  // namespace gdn::cli
