// step_test.cc: one serving step of the fused layer op over pools of state slots (gdn/step.h),
// on the CPU (every compiled ISA variant) and its float64 reference, against the oracle of
// tests/cpu/step_harness.h. The cases of the serving issue: large, mixed and decode-only
// batches, sparse slots, stale slots, two steps against one, isolation from NaN in other slots,
// padding, speculative windows, determinism across thread counts and
// float64 inputs. bf16 pools, Tokamax's padded metadata and read_state_indices:
// tests/cpu/step_pools_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "step_harness.h"

namespace gdn {
namespace {

using namespace step_test;

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

// Validation: tests/api/validate_step_test.cc, one test per rule of the header's list.

}  // namespace
}  // namespace gdn
