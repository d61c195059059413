// bench_step_data.cc: the problems of `gdn bench --op step` (bench_step_data.h).
#include "bench_step_data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "bench/error_stats.h"
#include "bench_util.h"

namespace gdn::cli::step_bench {
namespace {

template <class T>
void fill_uniform(T* p, std::int64_t n, Random& rng, double lo, double hi) {
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(rng.uniform(lo, hi));
}

}  // namespace

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

StepData make_step(const Preset& p, const Model& m, int threads, CpuIsa isa, DType dtype,
                   std::uint64_t seed) {
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
  if (dtype == DType::bf16) {  // rounded in place, so that the reference's slice has them too
    d.qkv16 = bf16_copy(d.qkv);
    d.a16 = bf16_copy(d.a);
    d.b16 = bf16_copy(d.b);
  }
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

}  // namespace gdn::cli::step_bench
