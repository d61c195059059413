// step_spec_test.cc: the serving step in vLLM's speculative layout (gdn/step.h: a rolling conv
// buffer of K - 1 + n columns per sequence, the recurrent state after each window token in a
// block-table slot, windows starting from the last accepted token). The oracle here is
// gdn::ref::fused_gdn_fwd, a window token by token, with the buffer rebuilt as vLLM's GPU
// kernel rolls it: its first K - 2 + q columns become the window's K - 1 history inputs and
// its q tokens, less the oldest input; the rest kept. The CPU step (every compiled ISA,
// float32 within 1e-4 as tests/cpu/step_harness.h) and the float64 reference step (within
// 1e-12) answer to it; slots the step must not write stay byte for byte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/isas.h"
#include "common/layer_problem.h"
#include "common/problem.h"
#include "common/validation.h"

namespace gdn {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A decode window: q tokens, `accepted` tokens of its previous window, its block-table row.
struct Window {
  std::int64_t q = 1, accepted = 1;
  std::vector<std::int64_t> row;  // [1 + num_spec]
  bool history = true;
};
// Any other live sequence (prefill, chunked continuation, one-token plain decode).
struct Other {
  std::int64_t len = 1, slot = 1;
  bool history = false;
};

struct SpecCase {
  std::int64_t hk = 2, hv = 4, dk = 16, dv = 16, taps = 4, num_spec = 3, num_slots = 32;
  DType dtype = DType::f32;
  bool bf16_conv_pool = false, bf16_rec_pool = false;
  std::vector<Window> windows;
  std::vector<Other> others;
  std::int64_t padding = 0;       // padding sequences (garbage metadata)
  bool window_rows_only = false;  // spec_state_indices and num_accepted_tokens: [decode_end]
  std::uint64_t seed = 1;
  std::int64_t channels() const { return 2 * hk * dk + hv * dv; }
  std::int64_t columns() const { return taps - 1 + num_spec; }
};

void set_value(Tensor& t, std::int64_t i, double x) {
  if (t.dtype() == DType::f32) {
    t.data<float>()[i] = static_cast<float>(x);
  } else if (t.dtype() == DType::bf16) {
    static_cast<std::uint16_t*>(t.raw())[i] = bf16_bits(static_cast<float>(x));
  } else {
    t.data<double>()[i] = x;
  }
}

Tensor clone(const Tensor& t) {
  Tensor r(t.dtype(), t.rank(), t.sizes());
  std::memcpy(r.raw(), t.raw(), t.bytes());
  return r;
}

Tensor to_f64(const Tensor& t) {
  Tensor r(DType::f64, t.rank(), t.sizes());
  for (std::int64_t i = 0; i < t.numel(); ++i) r.data<double>()[i] = test::value_at(t, i);
  return r;
}

std::int64_t slot_numel(const Tensor& pool) { return pool.numel() / pool.size(0); }

// One step's batch and data; the pools are the caller's.
struct SpecStep {
  SpecCase c;
  std::int64_t n = 0, tokens = 0;
  std::vector<std::int64_t> qsl, state_indices, seq_lens, distribution, table, accepted;
  Tensor qkv, a, b, conv_weight, conv_bias, A_log, dt_bias;

