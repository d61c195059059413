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
#include "bench_util.h"
#include "commands.h"
#include "gdn/gdn.h"
#include "gdn/step.h"
#include "inputs.h"
#include "sysinfo.h"

namespace gdn::cli {

const char* const kBenchStepHelp = R"HELP(usage: gdn bench --op step [options]

Times one serving step of the fused layer op (gdn::fused_gdn_step, float32; --pools bf16 for
bf16 state pools; conv K = 4): a
batch of sequences over pools of state slots, each sequence reading its conv and recurrent
state from its slot (when it has history) and writing its new states back, as an inference
engine calls the layer at every step. For each preset: the step's median latency with min and
max (us), live tokens per second, and GB/s: the bytes the step must move at least (each
recurrent and conv state it reads once and writes once, the qkv, a, b rows it reads and the
out rows it writes) over the median. For the batches without prefills (decodes and
speculative windows, bound by memory) the same run also times a copy of the batch's
recurrent states from one buffer into another (the same threads): copy GB/s, and the step's
GB/s as a percentage of it (in --json: copy_gbps and vs_copy, that percentage; both null for
batches with prefills).

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
)HELP";

namespace {

struct Model {
  std::string name;
  std::int64_t hk, hv, dk, dv;
};
const Model kModels[] = {{"qwen3-next", 16, 32, 128, 128}, {"qwen3.5-397b", 16, 64, 128, 128}};
constexpr std::int64_t kTaps = 4;
constexpr std::int64_t kHistory = 4096;  // tokens before the step, of sequences with history

// A batch: `decodes` decode windows of `window` tokens (1 + num_spec), then prefills (fresh
// ones first, then continued ones), then `padding` sequences of no token, in a pool of
// `pool_slots` slots (0: just enough, each sequence's slots next to the previous one's; else
// at random places in that pool).
struct Prefill {
  std::int64_t tokens, history;
};
struct Preset {
  const char* name;
  const char* what;
  std::int64_t decodes = 0, window = 1;
  std::vector<Prefill> prefills;
  std::int64_t padding = 0, pool_slots = 0;
};
const Preset kPresets[] = {
    {"decode-1", "1 decode", 1, 1, {}, 0, 0},
    {"decode-8", "8 decodes", 8, 1, {}, 0, 0},
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
    {"repeats", "R", "timed steps per preset after the checked first one (default 20)"},
    {"isa", "ISA", "CPU variant: auto, generic, avx2, avx512 or avx512_bf16 (default auto)"},
    {"pools", "DTYPE",
     "f32 or bf16: the dtype of both state pools (default f32; bf16: float32 compute, each state "
     "rounded once as it is written, gdn/step.h)"},
    {"json", nullptr, "print one JSON object per preset and nothing else on stdout"},
    {"help", nullptr, "show this help"},
};

// fp32 tolerance of the checks (docs/numerics.md).
constexpr double kTolerance = 1e-4;
// With bf16 pools: the rule of docs/numerics.md for a bf16 slot, kTolerance + 2 x the error of
// the reference's own states rounded to bf16 (the one rounding a bf16 slot carries more).
double bf16_pool_tolerance(const Tensor& conv64, const Tensor& rec64) {
  auto rounding = [](const Tensor& t) {
    const double* x = t.data<double>();
    return bench::error_stats(
               t.numel(),
               [&](std::int64_t i) {
                 const std::uint32_t bits =
                     static_cast<std::uint32_t>(bf16_bits(static_cast<float>(x[i]))) << 16;
                 float f;
                 std::memcpy(&f, &bits, sizeof f);
                 return static_cast<double>(f);
               },
               [&](std::int64_t i) { return x[i]; })
        .normalized();
  };
  return kTolerance + 2 * std::max(rounding(conv64), rounding(rec64));
}

// A float32 pool's bf16 copy; the pool itself rounded to the same values in place, so that the
// reference's slice starts from them.
Tensor bf16_copy(Tensor& pool) {
  Tensor r(DType::bf16, pool.rank(), pool.sizes());
  auto* to = static_cast<std::uint16_t*>(r.raw());
  float* from = pool.data<float>();
  for (std::int64_t i = 0; i < pool.numel(); ++i) {
    to[i] = bf16_bits(from[i]);
    const std::uint32_t bits = static_cast<std::uint32_t>(to[i]) << 16;
    std::memcpy(&from[i], &bits, sizeof bits);
  }
  return r;
}
void widen_into(const Tensor& pool16, Tensor& pool) {
  const auto* from = static_cast<const std::uint16_t*>(pool16.raw());
  float* to = pool.data<float>();
  for (std::int64_t i = 0; i < pool.numel(); ++i) {
    const std::uint32_t bits = static_cast<std::uint32_t>(from[i]) << 16;
    std::memcpy(&to[i], &bits, sizeof bits);
  }
}

template <class T>
void fill_uniform(T* p, std::int64_t n, Random& rng, double lo, double hi) {
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(rng.uniform(lo, hi));
}

// One step problem (float32, or float64 for the reference's slice).
struct StepData {
  Model model;
  std::int64_t channels = 0, tokens = 0, live_tokens = 0, seqs = 0, decodes = 0, prefills = 0;
  std::int64_t slots = 0, states_read = 0, states_written = 0;
  Tensor qkv, a, b, conv_weight, A_log, dt_bias, conv_state, recurrent_state;
  Tensor query_start_loc, state_indices, seq_lens, distribution, read_offsets;
  StepOptions options;

