// step_test.cc: one serving step of the fused layer op over pools of state slots (gdn/step.h),
// on the CPU (every compiled ISA variant) and its float64 reference, against an oracle written
// here: gdn::ref::fused_gdn_fwd run sequence by sequence, from the sequence's read slot when it
// has history and from zeros when it has none, a decode window one token at a time with the
// state after each position expected in consecutive slots. The cases of the serving issue:
// large, mixed and decode-only batches, sparse slots, stale slots, two steps against one,
// isolation from NaN in other slots, padding, every validation error, speculative windows,
// determinism across thread counts and float64 inputs.
//
// Tolerance as tests/cpu/layer_test.cc (docs/numerics.md): float32 within 1e-4 of the float64
// oracle in the shared metric (bench/error_stats.h), float64 within 1e-12; the float64
// reference step (gdn::ref::fused_gdn_step) within 1e-12 of the oracle. Slots that the step
// must not write are compared byte for byte, and output rows outside every live sequence must
// be exactly zero (out is filled with NaN before each call).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/compare.h"
#include "common/isas.h"
#include "common/layer_problem.h"
#include "common/problem.h"

namespace gdn {
namespace {

constexpr double kF32Tolerance = 1e-4;
constexpr double kF64Tolerance = 1e-12;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<CpuIsa> compiled_isas() { return test::runnable_isas(); }

// ---------------------------------------------------------------------------------------------
// Problems.

// One sequence of a step.
struct Seq {
  std::int64_t len = 1;          // its tokens in this step (the query length)
  std::int64_t slot = 1;         // state_indices
  std::int64_t history = 0;      // seq_lens - len: more than 0 means it reads its read slot
  std::int64_t read_offset = 0;  // read_offsets (passed only with StepSpec::read_offsets)
};

struct StepSpec {
  std::int64_t hk = 2, hv = 4, dk = 16, dv = 16, taps = 4;
  DType dtype = DType::f32;
  std::int64_t num_slots = 2;
  std::int64_t num_spec = 0;
  // In batch order: decodes, then prefills, then chunked continuations (prefill_end between
  // the two), then padding sequences.
  std::vector<Seq> decodes, prefills, continued, padding;
  std::int64_t trailing = 0;  // token rows past query_start_loc[N]
  bool read_offsets = false;  // pass read_offsets (else absent: zeros)
  std::uint64_t seed = 1;

  std::int64_t channels() const { return 2 * hk * dk + hv * dv; }
  std::vector<Seq> all() const {
    std::vector<Seq> s = decodes;
    s.insert(s.end(), prefills.begin(), prefills.end());
    s.insert(s.end(), continued.begin(), continued.end());
    s.insert(s.end(), padding.begin(), padding.end());
    return s;
  }
  std::string name() const {
    std::string s = std::to_string(decodes.size()) + " decodes, prefills [";
    auto lengths = [&s](const std::vector<Seq>& seqs) {
      for (std::size_t i = 0; i < seqs.size(); ++i) {
        s += (i ? ", " : "") + std::to_string(seqs[i].len);
      }
    };
    lengths(prefills);
    s += "], continued [";
    lengths(continued);
    s += "], " + std::to_string(padding.size()) + " padding, " + std::to_string(num_slots) +
         " slots, num_spec " + std::to_string(num_spec) + ", Hk=" + std::to_string(hk) +
         " Hv=" + std::to_string(hv) + " Dk=" + std::to_string(dk) + " Dv=" + std::to_string(dv) +
         " K=" + std::to_string(taps) + " " + dtype_name(dtype);
    return s;
  }
};

struct StepProblem {
  StepSpec spec;
  std::int64_t tokens = 0, n = 0;
  std::vector<std::int64_t> query_start_loc, state_indices, seq_lens, distribution, read_offsets;
  Tensor qkv, a, b, conv_weight, conv_bias, A_log, dt_bias;
  Tensor conv_pool, rec_pool;  // the pools before the step
  // Optional layouts the op must accept (the oracle reads qkv and conv_weight as they are):
  // qkv as a strided view into `qkv_wide` (element (t, c) at t (2 D + 3) + 2 c + 1), and
  // conv_weight as its [D, 1, K] view.
  Tensor qkv_wide;
  bool weight_3d = false;

  std::int64_t decode_end() const { return distribution[0]; }
  std::int64_t mixed_end() const { return distribution[2]; }

