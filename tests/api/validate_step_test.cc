// validate_step_test.cc: the serving step's validation rules (gdn::fused_gdn_step and the
// float64 reference gdn::ref::fused_gdn_step; gdn/step.h lists them), one test per rule, each
// named after it (docs/validation.md). A rule's test breaks one argument of a valid call and
// checks that the call throws gdn::InvalidArgument naming that argument, with "expected" and
// "given" and the rule's own words in the message, and that both pools and out are bit-identical
// to before the call. Every rule runs on float32 pools, bf16 pools (the pool dtype changes the
// pool rules) and the float64 reference.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "common/validation.h"
#include "cpu/step_harness.h"

namespace gdn {
namespace {

using step_test::as_f64;
using step_test::clone;
using step_test::make_step_problem;
using step_test::StepProblem;
using step_test::StepSpec;

// The base call: decodes 0 (2 tokens, slot 1, writes 1 and 2, reads 1) and 1 (1 token, slot 4,
// reads 5), prefill 2 (6 tokens, slot 7, fresh), continuation 3 (5 tokens, slot 9, reads 9),
// padding 4 (1 token); 12 slots, num_spec 1, T = 17; query_start_loc {0, 2, 3, 9, 14, 15};
// Hk 2, Hv 4, Dk = Dv = 16, K = 4: D = 128.
StepSpec base_spec(bool bf16_pools) {
  StepSpec spec;
  spec.num_slots = 12;
  spec.num_spec = 1;
  spec.read_offsets = true;
  spec.decodes = {{2, 1, 5, 0}, {1, 4, 3, 1}};
  spec.prefills = {{6, 7, 0}};
  spec.continued = {{5, 9, 10}};
  spec.padding = {{1, -1}};
  spec.trailing = 2;
  spec.bf16_conv_pool = spec.bf16_rec_pool = bf16_pools;
  return spec;
}

enum class Variant { f32_pools, bf16_pools, reference };

const StepProblem& problem(Variant v) {
  static const StepProblem p32 = make_step_problem(base_spec(false));
  static const StepProblem p16 = make_step_problem(base_spec(true));
  static const StepProblem p64 = as_f64(p32);
  return v == Variant::f32_pools ? p32 : v == Variant::bf16_pools ? p16 : p64;
}

// One call's arguments over copies of the pools; the index tensors owned here so that a rule
// can change them.
struct StepCall {
  const StepProblem& p;
  std::vector<std::int64_t> qsl, si, sl, dist, ro, rs;
  std::vector<std::int32_t> i32;  // for a rule passing an index tensor as int32
  Tensor out, conv_pool, rec_pool, out_before;
  StepInputs in;
  StatePools pools;
  MutableTensorView out_view;
  StepOptions options;

