// validate_test.cc: the core forward's validation rules (gdn::chunk_gated_delta_rule_fwd and
// the float64 reference gdn::ref::recurrent_fwd), one test per rule, each named after it
// (docs/validation.md lists them; the backward's own rules are validate_backward_test.cc). A
// rule's test breaks one argument of a valid call and checks that the call throws
// gdn::InvalidArgument naming that argument, with "expected" and "given" and the rule's own
// words in the message, and that every output still holds its sentinel bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "common/problem.h"
#include "common/validation.h"

namespace gdn {
namespace {

using test::make_problem;
using test::Problem;
using test::ProblemSpec;

// A valid problem (packed: lengths 40, 0, 30; Hk 2, Hv 4, Dk 16, Dv 8; initial states) with
// preallocated outputs filled with a sentinel.
struct Fixture {
  Problem p;
  Tensor o, ht, chunk_states, t_inv;
  std::vector<std::int64_t> cu;  // storage for a rule that replaces cu_seqlens
  ForwardInputs in;
  ForwardOutputs out;
  ForwardOptions options;

  Fixture() {
    ProblemSpec spec;
    spec.lengths = {40, 0, 30};
    spec.hk = 2;
    spec.hv = 4;
    spec.dk = 16;
    spec.dv = 8;
    spec.initial_state = true;
    p = make_problem(spec);
    in = p.inputs();
    options.chunk_size = 16;
    const ForwardShape shape = forward_shape(in, options);
    o = Tensor(DType::f32, 3, shape.o_sizes());
    ht = Tensor(DType::f32, 4, shape.state_sizes());
    chunk_states = Tensor(DType::f32, 4, shape.chunk_states_sizes());
    t_inv = Tensor(DType::f32, 4, shape.t_inv_sizes());
    test::fill_sentinel(outputs());
    out = {o.mutable_view(), ht.mutable_view(), chunk_states.mutable_view(), t_inv.mutable_view()};
  }
  std::vector<Tensor*> outputs() { return {&o, &ht, &chunk_states, &t_inv}; }
  bool outputs_untouched() { return test::hold_sentinel(outputs()); }
  void set_cu_seqlens(std::vector<std::int64_t> values) {
    cu = std::move(values);
    in.cu_seqlens = TensorView(cu.data(), {static_cast<std::int64_t>(cu.size())});
  }
};

using Rule = test::Rule<Fixture>;

const std::vector<Rule>& rules() {
  static const std::vector<Rule> all = {
      // q, k, v, g, beta, initial_state.
      {"QRankNot3Or4", "q", {"rank 3", "rank 2"}, [](Fixture& s) { s.in.q.rank = 2; }},
      {"QIntegerDtype",
       "q",
       {"f32, f64, bf16 or f16", "i64"},
       [](Fixture& s) { s.in.q.dtype = DType::i64; }},
      {"DkAbove256", "q", {"Dk in [1, 256]", "300"}, [](Fixture& s) { s.in.q.sizes[2] = 300; }},
      {"QNull", "q", {"non-null"}, [](Fixture& s) { s.in.q.data = nullptr; }},
      {"QNegativeSize", "q", {"non-negative"}, [](Fixture& s) { s.in.q.sizes[0] = -1; }},
      {"HkBelowOne", "q", {"Hk >= 1"}, [](Fixture& s) { s.in.q.sizes[1] = 0; }},
      {"KShapeNotThatOfQ",
       "k",
       {"equal to q", "[70, 2, 16]", "[70, 2, 8]"},
       [](Fixture& s) { s.in.k.sizes[2] = 8; }},
      {"KDtypeNotThatOfQ", "k", {"f32", "f64"}, [](Fixture& s) { s.in.k.dtype = DType::f64; }},
      {"HvNotMultipleOfHk",
       "v",
       {"multiple of Hk = 2", "Hv = 3"},
       [](Fixture& s) { s.in.v.sizes[1] = 3; }},
      {"VTokensNotThoseOfQ", "v", {"[70]", "[69, 4, 8]"}, [](Fixture& s) { s.in.v.sizes[0] = 69; }},
      {"DvZero", "v", {"Dv in [1, 256]", "Dv = 0"}, [](Fixture& s) { s.in.v.sizes[2] = 0; }},
      {"DvAbove256",
       "v",
       {"Dv in [1, 256]", "Dv = 257"},
       [](Fixture& s) { s.in.v.sizes[2] = 257; }},
      {"VRankNotThatOfQ", "v", {"rank 3"}, [](Fixture& s) { s.in.v.rank = 4; }},
      {"GShape", "g", {"[T, Hv]", "[70, 4]", "[70, 2]"}, [](Fixture& s) { s.in.g.sizes[1] = 2; }},
      {"BetaDtype", "beta", {"f32"}, [](Fixture& s) { s.in.beta.dtype = DType::f64; }},
      {"InitialStateShape",
       "initial_state",
       {"[N, Hv, Dk, Dv]", "[3, 4, 16, 8]", "[2, 4, 16, 8]"},
       [](Fixture& s) { s.in.initial_state.sizes[0] = 2; }},
      // cu_seqlens.
      {"CuSeqlensNotStartingAt0",
       "cu_seqlens",
       {"cu_seqlens[0] = 0", "5"},
       [](Fixture& s) {
         s.set_cu_seqlens({5, 40, 70});
       }},
      {"CuSeqlensDecreasing",
       "cu_seqlens",
       {"non-decreasing", "cu_seqlens[2] = 30 < cu_seqlens[1] = 40"},
       [](Fixture& s) {
         s.set_cu_seqlens({0, 40, 30, 70});
       }},
      {"CuSeqlensNotEndingAtT",
       "cu_seqlens",
       {"cu_seqlens[N] = T = 70", "68"},
       [](Fixture& s) {
         s.set_cu_seqlens({0, 40, 68});
       }},
      {"CuSeqlensPastT",
       "cu_seqlens",
       {"values <= T = 70", "90"},
       [](Fixture& s) {
         s.set_cu_seqlens({0, 90, 70});
       }},
      {"CuSeqlensNoSequence",
       "cu_seqlens",
       {"N >= 1", "[1]"},
       [](Fixture& s) { s.set_cu_seqlens({0}); }},
      {"CuSeqlensInt32",
       "cu_seqlens",
       {"i64", "i32"},
       [](Fixture& s) { s.in.cu_seqlens.dtype = DType::i32; }},
      // Options. chunk_size 0 lets the tiling plan choose (tests/cpu/plan_test.cc).
      {"ChunkSizeNegative",
       "options.chunk_size",
       {"0 (the tiling plan chooses) or an integer in [1, 256]", "-1"},
       [](Fixture& s) { s.options.chunk_size = -1; }},
      {"ChunkSizeAbove256",
       "options.chunk_size",
       {"[1, 256]", "512"},
       [](Fixture& s) { s.options.chunk_size = 512; }},
      {"ScaleNaN",
       "options.scale",
       {"finite", "nan"},
       [](Fixture& s) { s.options.scale = std::nan(""); }},
      {"ScaleInfinite",
       "options.scale",
       {"finite", "inf"},
       [](Fixture& s) { s.options.scale = HUGE_VAL; }},
      {"ScaleNotRepresentableInFloat32",
       "options.scale",
       {"representable in float32", "1e+300"},
       [](Fixture& s) { s.options.scale = 1e300; }},
      {"ThreadsNegative",
       "options.threads",
       {"0 (all cores) to 1024", "-2"},
       [](Fixture& s) { s.options.threads = -2; }},
      {"ThreadsAbove1024",
       "options.threads",
       {"0 (all cores) to 1024", "100000"},
       [](Fixture& s) { s.options.threads = 100000; }},
      {"AlgorithmOutOfRange",
       "options.algorithm",
       {"automatic, chunked or recurrent", "9"},
       [](Fixture& s) { s.options.algorithm = static_cast<Algorithm>(9); }},
      {"IsaOutOfRange",
       "options.isa",
       {"automatic, generic, avx2, avx512 or avx512_bf16", "9"},
       [](Fixture& s) { s.options.isa = static_cast<CpuIsa>(9); }},
      {"MatmulPrecisionOutOfRange",
       "options.matmul_precision",
       {"compute or bf16", "9"},
       [](Fixture& s) { s.options.matmul_precision = static_cast<MatmulPrecision>(9); }},
      {"MatmulPrecisionBf16WithTheRecurrence",
       "options.matmul_precision",
       {"options.algorithm = recurrent", "bf16"},
       [](Fixture& s) {
         s.options.matmul_precision = MatmulPrecision::bf16;
         s.options.algorithm = Algorithm::recurrent;
       }},
      // Outputs.
      // o alone may be left out (tests/cpu/forward_test.cc, WithoutOutput...); not everything.
      {"NoOutputAtAll",
       "o",
       {"at least one of final_state, chunk_states, t_inv", "no output at all"},
       [](Fixture& s) { s.out = {}; }},
      {"OutputShape", "o", {"[T, Hv, Dv]", "[70, 4, 8]"}, [](Fixture& s) { s.out.o.sizes[1] = 5; }},
      {"OutputDtype", "o", {"dtype f32", "f64"}, [](Fixture& s) { s.out.o.dtype = DType::f64; }},
      {"FinalStateShape",
       "final_state",
       {"[N, Hv, Dk, Dv]"},
       [](Fixture& s) { s.out.final_state.sizes[3] = 9; }},
      {"ChunkStatesShape",
       "chunk_states",
       {"[total_chunks, Hv, Dk, Dv]", "[5, 4, 16, 8]"},
       [](Fixture& s) { s.out.chunk_states.sizes[0] = 4; }},
      {"TInvShape",
       "t_inv",
       {"[total_chunks, Hv, C, C]", "[5, 4, 16, 16]", "[5, 4, 16, 8]"},
       [](Fixture& s) { s.out.t_inv.sizes[3] = 8; }},
      {"TInvWithTheRecurrence",
       "t_inv",
       {"recurrent"},
       [](Fixture& s) { s.options.algorithm = Algorithm::recurrent; }},
      {"OutputElementsShareAnAddress",
       "o",
       {"own address"},
       [](Fixture& s) { s.out.o.strides[1] = 0; }},
      // Aliasing.
      {"OutputOverlapsInput",
       "o",
       {"does not overlap the input 'v'"},
       [](Fixture& s) { s.out.o.data = const_cast<void*>(s.in.v.data); }},
      {"OutputsOverlapEachOther",
       "o",
       {"does not overlap 'final_state'"},
       [](Fixture& s) { s.out.final_state.data = s.out.o.data; }},
      {"FinalStateOverlapsInitialStateNotExactly",
       "final_state",
       {"exactly the view of initial_state"},
       [](Fixture& s) {
         // Shifted by one element (the tensor's allocation is padded to whole cache lines,
         // and nothing is written on error anyway).
         s.out.final_state.data =
             static_cast<float*>(const_cast<void*>(s.in.initial_state.data)) + 1;
       }},
      // Views no framework would produce: impossible ranks, misaligned pointers, sizes whose
      // element count or byte offsets overflow.
      {"QRankImpossible",
       "q",
       {"rank from 0 (absent) to 4", "100000"},
       [](Fixture& s) { s.in.q.rank = 100000; }},
      {"VRankAbove4", "v", {"rank from 0 (absent) to 4", "5"}, [](Fixture& s) { s.in.v.rank = 5; }},
      {"CuSeqlensRankAbove4",
       "cu_seqlens",
       {"rank from 0 (absent) to 4", "9"},
       [](Fixture& s) { s.in.cu_seqlens.rank = 9; }},
      {"OutputRankAbove4",
       "o",
       {"rank from 0 (absent) to 4", "9"},
       [](Fixture& s) { s.out.o.rank = 9; }},
      {"OutputRankNegative",
       "final_state",
       {"rank from 0 (absent) to 4", "-1"},
       [](Fixture& s) { s.out.final_state.rank = -1; }},
      {"InputMisaligned",
       "q",
       {"aligned to 4 bytes (f32)"},
       [](Fixture& s) { s.in.q.data = static_cast<const char*>(s.in.q.data) + 2; }},
      {"OutputMisaligned",
       "o",
       {"aligned to 4 bytes (f32)"},
       [](Fixture& s) { s.out.o.data = static_cast<char*>(s.out.o.data) + 1; }},
      {"ByteOffsetsOverflow",
       "k",
       {"byte offsets that fit in int64"},
       [](Fixture& s) { s.in.k.strides[0] = std::int64_t{1} << 62; }},
      {"ElementCountOverflows",
       "q",
       {"element count that fits in int64"},
       [](Fixture& s) {
         s.in.q.sizes = {std::int64_t{1} << 40, std::int64_t{1} << 30, 16, 0};
       }},
  };
  return all;
}

class ForwardValidation : public ::testing::TestWithParam<Rule> {};

// The CPU op, then the float64 reference on the same broken inputs. The reference takes
// float64 outputs, so its output rules are those of the CPU op with f64 for f32: only the
// input and option rules run on it, except algorithm, isa and matmul_precision, which it
// ignores (gdn/reference.h).
TEST_P(ForwardValidation, Rejects) {
  const Rule& rule = GetParam();
  const std::string arg = rule.argument;
  const bool output_rule =
      arg == "o" || arg == "final_state" || arg == "chunk_states" || arg == "t_inv";
  const bool ignored_by_reference =
      arg == "options.algorithm" || arg == "options.isa" || arg == "options.matmul_precision";
  for (const bool reference : {false, true}) {
    if (reference && (output_rule || ignored_by_reference)) continue;
    Fixture s;
    rule.breaks(s);
    Tensor o64(DType::f64, 3, s.o.sizes()), ht64(DType::f64, 4, s.ht.sizes());
    test::fill_sentinel({&o64, &ht64});
    test::expect_rejected(
        [&s, &o64, &ht64, reference] {
          if (reference) {
            ForwardOutputs out64;
            out64.o = o64.mutable_view();
            out64.final_state = ht64.mutable_view();
            ref::recurrent_fwd(s.in, out64, s.options);
          } else {
            chunk_gated_delta_rule_fwd(s.in, s.out, s.options);
          }
        },
        rule.name, rule.argument, rule.words, reference ? "ref::" : "", !reference);
    EXPECT_TRUE(s.outputs_untouched() && test::hold_sentinel({&o64, &ht64}))
        << (reference ? "ref::" : "") << "an output was written before rule " << rule.name
        << " threw";
  }
}

INSTANTIATE_TEST_SUITE_P(Core, ForwardValidation, ::testing::ValuesIn(rules()), test::RuleName());

// The unbroken call is accepted, and writes (so the sentinel check above can fail).
TEST(ForwardValidation, TheValidCallRunsAndWrites) {
  Fixture s;
  chunk_gated_delta_rule_fwd(s.in, s.out, s.options);
  EXPECT_FALSE(s.outputs_untouched());
}

// The batched layout [B, T, ...] takes no cu_seqlens (B defines the sequences).
TEST(ForwardValidation, BatchedLayoutRejectsCuSeqlens) {
  ProblemSpec spec;
  spec.lengths = {8, 8};
  spec.batched = true;
  const Problem p = make_problem(spec);
  std::vector<std::int64_t> cu = {0, 8, 16};
  ForwardInputs in = p.inputs();
  in.cu_seqlens = TensorView(cu.data(), {3});
  test::expect_rejected([&in] { chunk_gated_delta_rule_fwd(in, ForwardOptions{}); },
                        "BatchedLayoutRejectsCuSeqlens", "cu_seqlens",
                        {"absent with batched [B, T, ...] inputs"});
}

// The allocating API never allocates a tensor whose byte size does not fit.
TEST(Validation, HugeAllocationIsRefused) {
  EXPECT_THROW(Tensor(DType::f64, {std::int64_t{1} << 31, std::int64_t{1} << 30, 4}),
               InvalidArgument);
  EXPECT_THROW(Tensor(DType::f32, {std::int64_t{1} << 62, 4}), InvalidArgument);
  // T = 0 with absurd head counts passes validation (nothing to read), but the final states
  // it implies cannot be allocated: a clear error, not a wrapped size.
  std::vector<std::int64_t> cu(33, 0);
  const std::int64_t hv = std::int64_t{1} << 40;
  ForwardInputs in;
  in.q = TensorView(static_cast<const double*>(nullptr), {0, 1, 256});
  in.k = in.q;
  in.v = TensorView(static_cast<const double*>(nullptr), {0, hv, 256});
  in.g = TensorView(static_cast<const double*>(nullptr), {0, hv});
  in.beta = in.g;
  in.cu_seqlens = TensorView(cu.data(), {33});
  EXPECT_THROW(chunk_gated_delta_rule_fwd(in, ForwardOptions{}), InvalidArgument);
  EXPECT_THROW(ref::recurrent_fwd(in, ForwardOptions{}), InvalidArgument);
}

// Gradients written into one fused buffer: dq and dk interleaved row by row share no element
// (accepted); shifted by one element they would (rejected).
TEST(Validation, InterleavedOutputsAreExact) {
  ProblemSpec spec;
  spec.lengths = {33};
  spec.hk = 2;
  spec.hv = 2;
  spec.dk = 8;
  spec.dv = 8;
  const Problem p = make_problem(spec);
  const test::Cotangents c = test::make_cotangents(p, 3);
  BackwardInputs in = BackwardInputs::from(p.inputs());
  in.d_o = c.d_o.view();
  const std::int64_t t = 33, row = 2 * 2 * 8;  // [T, (q | k), Hk, Dk]
  std::vector<float> fused(t * row + 1);
  Tensor dv(DType::f32, {t, 2, 8}), dg(DType::f32, {t, 2}), dbeta(DType::f32, {t, 2});
  BackwardOutputs out{MutableTensorView(fused.data(), {t, 2, 8}, {row, 8, 1}),
                      MutableTensorView(fused.data() + 16, {t, 2, 8}, {row, 8, 1}),
                      dv.mutable_view(),
                      dg.mutable_view(),
                      dbeta.mutable_view(),
                      {}};
  EXPECT_NO_THROW(chunk_gated_delta_rule_bwd(in, out, ForwardOptions{}));
  const BackwardResult separate = chunk_gated_delta_rule_bwd(in, ForwardOptions{});
  for (std::int64_t i = 0; i < t; ++i) {
    EXPECT_EQ(
        std::memcmp(fused.data() + i * row, separate.dq.data<float>() + i * 16, 16 * sizeof(float)),
        0);
    EXPECT_EQ(std::memcmp(fused.data() + i * row + 16, separate.dk.data<float>() + i * 16,
                          16 * sizeof(float)),
              0);
  }
  out.dk = MutableTensorView(fused.data() + 15, {t, 2, 8}, {row, 8, 1});
  try {
    chunk_gated_delta_rule_bwd(in, out, ForwardOptions{});
    ADD_FAILURE() << "overlapping dq and dk accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "dq");
  }
}

}  // namespace
}  // namespace gdn