  StepInputs inputs() const {
    StepInputs in;
    in.qkv = qkv.view();
    in.a = a.view();
    in.b = b.view();
    in.conv_weight = conv_weight.view();
    in.conv_bias = conv_bias.view();
    in.A_log = A_log.view();
    in.dt_bias = dt_bias.view();
    in.query_start_loc = TensorView(qsl.data(), {n + 1});
    in.state_indices = TensorView(state_indices.data(), {n});
    in.seq_lens = TensorView(seq_lens.data(), {n});
    in.distribution = TensorView(distribution.data(), {3});
    const std::int64_t rows = c.window_rows_only ? distribution[0] : n;
    in.spec_state_indices = TensorView(table.data(), {rows, 1 + c.num_spec});
    in.num_accepted_tokens = TensorView(accepted.data(), {rows});
    return in;
  }
  StepOptions options() const {
    StepOptions o;
    o.hk = c.hk;
    o.hv = c.hv;
    o.dk = c.dk;
    o.dv = c.dv;
    o.num_spec = c.num_spec;
    return o;
  }
};

SpecStep make_step(const SpecCase& c) {
  SpecStep p;
  p.c = c;
  const std::int64_t row = 1 + c.num_spec;
  p.qsl.push_back(0);
  for (const Window& w : c.windows) {
    p.qsl.push_back(p.qsl.back() + w.q);
    p.state_indices.push_back(-7);  // not read for a window
    p.seq_lens.push_back(w.q + (w.history ? 40 : 0));
    p.table.insert(p.table.end(), w.row.begin(), w.row.end());
    p.accepted.push_back(w.accepted);
  }
  for (const Other& o : c.others) {
    p.qsl.push_back(p.qsl.back() + o.len);
    p.state_indices.push_back(o.slot);
    p.seq_lens.push_back(o.len + (o.history ? 30 : 0));
    p.table.insert(p.table.end(), static_cast<std::size_t>(row), -5);  // not read
    p.accepted.push_back(0);                                           // not read
  }
  const auto live = static_cast<std::int64_t>(c.windows.size() + c.others.size());
  for (std::int64_t i = 0; i < c.padding; ++i) {  // vLLM's padding, and worse
    p.qsl.push_back(p.qsl.back() - 1);
    p.state_indices.push_back(0);
    p.seq_lens.push_back(-3);
    p.table.insert(p.table.end(), static_cast<std::size_t>(row), 0);
    p.accepted.push_back(99);
  }
  p.n = live + c.padding;
  const auto nw = static_cast<std::int64_t>(c.windows.size());
  p.distribution = {nw, nw, live};
  p.tokens = p.qsl[static_cast<std::size_t>(live)] + 2;  // two trailing rows

  test::LayerSpec ls;
  ls.lengths = {p.tokens};
  ls.hk = c.hk;
  ls.hv = c.hv;
  ls.dk = c.dk;
  ls.dv = c.dv;
  ls.taps = c.taps;
  ls.dtype = c.dtype;
  ls.seed = c.seed;
  test::LayerProblem lp = test::make_layer_problem(ls);
  p.qkv = std::move(lp.qkv);
  p.a = std::move(lp.a);
  p.b = std::move(lp.b);
  p.conv_weight = std::move(lp.conv_weight);
  p.conv_bias = std::move(lp.conv_bias);
  p.A_log = std::move(lp.A_log);
  p.dt_bias = std::move(lp.dt_bias);
  return p;
}

struct Pools {
  Tensor conv, rec;
  StatePools view() { return {conv.mutable_view(), rec.mutable_view()}; }
};

// Random pools; slot 0 (the null slot) NaN.
Pools make_pools(const SpecCase& c) {
  Pools p{
      Tensor(c.bf16_conv_pool ? DType::bf16 : c.dtype, {c.num_slots, c.columns(), c.channels()}),
      Tensor(c.bf16_rec_pool ? DType::bf16 : c.dtype, {c.num_slots, c.hv, c.dk, c.dv})};
  test::Random rng(c.seed * 7919 + 3);
  for (std::int64_t i = 0; i < p.conv.numel(); ++i) set_value(p.conv, i, rng.normal());
  for (std::int64_t i = 0; i < p.rec.numel(); ++i) set_value(p.rec, i, 0.5 * rng.normal());
  for (std::int64_t i = 0; i < slot_numel(p.conv); ++i) set_value(p.conv, i, kNaN);
  for (std::int64_t i = 0; i < slot_numel(p.rec); ++i) set_value(p.rec, i, kNaN);
  return p;
}

struct Expected {
  Tensor out;        // f64 [T, Hv Dv]
  Tensor conv, rec;  // f64 pools after the step
  std::set<std::int64_t> live_rows, conv_written, rec_written;
};

// The oracle, from the pools `conv0`, `rec0` (any dtype) before the step.
Expected oracle(const SpecStep& p, const Tensor& conv0, const Tensor& rec0) {
  const SpecCase& c = p.c;
  const std::int64_t k = c.taps, d = c.channels(), cols = c.columns();
  const Tensor qkv = to_f64(p.qkv), a = to_f64(p.a), b = to_f64(p.b);
  const Tensor w = to_f64(p.conv_weight), bias = to_f64(p.conv_bias);
  const Tensor a_log = to_f64(p.A_log), dt_bias = to_f64(p.dt_bias);
  Expected e{Tensor(DType::f64, {p.tokens, c.hv * c.dv}), to_f64(conv0), to_f64(rec0), {}, {}, {}};
  const Tensor conv_before = to_f64(conv0), rec_before = to_f64(rec0);
  LayerOptions o;
  o.hk = c.hk;
  o.hv = c.hv;
  o.dk = c.dk;
  o.dv = c.dv;
  const std::int64_t rec_size = slot_numel(rec0);
  auto value_rows = [](const Tensor& t, std::int64_t from, std::int64_t count) {
    TensorView v = t.view();
    v.data = static_cast<const double*>(t.raw()) + from * v.strides[0];
    v.sizes[0] = count;
    return v;
  };
  // One run of ref::fused_gdn_fwd over tokens [t0, t0 + count) from the given states.
  auto run = [&](std::int64_t t0, std::int64_t count, const Tensor& conv, const Tensor& rec) {
    return ref::fused_gdn_fwd(LayerInputs{value_rows(qkv, t0, count),
                                          value_rows(a, t0, count),
                                          value_rows(b, t0, count),
                                          w.view(),
                                          bias.view(),
                                          a_log.view(),
                                          dt_bias.view(),
                                          conv.view(),
                                          rec.view(),
                                          {}},
                              o);
  };
  auto copy_out = [&](const Tensor& from, std::int64_t t0, std::int64_t count) {
    const std::int64_t width = c.hv * c.dv;
    for (std::int64_t i = 0; i < count * width; ++i) {
      e.out.data<double>()[t0 * width + i] = from.data<double>()[i];
    }
    for (std::int64_t t = t0; t < t0 + count; ++t) e.live_rows.insert(t);
  };
  for (std::size_t s = 0; s < c.windows.size(); ++s) {
    const Window& win = c.windows[s];
    const std::int64_t t0 = p.qsl[s], slot = win.row[0];
    // The history: columns [a - 1, a - 1 + K - 1) of the buffer, and the recurrent state of
    // column a - 1 of the block table; zeros without history.
    Tensor conv(DType::f64, {1, k - 1, d}), rec(DType::f64, {1, c.hv, c.dk, c.dv});
    if (win.history) {
      for (std::int64_t i = 0; i < (k - 1) * d; ++i) {
        conv.data<double>()[i] =
            conv_before.data<double>()[(slot * cols + win.accepted - 1) * d + i];
      }
      const std::int64_t from = win.row[static_cast<std::size_t>(win.accepted - 1)];
      for (std::int64_t i = 0; i < rec_size; ++i) {
        rec.data<double>()[i] = rec_before.data<double>()[from * rec_size + i];
      }
    }
    // The window's inputs: history then its q tokens.
    std::vector<double> inputs((static_cast<std::size_t>(k - 1 + win.q)) * d);
    for (std::int64_t i = 0; i < (k - 1) * d; ++i) inputs[i] = conv.data<double>()[i];
    for (std::int64_t t = 0; t < win.q; ++t) {
      for (std::int64_t ch = 0; ch < d; ++ch) {
        inputs[(k - 1 + t) * d + ch] = qkv.data<double>()[(t0 + t) * d + ch];
      }
    }
    for (std::int64_t t = 0; t < win.q; ++t) {
      LayerForwardResult r = run(t0 + t, 1, conv, rec);
      copy_out(r.out, t0 + t, 1);
      const std::int64_t to = win.row[static_cast<std::size_t>(t)];
      for (std::int64_t i = 0; i < rec_size; ++i) {
        e.rec.data<double>()[to * rec_size + i] = r.recurrent_state_out.data<double>()[i];
      }
      e.rec_written.insert(to);
      conv = std::move(r.conv_state_out);
      rec = std::move(r.recurrent_state_out);
    }
    // The buffer as vLLM's GPU kernel rolls it: K - 2 + q columns from input 1 on.
    if (k > 1) {
      for (std::int64_t i = 0; i < (k - 2 + win.q) * d; ++i) {
        e.conv.data<double>()[slot * cols * d + i] = inputs[static_cast<std::size_t>(d + i)];
      }
    }
    e.conv_written.insert(slot);
  }
  for (std::size_t i = 0; i < c.others.size(); ++i) {
    const Other& x = c.others[i];
    const std::size_t s = c.windows.size() + i;
    const std::int64_t t0 = p.qsl[s];
    // Columns [0, K - 1) of the buffer and its own recurrent slot.
    Tensor conv(DType::f64, {1, k - 1, d}), rec(DType::f64, {1, c.hv, c.dk, c.dv});
    if (x.history) {
      for (std::int64_t j = 0; j < (k - 1) * d; ++j)
        conv.data<double>()[j] = conv_before.data<double>()[x.slot * cols * d + j];
      for (std::int64_t j = 0; j < rec_size; ++j)
        rec.data<double>()[j] = rec_before.data<double>()[x.slot * rec_size + j];
    }
    const LayerForwardResult r = run(t0, x.len, conv, rec);
    copy_out(r.out, t0, x.len);
    for (std::int64_t j = 0; j < (k - 1) * d; ++j)
      e.conv.data<double>()[x.slot * cols * d + j] = r.conv_state_out.data<double>()[j];
    for (std::int64_t j = 0; j < rec_size; ++j)
      e.rec.data<double>()[x.slot * rec_size + j] = r.recurrent_state_out.data<double>()[j];
    e.conv_written.insert(x.slot);
    e.rec_written.insert(x.slot);
  }
  return e;
}

// The rows `index` of a pool (any dtype), as a new tensor of that dtype.
Tensor slots(const Tensor& pool, const std::set<std::int64_t>& index) {
  Dims sizes = pool.sizes();
  sizes[0] = static_cast<std::int64_t>(index.size());
  Tensor r(pool.dtype(), pool.rank(), sizes);
  const std::size_t row = pool.bytes() / static_cast<std::size_t>(pool.size(0));
  std::size_t i = 0;
  for (std::int64_t x : index) {
    std::memcpy(static_cast<char*>(r.raw()) + i++ * row,
                static_cast<const char*>(pool.raw()) + static_cast<std::size_t>(x) * row, row);
  }
  return r;
}

Tensor out_rows(const Tensor& out, const std::set<std::int64_t>& index) {
  return slots(out, index);
}

// A bf16 slot carries one rounding more than a float32 one (tests/cpu/step_harness.h).
double tolerance_of(const Tensor& got, const Tensor& want, double tolerance) {
  if (got.dtype() != DType::bf16) return tolerance;
  Tensor r(DType::bf16, want.rank(), want.sizes());
  for (std::int64_t i = 0; i < want.numel(); ++i) set_value(r, i, test::value_at(want, i));
  return tolerance + 2 * test::compare(r, want).normalized();
}

// The step's result (out, pools after) against the oracle; slots not written byte for byte as
// before (conv0, rec0), out rows outside the live sequences exactly zero.
void expect_matches(const Expected& want, const Tensor& out, const Pools& got, const Tensor& conv0,
                    const Tensor& rec0, double tolerance, const std::string& what) {
  EXPECT_TRUE(test::within(out_rows(out, want.live_rows), out_rows(want.out, want.live_rows),
                           tolerance, "out, " + what));
  const Tensor wc = slots(want.conv, want.conv_written), wr = slots(want.rec, want.rec_written);
  EXPECT_TRUE(test::within(slots(got.conv, want.conv_written), wc,
                           tolerance_of(got.conv, wc, tolerance), "conv_state, " + what));
  EXPECT_TRUE(test::within(slots(got.rec, want.rec_written), wr,
                           tolerance_of(got.rec, wr, tolerance), "recurrent_state, " + what));
  for (std::int64_t x = 0; x < got.conv.size(0); ++x) {
    if (!want.conv_written.count(x)) {
      EXPECT_TRUE(
          test::bit_identical(slots(got.conv, {x}), slots(conv0, {x}),
                              "conv_state slot " + std::to_string(x) + " (not written), " + what));
    }
    if (!want.rec_written.count(x)) {
      EXPECT_TRUE(test::bit_identical(
          slots(got.rec, {x}), slots(rec0, {x}),
          "recurrent_state slot " + std::to_string(x) + " (not written), " + what));
    }
  }
  const std::int64_t width = out.size(1);
  for (std::int64_t t = 0; t < out.size(0); ++t) {
    if (want.live_rows.count(t)) continue;
    for (std::int64_t j = 0; j < width; ++j) {
      ASSERT_EQ(test::value_at(out, t * width + j), 0.0) << "out row " << t << ", " << what;
    }
  }
}

// Runs one step on `pools` (updated), out filled with NaN first.
Tensor run(const SpecStep& p, Pools& pools, const StepOptions& o, bool reference = false) {
  Tensor out(reference ? DType::f64 : p.c.dtype, {p.tokens, p.c.hv * p.c.dv});
  for (std::int64_t i = 0; i < out.numel(); ++i) set_value(out, i, kNaN);
  if (reference) {
    ref::fused_gdn_step(p.inputs(), pools.view(), out.mutable_view(), o);
  } else {
    fused_gdn_step(p.inputs(), pools.view(), out.mutable_view(), o);
  }
  return out;
}

Pools f64_pools(const Pools& p) { return {to_f64(p.conv), to_f64(p.rec)}; }

// A run of steps: each step's windows take `accepted[step]` (one per window; the others keep
// their own), the CPU step on every ISA and the float64 reference step each carrying their own
// pools, each step checked against the oracle from that path's pools before it.
void check_steps(SpecCase c, const std::vector<std::vector<std::int64_t>>& accepted,
                 const std::vector<std::vector<std::int64_t>>& lengths = {}) {
  const Pools start = make_pools(c);
  const double tolerance = c.dtype == DType::f32 ? 1e-4 : 1e-12;
  for (CpuIsa isa : test::runnable_isas()) {
    Pools fast{clone(start.conv), clone(start.rec)};
    Pools ref64 = f64_pools(start);
    for (std::size_t step = 0; step < accepted.size(); ++step) {
      SpecCase sc = c;
      sc.seed = c.seed + 101 * step;
      for (std::size_t w = 0; w < sc.windows.size(); ++w) {
        sc.windows[w].accepted = accepted[step][w];
        if (!lengths.empty()) sc.windows[w].q = lengths[step][w];
        if (step > 0) sc.windows[w].history = true;
      }
      if (step > 0) {
        for (Other& x : sc.others) x.history = true;
      }
      const SpecStep p = make_step(sc);
      const std::string what = std::string(cpu_isa_name(isa)) + ", step " + std::to_string(step);
      StepOptions o = p.options();
      o.isa = isa;
      const Tensor conv0 = clone(fast.conv), rec0 = clone(fast.rec);
      const Expected want = oracle(p, conv0, rec0);
      const Tensor out = run(p, fast, o);
      expect_matches(want, out, fast, conv0, rec0, tolerance, what);
      if (isa != test::runnable_isas().front() || c.dtype == DType::f64) continue;
      // The float64 reference step, on its own float64 pools.
      SpecCase c64 = sc;
      c64.dtype = DType::f64;
      SpecStep same = make_step(c64);  // with the float32 step's values, widened
      same.qkv = to_f64(p.qkv);
      same.a = to_f64(p.a);
      same.b = to_f64(p.b);
      same.conv_weight = to_f64(p.conv_weight);
      same.conv_bias = to_f64(p.conv_bias);
      same.A_log = to_f64(p.A_log);
      same.dt_bias = to_f64(p.dt_bias);
      const Tensor rc0 = clone(ref64.conv), rr0 = clone(ref64.rec);
      const Expected want64 = oracle(same, rc0, rr0);
      const Tensor out64 = run(same, ref64, same.options(), /*reference=*/true);
      expect_matches(want64, out64, ref64, rc0, rr0, 1e-12, "ref::fused_gdn_step, " + what);
    }
  }
}

// Four windows of num_spec = 3 (block-table rows of scattered slots), after them a chunked
// prefill, a fresh prefill and a one-token plain decode.
SpecCase mixed_case() {
  SpecCase c;
  c.windows = {{4, 1, {5, 17, 2, 30}},
               {4, 4, {9, 3, 22, 14}},
               {2, 2, {11, 26, 7, 19}},
               {1, 3, {28, 6, 24, 12}}};
  c.others = {{9, 20, true}, {70, 13, false}, {1, 15, true}};
  c.num_slots = 32;
  return c;
}

TEST(CpuStepSpeculative, OneStepWindowsAndPrefillsMatchOracle) {
  check_steps(mixed_case(), {{1, 4, 2, 3}});
}

TEST(CpuStepSpeculative, AcceptedOneAndAllInEveryWindow) {
  SpecCase c = mixed_case();
  c.others.clear();
  for (Window& w : c.windows) w.q = 4;
  check_steps(c, {{1, 1, 1, 1}, {4, 4, 4, 4}, {1, 4, 1, 4}});
}

TEST(CpuStepSpeculative, FiveStepsInARowWithVaryingAcceptedCountsAndLengths) {
  // Each step's accepted count at most the previous step's window length, as an engine's.
  check_steps(mixed_case(), {{1, 1, 1, 1}, {3, 4, 2, 1}, {2, 1, 3, 1}, {4, 2, 1, 1}, {1, 3, 2, 1}},
              {{4, 4, 2, 1}, {4, 4, 3, 1}, {4, 2, 1, 2}, {1, 3, 2, 4}, {4, 4, 4, 4}});
}

TEST(CpuStepSpeculative, WindowsWithoutHistoryStartFromZeros) {
  SpecCase c = mixed_case();
  c.windows[1].history = false;
  c.windows[3].history = false;
  c.windows[3].row[2] = 0;  // column a - 1 of a window without history: never read
  check_steps(c, {{1, 2, 2, 3}});
}

TEST(CpuStepSpeculative, PaddingSequencesWriteNothing) {
  SpecCase c = mixed_case();
  c.padding = 3;
  check_steps(c, {{1, 4, 2, 3}, {2, 3, 1, 1}});
}

TEST(CpuStepSpeculative, BlockTableOfTheWindowsAloneAsVllmPassesIt) {
  SpecCase c = mixed_case();
  c.window_rows_only = true;
  c.padding = 2;
  check_steps(c, {{1, 4, 2, 3}, {3, 2, 1, 1}});
}

TEST(CpuStepSpeculative, Bf16PoolsMatchOracle) {
  SpecCase c = mixed_case();
  c.bf16_conv_pool = c.bf16_rec_pool = true;
  check_steps(c, {{1, 4, 2, 3}, {4, 1, 1, 1}});
}

TEST(CpuStepSpeculative, Float64StepMatchesOracle) {
  SpecCase c = mixed_case();
  c.dtype = DType::f64;
  check_steps(c, {{1, 4, 2, 3}});
}

TEST(CpuStepSpeculative, TapsTwoAndSixNumSpecOne) {
  for (std::int64_t taps : {2, 6}) {
    SpecCase c;
    c.taps = taps;
    c.num_spec = 1;
    c.windows = {{2, 1, {3, 8}}, {2, 2, {5, 1}}, {1, 2, {9, 2}}};
    c.others = {{7, 4, true}};
    c.num_slots = 10;
    SCOPED_TRACE("K = " + std::to_string(taps));
    check_steps(c, {{1, 2, 2}, {2, 1, 1}}, {{2, 2, 1}, {2, 1, 2}});
  }
}

TEST(CpuStepSpeculative, BitIdenticalAcrossThreadCounts) {
  SpecCase c = mixed_case();
  c.hv = 8;
  c.hk = 4;
  c.dv = 40;  // value-column blocks with a tail
  const SpecStep p = make_step(c);
  const Pools start = make_pools(c);
  for (CpuIsa isa : test::runnable_isas()) {
    Pools first{clone(start.conv), clone(start.rec)};
    StepOptions o = p.options();
    o.isa = isa;
    o.threads = 1;
    const Tensor out1 = run(p, first, o);
    for (int threads : {2, 3, 5}) {
      Pools other{clone(start.conv), clone(start.rec)};
      o.threads = threads;
      const Tensor out = run(p, other, o);
      const std::string what =
          std::string(cpu_isa_name(isa)) + ", " + std::to_string(threads) + " threads";
      EXPECT_TRUE(test::bit_identical(out, out1, "out, " + what));
      EXPECT_TRUE(test::bit_identical(other.conv, first.conv, "conv_state, " + what));
      EXPECT_TRUE(test::bit_identical(other.rec, first.rec, "recurrent_state, " + what));
    }
  }
}

// vLLM's hybrid pages: each slot's conv buffer and recurrent state in one padded page, the
// two pools interleaved at a storage offset (docs: include/gdn/step.h, any slot stride). The
// step on such pools gives the bytes it gives on dense ones, and touches no padding.
TEST(CpuStepSpeculative, InterleavedPagesGiveTheDensePoolsBytes) {
  SpecCase c = mixed_case();
  const SpecStep p = make_step(c);
  Pools dense = make_pools(c);
  const std::int64_t conv_slot = slot_numel(dense.conv), rec_slot = slot_numel(dense.rec);
  const std::int64_t page = conv_slot + rec_slot + 24, offset = 8;  // elements (float32)
  std::vector<float> pages(static_cast<std::size_t>(offset + c.num_slots * page), -3.5f);
  for (std::int64_t x = 0; x < c.num_slots; ++x) {
    std::memcpy(&pages[offset + x * page], dense.conv.data<float>() + x * conv_slot,
                conv_slot * sizeof(float));
    std::memcpy(&pages[offset + x * page + conv_slot], dense.rec.data<float>() + x * rec_slot,
                rec_slot * sizeof(float));
  }
  const std::vector<float> before = pages;
  const std::int64_t d = c.channels(), cols = c.columns();
  const StatePools strided{
      MutableTensorView(&pages[offset], DType::f32, 3, {c.num_slots, cols, d, 0}, {page, d, 1, 0}),
      MutableTensorView(&pages[offset + conv_slot], DType::f32, 4, {c.num_slots, c.hv, c.dk, c.dv},
                        {page, c.dk * c.dv, c.dv, 1})};
  for (CpuIsa isa : test::runnable_isas()) {
    StepOptions o = p.options();
    o.isa = isa;
    Pools want{clone(dense.conv), clone(dense.rec)};
    const Tensor want_out = run(p, want, o);
    std::vector<float> got = before;
    const std::ptrdiff_t shift = got.data() - pages.data();
    StatePools views = strided;
    views.conv_state.data = static_cast<float*>(views.conv_state.data) + shift;
    views.recurrent_state.data = static_cast<float*>(views.recurrent_state.data) + shift;
    Tensor out(DType::f32, {p.tokens, c.hv * c.dv});
    fused_gdn_step(p.inputs(), views, out.mutable_view(), o);
    EXPECT_TRUE(test::bit_identical(out, want_out, std::string("out, ") + cpu_isa_name(isa)));
    for (std::int64_t x = 0; x < c.num_slots; ++x) {
      const float* at = &got[offset + x * page];
      EXPECT_EQ(std::memcmp(at, want.conv.data<float>() + x * conv_slot, conv_slot * 4), 0)
          << "conv slot " << x;
      EXPECT_EQ(std::memcmp(at + conv_slot, want.rec.data<float>() + x * rec_slot, rec_slot * 4), 0)
          << "recurrent slot " << x;
      for (std::int64_t i = conv_slot + rec_slot; i < page && x + 1 < c.num_slots; ++i)
        ASSERT_EQ(at[i], -3.5f) << "padding of page " << x;
    }
  }
}

// Check mode: a window whose output overflows throws after the step wrote its slots; every
// slot is put back. NaN in the buffer columns no sequence reads is never reported.
TEST(CpuStepSpeculative, CheckModeRestoresEverySlotAndIgnoresUnreadColumns) {
  SpecCase c = mixed_case();
  SpecStep p = make_step(c);
  Pools pools = make_pools(c);
  const std::int64_t d = c.channels(), cols = c.columns();
  // NaN in columns no sequence reads: window 1 (a = 4) reads columns [3, 6) (and rewrites
  // column 0), window 2 (a = 2, q = 2) reads [1, 4) and keeps [4, 6), the plain decode of slot
  // 15 reads and writes [0, 3).
  for (std::int64_t ch = 0; ch < d; ++ch) {
    set_value(pools.conv, (9 * cols + 0) * d + ch, kNaN);
    set_value(pools.conv, (11 * cols + 5) * d + ch, kNaN);
    set_value(pools.conv, (15 * cols + 4) * d + ch, kNaN);
  }
  StepOptions o = p.options();
  o.check_finite = true;
  {
    Pools copy{clone(pools.conv), clone(pools.rec)};
    EXPECT_NO_THROW(run(p, copy, o));
  }
  // The v channels of window 2's last token huge and their conv taps 4: its conv overflows.
  const std::int64_t t = p.qsl[3] - 1;
  for (std::int64_t ch = 2 * c.hk * c.dk; ch < d; ++ch) {
    set_value(p.qkv, t * d + ch, 3e38);
    for (std::int64_t j = 0; j < c.taps; ++j) set_value(p.conv_weight, ch * c.taps + j, 4.0);
  }
  Pools copy{clone(pools.conv), clone(pools.rec)};
  EXPECT_THROW(run(p, copy, o), NonFiniteError);
  EXPECT_TRUE(test::bit_identical(copy.conv, pools.conv, "conv_state after the throw"));
  EXPECT_TRUE(test::bit_identical(copy.rec, pools.rec, "recurrent_state after the throw"));
}

// ---------------------------------------------------------------------------------------------
// Refusals: gdn::InvalidArgument naming the argument, pools unchanged.

struct Refusal {
  const char* name;
  const char* argument;
  std::vector<const char*> words;
  std::function<void(SpecStep&, Pools&, std::vector<std::int64_t>&)> breaks;
};

TEST(CpuStepSpeculative, EveryRefusalNamesItsArgumentAndWritesNothing) {
  const std::vector<Refusal> refusals = {
      {"NumAcceptedAbsent",
       "num_accepted_tokens",
       {"present with spec_state_indices"},
       [](SpecStep&, Pools&, std::vector<std::int64_t>& flags) { flags[0] = 1; }},
      {"SpecStateIndicesAbsent",
       "spec_state_indices",
       {"present with num_accepted_tokens"},
       [](SpecStep&, Pools&, std::vector<std::int64_t>& flags) { flags[1] = 1; }},
      {"ReadOffsetsGiven",
       "read_offsets",
       {"absent in the speculative layout"},
       [](SpecStep&, Pools&, std::vector<std::int64_t>& flags) { flags[2] = 1; }},
      {"ReadStateIndicesGiven",
       "read_state_indices",
       {"absent in the speculative layout"},
       [](SpecStep&, Pools&, std::vector<std::int64_t>& flags) { flags[3] = 1; }},
      {"ConvPoolWithoutSpecColumns",
       "conv_state",
       {"[num_slots, K - 1 + num_spec, D]", "[32, 6, 128]"},
       [](SpecStep&, Pools& pools, std::vector<std::int64_t>&) {
         pools.conv = Tensor(DType::f32, {32, 3, 128});
       }},
      {"TableOfWrongWidth",
       "spec_state_indices",
       {"[R, 1 + num_spec] = [R, 4], R at most N", "[7, 3]"},
       [](SpecStep&, Pools&, std::vector<std::int64_t>& flags) { flags[4] = 1; }},
      {"TableShorterThanWindows",
       "spec_state_indices",
       {"at least decode_end = 4 rows", "[3, 4]"},
       [](SpecStep&, Pools&, std::vector<std::int64_t>& flags) { flags[5] = 1; }},
      {"AcceptedOfAnotherLength",
       "num_accepted_tokens",
       {"[R] with R = 4", "given [7]"},
       [](SpecStep&, Pools&, std::vector<std::int64_t>& flags) { flags[6] = 1; }},
      {"AcceptedZero",
       "num_accepted_tokens",
       {"1 to 1 + num_spec = 4", "num_accepted_tokens[2] = 0"},
       [](SpecStep& p, Pools&, std::vector<std::int64_t>&) { p.accepted[2] = 0; }},
      {"AcceptedPastWindow",
       "num_accepted_tokens",
       {"num_accepted_tokens[0] = 5"},
       [](SpecStep& p, Pools&, std::vector<std::int64_t>&) { p.accepted[0] = 5; }},
      {"WindowWritesNullSlot",
       "spec_state_indices",
       {"a slot in [1, 32)", "spec_state_indices[1, 2] = 0"},
       [](SpecStep& p, Pools&, std::vector<std::int64_t>&) { p.table[1 * 4 + 2] = 0; }},
      {"WindowSlotPastPool",
       "spec_state_indices",
       {"spec_state_indices[0, 3] = 32"},
       [](SpecStep& p, Pools&, std::vector<std::int64_t>&) { p.table[0 * 4 + 3] = 32; }},
      {"ReadColumnOutOfRange",
       "spec_state_indices",
       {"the state it starts from", "spec_state_indices[3, 2] = -1"},
       [](SpecStep& p, Pools&, std::vector<std::int64_t>&) {
         p.accepted[3] = 3;  // window 3 has one token, reads column 2
         p.table[3 * 4 + 2] = -1;
       }},
      {"TwoWindowsWriteOneSlot",
       "spec_state_indices",
       {"both write slot 17"},
       [](SpecStep& p, Pools&, std::vector<std::int64_t>&) { p.table[1 * 4 + 3] = 17; }},
      {"PrefillWritesAWindowSlot",
       "state_indices",
       {"both write slot 26"},
       [](SpecStep& p, Pools&, std::vector<std::int64_t>&) { p.state_indices[4] = 26; }},
      {"WindowReadsASlotAPrefillWrites",
       "spec_state_indices",
       {"a read slot that no other live sequence writes", "reads slot 20"},
       [](SpecStep& p, Pools&, std::vector<std::int64_t>&) {
         p.accepted[3] = 2;  // window 3 has one token, reads column 1
         p.table[3 * 4 + 1] = 20;
       }},
      {"WindowLongerThanSpec",
       "query_start_loc",
       {"decodes of 1 to 1 + num_spec = 4 tokens"},
       [](SpecStep& p, Pools&, std::vector<std::int64_t>&) {
         p.distribution = {5, 5, 7};  // the 9-token continuation counted as a window
       }},
  };
  for (const Refusal& r : refusals) {
    SpecCase c = mixed_case();
    SpecStep p = make_step(c);
    Pools pools = make_pools(c);
    std::vector<std::int64_t> flags(7, 0);
    r.breaks(p, pools, flags);
    const Tensor conv0 = clone(pools.conv), rec0 = clone(pools.rec);
    std::vector<std::int64_t> narrow(p.table.size(), 3);
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(p.n), 0);
    test::expect_rejected(
        [&] {
          StepInputs in = p.inputs();
          if (flags[0]) in.num_accepted_tokens = TensorView{};
          if (flags[1]) in.spec_state_indices = TensorView{};
          if (flags[2]) in.read_offsets = TensorView(offsets.data(), {p.n});
          if (flags[3]) in.read_state_indices = TensorView(offsets.data(), {p.n});
          if (flags[4]) in.spec_state_indices = TensorView(narrow.data(), {p.n, 3});
          if (flags[5]) {
            in.spec_state_indices = TensorView(p.table.data(), {3, 4});
            in.num_accepted_tokens = TensorView(p.accepted.data(), {3});
          }
          if (flags[6]) in.spec_state_indices = TensorView(p.table.data(), {4, 4});
          Tensor out(DType::f32, {p.tokens, c.hv * c.dv});
          fused_gdn_step(in, pools.view(), out.mutable_view(), p.options());
        },
        r.name, r.argument, r.words);
    EXPECT_TRUE(test::bit_identical(pools.conv, conv0, std::string(r.name) + ": conv_state"));
    EXPECT_TRUE(test::bit_identical(pools.rec, rec0, std::string(r.name) + ": recurrent_state"));
  }
}

}  // namespace
}  // namespace gdn
