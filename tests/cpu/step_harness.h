// step_harness.h: the serving step's test harness (tests/cpu/step_test.cc and
// tests/cpu/step_pools_test.cc): batches built from a spec, the oracle (gdn::ref::fused_gdn_fwd
// run sequence by sequence, from the sequence's read slot when it has history and from zeros
// when it has none, a decode window one token at a time with the state after each position
// expected in consecutive slots), running a step on copies of the pools and checking it.
//
// Tolerance as tests/cpu/layer_test.cc (docs/numerics.md): float32 within 1e-4 of the float64
// oracle in the shared metric (bench/error_stats.h), float64 within 1e-12; the float64
// reference step (gdn::ref::fused_gdn_step) within 1e-12 of the oracle; a bf16 pool's written
// slots within slot_tolerance. Slots that the step must not write are compared byte for byte,
// and output rows outside every live sequence must be exactly zero (out is filled with NaN
// before each call).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/compare.h"
#include "common/isas.h"
#include "common/layer_problem.h"
#include "common/problem.h"

namespace gdn::step_test {

inline constexpr double kF32Tolerance = 1e-4;
inline constexpr double kF64Tolerance = 1e-12;
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

inline std::vector<CpuIsa> compiled_isas() { return test::runnable_isas(); }

// ---------------------------------------------------------------------------------------------
// Problems.

// One sequence of a step.
struct Seq {
  std::int64_t len = 1;          // its tokens in this step (the query length)
  std::int64_t slot = 1;         // state_indices
  std::int64_t history = 0;      // seq_lens - len: more than 0 means it reads its read slot
  std::int64_t read_offset = 0;  // read_offsets (passed only with StepSpec::read_offsets)
  // read_state_indices (passed only with StepSpec::read_state_indices); -1: state_indices.
  std::int64_t read_slot = -1;
};

struct StepSpec {
  std::int64_t hk = 2, hv = 4, dk = 16, dv = 16, taps = 4;
  DType dtype = DType::f32;
  // bf16 pools (f32 activations only here; else the pools have the activations' dtype).
  bool bf16_conv_pool = false, bf16_rec_pool = false;
  std::int64_t num_slots = 2;
  std::int64_t num_spec = 0;
  // In batch order: decodes, then prefills, then chunked continuations (prefill_end between
  // the two), then padding sequences.
  std::vector<Seq> decodes, prefills, continued, padding;
  std::int64_t trailing = 0;        // token rows past query_start_loc[N]
  bool read_offsets = false;        // pass read_offsets (else absent: zeros)
  bool read_state_indices = false;  // pass read_state_indices (else absent: state_indices)
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
    if (bf16_conv_pool || bf16_rec_pool) {
      s += std::string(", pools ") + (bf16_conv_pool ? "bf16" : "f32") + " / " +
           (bf16_rec_pool ? "bf16" : "f32");
    }
    return s;
  }
};

struct StepProblem {
  StepSpec spec;
  std::int64_t tokens = 0, n = 0;
  std::vector<std::int64_t> query_start_loc, state_indices, seq_lens, distribution, read_offsets;
  std::vector<std::int64_t> read_state_indices;
  Tensor qkv, a, b, conv_weight, conv_bias, A_log, dt_bias;
  Tensor conv_pool, rec_pool;  // the pools before the step
  // Optional layouts the op must accept (the oracle reads qkv and conv_weight as they are):
  // qkv as a strided view into `qkv_wide` (element (t, c) at t (2 D + 3) + 2 c + 1), and
  // conv_weight as its [D, 1, K] view.
  Tensor qkv_wide;
  bool weight_3d = false;