  StepInputs inputs() const {
    return {qkv.view(),
            a.view(),
            b.view(),
            conv_weight.view(),
            {},
            A_log.view(),
            dt_bias.view(),
            query_start_loc.view(),
            state_indices.view(),
            seq_lens.view(),
            distribution.view(),
            read_offsets.view(),
            TensorView{}};
  }
  StatePools pools() { return {conv_state.mutable_view(), recurrent_state.mutable_view()}; }
};

// The preset's batch at the model's shape. Inputs as `gdn bench --op layer` makes them (qkv,
// a, b uniform in [-1, 1), conv weights in [-0.5, 0.5), A = exp(A_log) in [1, 16), dt around
// [0.001, 0.1)); the states a sequence reads uniform (conv state in [-1, 1), recurrent state
// in [-0.5, 0.5)), the slots it writes without reading NaN, every other slot zero.
StepData make_step(const Preset& p, const Model& m, int threads, CpuIsa isa, std::uint64_t seed) {
  StepData d;
  d.model = m;
  d.channels = 2 * m.hk * m.dk + m.hv * m.dv;
  d.decodes = p.decodes;
  d.prefills = static_cast<std::int64_t>(p.prefills.size());
  const std::int64_t live = d.decodes + d.prefills;
  d.seqs = live + p.padding;
  // Tokens and windows of the live sequences.
  std::vector<std::int64_t> tokens, history, window;
  for (std::int64_t s = 0; s < d.decodes; ++s) {
    tokens.push_back(p.window);
    history.push_back(kHistory);
    window.push_back(p.window);
  }
  std::int64_t fresh = 0;
  for (const Prefill& f : p.prefills) {
    tokens.push_back(f.tokens);
    history.push_back(f.history);
    window.push_back(1);
    fresh += f.history == 0 ? 1 : 0;
  }
  for (std::int64_t s = 0; s < live; ++s) d.live_tokens += tokens[static_cast<std::size_t>(s)];
  d.tokens = p.padding > 0 ? (d.live_tokens + 255) / 256 * 256 : d.live_tokens;
  // Slots: each live sequence a block of `widest` slots, next to each other or at random.
  const std::int64_t widest = p.window;
  std::vector<std::int64_t> blocks;
  if (p.pool_slots == 0) {
    d.slots = 1 + live * widest;
    for (std::int64_t s = 0; s < live; ++s) blocks.push_back(s);
  } else {
    d.slots = p.pool_slots;
    std::vector<std::int64_t> all;
    for (std::int64_t i = 0; i < (p.pool_slots - 1) / widest; ++i) all.push_back(i);
    Random shuffle(seed + 1);
    for (std::int64_t i = 0; i < live; ++i) {
      const auto left = static_cast<std::int64_t>(all.size()) - i;
      const auto j = i + std::min<std::int64_t>(
                             left - 1, static_cast<std::int64_t>(shuffle.uniform(0, 1) * left));
      std::swap(all[static_cast<std::size_t>(i)], all[static_cast<std::size_t>(j)]);
      blocks.push_back(all[static_cast<std::size_t>(i)]);
    }
  }

  Random rng(seed);
  const std::int64_t dd = d.channels, hv = m.hv;
  d.qkv = Tensor(DType::f32, {d.tokens, dd});
  d.a = Tensor(DType::f32, {d.tokens, hv});
  d.b = Tensor(DType::f32, {d.tokens, hv});
  d.conv_weight = Tensor(DType::f32, {dd, kTaps});
  d.A_log = Tensor(DType::f32, {hv});
  d.dt_bias = Tensor(DType::f32, {hv});
  fill_uniform(d.qkv.data<float>(), d.qkv.numel(), rng, -1, 1);
  fill_uniform(d.a.data<float>(), d.a.numel(), rng, -1, 1);
  fill_uniform(d.b.data<float>(), d.b.numel(), rng, -1, 1);
  fill_uniform(d.conv_weight.data<float>(), d.conv_weight.numel(), rng, -0.5, 0.5);
  for (std::int64_t h = 0; h < hv; ++h) {
    d.A_log.data<float>()[h] = static_cast<float>(std::log(rng.uniform(1, 16)));
    d.dt_bias.data<float>()[h] = static_cast<float>(std::log(std::expm1(rng.uniform(0.001, 0.1))));
  }

  d.conv_state = Tensor(DType::f32, {d.slots, kTaps - 1, dd});
  d.recurrent_state = Tensor(DType::f32, {d.slots, hv, m.dk, m.dv});
  d.query_start_loc = Tensor(DType::i64, {d.seqs + 1});
  d.state_indices = Tensor(DType::i64, {d.seqs});
  d.seq_lens = Tensor(DType::i64, {d.seqs});
  d.distribution = Tensor(DType::i64, {3});
  if (p.window > 1) d.read_offsets = Tensor(DType::i64, {d.seqs});
  std::int64_t* qsl = d.query_start_loc.data<std::int64_t>();
  std::int64_t* index = d.state_indices.data<std::int64_t>();
  std::int64_t* lens = d.seq_lens.data<std::int64_t>();
  const std::int64_t conv_slot = (kTaps - 1) * dd, state_slot = hv * m.dk * m.dv;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  qsl[0] = 0;
  for (std::int64_t s = 0; s < d.seqs; ++s) {
    const auto i = static_cast<std::size_t>(s);
    if (s >= live) {  // padding: no token, a slot index nobody looks at
      qsl[s + 1] = qsl[s];
      index[s] = -1;
      lens[s] = 0;
      if (d.read_offsets.present()) d.read_offsets.data<std::int64_t>()[s] = 0;
      continue;
    }
    qsl[s + 1] = qsl[s] + tokens[i];
    index[s] = 1 + blocks[i] * widest;
    lens[s] = history[i] + tokens[i];
    const std::int64_t offset = s < d.decodes && p.window > 1 ? s % p.window : 0;
    if (d.read_offsets.present()) d.read_offsets.data<std::int64_t>()[s] = offset;
    for (std::int64_t w = 0; w < window[i]; ++w) {
      const std::int64_t slot = index[s] + w;
      float* conv = d.conv_state.data<float>() + slot * conv_slot;
      float* state = d.recurrent_state.data<float>() + slot * state_slot;
      if (history[i] > 0 && w == offset) {
        fill_uniform(conv, conv_slot, rng, -1, 1);
        fill_uniform(state, state_slot, rng, -0.5, 0.5);
      } else {
        std::fill_n(conv, conv_slot, nan);
        std::fill_n(state, state_slot, nan);
      }
    }
    d.states_read += history[i] > 0 ? 1 : 0;
    d.states_written += window[i];
  }
  std::int64_t* dist = d.distribution.data<std::int64_t>();
  dist[0] = d.decodes;
  dist[1] = d.decodes + fresh;
  dist[2] = live;

  d.options.hk = m.hk;
  d.options.hv = m.hv;
  d.options.dk = m.dk;
  d.options.dv = m.dv;
  d.options.num_spec = p.window - 1;
  d.options.threads = threads;
  d.options.isa = isa;
  return d;
}

// The check slice in float64: key head 0 and its value heads (Hk = 1, Hv = Hv / Hk), every
// sequence, token and slot, copied from `d` (before it runs).
StepData slice_of(const StepData& d) {
  const Model& m = d.model;
  const std::int64_t group = m.hv / m.hk;
  auto copy_of = [](const Tensor& t) {
    if (!t.present()) return Tensor{};
    Tensor c(t.dtype(), t.rank(), t.sizes());
    std::memcpy(c.raw(), t.raw(), t.bytes());
    return c;
  };
  StepData s;
  s.model = m;
  s.tokens = d.tokens;
  s.live_tokens = d.live_tokens;
  s.seqs = d.seqs;
  s.decodes = d.decodes;
  s.prefills = d.prefills;
  s.slots = d.slots;
  s.states_read = d.states_read;
  s.states_written = d.states_written;
  s.options = d.options;
  s.query_start_loc = copy_of(d.query_start_loc);
  s.state_indices = copy_of(d.state_indices);
  s.seq_lens = copy_of(d.seq_lens);
  s.distribution = copy_of(d.distribution);
  s.read_offsets = copy_of(d.read_offsets);
  s.model.hk = 1;
  s.model.hv = group;
  s.channels = 2 * m.dk + group * m.dv;
  s.options.hk = 1;
  s.options.hv = group;
  std::vector<std::int64_t> source;  // channel of d behind each channel of the slice
  for (std::int64_t c = 0; c < m.dk; ++c) source.push_back(c);
  for (std::int64_t c = 0; c < m.dk; ++c) source.push_back(m.hk * m.dk + c);
  for (std::int64_t c = 0; c < group * m.dv; ++c) source.push_back(2 * m.hk * m.dk + c);
  const std::int64_t dd = d.channels, sc = s.channels;
  auto rows = [](const Tensor& x, std::int64_t n, std::int64_t width, auto&& column_of,
                 std::int64_t keep) {
    Tensor y(DType::f64, {n, keep});
    for (std::int64_t r = 0; r < n; ++r) {
      for (std::int64_t c = 0; c < keep; ++c) {
        y.data<double>()[r * keep + c] = x.data<float>()[r * width + column_of(c)];
      }
    }
    return y;
  };
  auto channel = [&](std::int64_t c) { return source[static_cast<std::size_t>(c)]; };
  auto same = [](std::int64_t c) { return c; };
  s.qkv = rows(d.qkv, d.tokens, dd, channel, sc);
  s.a = rows(d.a, d.tokens, m.hv, same, group);
  s.b = rows(d.b, d.tokens, m.hv, same, group);
  s.A_log = Tensor(DType::f64, {group});
  s.dt_bias = Tensor(DType::f64, {group});
  for (std::int64_t h = 0; h < group; ++h) {
    s.A_log.data<double>()[h] = d.A_log.data<float>()[h];
    s.dt_bias.data<double>()[h] = d.dt_bias.data<float>()[h];
  }
  s.conv_weight = Tensor(DType::f64, {sc, kTaps});
  for (std::int64_t c = 0; c < sc; ++c) {
    for (std::int64_t i = 0; i < kTaps; ++i) {
      s.conv_weight.data<double>()[c * kTaps + i] =
          d.conv_weight.data<float>()[channel(c) * kTaps + i];
    }
  }
  s.conv_state = Tensor(DType::f64, {d.slots, kTaps - 1, sc});
  for (std::int64_t r = 0; r < d.slots * (kTaps - 1); ++r) {
    for (std::int64_t c = 0; c < sc; ++c) {
      s.conv_state.data<double>()[r * sc + c] = d.conv_state.data<float>()[r * dd + channel(c)];
    }
  }
  const std::int64_t head = m.dk * m.dv;
  s.recurrent_state = Tensor(DType::f64, {d.slots, group, m.dk, m.dv});
  for (std::int64_t slot = 0; slot < d.slots; ++slot) {
    const float* from = d.recurrent_state.data<float>() + slot * m.hv * head;
    double* to = s.recurrent_state.data<double>() + slot * group * head;
    for (std::int64_t i = 0; i < group * head; ++i) to[i] = from[i];
  }
  return s;
}

// The worst normalised error of the CPU step's first run on `d` (out and both pools, on the
// slice's heads and channels) against the float64 reference's step on the slice `s`.
double check_step(const StepData& d, const StepData& s, const Tensor& out, const Tensor& ref_out) {
  const Model& m = d.model;
  const std::int64_t group = m.hv / m.hk, dd = d.channels, sc = s.channels;
  const std::int64_t row = group * m.dv, head = m.dk * m.dv;
  const float* o = out.data<float>();
  const double* r = ref_out.data<double>();
  const double out_error =
      bench::error_stats(
          d.tokens * row, [&](std::int64_t i) { return o[(i / row) * m.hv * m.dv + i % row]; },
          [&](std::int64_t i) { return r[i]; })
          .normalized();
  auto channel = [&](std::int64_t c) {
    return c < 2 * m.dk ? (c < m.dk ? c : m.hk * m.dk + c - m.dk) : 2 * m.hk * m.dk + c - 2 * m.dk;
  };
  const float* conv = d.conv_state.data<float>();
  const double* ref_conv = s.conv_state.data<double>();
  const double conv_error =
      bench::error_stats(
          d.slots * (kTaps - 1) * sc,
          [&](std::int64_t i) { return conv[(i / sc) * dd + channel(i % sc)]; },
          [&](std::int64_t i) { return ref_conv[i]; })
          .normalized();
  const float* state = d.recurrent_state.data<float>();
  const double* ref_state = s.recurrent_state.data<double>();
  const std::int64_t per_slot = group * head;
  const double state_error =
      bench::error_stats(
          d.slots * per_slot,
          [&](std::int64_t i) { return state[(i / per_slot) * m.hv * head + i % per_slot]; },
          [&](std::int64_t i) { return ref_state[i]; })
          .normalized();
  return std::max({out_error, conv_error, state_error});
}

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

// One preset's step on fresh pools: checked against the float64 reference (the check line on
// `info`), then timed; batches without prefills also time a copy of their states.
struct StepMeasurement {
  StepData d;
  Tensor conv16, rec16;  // bf16 pools (--pools bf16), else absent
  Timing timing;
  double error = 0, gbps = 0, copy_gbps = 0;
  std::int64_t bytes = 0;
  NoiseFigures noise;  // with a watch: the step's figures and the verdict (with its copy's)
  NoiseVerdict verdict;
};

int measure_step(const Preset& p, const Model& m, int threads, CpuIsa isa, int repeats,
                 bool bf16_pools, std::FILE* info, NoiseWatch* noise, StepMeasurement* result) {
  const std::int64_t channels = 2 * m.hk * m.dk + m.hv * m.dv;
  const std::string label = m.name + " " + p.name;
  progress("  %s: generating inputs...", label.c_str());
  result->d = make_step(p, m, threads, isa, 20261202);
  StepData& d = result->d;
  if (bf16_pools) {
    result->conv16 = bf16_copy(d.conv_state);
    result->rec16 = bf16_copy(d.recurrent_state);
  }
  progress("  %s: float64 reference on the check slice...", label.c_str());
  StepData s = slice_of(d);
  const Tensor ref_out = ref::fused_gdn_step(s.inputs(), s.pools(), s.options);
  progress("  %s: first step...", label.c_str());
  Tensor out(DType::f32, {d.tokens, m.hv * m.dv});
  const StepInputs inputs = d.inputs();
  const StatePools pools =
      bf16_pools ? StatePools{result->conv16.mutable_view(), result->rec16.mutable_view()}
                 : d.pools();
  auto run = [&] { fused_gdn_step(inputs, pools, out.mutable_view(), d.options); };
  run();  // the checked first run, also the warm-up
  if (bf16_pools) {
    widen_into(result->conv16, d.conv_state);
    widen_into(result->rec16, d.recurrent_state);
  }
  const double error = check_step(d, s, out, ref_out);
  const double tolerance =
      bf16_pools ? bf16_pool_tolerance(s.conv_state, s.recurrent_state) : kTolerance;
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
  result->timing = time_runs(run, repeats, label);
  const Timing& t = result->timing;
  if (noise != nullptr) {
    result->verdict = noise->judge(label, t);
    result->noise = noise->last();
  }

  // Bytes the step must move: states read and written, input rows, output rows.
  const std::int64_t pool_element = bf16_pools ? 2 : 4;
  const std::int64_t state_bytes = m.hv * m.dk * m.dv * pool_element;
  const std::int64_t conv_bytes = (kTaps - 1) * channels * pool_element;
  result->bytes = (d.states_read + d.states_written) * (state_bytes + conv_bytes) +
                  d.live_tokens * (channels + 2 * m.hv + m.hv * m.dv) * 4;
  result->gbps = static_cast<double>(result->bytes) / (t.median_ms * 1e-3) * 1e-9;
  // The floor of a batch without prefills: a copy of the recurrent states it writes, from
  // the pool into another buffer.
  const bool memory_bound = p.prefills.empty();
  if (memory_bound) {
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
    const Timing c = time_runs(copy, repeats, label + " (copy of the states)");
    if (noise != nullptr) {
      result->verdict.add("its baseline, the copy of the states",
                          noise->judge(label + " (copy of the states)", c));
    }
    result->copy_gbps = 2.0 * static_cast<double>(copy_bytes) / (c.median_ms * 1e-3) * 1e-9;
  }
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
  const bool bf16_pools = args.choice("pools", "f32", {"f32", "bf16"}) == "bf16";
  const char* pools_name = bf16_pools ? "bf16" : "f32";

  std::FILE* info = json ? stderr : stdout;
  std::fprintf(info,
               "gdn bench --op step: fused layer op step over state-slot pools, f32 "
               "activations, %s pools, conv K = %lld, chunk 64\n",
               pools_name, static_cast<long long>(kTaps));
  std::fprintf(info, "machine: %s; ISA %s; %d thread%s\n", cpu_model_name().c_str(),
               cpu_isa_name(isa), threads, threads == 1 ? "" : "s");

  NoiseWatch noise(isa);
  noise.start(threads, 0);  // no peak in this benchmark
  std::vector<std::string> rows;
  for (const Model& m : models) {
    const std::int64_t channels = 2 * m.hk * m.dk + m.hv * m.dv;
    std::fprintf(info, "model %s: Hk=%lld Hv=%lld Dk=%lld Dv=%lld, D = %lld\n", m.name.c_str(),
                 static_cast<long long>(m.hk), static_cast<long long>(m.hv),
                 static_cast<long long>(m.dk), static_cast<long long>(m.dv),
                 static_cast<long long>(channels));
    for (const Preset* p : presets) {
      StepMeasurement sm;
      if (measure_step(*p, m, threads, isa, repeats, bf16_pools, info, &noise, &sm) != 0) {
        return 1;
      }
      const StepData& d = sm.d;
      const Timing& t = sm.timing;
      const double error = sm.error, gbps = sm.gbps, copy_gbps = sm.copy_gbps;
      const std::int64_t bytes = sm.bytes;
      const bool memory_bound = p->prefills.empty();
      const double tokens_per_s = static_cast<double>(d.live_tokens) / (t.median_ms * 1e-3);
      if (json) {
        char copy_fields[96] = "\"copy_gbps\": null, \"vs_copy\": null";
        if (memory_bound) {
          std::snprintf(copy_fields, sizeof copy_fields, "\"copy_gbps\": %.2f, \"vs_copy\": %.2f",
                        copy_gbps, 100 * gbps / copy_gbps);
        }
        std::printf(
            "{\"op\": \"step\", \"preset\": \"%s\", \"model\": \"%s\", \"dtype\": \"f32\", "
            "\"pools\": \"%s\", \"isa\": \"%s\", \"threads\": %d, \"hk\": %lld, \"hv\": %lld, "
            "\"dk\": %lld, "
            "\"dv\": %lld, \"channels\": %lld, \"taps\": %lld, \"num_spec\": %lld, \"seqs\": "
            "%lld, \"decodes\": %lld, \"prefills\": %lld, \"tokens\": %lld, \"slots\": %lld, "
            "\"repeats\": %d, \"median_ms\": %.4f, \"min_ms\": %.4f, \"max_ms\": %.4f, "
            "\"tokens_per_s\": %.1f, \"bytes\": %lld, \"gbps\": %.2f, %s, \"check_error\": "
            "%.3e, %s}\n",
            p->name, m.name.c_str(), pools_name, cpu_isa_name(isa), threads,
            static_cast<long long>(m.hk), static_cast<long long>(m.hv),
            static_cast<long long>(m.dk), static_cast<long long>(m.dv),
            static_cast<long long>(channels), static_cast<long long>(kTaps),
            static_cast<long long>(d.options.num_spec), static_cast<long long>(d.seqs),
            static_cast<long long>(d.decodes), static_cast<long long>(d.prefills),
            static_cast<long long>(d.live_tokens), static_cast<long long>(d.slots), repeats,
            t.median_ms, t.min_ms, t.max_ms, tokens_per_s, static_cast<long long>(bytes), gbps,
            copy_fields, error, noise_json(sm.noise, sm.verdict).c_str());
        std::fflush(stdout);
      } else {
        char range[64], copy_text[32] = "-", pct[32] = "-", row[320];
        std::snprintf(range, sizeof range, "(%.1f - %.1f)", t.min_ms * 1e3, t.max_ms * 1e3);
        if (memory_bound) {
          std::snprintf(copy_text, sizeof copy_text, "%.1f", copy_gbps);
          std::snprintf(pct, sizeof pct, "%.1f%%", 100 * gbps / copy_gbps);
        }
        std::snprintf(row, sizeof row,
                      "%-13s %-17s %5lld %6lld %5lld %11.1f %21s %11.0f %8.1f %9s %7s%s\n",
                      m.name.c_str(), p->name, static_cast<long long>(d.seqs),
                      static_cast<long long>(d.live_tokens), static_cast<long long>(d.slots),
                      t.median_ms * 1e3, range, tokens_per_s, gbps, copy_text, pct,
                      sm.verdict.noisy ? "  noisy" : "");
        rows.push_back(row);
      }
    }
  }
  if (!json) {
    std::printf("\n%-13s %-17s %5s %6s %5s %11s %21s %11s %8s %9s %7s\n", "model", "preset", "seqs",
                "tokens", "slots", "median us", "(min - max)", "tokens/s", "GB/s", "copy GB/s",
                "% copy");
    for (const std::string& row : rows) std::fputs(row.c_str(), stdout);
    std::printf(
        "\nGB/s: the bytes a step must move (each state read once and written once, qkv, a, b "
        "rows in, out rows out) over its median time, %d thread%s.\ncopy GB/s: a copy of the "
        "batch's recurrent states (written states) into another buffer, same run, same "
        "threads (batches without prefills).\n",
        threads, threads == 1 ? "" : "s");
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
  if (measure_step(preset, model, config.threads, config.isa, config.repeats, false, config.info,
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