  StepInputs inputs() const {
    StepInputs in;
    in.qkv = qkv.view();
    if (qkv_wide.present()) {
      const std::int64_t d = spec.channels();
      const auto* base = static_cast<const char*>(qkv_wide.raw()) + dtype_size(spec.dtype);
      in.qkv = TensorView(base, spec.dtype, 2, {tokens, d, 0, 0}, {2 * d + 3, 2, 0, 0});
    }
    in.a = a.view();
    in.b = b.view();
    in.conv_weight = conv_weight.view();
    if (weight_3d) {
      const std::int64_t d = spec.channels(), k = spec.taps;
      in.conv_weight = TensorView(conv_weight.raw(), spec.dtype, 3, {d, 1, k, 0}, {k, k, 1, 0});
    }
    in.conv_bias = conv_bias.view();
    in.A_log = A_log.view();
    in.dt_bias = dt_bias.view();
    in.query_start_loc = TensorView(query_start_loc.data(), {n + 1});
    in.state_indices = TensorView(state_indices.data(), {n});
    in.seq_lens = TensorView(seq_lens.data(), {n});
    in.distribution = TensorView(distribution.data(), {3});
    if (spec.read_offsets) in.read_offsets = TensorView(read_offsets.data(), {n});
    return in;
  }
  LayerOptions layer_options() const {
    LayerOptions o;
    o.hk = spec.hk;
    o.hv = spec.hv;
    o.dk = spec.dk;
    o.dv = spec.dv;
    return o;
  }
  StepOptions options() const {
    StepOptions o;
    static_cast<LayerOptions&>(o) = layer_options();
    o.num_spec = spec.num_spec;
    return o;
  }
};

void set_value(Tensor& t, std::int64_t i, double x) {
  if (t.dtype() == DType::f32) {
    t.data<float>()[i] = static_cast<float>(x);
  } else {
    t.data<double>()[i] = x;
  }
}

std::int64_t slot_numel(const Tensor& pool) { return pool.numel() / pool.size(0); }

void fill_slot(Tensor& pool, std::int64_t slot, double x) {
  const std::int64_t m = slot_numel(pool);
  for (std::int64_t i = 0; i < m; ++i) set_value(pool, slot * m + i, x);
}

Tensor clone(const Tensor& t) {
  if (!t.present()) return Tensor();
  Tensor r(t.dtype(), t.rank(), t.sizes());
  std::memcpy(r.raw(), t.raw(), t.bytes());
  return r;
}

Tensor to_f64(const Tensor& t) {
  if (!t.present()) return Tensor();
  Tensor r(DType::f64, t.rank(), t.sizes());
  for (std::int64_t i = 0; i < t.numel(); ++i) r.data<double>()[i] = test::value_at(t, i);
  return r;
}

// Rows [from, from + count) of a tensor, as a view.
TensorView rows(const Tensor& t, std::int64_t from, std::int64_t count) {
  TensorView v = t.view();
  v.data = static_cast<const char*>(v.data) +
           from * v.strides[0] * static_cast<std::int64_t>(dtype_size(v.dtype));
  v.sizes[0] = count;
  return v;
}
MutableTensorView mutable_rows(Tensor& t, std::int64_t from, std::int64_t count) {
  MutableTensorView v = t.mutable_view();
  v.data = static_cast<char*>(v.data) +
           from * v.strides[0] * static_cast<std::int64_t>(dtype_size(v.dtype));
  v.sizes[0] = count;
  return v;
}

// Copies row `from` of src (any float dtype) into row `to` of dst (f64), one row = numel /
// size(0) elements.
void copy_row(const Tensor& src, std::int64_t from, Tensor& dst, std::int64_t to) {
  const std::int64_t m = slot_numel(src);
  for (std::int64_t i = 0; i < m; ++i) {
    dst.data<double>()[to * m + i] = test::value_at(src, from * m + i);
  }
}

// The rows `index` of t, as a new tensor.
Tensor gather(const Tensor& t, const std::vector<std::int64_t>& index) {
  Dims sizes = t.sizes();
  sizes[0] = static_cast<std::int64_t>(index.size());
  Tensor r(t.dtype(), t.rank(), sizes);
  const std::size_t row = t.bytes() / static_cast<std::size_t>(t.size(0));
  for (std::size_t i = 0; i < index.size(); ++i) {
    std::memcpy(static_cast<char*>(r.raw()) + i * row,
                static_cast<const char*>(t.raw()) + static_cast<std::size_t>(index[i]) * row, row);
  }
  return r;
}

bool rows_identical(const Tensor& x, const Tensor& y, std::int64_t from, std::int64_t count) {
  const std::size_t row = x.bytes() / static_cast<std::size_t>(x.size(0));
  return std::memcmp(static_cast<const char*>(x.raw()) + static_cast<std::size_t>(from) * row,
                     static_cast<const char*>(y.raw()) + static_cast<std::size_t>(from) * row,
                     static_cast<std::size_t>(count) * row) == 0;
}

StepProblem make_step_problem(const StepSpec& spec) {
  StepProblem p;
  p.spec = spec;
  const std::vector<Seq> seqs = spec.all();
  p.n = static_cast<std::int64_t>(seqs.size());
  p.query_start_loc.push_back(0);
  for (const Seq& s : seqs) {
    p.query_start_loc.push_back(p.query_start_loc.back() + s.len);
    p.state_indices.push_back(s.slot);
    p.seq_lens.push_back(s.len + s.history);
    p.read_offsets.push_back(s.read_offset);
  }
  const auto nd = static_cast<std::int64_t>(spec.decodes.size());
  const auto np = static_cast<std::int64_t>(spec.prefills.size());
  const auto nc = static_cast<std::int64_t>(spec.continued.size());
  p.distribution = {nd, nd + np, nd + np + nc};
  p.tokens = p.query_start_loc.back() + spec.trailing;

  test::LayerSpec ls;
  ls.lengths = {p.tokens};
  ls.hk = spec.hk;
  ls.hv = spec.hv;
  ls.dk = spec.dk;
  ls.dv = spec.dv;
  ls.taps = spec.taps;
  ls.dtype = spec.dtype;
  ls.seed = spec.seed;
  test::LayerProblem lp = test::make_layer_problem(ls);
  p.qkv = std::move(lp.qkv);
  p.a = std::move(lp.a);
  p.b = std::move(lp.b);
  p.conv_weight = std::move(lp.conv_weight);
  p.conv_bias = std::move(lp.conv_bias);
  p.A_log = std::move(lp.A_log);
  p.dt_bias = std::move(lp.dt_bias);

  p.conv_pool = Tensor(spec.dtype, {spec.num_slots, spec.taps - 1, spec.channels()});
  p.rec_pool = Tensor(spec.dtype, {spec.num_slots, spec.hv, spec.dk, spec.dv});
  test::Random rng(spec.seed * 1000003 + 17);
  for (std::int64_t i = 0; i < p.conv_pool.numel(); ++i) set_value(p.conv_pool, i, rng.normal());
  for (std::int64_t i = 0; i < p.rec_pool.numel(); ++i) {
    set_value(p.rec_pool, i, 0.5 * rng.normal());
  }
  // The null slot: never read by a live sequence, so NaN there must never show.
  fill_slot(p.conv_pool, 0, kNaN);
  fill_slot(p.rec_pool, 0, kNaN);
  return p;
}

// The same problem with every float tensor in f64 (values exactly the same).
StepProblem as_f64(const StepProblem& p) {
  StepProblem r;
  r.spec = p.spec;
  r.spec.dtype = DType::f64;
  r.tokens = p.tokens;
  r.n = p.n;
  r.query_start_loc = p.query_start_loc;
  r.state_indices = p.state_indices;
  r.seq_lens = p.seq_lens;
  r.distribution = p.distribution;
  r.read_offsets = p.read_offsets;
  r.qkv = to_f64(p.qkv);
  r.a = to_f64(p.a);
  r.b = to_f64(p.b);
  r.conv_weight = to_f64(p.conv_weight);
  r.conv_bias = to_f64(p.conv_bias);
  r.A_log = to_f64(p.A_log);
  r.dt_bias = to_f64(p.dt_bias);
  r.conv_pool = to_f64(p.conv_pool);
  r.rec_pool = to_f64(p.rec_pool);
  return r;
}

// ---------------------------------------------------------------------------------------------
// The oracle: gdn::ref::fused_gdn_fwd, sequence by sequence, in float64.

struct Oracle {
  Tensor out;                  // f64 [T, Hv Dv], zero outside the live sequences
  Tensor conv_pool, rec_pool;  // f64 pools after the step
  std::vector<std::int64_t> live_rows, written_slots;
};

Oracle oracle(const StepProblem& p) {
  const Tensor qkv = to_f64(p.qkv), a = to_f64(p.a), b = to_f64(p.b);
  const Tensor w = to_f64(p.conv_weight), bias = to_f64(p.conv_bias);
  const Tensor a_log = to_f64(p.A_log), dt_bias = to_f64(p.dt_bias);
  const Tensor conv0 = to_f64(p.conv_pool), rec0 = to_f64(p.rec_pool);
  const LayerOptions o = p.layer_options();
  Oracle e;
  e.out = Tensor(DType::f64, {p.tokens, p.spec.hv * p.spec.dv});
  e.conv_pool = clone(conv0);
  e.rec_pool = clone(rec0);
  auto run = [&](std::int64_t from, std::int64_t count, const TensorView& conv,
                 const TensorView& rec) {
    const LayerInputs in{rows(qkv, from, count),
                         rows(a, from, count),
                         rows(b, from, count),
                         w.view(),
                         bias.view(),
                         a_log.view(),
                         dt_bias.view(),
                         conv,
                         rec,
                         {}};
    return ref::fused_gdn_fwd(in, o);
  };
  for (std::int64_t s = 0; s < p.mixed_end(); ++s) {
    const std::int64_t r0 = p.query_start_loc[s], len = p.query_start_loc[s + 1] - r0;
    const std::int64_t slot = p.state_indices[s];
    const std::int64_t read = slot + (p.spec.read_offsets ? p.read_offsets[s] : 0);
    const bool history = p.seq_lens[s] > len;
    TensorView conv = history ? rows(conv0, read, 1) : TensorView();
    TensorView rec = history ? rows(rec0, read, 1) : TensorView();
    for (std::int64_t i = 0; i < len; ++i) e.live_rows.push_back(r0 + i);
    if (s < p.decode_end()) {
      LayerForwardResult state;  // the states after the previous window position
      for (std::int64_t t = 0; t < len; ++t) {
        LayerForwardResult r = run(r0 + t, 1, conv, rec);
        copy_row(r.out, 0, e.out, r0 + t);
        copy_row(r.conv_state_out, 0, e.conv_pool, slot + t);
        copy_row(r.recurrent_state_out, 0, e.rec_pool, slot + t);
        e.written_slots.push_back(slot + t);
        state = std::move(r);
        conv = state.conv_state_out.view();
        rec = state.recurrent_state_out.view();
      }
    } else {
      const LayerForwardResult r = run(r0, len, conv, rec);
      for (std::int64_t t = 0; t < len; ++t) copy_row(r.out, t, e.out, r0 + t);
      copy_row(r.conv_state_out, 0, e.conv_pool, slot);
      copy_row(r.recurrent_state_out, 0, e.rec_pool, slot);
      e.written_slots.push_back(slot);
    }
  }
  return e;
}

// ---------------------------------------------------------------------------------------------
// Running the step and checking its result.

struct StepResult {
  Tensor out, conv_pool, rec_pool;
};

// One call on copies of the problem's pools, out filled with NaN first. `reference`: the
// float64 reference step (the problem must be f64).
StepResult run_step(const StepProblem& p, const StepOptions& o, bool reference = false) {
  StepResult r{Tensor(p.spec.dtype, {p.tokens, p.spec.hv * p.spec.dv}), clone(p.conv_pool),
               clone(p.rec_pool)};
  for (std::int64_t i = 0; i < r.out.numel(); ++i) set_value(r.out, i, kNaN);
  const StatePools pools{r.conv_pool.mutable_view(), r.rec_pool.mutable_view()};
  if (reference) {
    ref::fused_gdn_step(p.inputs(), pools, r.out.mutable_view(), o);
  } else {
    fused_gdn_step(p.inputs(), pools, r.out.mutable_view(), o);
  }
  return r;
}

// The result of a step against the oracle: live rows and written slots within `tolerance`,
// every other row exactly zero, every other slot byte for byte as before (conv0, rec0).
void expect_matches(const Oracle& want, const StepResult& got, const Tensor& conv0,
                    const Tensor& rec0, double tolerance, const std::string& what) {
  EXPECT_TRUE(test::within(gather(got.out, want.live_rows), gather(want.out, want.live_rows),
                           tolerance, "out (live rows), " + what));
  EXPECT_TRUE(test::within(gather(got.conv_pool, want.written_slots),
                           gather(want.conv_pool, want.written_slots), tolerance,
                           "conv_state (written slots), " + what));
  EXPECT_TRUE(test::within(gather(got.rec_pool, want.written_slots),
                           gather(want.rec_pool, want.written_slots), tolerance,
                           "recurrent_state (written slots), " + what));
  const std::set<std::int64_t> live(want.live_rows.begin(), want.live_rows.end());
  const std::int64_t width = got.out.size(1);
  int reported = 0;
  for (std::int64_t t = 0; t < got.out.size(0); ++t) {
    if (live.count(t)) continue;
    for (std::int64_t j = 0; j < width; ++j) {
      const double x = test::value_at(got.out, t * width + j);
      if (x != 0.0 && reported++ < 3) {
        ADD_FAILURE() << "out row " << t << " (no live sequence) element " << j << " is " << x
                      << ", expected 0; " << what;
      }
    }
  }
  const std::set<std::int64_t> written(want.written_slots.begin(), want.written_slots.end());
  for (std::int64_t slot = 0; slot < conv0.size(0); ++slot) {
    if (written.count(slot)) continue;
    EXPECT_TRUE(rows_identical(got.conv_pool, conv0, slot, 1))
        << "conv_state slot " << slot << " (not written by the step) changed; " << what;
    EXPECT_TRUE(rows_identical(got.rec_pool, rec0, slot, 1))
        << "recurrent_state slot " << slot << " (not written by the step) changed; " << what;
  }
}

// The CPU op on every compiled ISA variant, and the float64 reference step, against the oracle.
void check_case(const StepProblem& p) {
  const Oracle want = oracle(p);
  const double tolerance = p.spec.dtype == DType::f32 ? kF32Tolerance : kF64Tolerance;
  for (CpuIsa isa : compiled_isas()) {
    StepOptions o = p.options();
    o.isa = isa;
    const StepResult got = run_step(p, o);
    expect_matches(want, got, p.conv_pool, p.rec_pool, tolerance,
                   std::string(cpu_isa_name(isa)) + ", " + p.spec.name());
  }
  const StepProblem p64 = as_f64(p);
  const StepResult got = run_step(p64, p64.options(), /*reference=*/true);
  expect_matches(want, got, p64.conv_pool, p64.rec_pool, kF64Tolerance,
                 "ref::fused_gdn_step, " + p.spec.name());
}

// ---------------------------------------------------------------------------------------------
// Batches against the oracle.

TEST(CpuStep, OnePrefillOf8192Tokens) {
  StepSpec spec;
  spec.dk = 32;
  spec.dv = 32;
  spec.num_slots = 4;
  spec.prefills = {{8192, 2, 1000}};  // a prompt continued after 1000 tokens
  check_case(make_step_problem(spec));
}

TEST(CpuStep, MixedPrefills256x128x128) {
  StepSpec spec;
  spec.num_slots = 5;
  spec.prefills = {{256, 3, 0}, {128, 1, 0}};  // fresh prompts: stale slots
  spec.continued = {{128, 4, 64}};             // a chunked continuation
  check_case(make_step_problem(spec));
}

TEST(CpuStep, SixtyFourDecodes) {
  StepSpec spec;
  spec.num_slots = 65;
  for (std::int64_t i = 0; i < 64; ++i) {
    // Slots in a scrambled order; every eighth decode is a fresh one-token sequence.
    spec.decodes.push_back({1, 1 + (i * 37) % 64, i % 8 == 5 ? 0 : 3 + i % 7});
  }
  check_case(make_step_problem(spec));
}

TEST(CpuStep, EightDecodesAndPrefills128x128x256) {
  StepSpec spec;
  spec.num_slots = 16;
  for (std::int64_t i = 0; i < 8; ++i) spec.decodes.push_back({1, 15 - i, 10 + i});
  spec.prefills = {{128, 2, 0}, {128, 5, 40}};
  spec.continued = {{256, 3, 300}};
  check_case(make_step_problem(spec));
}

TEST(CpuStep, FiveSequencesInSixteenSlots) {
  StepSpec spec;
  spec.taps = 3;
  spec.num_slots = 16;
  spec.decodes = {{1, 13, 7}, {1, 2, 0}};
  spec.prefills = {{37, 9, 0}, {64, 15, 0}};
  spec.continued = {{65, 6, 100}};
  check_case(make_step_problem(spec));
}

TEST(CpuStep, SixtyFourDecodesIn512Slots) {
  StepSpec spec;
  spec.num_slots = 512;
  std::vector<std::int64_t> slots(511);
  for (std::int64_t i = 0; i < 511; ++i) slots[i] = i + 1;
  test::Random rng(5);
  for (std::int64_t i = 510; i > 0; --i) {  // Fisher-Yates
    std::swap(slots[i], slots[static_cast<std::int64_t>(rng.next() % (i + 1))]);
  }
  for (std::int64_t i = 0; i < 64; ++i) spec.decodes.push_back({1, slots[i], 1 + i % 5});
  spec.seed = 2;
  check_case(make_step_problem(spec));
}

// num_spec = 3: windows of 1 to 4 tokens reading slot + 0, 1 or 2 (some fresh), each position's
// states in consecutive slots; prefills reading with an offset too.
StepSpec speculative_spec() {
  StepSpec spec;
  spec.num_spec = 3;
  spec.read_offsets = true;
  const std::vector<std::pair<std::int64_t, std::int64_t>> windows = {
      {1, 0}, {2, 1}, {3, 2}, {4, 0}, {4, 2}, {3, 1}, {2, 0}, {1, 2}, {4, 1}, {3, 1}};
  for (std::size_t i = 0; i < windows.size(); ++i) {
    const std::int64_t base = 1 + 4 * static_cast<std::int64_t>(i);  // slots base .. base + 3
    const std::int64_t history = i == 9 ? 0 : 20 + static_cast<std::int64_t>(i);
    spec.decodes.push_back({windows[i].first, base, history, windows[i].second});
  }
  spec.prefills = {{50, 41, 0, 1}};    // fresh: its read slot 42 is never read
  spec.continued = {{70, 43, 25, 1}};  // reads 44, writes 43
  spec.num_slots = 45;
  return spec;
}

TEST(CpuStep, SpeculativeWindows) { check_case(make_step_problem(speculative_spec())); }

// The windows above with K = 1, 2 and 8 (windows shorter and longer than K - 1), Dk = Dv = 20
// (no whole number of vectors), Hv = 4 Hk; then the same with qkv a strided view (channel
// stride 2) and conv_weight as [D, 1, K].
TEST(CpuStep, TapsShapesAndStridedLayouts) {
  for (const std::int64_t taps : {1, 2, 8}) {
    StepSpec spec = speculative_spec();
    spec.taps = taps;
    spec.hk = 1;
    spec.hv = 4;
    spec.dk = 20;
    spec.dv = 20;
    StepProblem p = make_step_problem(spec);
    check_case(p);
    const std::int64_t d = spec.channels();
    p.qkv_wide = Tensor(spec.dtype, {p.tokens, 2 * d + 3});
    for (std::int64_t i = 0; i < p.qkv_wide.numel(); ++i) set_value(p.qkv_wide, i, kNaN);
    for (std::int64_t t = 0; t < p.tokens; ++t) {
      for (std::int64_t c = 0; c < d; ++c) {
        set_value(p.qkv_wide, t * (2 * d + 3) + 2 * c + 1, test::value_at(p.qkv, t * d + c));
      }
    }
    p.weight_3d = true;
    SCOPED_TRACE("strided qkv, [D, 1, K] conv_weight");
    check_case(p);
  }
}

// The op templated on both dtypes: f64 inputs and pools, within 1e-12 of the oracle.
TEST(CpuStep, Float64Inputs) {
  StepSpec spec = speculative_spec();
  spec.dtype = DType::f64;
  check_case(make_step_problem(spec));
  StepSpec mixed;
  mixed.dtype = DType::f64;
  mixed.num_slots = 8;
  mixed.decodes = {{1, 7, 3}};
  mixed.prefills = {{130, 2, 0}};
  mixed.continued = {{67, 5, 9}};
  mixed.padding = {{2, -1}};
  mixed.trailing = 3;
  check_case(make_step_problem(mixed));
}

// ---------------------------------------------------------------------------------------------
// Slots: stale contents, NaN elsewhere, two steps, padding.

// A sequence without history (seq_lens == its query length) starts from zeros: its slot's stale
// contents (NaN here) are never read, whatever read_offsets says.
TEST(CpuStep, StaleSlotIgnoredWithoutHistory) {
  StepSpec spec;
  spec.num_slots = 10;
  spec.num_spec = 1;
  spec.read_offsets = true;
  spec.decodes = {{1, 5, 0}, {2, 1, 0, 1}, {1, 9, 4}};  // fresh, fresh window, with history
  spec.prefills = {{24, 3, 0}};
  spec.continued = {{16, 7, 12}};
  const StepProblem clean = make_step_problem(spec);
  StepProblem stale = make_step_problem(spec);
  for (std::int64_t slot : {5, 1, 2, 3}) {
    fill_slot(stale.conv_pool, slot, kNaN);
    fill_slot(stale.rec_pool, slot, kNaN);
  }
  check_case(stale);  // the oracle starts those from zeros
  for (CpuIsa isa : compiled_isas()) {
    StepOptions o = clean.options();
    o.isa = isa;
    const StepResult a = run_step(clean, o), b = run_step(stale, o);
    const std::string what = std::string(", ") + cpu_isa_name(isa);
    EXPECT_TRUE(test::bit_identical(b.out, a.out, "out, stale NaN vs ordinary values" + what));
    for (std::int64_t slot : {5, 1, 2, 3, 7, 9}) {
      EXPECT_TRUE(rows_identical(b.conv_pool, a.conv_pool, slot, 1)) << "slot " << slot << what;
      EXPECT_TRUE(rows_identical(b.rec_pool, a.rec_pool, slot, 1)) << "slot " << slot << what;
    }
  }
}

// NaN in a slot that a sequence neither reads nor writes leaves that sequence's output rows and
// written slots bit-identical to a run where the slot holds ordinary values.
TEST(CpuStep, NanInAnotherSlotChangesNothing) {
  StepSpec spec;
  spec.num_slots = 12;
  spec.num_spec = 1;
  spec.decodes = {{2, 1, 9}, {1, 3, 4}};  // writes 1, 2 and 3
  spec.prefills = {{40, 6, 0}};
  spec.continued = {{33, 8, 20}};
  const StepProblem base = make_step_problem(spec);
  const std::vector<Seq> seqs = spec.all();
  // The NaN slot, and the sequence that reads it (-1: none).
  const std::vector<std::pair<std::int64_t, int>> cases = {{10, -1}, {3, 1}, {8, 3}, {1, 0}};
  for (CpuIsa isa : compiled_isas()) {
    StepOptions o = base.options();
    o.isa = isa;
    const StepResult a = run_step(base, o);
    for (const auto& [nan_slot, reader] : cases) {
      StepProblem p = make_step_problem(spec);
      fill_slot(p.conv_pool, nan_slot, kNaN);
      fill_slot(p.rec_pool, nan_slot, kNaN);
      const StepResult b = run_step(p, o);
      for (int s = 0; s < static_cast<int>(seqs.size()); ++s) {
        if (s == reader) continue;
        const std::string what = "sequence " + std::to_string(s) + ", NaN in slot " +
                                 std::to_string(nan_slot) + ", " + cpu_isa_name(isa);
        EXPECT_TRUE(rows_identical(b.out, a.out, base.query_start_loc[s], seqs[s].len))
            << "out rows, " << what;
        const std::int64_t written = s < base.decode_end() ? seqs[s].len : 1;
        for (std::int64_t t = 0; t < written; ++t) {
          EXPECT_TRUE(rows_identical(b.conv_pool, a.conv_pool, seqs[s].slot + t, 1))
              << "conv_state slot " << seqs[s].slot + t << ", " << what;
          EXPECT_TRUE(rows_identical(b.rec_pool, a.rec_pool, seqs[s].slot + t, 1))
              << "recurrent_state slot " << seqs[s].slot + t << ", " << what;
        }
      }
    }
  }
}

// 32 tokens, then 32 more from the same slot (seq_lens 64: history), equal 64 in one step, within
// tolerance; both match the oracle of the 64 tokens. Same with a prompt that had history first.
TEST(CpuStep, TwoStepsOf32EqualOneOf64) {
  for (std::int64_t history : {0, 50}) {
    StepSpec spec;
    spec.num_slots = 8;
    spec.prefills = {{64, 5, history}};
    const StepProblem whole = make_step_problem(spec);
    const Oracle want = oracle(whole);
    const std::int64_t width = spec.hv * spec.dv;
    for (CpuIsa isa : compiled_isas()) {
      StepOptions o = whole.options();
      o.isa = isa;
      const std::string what =
          "history " + std::to_string(history) + ", " + std::string(cpu_isa_name(isa));
      const StepResult one = run_step(whole, o);
      expect_matches(want, one, whole.conv_pool, whole.rec_pool, kF32Tolerance,
                     "one step, " + what);
      StepResult two{Tensor(DType::f32, {64, width}), clone(whole.conv_pool),
                     clone(whole.rec_pool)};
      for (std::int64_t i = 0; i < two.out.numel(); ++i) set_value(two.out, i, kNaN);
      for (std::int64_t step = 0; step < 2; ++step) {
        StepInputs in = whole.inputs();
        in.qkv = rows(whole.qkv, 32 * step, 32);
        in.a = rows(whole.a, 32 * step, 32);
        in.b = rows(whole.b, 32 * step, 32);
        const std::vector<std::int64_t> qsl = {0, 32}, slots = {5},
                                        lens = {history + 32 * (step + 1)}, dist = {0, 1, 1};
        in.query_start_loc = TensorView(qsl.data(), {2});
        in.state_indices = TensorView(slots.data(), {1});
        in.seq_lens = TensorView(lens.data(), {1});
        in.distribution = TensorView(dist.data(), {3});
        fused_gdn_step(in, {two.conv_pool.mutable_view(), two.rec_pool.mutable_view()},
                       mutable_rows(two.out, 32 * step, 32), o);
      }
      expect_matches(want, two, whole.conv_pool, whole.rec_pool, kF32Tolerance,
                     "two steps, " + what);
      EXPECT_TRUE(test::within(two.out, one.out, kF32Tolerance, "out, two steps vs one, " + what));
      EXPECT_TRUE(test::within(gather(two.rec_pool, {5}), gather(one.rec_pool, {5}), kF32Tolerance,
                               "recurrent_state, two steps vs one, " + what));
      EXPECT_TRUE(test::bit_identical(gather(two.conv_pool, {5}), gather(one.conv_pool, {5}),
                                      "conv_state (raw inputs), two steps vs one, " + what));
    }
  }
}

// Padding sequences (from mixed_end on) write nothing, whatever their state_indices say (-1, 0,
// past the pool, a live sequence's slot); their token rows and the trailing rows of out are zero.
// The allocating forms give the same bytes.
TEST(CpuStep, PaddingWritesNothing) {
  StepSpec spec;
  spec.num_slots = 10;
  spec.num_spec = 1;
  spec.read_offsets = true;
  spec.decodes = {{2, 1, 3, 1}, {1, 4, 2}};
  spec.prefills = {{20, 6, 0}};
  spec.continued = {{9, 8, 30}};
  spec.padding = {{1, -1}, {0, 0}, {3, 6}, {1, 100}, {2, 9}};
  spec.trailing = 5;
  const StepProblem p = make_step_problem(spec);
  check_case(p);
  StepOptions o = p.options();
  const StepResult in_place = run_step(p, o);
  Tensor conv = clone(p.conv_pool), rec = clone(p.rec_pool);
  const Tensor out = fused_gdn_step(p.inputs(), {conv.mutable_view(), rec.mutable_view()}, o);
  EXPECT_TRUE(test::bit_identical(out, in_place.out, "out, allocating form"));
  EXPECT_TRUE(test::bit_identical(conv, in_place.conv_pool, "conv_state, allocating form"));
  EXPECT_TRUE(test::bit_identical(rec, in_place.rec_pool, "recurrent_state, allocating form"));
  const StepProblem p64 = as_f64(p);
  const StepResult ref_in_place = run_step(p64, p64.options(), true);
  Tensor conv64 = clone(p64.conv_pool), rec64 = clone(p64.rec_pool);
  const Tensor out64 =
      ref::fused_gdn_step(p64.inputs(), {conv64.mutable_view(), rec64.mutable_view()}, o);
  EXPECT_TRUE(test::bit_identical(out64, ref_in_place.out, "out, reference allocating form"));
  EXPECT_TRUE(test::bit_identical(rec64, ref_in_place.rec_pool, "reference allocating form"));
}

// ---------------------------------------------------------------------------------------------
// Determinism.

TEST(CpuStep, BitIdenticalForAnyThreadCount) {
  StepSpec spec = speculative_spec();
  spec.prefills = {{300, 41, 0, 1}, {5, 45, 0}};
  spec.continued = {{129, 43, 25, 1}};
  spec.num_slots = 46;
  const StepProblem p = make_step_problem(spec);
  for (CpuIsa isa : compiled_isas()) {
    StepOptions o = p.options();
    o.isa = isa;
    o.threads = 1;
    const StepResult one = run_step(p, o);
    for (int threads : {2, 3}) {
      o.threads = threads;
      const StepResult r = run_step(p, o);
      const std::string what =
          std::to_string(threads) + " threads vs 1, " + std::string(cpu_isa_name(isa));
      EXPECT_TRUE(test::bit_identical(r.out, one.out, "out, " + what));
      EXPECT_TRUE(test::bit_identical(r.conv_pool, one.conv_pool, "conv_state, " + what));
      EXPECT_TRUE(test::bit_identical(r.rec_pool, one.rec_pool, "recurrent_state, " + what));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Validation.

// One call's arguments, the index tensors owned here so that a case can change them.
struct Call {
  std::vector<std::int64_t> qsl, si, sl, dist, ro;
  std::vector<std::int32_t> i32;  // for a case passing an index tensor as int32
  StepInputs in;
  StatePools pools;
  MutableTensorView out;
  StepOptions options;
};

struct InvalidCase {
  const char* what;
  std::vector<std::string> arguments;  // the names the error may give
  std::function<void(Call&)> change;
};

std::vector<std::int32_t> narrow(const std::vector<std::int64_t>& v) {
  return std::vector<std::int32_t>(v.begin(), v.end());
}

std::vector<InvalidCase> invalid_cases() {
  // The base call (validation_spec below): decodes 0 (2 tokens, slot 1, writes 1 and 2, reads 1)
  // and 1 (1 token, slot 4, reads 5), prefill 2 (6 tokens, slot 7, fresh), continuation 3
  // (5 tokens, slot 9, reads 9), padding 4 (1 token); 12 slots, num_spec 1, T = 17;
  // query_start_loc {0, 2, 3, 9, 14, 15}.
  const std::vector<std::string> index_shape = {"query_start_loc", "state_indices"};
  return {
      {"slot == num_slots", {"state_indices"}, [](Call& c) { c.si[2] = 12; }},
      {"window past the pool", {"state_indices"}, [](Call& c) { c.si[0] = 11; }},
      {"negative slot", {"state_indices"}, [](Call& c) { c.si[1] = -1; }},
      {"slot 0, live prefill", {"state_indices"}, [](Call& c) { c.si[2] = 0; }},
      {"slot 0, live decode", {"state_indices"}, [](Call& c) { c.si[1] = 0; }},
      {"two live sequences write one slot", {"state_indices"}, [](Call& c) { c.si[3] = 7; }},
      {"decode windows overlap", {"state_indices"}, [](Call& c) { c.si[1] = 2; }},
      {"read slot written by another sequence",
       {"read_offsets", "state_indices"},
       [](Call& c) { c.ro[1] = 3; }},  // decode 1 reads 7, which prefill 2 writes
      {"read slot written by another window",
       {"read_offsets", "state_indices"},
       [](Call& c) { c.ro[3] = -7; }},  // continuation 3 reads 2, which decode 0 writes
      {"read slot past the pool", {"read_offsets", "state_indices"}, [](Call& c) { c.ro[3] = 3; }},
      {"read slot 0", {"read_offsets", "state_indices"}, [](Call& c) { c.ro[0] = -1; }},
      {"bf16 matrix operands",
       {"options.matmul_precision"},
       [](Call& c) { c.options.matmul_precision = MatmulPrecision::bf16; }},
      {"matmul_precision out of range",
       {"options.matmul_precision"},
       [](Call& c) { c.options.matmul_precision = static_cast<MatmulPrecision>(9); }},
      {"query_start_loc decreases", {"query_start_loc"}, [](Call& c) { c.qsl[3] = 1; }},
      {"query_start_loc past T", {"query_start_loc"}, [](Call& c) { c.qsl[5] = 18; }},
      {"query_start_loc[0] not 0", {"query_start_loc"}, [](Call& c) { c.qsl[0] = 1; }},
      {"decode longer than 1 + num_spec",
       {"query_start_loc", "options.num_spec", "num_spec"},
       [](Call& c) { c.options.num_spec = 0; }},
      {"decode of 3 tokens with num_spec 1",
       {"query_start_loc", "options.num_spec", "num_spec"},
       [](Call& c) { c.qsl = {0, 3, 4, 9, 14, 15}; }},
      {"decode with no token",
       {"query_start_loc"},
       [](Call& c) {
         c.qsl[2] = 2;  // decode 1 empty, prefill 2 gets 7 tokens
         c.sl[2] = 7;
       }},
      {"live prefill with no token", {"query_start_loc"}, [](Call& c) { c.qsl[4] = 9; }},
      {"decode_end > prefill_end",
       {"distribution"},
       [](Call& c) {
         c.dist = {3, 2, 4};
       }},
      {"prefill_end > mixed_end",
       {"distribution"},
       [](Call& c) {
         c.dist = {2, 5, 4};
       }},
      {"mixed_end > N",
       {"distribution"},
       [](Call& c) {
         c.dist = {2, 3, 6};
       }},
      {"negative decode_end",
       {"distribution"},
       [](Call& c) {
         c.dist = {-1, 3, 4};
       }},
      {"distribution of 2 entries",
       {"distribution"},
       [](Call& c) { c.in.distribution.sizes[0] = 2; }},
      {"seq_lens below a prefill's query length", {"seq_lens"}, [](Call& c) { c.sl[2] = 5; }},
      {"seq_lens below a decode's query length", {"seq_lens"}, [](Call& c) { c.sl[0] = 1; }},
      {"state_indices int32",
       {"state_indices"},
       [](Call& c) {
         c.i32 = narrow(c.si);
         c.in.state_indices = TensorView(c.i32.data(), {5});
       }},
      {"query_start_loc int32",
       {"query_start_loc"},
       [](Call& c) {
         c.i32 = narrow(c.qsl);
         c.in.query_start_loc = TensorView(c.i32.data(), {6});
       }},
      {"seq_lens int32",
       {"seq_lens"},
       [](Call& c) {
         c.i32 = narrow(c.sl);
         c.in.seq_lens = TensorView(c.i32.data(), {5});
       }},
      {"distribution int32",
       {"distribution"},
       [](Call& c) {
         c.i32 = narrow(c.dist);
         c.in.distribution = TensorView(c.i32.data(), {3});
       }},
      {"read_offsets int32",
       {"read_offsets"},
       [](Call& c) {
         c.i32 = narrow(c.ro);
         c.in.read_offsets = TensorView(c.i32.data(), {5});
       }},
      {"state_indices of N - 1 entries", index_shape,
       [](Call& c) { c.in.state_indices.sizes[0] = 4; }},
      {"seq_lens of N - 1 entries", {"seq_lens"}, [](Call& c) { c.in.seq_lens.sizes[0] = 4; }},
      {"read_offsets of N - 1 entries",
       {"read_offsets"},
       [](Call& c) { c.in.read_offsets.sizes[0] = 4; }},
      {"conv_state pool with K - 2 inputs",
       {"conv_state", "pools.conv_state"},
       [](Call& c) { c.pools.conv_state.sizes[1] = 2; }},
      {"conv_state pool with D - 1 channels",
       {"conv_state", "pools.conv_state"},
       [](Call& c) { c.pools.conv_state.sizes[2] -= 1; }},
      {"recurrent_state pool with Dv - 1",
       {"recurrent_state", "pools.recurrent_state"},
       [](Call& c) { c.pools.recurrent_state.sizes[3] -= 1; }},
      {"recurrent_state pool with Hv - 1 heads",
       {"recurrent_state", "pools.recurrent_state"},
       [](Call& c) { c.pools.recurrent_state.sizes[1] -= 1; }},
      {"pools of different slot counts",
       {"recurrent_state", "pools.recurrent_state", "conv_state", "pools.conv_state"},
       [](Call& c) { c.pools.recurrent_state.sizes[0] = 11; }},
      {"conv_state pool of the other float dtype",
       {"conv_state", "pools.conv_state"},
       [](Call& c) {
         c.pools.conv_state.dtype =
             c.pools.conv_state.dtype == DType::f32 ? DType::f64 : DType::f32;
         c.pools.conv_state.sizes[0] = 6;  // within the buffer either way
         c.pools.conv_state.strides = contiguous_strides(c.pools.conv_state.sizes, 3);
       }},
      {"recurrent_state pool absent",
       {"recurrent_state", "pools.recurrent_state"},
       [](Call& c) { c.pools.recurrent_state = MutableTensorView(); }},
      {"out with T - 1 rows", {"out"}, [](Call& c) { c.out.sizes[0] = 16; }},
  };
}

StepSpec validation_spec() {
  StepSpec spec;
  spec.num_slots = 12;
  spec.num_spec = 1;
  spec.read_offsets = true;
  spec.decodes = {{2, 1, 5, 0}, {1, 4, 3, 1}};
  spec.prefills = {{6, 7, 0}};
  spec.continued = {{5, 9, 10}};
  spec.padding = {{1, -1}};
  spec.trailing = 2;
  return spec;
}

// Every invalid call of the header's list throws gdn::InvalidArgument naming the argument and
// leaves both pools (and out) bit-identical; the same for the float64 reference step. The
// unchanged base call is accepted.
TEST(CpuStep, ValidationErrorsLeavePoolsUntouched) {
  const StepProblem p32 = make_step_problem(validation_spec());
  const StepProblem p64 = as_f64(p32);
  ASSERT_EQ(p32.tokens, 17);
  ASSERT_EQ(p32.query_start_loc, (std::vector<std::int64_t>{0, 2, 3, 9, 14, 15}));
  for (const StepProblem* p : {&p32, &p64}) {
    const bool reference = p == &p64;
    const std::string who = reference ? "ref::fused_gdn_step" : "fused_gdn_step";
    EXPECT_NO_THROW(run_step(*p, p->options(), reference)) << who << ", the valid base call";
    for (const InvalidCase& bad : invalid_cases()) {
      StepResult r{Tensor(p->spec.dtype, {p->tokens, p->spec.hv * p->spec.dv}), clone(p->conv_pool),
                   clone(p->rec_pool)};
      for (std::int64_t i = 0; i < r.out.numel(); ++i) set_value(r.out, i, -3.0);
      const Tensor out_before = clone(r.out);
      Call c;
      c.qsl = p->query_start_loc;
      c.si = p->state_indices;
      c.sl = p->seq_lens;
      c.dist = p->distribution;
      c.ro = p->read_offsets;
      c.in = p->inputs();
      c.in.query_start_loc = TensorView(c.qsl.data(), {6});
      c.in.state_indices = TensorView(c.si.data(), {5});
      c.in.seq_lens = TensorView(c.sl.data(), {5});
      c.in.distribution = TensorView(c.dist.data(), {3});
      c.in.read_offsets = TensorView(c.ro.data(), {5});
      c.pools = {r.conv_pool.mutable_view(), r.rec_pool.mutable_view()};
      c.out = r.out.mutable_view();
      c.options = p->options();
      bad.change(c);
      // A case may have replaced a vector: point the views at the current storage again.
      if (c.in.query_start_loc.dtype == DType::i64) c.in.query_start_loc.data = c.qsl.data();
      if (c.in.distribution.dtype == DType::i64) c.in.distribution.data = c.dist.data();
      const std::string what = who + ", " + bad.what;
      try {
        if (reference) {
          ref::fused_gdn_step(c.in, c.pools, c.out, c.options);
        } else {
          fused_gdn_step(c.in, c.pools, c.out, c.options);
        }
        ADD_FAILURE() << "no error for: " << what;
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::find(bad.arguments.begin(), bad.arguments.end(), e.argument()),
                  bad.arguments.end())
            << what << ": the error names '" << e.argument() << "': " << e.what();
        EXPECT_NE(std::string(e.what()).find("'" + e.argument() + "'"), std::string::npos)
            << e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << what << ": not an InvalidArgument: " << e.what();
      }
      EXPECT_TRUE(test::bit_identical(r.conv_pool, p->conv_pool, "conv_state pool, " + what));
      EXPECT_TRUE(test::bit_identical(r.rec_pool, p->rec_pool, "recurrent_state pool, " + what));
      EXPECT_TRUE(test::bit_identical(r.out, out_before, "out, " + what));
    }
  }
}

}  // namespace
}  // namespace gdn
