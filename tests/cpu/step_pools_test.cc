// step_pools_test.cc: what a drop-in for Tokamax's serving call needs from the step
// (gdn/step.h), against the oracle of tests/cpu/step_harness.h on every compiled ISA variant:
//   bf16 pools: bit for bit the float32 pools' result rounded once, when the float32 pools hold
//     the same (bf16) start values; within slot_tolerance of the float64 oracle; bit-identical
//     for any thread count (a rejected call leaves them untouched: step_test.cc's validation
//     test runs on bf16 pools too);
//   Tokamax's padded metadata: its own tests' batches (a decreasing query_start_loc tail,
//     distribution values past N);
//   read_state_indices: a sequence reading one slot and writing another.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "step_harness.h"

namespace gdn {
namespace {

using namespace step_test;

// t (f32 or bf16) as f32, exactly.
Tensor widened(const Tensor& t) {
  Tensor r(DType::f32, t.rank(), t.sizes());
  for (std::int64_t i = 0; i < t.numel(); ++i) set_value(r, i, test::value_at(t, i));
  return r;
}

// t (f32) rounded to bf16 (or f16) as gdn::bf16_bits (gdn::f16_bits) rounds.
Tensor rounded(const Tensor& t, DType to = DType::bf16) {
  Tensor r(to, t.rank(), t.sizes());
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float x = t.data<float>()[i];
    static_cast<std::uint16_t*>(r.raw())[i] = to == DType::bf16 ? bf16_bits(x) : f16_bits(x);
  }
  return r;
}

// The three ways to mix the pools' dtypes.
struct PoolDtypes {
  bool conv, rec;
  const char* name;
};
const PoolDtypes kMixes[] = {
    {true, true, "bf16 / bf16"}, {true, false, "bf16 / f32"}, {false, true, "f32 / bf16"}};

StepSpec with_pools(StepSpec spec, const PoolDtypes& mix) {
  spec.bf16_conv_pool = mix.conv;
  spec.bf16_rec_pool = mix.rec;
  return spec;
}

// Decodes (one fresh), a speculative window, a fresh and a continued prefill, padding: K = 4.
StepSpec mixed_spec() {
  StepSpec spec;
  spec.num_slots = 16;
  spec.num_spec = 2;
  spec.read_offsets = true;
  spec.decodes = {{1, 13, 7}, {1, 2, 0}, {3, 4, 30, 2}, {2, 8, 5, 0}};
  spec.prefills = {{37, 11, 0}, {70, 15, 0}};
  spec.continued = {{65, 10, 100}};
  spec.padding = {{2, -1}};
  spec.trailing = 3;
  return spec;
}

// Sequences reading one slot and writing another (prefix caching), with and without offsets:
// decodes (two of them sharing a read slot, one reading its own), a window, a continued
// prefill; a fresh prefill whose read slot is never read.
StepSpec read_state_spec() {
  StepSpec spec;
  spec.num_slots = 24;
  spec.num_spec = 3;
  spec.read_offsets = true;
  spec.read_state_indices = true;
  spec.decodes = {
      {1, 1, 9, 0, 20}, {1, 2, 4, 0, 2}, {4, 3, 12, 1, 17}, {2, 7, 6, -1, 22}, {1, 12, 3, 0, 20}};
  spec.prefills = {{40, 9, 0, 0, 21}};
  spec.continued = {{33, 10, 50, 2, 15}, {17, 11, 8, 0, 11}};
  spec.padding = {{3, 0, 0, 0, -7}};
  return spec;
}

// ---------------------------------------------------------------------------------------------
// bf16 pools.

// The step over bf16 pools against the step over float32 pools holding the same values: the
// same out bytes, and every slot of a bf16 pool equal to the float32 pool's rounded to bf16
// (slots nobody writes included: their values are bf16 values already). With float32, bf16 and
// f16 activations, K = 1, 2 and 4, and an odd channel count (a channel tail on every variant,
// where the conv kernel stages the conv state's rows).
TEST(CpuStepPools, Bf16EqualsFloat32RoundedOnce) {
  std::vector<StepSpec> specs = {speculative_spec(), mixed_spec(), read_state_spec()};
  for (const std::int64_t taps : {1, 2}) {
    StepSpec s = mixed_spec();
    s.taps = taps;
    s.dk = 20;
    s.dv = 36;  // no whole number of vectors
    specs.push_back(s);
  }
  StepSpec odd = mixed_spec();
  odd.hk = 1;
  odd.hv = 3;
  odd.dk = 18;
  odd.dv = 37;  // D = 147
  specs.push_back(odd);
  for (const StepSpec& base : specs) {
    for (const PoolDtypes& mix : kMixes) {
      for (const DType activations : {DType::f32, DType::bf16, DType::f16}) {
        StepProblem p16 = make_step_problem(with_pools(base, mix));
        StepProblem p32 = make_step_problem(base);
        p32.conv_pool = widened(p16.conv_pool);
        p32.rec_pool = widened(p16.rec_pool);
        if (activations != DType::f32) {
          for (StepProblem* p : {&p16, &p32}) {
            p->spec.dtype = activations;
            p->qkv = rounded(p->qkv, activations);
            p->a = rounded(p->a, activations);
            p->b = rounded(p->b, activations);
          }
        }
        for (CpuIsa isa : compiled_isas()) {
          StepOptions o = p16.options();
          o.isa = isa;
          const StepResult got = run_step(p16, o), want = run_step(p32, o);
          const std::string what = p16.spec.name() + ", " + cpu_isa_name(isa);
          EXPECT_TRUE(test::bit_identical(got.out, want.out, "out, " + what));
          const Tensor conv = mix.conv ? rounded(want.conv_pool) : clone(want.conv_pool);
          const Tensor rec = mix.rec ? rounded(want.rec_pool) : clone(want.rec_pool);
          EXPECT_TRUE(test::bit_identical(got.conv_pool, conv,
                                          "conv_state vs the float32 pool's, rounded, " + what));
          EXPECT_TRUE(test::bit_identical(
              got.rec_pool, rec, "recurrent_state vs the float32 pool's, rounded, " + what));
        }
      }
    }
  }
}

// Against the float64 oracle (start values the bf16 pool's): out within the float32
// tolerance, the written slots within slot_tolerance, every other slot untouched; the float64
// reference step on the same values too.
TEST(CpuStepPools, Bf16AgainstFloat64Reference) {
  for (const PoolDtypes& mix : kMixes) {
    check_case(make_step_problem(with_pools(speculative_spec(), mix)));
    check_case(make_step_problem(with_pools(mixed_spec(), mix)));
  }
  StepSpec large;
  large.dk = 32;
  large.dv = 32;
  large.num_slots = 70;
  for (std::int64_t i = 0; i < 64; ++i) large.decodes.push_back({1, 1 + (i * 37) % 64, 3 + i});
  large.prefills = {{300, 65, 0}};
  large.continued = {{257, 66, 1000}};
  check_case(make_step_problem(with_pools(large, kMixes[0])));
}

TEST(CpuStepPools, Bf16BitIdenticalForAnyThreadCount) {
  StepSpec spec = speculative_spec();
  spec.prefills = {{300, 41, 0, 1}, {5, 45, 0}};
  spec.continued = {{129, 43, 25, 1}};
  spec.num_slots = 46;
  for (const PoolDtypes& mix : kMixes) {
    const StepProblem p = make_step_problem(with_pools(spec, mix));
    for (CpuIsa isa : compiled_isas()) {
      StepOptions o = p.options();
      o.isa = isa;
      o.threads = 1;
      const StepResult one = run_step(p, o);
      for (int threads : {2, 3}) {
        o.threads = threads;
        const StepResult r = run_step(p, o);
        const std::string what =
            std::to_string(threads) + " threads vs 1, pools " + mix.name + ", " + cpu_isa_name(isa);
        EXPECT_TRUE(test::bit_identical(r.out, one.out, "out, " + what));
        EXPECT_TRUE(test::bit_identical(r.conv_pool, one.conv_pool, "conv_state, " + what));
        EXPECT_TRUE(test::bit_identical(r.rec_pool, one.rec_pool, "recurrent_state, " + what));
      }
    }
  }
}

// Enough decodes that cpu::decode hands its items out in runs of several (160 items: runs of 10,
// 6 and 2 on 2, 3 and 7 threads), each item of a bf16 pool prefetching the next one of its run,
// whole vector pairs of columns (Dv = 64, the pair-order kernel): the same bits as one thread
// (one run of every item), for both pools' dtypes.
TEST(CpuStepPools, DecodeInRunsOfItemsBitIdenticalForAnyThreadCount) {
  StepSpec spec;
  spec.dk = 32;
  spec.dv = 64;
  spec.num_slots = 41;
  for (std::int64_t i = 0; i < 40; ++i) spec.decodes.push_back({1, 1 + (i * 7) % 40, 2 + i});
  for (const bool bf16 : {false, true}) {
    spec.bf16_conv_pool = spec.bf16_rec_pool = bf16;
    const StepProblem p = make_step_problem(spec);
    for (CpuIsa isa : compiled_isas()) {
      StepOptions o = p.options();
      o.isa = isa;
      o.threads = 1;
      const StepResult one = run_step(p, o);
      for (int threads : {2, 3, 7}) {
        o.threads = threads;
        const StepResult r = run_step(p, o);
        const std::string what = std::to_string(threads) + " threads vs 1, " +
                                 (bf16 ? "bf16" : "f32") + " pools, " + cpu_isa_name(isa);
        EXPECT_TRUE(test::bit_identical(r.out, one.out, "out, " + what));
        EXPECT_TRUE(test::bit_identical(r.rec_pool, one.rec_pool, "recurrent_state, " + what));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Tokamax's padded metadata (its gdn_attention_test.py; docs/peers.md, section 3).

// padded_mixed_prefill: query_start_loc = [0, 128, 192, 224, 240, 248] + [1] * 11, the padding
// sequences with seq_lens 0 and state_indices 0. Prefills (two of them continued) and the same
// with bf16 pools.
TEST(CpuStepPools, TokamaxPaddedMixedPrefill) {
  StepSpec spec;
  spec.num_slots = 8;
  spec.prefills = {{128, 1, 0}, {64, 2, 0}, {32, 3, 0}};
  spec.continued = {{16, 4, 40}, {8, 5, 7}};
  for (int i = 0; i < 11; ++i) spec.padding.push_back({0, 0, 0});
  spec.trailing = 8;
  for (const bool bf16 : {false, true}) {
    spec.bf16_conv_pool = spec.bf16_rec_pool = bf16;
    StepProblem p = make_step_problem(spec);
    for (std::size_t i = 6; i < p.query_start_loc.size(); ++i) p.query_start_loc[i] = 1;
    ASSERT_EQ(p.n, 16);
    ASSERT_EQ(p.query_start_loc[5], 248);
    ASSERT_EQ(p.distribution, (std::vector<std::int64_t>{0, 3, 5}));
    for (std::int64_t s = 5; s < p.n; ++s) ASSERT_EQ(p.seq_lens[s], 0);
    check_case(p);
  }
}

// A tail past mixed_end that decreases, runs past T and below 0, behind decodes and a window;
// padding sequences whose every other entry is garbage too.
TEST(CpuStepPools, AnyQueryStartLocTailPastMixedEnd) {
  StepSpec spec;
  spec.num_slots = 12;
  spec.num_spec = 1;
  spec.decodes = {{1, 3, 5}, {2, 5, 9}};
  spec.prefills = {{20, 8, 0}};
  spec.padding = {{1, -1, 0}, {1, 100, -5}, {1, 3, 0}};
  spec.trailing = 2;
  StepProblem p = make_step_problem(spec);
  p.query_start_loc[4] = 7;
  p.query_start_loc[5] = 1000000;
  p.query_start_loc[6] = -3;
  check_case(p);
}

// prefill: N = 1 with distribution [0, 0, 3] (mixed_end past N counts as N), fresh and with
// history; and decode_end and prefill_end past N as well.
TEST(CpuStepPools, TokamaxDistributionPastN) {
  for (const std::int64_t history : {0, 30}) {
    StepSpec spec;
    spec.num_slots = 3;
    spec.prefills = {{50, 2, history}};
    StepProblem p = make_step_problem(spec);
    p.distribution = {0, 0, 3};
    check_case(p);
  }
  StepSpec spec;
  spec.num_slots = 4;
  spec.decodes = {{1, 1, 6}, {1, 3, 0}};
  StepProblem p = make_step_problem(spec);
  p.distribution = {2, 7, 9};  // all decodes: [2, 2, 2]
  check_case(p);
}

// ---------------------------------------------------------------------------------------------
// read_state_indices.

// Read one slot, write another: against the oracle (which reads read_state_indices[s] +
// read_offsets[s]), the read slots untouched; with f32 and bf16 pools.
TEST(CpuStepPools, ReadStateIndicesReadOneSlotWriteAnother) {
  for (const bool bf16 : {false, true}) {
    StepSpec spec = read_state_spec();
    spec.bf16_conv_pool = spec.bf16_rec_pool = bf16;
    const StepProblem p = make_step_problem(spec);
    check_case(p);
    for (CpuIsa isa : compiled_isas()) {
      StepOptions o = p.options();
      o.isa = isa;
      const StepResult r = run_step(p, o);
      for (std::int64_t slot : {20, 18, 21, 17}) {
        EXPECT_TRUE(rows_identical(r.conv_pool, p.conv_pool, slot, 1)) << "read slot " << slot;
        EXPECT_TRUE(rows_identical(r.rec_pool, p.rec_pool, slot, 1)) << "read slot " << slot;
      }
    }
  }
}

// read_state_indices equal to state_indices gives the bytes of a call without it.
TEST(CpuStepPools, ReadStateIndicesDefaultToStateIndices) {
  StepSpec spec = speculative_spec();
  StepProblem with = make_step_problem(spec);
  with.spec.read_state_indices = true;
  with.read_state_indices = with.state_indices;
  const StepProblem without = make_step_problem(spec);
  for (CpuIsa isa : compiled_isas()) {
    StepOptions o = with.options();
    o.isa = isa;
    const StepResult a = run_step(with, o), b = run_step(without, o);
    EXPECT_TRUE(test::bit_identical(a.out, b.out, "out"));
    EXPECT_TRUE(test::bit_identical(a.conv_pool, b.conv_pool, "conv_state"));
    EXPECT_TRUE(test::bit_identical(a.rec_pool, b.rec_pool, "recurrent_state"));
  }
}

}  // namespace
}  // namespace gdn