  explicit StepCall(const StepProblem& problem_)
      : p(problem_),
        qsl(p.query_start_loc),
        si(p.state_indices),
        sl(p.seq_lens),
        dist(p.distribution),
        ro(p.read_offsets),
        out(p.spec.dtype, {p.tokens, p.spec.hv * p.spec.dv}),
        conv_pool(clone(p.conv_pool)),
        rec_pool(clone(p.rec_pool)) {
    for (std::int64_t i = 0; i < out.numel(); ++i) step_test::set_value(out, i, -3.0);
    out_before = clone(out);
    in = p.inputs();
    in.query_start_loc = TensorView(qsl.data(), {6});
    in.state_indices = TensorView(si.data(), {5});
    in.seq_lens = TensorView(sl.data(), {5});
    in.distribution = TensorView(dist.data(), {3});
    in.read_offsets = TensorView(ro.data(), {5});
    pools = {conv_pool.mutable_view(), rec_pool.mutable_view()};
    out_view = out.mutable_view();
    options = p.options();
  }
  // Passes `values` (a copy of an index vector) as an int32 tensor.
  TensorView int32(const std::vector<std::int64_t>& values) {
    i32.assign(values.begin(), values.end());
    return TensorView(i32.data(), {static_cast<std::int64_t>(i32.size())});
  }
  // Passes read_state_indices: state_indices with entry s set to `slot`.
  void read_slot(std::size_t s, std::int64_t slot) {
    rs = si;
    rs[s] = slot;
    in.read_state_indices = TensorView(rs.data(), {5});
  }
  // Sets a pool's dtype to one its inputs do not take: `sixteen_bit` bf16 for float64 inputs,
  // f16 for the others; else the other float width (f64 for f32 or bf16 pools, f32 for f64
  // ones), with fewer slots so that the view stays inside the pool's buffer.
  static void wrong_pool_dtype(MutableTensorView& pool, int rank, bool sixteen_bit) {
    const bool f64 = pool.dtype == DType::f64;
    if (sixteen_bit) {
      pool.dtype = f64 ? DType::bf16 : DType::f16;
      return;
    }
    pool.dtype = f64 ? DType::f32 : DType::f64;
    pool.sizes[0] = 3;
    pool.strides = contiguous_strides(pool.sizes, rank);
  }
};

using Rule = test::Rule<StepCall>;

const std::vector<Rule>& rules() {
  static const std::vector<Rule> all = {
      // Slots out of range, and the slots' owners.
      {"SlotEqualToNumSlots",
       "state_indices",
       {"a slot in [1, 12)", "state_indices[2] = 12"},
       [](StepCall& c) { c.si[2] = 12; }},
      {"DecodeWindowPastThePool",
       "state_indices",
       {"with the 2 slots of its window from it", "state_indices[0] = 11"},
       [](StepCall& c) { c.si[0] = 11; }},
      {"SlotNegative",
       "state_indices",
       {"a slot in [1, 12)", "state_indices[1] = -1"},
       [](StepCall& c) { c.si[1] = -1; }},
      {"NullSlotWrittenByAPrefill",
       "state_indices",
       {"slot 0 is the null slot", "state_indices[2] = 0"},
       [](StepCall& c) { c.si[2] = 0; }},
      {"NullSlotWrittenByADecode",
       "state_indices",
       {"slot 0 is the null slot", "state_indices[1] = 0"},
       [](StepCall& c) { c.si[1] = 0; }},
      {"TwoSequencesWriteOneSlot",
       "state_indices",
       {"a distinct slot for every live sequence", "sequences 2 and 3 both write slot 7"},
       [](StepCall& c) { c.si[3] = 7; }},
      {"DecodeWindowsOverlap",
       "state_indices",
       {"a distinct slot for every live sequence", "sequences 0 and 1 both write slot 2"},
       [](StepCall& c) { c.si[1] = 2; }},
      {"PaddingMadeLiveByMixedEndPastN",
       "state_indices",
       {"a slot in [1, 12)", "state_indices[4] = -1"},
       [](StepCall& c) {
         c.dist = {2, 3, 6};
       }},
      {"StateIndicesAbsent",
       "state_indices",
       {"a rank-1 array [N] (a slot per sequence)", "absent"},
       [](StepCall& c) { c.in.state_indices = {}; }},
      {"StateIndicesRank2",
       "state_indices",
       {"a rank-1 array [N] (a slot per sequence)", "rank 2, [1, 5]"},
       [](StepCall& c) {
         c.in.state_indices = TensorView(c.si.data(), {1, 5});
       }},
      // Read slots.
      {"ReadSlotWrittenByAnotherSequence",
       "read_offsets",
       {"a read slot that no other live sequence writes",
        "sequence 1 reads slot 7, which sequence 2 writes"},
       [](StepCall& c) { c.ro[1] = 3; }},
      {"ReadSlotWrittenByAnotherWindow",
       "read_offsets",
       {"a read slot that no other live sequence writes",
        "sequence 3 reads slot 2, which sequence 0 writes"},
       [](StepCall& c) { c.ro[3] = -7; }},
      {"ReadSlotPastThePool",
       "read_offsets",
       {"a slot in [1, 12)", "read_offsets[3] = 3 (slot 9 + 3)"},
       [](StepCall& c) { c.ro[3] = 3; }},
      {"ReadSlotNull",
       "read_offsets",
       {"slot 0 is the null slot", "read_offsets[0] = -1 (slot 1 + -1)"},
       [](StepCall& c) { c.ro[0] = -1; }},
      {"ReadStateIndicesNullSlot",
       "read_state_indices",
       {"a slot in [1, 12)", "read_state_indices[3] = 0"},
       [](StepCall& c) { c.read_slot(3, 0); }},
      {"ReadStateIndicesPastThePool",
       "read_state_indices",
       {"a slot in [1, 12)", "read_state_indices[3] = 12"},
       [](StepCall& c) { c.read_slot(3, 12); }},
      {"ReadStateIndicesPlusOffsetPastThePool",
       "read_offsets",
       {"read_state_indices[s] + read_offsets[s]", "read_offsets[1] = 1 (slot 11 + 1)"},
       [](StepCall& c) { c.read_slot(1, 11); }},
      {"ReadStateIndicesFarOutOfRange",
       "read_state_indices",
       {"a slot in [1, 12)", "read_state_indices[3] = 9223372036854775807"},
       [](StepCall& c) { c.read_slot(3, std::numeric_limits<std::int64_t>::max()); }},
      {"ReadStateIndicesReadsAWrittenSlot",
       "read_state_indices",
       {"a read slot that no other live sequence writes",
        "sequence 3 reads slot 7, which sequence 2 writes"},
       [](StepCall& c) { c.read_slot(3, 7); }},
      // query_start_loc and the decode windows.
      {"QueryStartLocDecreasing",
       "query_start_loc",
       {"non-decreasing", "query_start_loc[3] = 1 < query_start_loc[2] = 3"},
       [](StepCall& c) { c.qsl[3] = 1; }},
      {"QueryStartLocDecreasingAtMixedEnd",
       "query_start_loc",
       {"non-decreasing", "query_start_loc[4] = 8 < query_start_loc[3] = 9"},
       [](StepCall& c) { c.qsl[4] = 8; }},
      {"QueryStartLocPastT",
       "query_start_loc",
       {"values at most T = 17", "query_start_loc[4] = 18"},
       [](StepCall& c) { c.qsl[4] = 18; }},
      {"QueryStartLocNotStartingAt0",
       "query_start_loc",
       {"query_start_loc[0] = 0", "1"},
       [](StepCall& c) { c.qsl[0] = 1; }},
      {"DecodeLongerThanOnePlusNumSpec",
       "query_start_loc",
       {"decodes of 1 to 1 + num_spec = 1 tokens", "has 2 tokens"},
       [](StepCall& c) { c.options.num_spec = 0; }},
      {"DecodeOfThreeTokensWithNumSpecOne",
       "query_start_loc",
       {"decodes of 1 to 1 + num_spec = 2 tokens", "has 3 tokens"},
       [](StepCall& c) { c.qsl = {0, 3, 4, 9, 14, 15}; }},
      {"DecodeWithNoToken",
       "query_start_loc",
       {"decodes of 1 to 1 + num_spec = 2 tokens", "sequence 1", "has 0 tokens"},
       [](StepCall& c) {
         c.qsl[2] = 2;  // decode 1 empty, prefill 2 gets 7 tokens
         c.sl[2] = 7;
       }},
      {"LivePrefillWithNoToken",
       "query_start_loc",
       {"at least one token for each prefill", "sequence 3 has none"},
       [](StepCall& c) { c.qsl[4] = 9; }},
      {"NumSpecNegative",
       "options.num_spec",
       {"0 to 1024 speculative tokens", "-1"},
       [](StepCall& c) { c.options.num_spec = -1; }},
      // seq_lens and distribution.
      {"SeqLensBelowAPrefillsTokens",
       "seq_lens",
       {"at least its tokens in this step", "seq_lens[2] = 5 < 6"},
       [](StepCall& c) { c.sl[2] = 5; }},
      {"SeqLensBelowADecodesTokens",
       "seq_lens",
       {"at least its tokens in this step", "seq_lens[0] = 1 < 2"},
       [](StepCall& c) { c.sl[0] = 1; }},
      {"DecodeEndAbovePrefillEnd",
       "distribution",
       {"0 <= decode_end <= prefill_end <= mixed_end", "[3, 2, 4]"},
       [](StepCall& c) {
         c.dist = {3, 2, 4};
       }},
      {"PrefillEndAboveMixedEnd",
       "distribution",
       {"0 <= decode_end <= prefill_end <= mixed_end", "[2, 5, 4]"},
       [](StepCall& c) {
         c.dist = {2, 5, 4};
       }},
      {"DecodeEndPastNClampedAbovePrefillEnd",
       "distribution",
       {"each value past N = 5 counting as N", "[9, 3, 4]"},
       [](StepCall& c) {
         c.dist = {9, 3, 4};
       }},
      {"DecodeEndNegative",
       "distribution",
       {"0 <= decode_end", "[-1, 3, 4]"},
       [](StepCall& c) {
         c.dist = {-1, 3, 4};
       }},
      {"DistributionOfTwoEntries",
       "distribution",
       {"[3] = [decode_end, prefill_end, mixed_end]", "[2]"},
       [](StepCall& c) { c.in.distribution.sizes[0] = 2; }},
      // The index tensors' dtype (int64) and length.
      {"StateIndicesInt32",
       "state_indices",
       {"dtype i64", "i32"},
       [](StepCall& c) { c.in.state_indices = c.int32(c.si); }},
      {"QueryStartLocInt32",
       "query_start_loc",
       {"dtype i64", "i32"},
       [](StepCall& c) { c.in.query_start_loc = c.int32(c.qsl); }},
      {"SeqLensInt32",
       "seq_lens",
       {"dtype i64", "i32"},
       [](StepCall& c) { c.in.seq_lens = c.int32(c.sl); }},
      {"DistributionInt32",
       "distribution",
       {"dtype i64", "i32"},
       [](StepCall& c) { c.in.distribution = c.int32(c.dist); }},
      {"ReadOffsetsInt32",
       "read_offsets",
       {"dtype i64", "i32"},
       [](StepCall& c) { c.in.read_offsets = c.int32(c.ro); }},
      {"ReadStateIndicesInt32",
       "read_state_indices",
       {"dtype i64", "i32"},
       [](StepCall& c) { c.in.read_state_indices = c.int32(c.si); }},
      {"QueryStartLocNotNPlusOne",
       "query_start_loc",
       {"[N + 1] with N = 4 (the length of state_indices)", "[6]"},
       [](StepCall& c) { c.in.state_indices.sizes[0] = 4; }},
      {"SeqLensNotN",
       "seq_lens",
       {"[N] with N = 5", "[4]"},
       [](StepCall& c) { c.in.seq_lens.sizes[0] = 4; }},
      {"ReadOffsetsNotN",
       "read_offsets",
       {"[N] with N = 5", "[4]"},
       [](StepCall& c) { c.in.read_offsets.sizes[0] = 4; }},
      {"ReadStateIndicesNotN",
       "read_state_indices",
       {"[N] with N = 5", "[4]"},
       [](StepCall& c) {
         c.read_slot(0, c.si[0]);
         c.in.read_state_indices.sizes[0] = 4;
       }},
      // The pools.
      {"ConvPoolTaps",
       "conv_state",
       {"[num_slots, K - 1, D] = [num_slots, 3, 128]", "[12, 2, 128]"},
       [](StepCall& c) { c.pools.conv_state.sizes[1] = 2; }},
      {"ConvPoolChannels",
       "conv_state",
       {"[num_slots, K - 1, D] = [num_slots, 3, 128]", "[12, 3, 127]"},
       [](StepCall& c) { c.pools.conv_state.sizes[2] -= 1; }},
      {"RecurrentPoolDv",
       "recurrent_state",
       {"[num_slots, Hv, Dk, Dv] = [num_slots, 4, 16, 16]", "[12, 4, 16, 15]"},
       [](StepCall& c) { c.pools.recurrent_state.sizes[3] -= 1; }},
      {"RecurrentPoolHeads",
       "recurrent_state",
       {"[num_slots, Hv, Dk, Dv] = [num_slots, 4, 16, 16]", "[12, 3, 16, 16]"},
       [](StepCall& c) { c.pools.recurrent_state.sizes[1] -= 1; }},
      {"PoolsOfDifferentSlotCounts",
       "conv_state",
       {"as many slots as recurrent_state (11)", "[12, 3, 128]"},
       [](StepCall& c) { c.pools.recurrent_state.sizes[0] = 11; }},
      {"RecurrentPoolAbsent",
       "recurrent_state",
       {"a pool", "absent"},
       [](StepCall& c) { c.pools.recurrent_state = MutableTensorView(); }},
      {"ConvPoolOfTheOtherFloatWidth",
       "conv_state",
       {"state pools"},
       [](StepCall& c) { StepCall::wrong_pool_dtype(c.pools.conv_state, 3, false); }},
      {"RecurrentPoolOfTheOtherFloatWidth",
       "recurrent_state",
       {"state pools"},
       [](StepCall& c) { StepCall::wrong_pool_dtype(c.pools.recurrent_state, 4, false); }},
      {"ConvPoolOfA16BitDtypeItsInputsDoNotTake",
       "conv_state",
       {"state pools"},
       [](StepCall& c) { StepCall::wrong_pool_dtype(c.pools.conv_state, 3, true); }},
      {"RecurrentPoolOfA16BitDtypeItsInputsDoNotTake",
       "recurrent_state",
       {"state pools"},
       [](StepCall& c) { StepCall::wrong_pool_dtype(c.pools.recurrent_state, 4, true); }},
      // The pools' layout: each slot dense, slots apart by at least a slot, pools apart from
      // each other and from every input (a padded slot stride is fine: step_strided_test.cc).
      {"RecurrentPoolInnerDimsNotContiguous",
       "recurrent_state",
       {"each slot contiguous (row-major inner dimensions), strides [1024, 256, 16, 1]",
        "strides [1024, 256, 1, 16]"},
       [](StepCall& c) {
         std::swap(c.pools.recurrent_state.strides[2], c.pools.recurrent_state.strides[3]);
       }},
      {"ConvPoolInnerDimsNotContiguous",
       "conv_state",
       {"each slot contiguous (row-major inner dimensions), strides [384, 128, 1]",
        "strides [384, 1, 3]"},
       [](StepCall& c) {
         c.pools.conv_state.strides[1] = 1;
         c.pools.conv_state.strides[2] = 3;
       }},
      {"RecurrentPoolSlotStrideBelowASlot",
       "recurrent_state",
       {"a slot stride (dim 0) of at least one slot, 1024 elements", "stride 1008 with 12 slots"},
       [](StepCall& c) { c.pools.recurrent_state.strides[0] = 1008; }},
      {"ConvPoolSlotStrideZeroWithManySlots",
       "conv_state",
       {"0 only with num_slots = 1", "stride 0 with 12 slots"},
       [](StepCall& c) { c.pools.conv_state.strides[0] = 0; }},
      {"ConvPoolSlotStrideNegative",
       "conv_state",
       {"a slot stride (dim 0) of at least one slot, 384 elements", "stride -384 with 12 slots"},
       [](StepCall& c) {
         MutableTensorView& v = c.pools.conv_state;
         v.data =
             static_cast<char*>(v.data) + 11 * 384 * static_cast<std::int64_t>(dtype_size(v.dtype));
         v.strides[0] = -384;
       }},
      {"PoolsOverlapEachOther",
       "conv_state",
       {"memory that does not overlap 'recurrent_state'"},
       // The conv pool (fewer bytes) inside the recurrent pool's buffer: no other overlap.
       [](StepCall& c) { c.pools.conv_state.data = c.pools.recurrent_state.data; }},
      {"ConvPoolOverlapsQkv",
       "conv_state",
       {"does not overlap the input 'qkv'"},
       // qkv (fewer bytes) inside the conv pool's buffer: no other overlap.
       [](StepCall& c) { c.in.qkv.data = c.pools.conv_state.data; }},
      // out, and outputs overlapping inputs.
      {"OutRows", "out", {"[T, Hv Dv]", "[16, 64]"}, [](StepCall& c) { c.out_view.sizes[0] = 16; }},
      {"OutAbsent", "out", {"absent"}, [](StepCall& c) { c.out_view = {}; }},
      {"OutOverlapsQkv",
       "out",
       {"does not overlap the input 'qkv'"},
       [](StepCall& c) { c.out_view.data = const_cast<void*>(c.in.qkv.data); }},
      {"OutOverlapsRecurrentPool",
       "out",
       {"does not overlap 'recurrent_state'"},
       [](StepCall& c) { c.out_view.data = c.pools.recurrent_state.data; }},
      {"RecurrentPoolOverlapsAnInput",
       "recurrent_state",
       {"does not overlap the input 'A_log'"},
       [](StepCall& c) { c.in.A_log.data = c.pools.recurrent_state.data; }},
      // The layer's rules, which the step shares (tests/api/validate_layer_test.cc has them all).
      {"QkvWidthNotTheHeadLayout",
       "qkv",
       {"D = 2 Hk Dk + Hv Dv = 128", "[17, 127]"},
       [](StepCall& c) { c.in.qkv.sizes[1] = 127; }},
      {"QkvNegativeTokens",
       "qkv",
       {"non-negative sizes", "[-1, 128]"},
       [](StepCall& c) { c.in.qkv.sizes[0] = -1; }},
      {"QkvOverflowingSize",
       "qkv",
       {"an element count that fits in int64"},
       [](StepCall& c) { c.in.qkv.sizes[0] = std::int64_t{1} << 60; }},
      {"HvNotMultipleOfHk",
       "options.hv",
       {"a multiple of options.hk = 3", "4"},
       [](StepCall& c) { c.options.hk = 3; }},
      {"DkAbove256", "options.dk", {"<= 256", "300"}, [](StepCall& c) { c.options.dk = 300; }},
      {"DvAbove256", "options.dv", {"<= 256", "257"}, [](StepCall& c) { c.options.dv = 257; }},
      {"MatmulPrecisionBf16",
       "options.matmul_precision",
       {"compute", "bf16"},
       [](StepCall& c) { c.options.matmul_precision = MatmulPrecision::bf16; }},
      {"MatmulPrecisionOutOfRange",
       "options.matmul_precision",
       {"compute or bf16", "9"},
       [](StepCall& c) { c.options.matmul_precision = static_cast<MatmulPrecision>(9); }},
  };
  return all;
}

class StepValidation : public ::testing::TestWithParam<Rule> {};

TEST_P(StepValidation, Rejects) {
  const Rule& rule = GetParam();
  for (const Variant v : {Variant::f32_pools, Variant::bf16_pools, Variant::reference}) {
    const StepProblem& p = problem(v);
    const std::string which = v == Variant::reference    ? "ref::fused_gdn_step: "
                              : v == Variant::bf16_pools ? "fused_gdn_step, bf16 pools: "
                                                         : "fused_gdn_step: ";
    StepCall c(p);
    rule.breaks(c);
    test::expect_rejected(
        [&c, v] {
          if (v == Variant::reference) {
            ref::fused_gdn_step(c.in, c.pools, c.out_view, c.options);
          } else {
            fused_gdn_step(c.in, c.pools, c.out_view, c.options);
          }
        },
        rule.name, rule.argument, rule.words, which, v == Variant::f32_pools);
    EXPECT_TRUE(test::bit_identical(c.conv_pool, p.conv_pool, which + "conv_state pool"));
    EXPECT_TRUE(test::bit_identical(c.rec_pool, p.rec_pool, which + "recurrent_state pool"));
    EXPECT_TRUE(test::bit_identical(c.out, c.out_before, which + "out"));
  }
}

INSTANTIATE_TEST_SUITE_P(Step, StepValidation, ::testing::ValuesIn(rules()), test::RuleName());

// The float64 reference takes float64 activations only.
TEST(StepValidation, ReferenceRejectsFloat32Activations) {
  StepCall c(problem(Variant::f32_pools));
  test::expect_rejected([&c] { ref::fused_gdn_step(c.in, c.pools, c.out_view, c.options); },
                        "ReferenceRejectsFloat32Activations", "qkv",
                        {"dtype f64 (the reference runs in float64)"});
  EXPECT_TRUE(test::bit_identical(c.conv_pool, c.p.conv_pool, "conv_state pool"));
  EXPECT_TRUE(test::bit_identical(c.rec_pool, c.p.rec_pool, "recurrent_state pool"));
}

// The unbroken call is accepted on every variant, and writes (so the checks above can fail).
TEST(StepValidation, TheValidCallRunsAndWrites) {
  for (const Variant v : {Variant::f32_pools, Variant::bf16_pools, Variant::reference}) {
    StepCall c(problem(v));
    if (v == Variant::reference) {
      ref::fused_gdn_step(c.in, c.pools, c.out_view, c.options);
    } else {
      fused_gdn_step(c.in, c.pools, c.out_view, c.options);
    }
    EXPECT_FALSE(test::bit_identical(c.rec_pool, c.p.rec_pool, "recurrent_state pool"));
  }
}

}  // namespace
}  // namespace gdn