  // Values past N count as N (gdn/step.h).
  std::int64_t decode_end() const { return std::min(distribution[0], n); }
  std::int64_t mixed_end() const { return std::min(distribution[2], n); }
  std::int64_t read_base(std::int64_t s) const {
    return spec.read_state_indices ? read_state_indices[s] : state_indices[s];
  }

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
    if (spec.read_state_indices) {
      in.read_state_indices = TensorView(read_state_indices.data(), {n});
    }
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

inline void set_value(Tensor& t, std::int64_t i, double x) {
  if (t.dtype() == DType::f32) {
    t.data<float>()[i] = static_cast<float>(x);
  } else if (t.dtype() == DType::bf16) {
    static_cast<std::uint16_t*>(t.raw())[i] = bf16_bits(static_cast<float>(x));
  } else if (t.dtype() == DType::f16) {
    static_cast<std::uint16_t*>(t.raw())[i] = f16_bits(static_cast<float>(x));
  } else {
    t.data<double>()[i] = x;
  }
}

inline std::int64_t slot_numel(const Tensor& pool) { return pool.numel() / pool.size(0); }

inline void fill_slot(Tensor& pool, std::int64_t slot, double x) {
  const std::int64_t m = slot_numel(pool);
  for (std::int64_t i = 0; i < m; ++i) set_value(pool, slot * m + i, x);
}

inline Tensor clone(const Tensor& t) {
  if (!t.present()) return Tensor();
  Tensor r(t.dtype(), t.rank(), t.sizes());
  std::memcpy(r.raw(), t.raw(), t.bytes());
  return r;
}

inline Tensor to_f64(const Tensor& t) {
  if (!t.present()) return Tensor();
  Tensor r(DType::f64, t.rank(), t.sizes());
  for (std::int64_t i = 0; i < t.numel(); ++i) r.data<double>()[i] = test::value_at(t, i);
  return r;
}

// Rows [from, from + count) of a tensor, as a view.
inline TensorView rows(const Tensor& t, std::int64_t from, std::int64_t count) {
  TensorView v = t.view();
  v.data = static_cast<const char*>(v.data) +
           from * v.strides[0] * static_cast<std::int64_t>(dtype_size(v.dtype));
  v.sizes[0] = count;
  return v;
}
inline MutableTensorView mutable_rows(Tensor& t, std::int64_t from, std::int64_t count) {
  MutableTensorView v = t.mutable_view();
  v.data = static_cast<char*>(v.data) +
           from * v.strides[0] * static_cast<std::int64_t>(dtype_size(v.dtype));
  v.sizes[0] = count;
  return v;
}

// Copies row `from` of src (any float dtype) into row `to` of dst (f64), one row = numel /
// size(0) elements.
inline void copy_row(const Tensor& src, std::int64_t from, Tensor& dst, std::int64_t to) {
  const std::int64_t m = slot_numel(src);
  for (std::int64_t i = 0; i < m; ++i) {
    dst.data<double>()[to * m + i] = test::value_at(src, from * m + i);
  }
}

// The rows `index` of t, as a new tensor.
inline Tensor gather(const Tensor& t, const std::vector<std::int64_t>& index) {
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

inline bool rows_identical(const Tensor& x, const Tensor& y, std::int64_t from,
                           std::int64_t count) {
  const std::size_t row = x.bytes() / static_cast<std::size_t>(x.size(0));
  return std::memcmp(static_cast<const char*>(x.raw()) + static_cast<std::size_t>(from) * row,
                     static_cast<const char*>(y.raw()) + static_cast<std::size_t>(from) * row,
                     static_cast<std::size_t>(count) * row) == 0;
}

inline StepProblem make_step_problem(const StepSpec& spec) {
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
    p.read_state_indices.push_back(s.read_slot >= 0 ? s.read_slot : s.slot);
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

  p.conv_pool = Tensor(spec.bf16_conv_pool ? DType::bf16 : spec.dtype,
                       {spec.num_slots, spec.taps - 1, spec.channels()});
  p.rec_pool = Tensor(spec.bf16_rec_pool ? DType::bf16 : spec.dtype,
                      {spec.num_slots, spec.hv, spec.dk, spec.dv});
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
inline StepProblem as_f64(const StepProblem& p) {
  StepProblem r;
  r.spec = p.spec;
  r.spec.dtype = DType::f64;
  r.spec.bf16_conv_pool = r.spec.bf16_rec_pool = false;
  r.tokens = p.tokens;
  r.n = p.n;
  r.query_start_loc = p.query_start_loc;
  r.state_indices = p.state_indices;
  r.seq_lens = p.seq_lens;
  r.distribution = p.distribution;
  r.read_offsets = p.read_offsets;
  r.read_state_indices = p.read_state_indices;
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

inline Oracle oracle(const StepProblem& p) {
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
    const std::int64_t read = p.read_base(s) + (p.spec.read_offsets ? p.read_offsets[s] : 0);
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
inline StepResult run_step(const StepProblem& p, const StepOptions& o, bool reference = false) {
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

// The error (bench/error_stats.h's metric) of the f64 tensor ref rounded to bf16.
inline double bf16_rounding_error(const Tensor& ref) {
  Tensor r(DType::bf16, ref.rank(), ref.sizes());
  for (std::int64_t i = 0; i < ref.numel(); ++i) set_value(r, i, test::value_at(ref, i));
  return test::compare(r, ref).normalized();
}

// The tolerance of the written slots of `pool` (of the step's result) against want (f64): a
// bf16 slot carries one rounding more than a float32 one, so twice the error of want rounded
// to bf16 is added to the float32 tolerance (docs/numerics.md, "bf16 state pools").
inline double slot_tolerance(const Tensor& pool, const Tensor& want, double tolerance) {
  return pool.dtype() == DType::bf16 ? tolerance + 2 * bf16_rounding_error(want) : tolerance;
}

// The result of a step against the oracle: live rows and written slots within `tolerance`
// (slots of a bf16 pool: slot_tolerance), every other row exactly zero, every other slot byte
// for byte as before (conv0, rec0).
inline void expect_matches(const Oracle& want, const StepResult& got, const Tensor& conv0,
                           const Tensor& rec0, double tolerance, const std::string& what) {
  EXPECT_TRUE(test::within(gather(got.out, want.live_rows), gather(want.out, want.live_rows),
                           tolerance, "out (live rows), " + what));
  const Tensor want_conv = gather(want.conv_pool, want.written_slots);
  const Tensor want_rec = gather(want.rec_pool, want.written_slots);
  EXPECT_TRUE(test::within(gather(got.conv_pool, want.written_slots), want_conv,
                           slot_tolerance(got.conv_pool, want_conv, tolerance),
                           "conv_state (written slots), " + what));
  EXPECT_TRUE(test::within(gather(got.rec_pool, want.written_slots), want_rec,
                           slot_tolerance(got.rec_pool, want_rec, tolerance),
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
inline void check_case(const StepProblem& p) {
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

// num_spec = 3: windows of 1 to 4 tokens reading slot + 0, 1 or 2 (some fresh), each position's
// states in consecutive slots; prefills reading with an offset too.
inline StepSpec speculative_spec() {
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

}  // namespace gdn::step_test
