// validate_conv_test.cc: the conv op's validation rules (gdn::causal_conv1d_fwd / _bwd and their
// float64 references), one test per rule, each named after it (docs/validation.md lists them).
// A rule's test breaks one argument of a valid call and checks that the call throws
// gdn::InvalidArgument naming that argument, with "expected" and "given" and the rule's own
// words in the message, and that every output still holds its sentinel bytes. The input and
// option rules run through the forward and the backward, on the CPU op and the reference.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "common/problem.h"
#include "common/validation.h"

namespace gdn {
namespace {

// A valid call: two sequences (10 and 6 tokens), D = 24 channels, K = 4 taps, bias, initial
// states, cotangents of out and of the final states; preallocated outputs and gradients (f32
// for the CPU op, f64 for the reference) filled with a sentinel.
struct ConvCall {
  static constexpr std::int64_t kT = 16, kD = 24, kK = 4, kN = 2;
  Tensor x, weight, bias, state, d_out, d_final_state;
  std::vector<std::int64_t> cu = {0, 10, 16};
  Tensor out, final_state, d_x, d_weight, d_bias, d_initial_state;
  Tensor out64, final_state64, d_x64, d_weight64, d_bias64, d_initial_state64;
  ConvInputs in;
  TensorView d_out_view, d_final_state_view;
  ConvOutputs fwd_out, fwd_out64;
  ConvBackwardOutputs bwd_out, bwd_out64;
  ConvOptions options;

  ConvCall()
      : x(DType::f32, {kT, kD}),
        weight(DType::f32, {kD, kK}),
        bias(DType::f32, {kD}),
        state(DType::f32, {kN, kK - 1, kD}),
        d_out(DType::f32, {kT, kD}),
        d_final_state(DType::f32, {kN, kK - 1, kD}),
        out(DType::f32, {kT, kD}),
        final_state(DType::f32, {kN, kK - 1, kD}),
        d_x(DType::f32, {kT, kD}),
        d_weight(DType::f32, {kD, kK}),
        d_bias(DType::f32, {kD}),
        d_initial_state(DType::f32, {kN, kK - 1, kD}),
        out64(DType::f64, {kT, kD}),
        final_state64(DType::f64, {kN, kK - 1, kD}),
        d_x64(DType::f64, {kT, kD}),
        d_weight64(DType::f64, {kD, kK}),
        d_bias64(DType::f64, {kD}),
        d_initial_state64(DType::f64, {kN, kK - 1, kD}) {
    test::Random rng(11);
    for (Tensor* t : {&x, &weight, &bias, &state, &d_out, &d_final_state}) {
      for (std::int64_t i = 0; i < t->numel(); ++i) {
        t->data<float>()[i] = static_cast<float>(rng.normal());
      }
    }
    test::fill_sentinel(outputs());
    in = {x.view(), weight.view(), bias.view(), state.view(), TensorView(cu.data(), {kN + 1})};
    d_out_view = d_out.view();
    d_final_state_view = d_final_state.view();
    fwd_out = {out.mutable_view(), final_state.mutable_view()};
    fwd_out64 = {out64.mutable_view(), final_state64.mutable_view()};
    bwd_out = {d_x.mutable_view(), d_weight.mutable_view(), d_bias.mutable_view(),
               d_initial_state.mutable_view()};
    bwd_out64 = {d_x64.mutable_view(), d_weight64.mutable_view(), d_bias64.mutable_view(),
                 d_initial_state64.mutable_view()};
  }
  std::vector<Tensor*> outputs() {
    return {&out,   &final_state,   &d_x,   &d_weight,   &d_bias,   &d_initial_state,
            &out64, &final_state64, &d_x64, &d_weight64, &d_bias64, &d_initial_state64};
  }
  bool untouched() { return test::hold_sentinel(outputs()); }
  ConvBackwardInputs backward_inputs() const { return {in, d_out_view, d_final_state_view}; }
  void set_cu_seqlens(std::vector<std::int64_t> values) {
    cu = std::move(values);
    in.cu_seqlens = TensorView(cu.data(), {static_cast<std::int64_t>(cu.size())});
  }
};

using Rule = test::Rule<ConvCall>;

// An input or option rule runs through both directions; the rule of an output runs through the
// forward, that of a cotangent or a gradient (d_...) through the backward.
enum class Op { input, forward, backward };

Op op_of(const Rule& rule) {
  const std::string arg = rule.argument;
  if (arg == "out" || arg == "final_state") return Op::forward;
  return arg.rfind("d_", 0) == 0 ? Op::backward : Op::input;
}

const std::vector<Rule>& rules() {
  static const std::vector<Rule> all = {
      // x.
      {"XRankNot2", "x", {"rank 2 [T, D]", "rank 3"}, [](ConvCall& c) { c.in.x.rank = 3; }},
      {"XIntegerDtype",
       "x",
       {"dtype f32, f64, bf16 or f16", "i64"},
       [](ConvCall& c) { c.in.x.dtype = DType::i64; }},
      {"XNegativeSize",
       "x",
       {"non-negative sizes", "[-1, 24]"},
       [](ConvCall& c) { c.in.x.sizes[0] = -1; }},
      {"XOverflowingSize",
       "x",
       {"an element count that fits in int64"},
       [](ConvCall& c) { c.in.x.sizes[0] = std::int64_t{1} << 60; }},
      {"XMisaligned",
       "x",
       {"aligned to 4 bytes (f32)"},
       [](ConvCall& c) { c.in.x.data = static_cast<const char*>(c.in.x.data) + 1; }},
      {"XNull", "x", {"non-null"}, [](ConvCall& c) { c.in.x.data = nullptr; }},
      {"XRankImpossible",
       "x",
       {"rank from 0 (absent) to 4", "7"},
       [](ConvCall& c) { c.in.x.rank = 7; }},
      // weight, bias, initial_state, cu_seqlens.
      {"WeightTapsAbove8",
       "weight",
       {"K from 1 to 8", "K = 9"},
       [](ConvCall& c) { c.in.weight.sizes[1] = 9; }},
      {"WeightChannelsNotThoseOfX",
       "weight",
       {"[D, K] or [D, 1, K] with D = 24", "[25, 4]"},
       [](ConvCall& c) { c.in.weight.sizes[0] = 25; }},
      {"WeightDtype",
       "weight",
       {"dtype f32", "f64"},
       [](ConvCall& c) { c.in.weight.dtype = DType::f64; }},
      {"BiasShape", "bias", {"[D]", "[23]"}, [](ConvCall& c) { c.in.bias.sizes[0] = 23; }},
      {"BiasDtype",
       "bias",
       {"dtype f32", "f64"},
       [](ConvCall& c) { c.in.bias.dtype = DType::f64; }},
      {"InitialStateShape",
       "initial_state",
       {"[N, K - 1, D] = [2, 3, 24]", "[1, 3, 24]"},
       [](ConvCall& c) { c.in.initial_state.sizes[0] = 1; }},
      {"InitialStateDtype",
       "initial_state",
       {"dtype f32", "f64"},
       [](ConvCall& c) { c.in.initial_state.dtype = DType::f64; }},
      {"CuSeqlensDecreasing",
       "cu_seqlens",
       {"non-decreasing"},
       [](ConvCall& c) {
         c.set_cu_seqlens({0, 12, 10, 16});
       }},
      {"CuSeqlensNotEndingAtT",
       "cu_seqlens",
       {"cu_seqlens[N] = T = 16", "15"},
       [](ConvCall& c) {
         c.set_cu_seqlens({0, 10, 15});
       }},
      {"CuSeqlensInt32",
       "cu_seqlens",
       {"i64", "i32"},
       [](ConvCall& c) { c.in.cu_seqlens.dtype = DType::i32; }},
      // Options.
      {"ThreadsNegative",
       "options.threads",
       {"0 (all cores) to 1024", "-1"},
       [](ConvCall& c) { c.options.threads = -1; }},
      {"IsaOutOfRange",
       "options.isa",
       {"automatic, generic, avx2, avx512 or avx512_bf16", "9"},
       [](ConvCall& c) { c.options.isa = static_cast<CpuIsa>(9); }},
      {"ActivationOutOfRange",
       "options.activation",
       {"none or silu", "7"},
       [](ConvCall& c) { c.options.activation = static_cast<ConvActivation>(7); }},
      // The forward's outputs.
      {"OutAbsent", "out", {"absent"}, [](ConvCall& c) { c.fwd_out.out = {}; }},
      {"OutShape",
       "out",
       {"[T, D] (that of x)", "[15, 24]"},
       [](ConvCall& c) { c.fwd_out.out.sizes[0] = 15; }},
      {"OutDtype",
       "out",
       {"dtype f32 (the dtype of x)", "bf16"},
       [](ConvCall& c) { c.fwd_out.out.dtype = DType::bf16; }},
      {"OutElementsShareAnAddress",
       "out",
       {"own address"},
       [](ConvCall& c) { c.fwd_out.out.strides[0] = 0; }},
      {"FinalStateShape",
       "final_state",
       {"[N, K - 1, D]", "[2, 2, 24]"},
       [](ConvCall& c) { c.fwd_out.final_state.sizes[1] = 2; }},
      {"FinalStateDtype",
       "final_state",
       {"dtype f32", "f64"},
       [](ConvCall& c) { c.fwd_out.final_state.dtype = DType::f64; }},
      {"OutOverlapsX",
       "out",
       {"does not overlap the input 'x'"},
       [](ConvCall& c) { c.fwd_out.out.data = const_cast<void*>(c.in.x.data); }},
      {"FinalStateOverlapsOut",
       "out",
       {"does not overlap 'final_state'"},
       [](ConvCall& c) { c.fwd_out.final_state.data = c.fwd_out.out.data; }},
      {"FinalStateOverlapsInitialStateNotExactly",
       "final_state",
       {"exactly the view of initial_state"},
       [](ConvCall& c) {
         c.fwd_out.final_state.data =
             static_cast<float*>(const_cast<void*>(c.in.initial_state.data)) + 1;
       }},
      // The backward's cotangents and gradients.
      {"DOutAbsent", "d_out", {"absent"}, [](ConvCall& c) { c.d_out_view = {}; }},
      {"DOutShape",
       "d_out",
       {"[T, D] (that of x)", "[15, 24]"},
       [](ConvCall& c) { c.d_out_view.sizes[0] = 15; }},
      {"DOutDtype",
       "d_out",
       {"dtype f32 (the dtype of x)", "f64"},
       [](ConvCall& c) { c.d_out_view.dtype = DType::f64; }},
      {"DFinalStateShape",
       "d_final_state",
       {"[N, K - 1, D]", "[2, 3, 23]"},
       [](ConvCall& c) { c.d_final_state_view.sizes[2] = 23; }},
      {"DFinalStateDtype",
       "d_final_state",
       {"dtype f32", "f64"},
       [](ConvCall& c) { c.d_final_state_view.dtype = DType::f64; }},
      {"DxAbsent", "d_x", {"absent"}, [](ConvCall& c) { c.bwd_out.d_x = {}; }},
      {"DxShape",
       "d_x",
       {"[T, D] (that of x)", "[16, 23]"},
       [](ConvCall& c) { c.bwd_out.d_x.sizes[1] = 23; }},
      {"DxDtype",
       "d_x",
       {"dtype f32 (the dtype of x)", "f64"},
       [](ConvCall& c) { c.bwd_out.d_x.dtype = DType::f64; }},
      {"DWeightAbsent", "d_weight", {"absent"}, [](ConvCall& c) { c.bwd_out.d_weight = {}; }},
      {"DWeightShape",
       "d_weight",
       {"that of weight", "[24, 3]"},
       [](ConvCall& c) { c.bwd_out.d_weight.sizes[1] = 3; }},
      {"DBiasWithoutBias",
       "d_bias",
       {"absent (the forward has no bias)", "[24]"},
       [](ConvCall& c) { c.in.bias = {}; }},
      {"DBiasShape",
       "d_bias",
       {"[D]", "[12]"},
       [](ConvCall& c) { c.bwd_out.d_bias.sizes[0] = 12; }},
      {"DInitialStateShape",
       "d_initial_state",
       {"[N, K - 1, D]", "[1, 3, 24]"},
       [](ConvCall& c) { c.bwd_out.d_initial_state.sizes[0] = 1; }},
      {"DxOverlapsX",
       "d_x",
       {"does not overlap the input 'x'"},
       [](ConvCall& c) { c.bwd_out.d_x.data = const_cast<void*>(c.in.x.data); }},
      {"DxOverlapsDOut",
       "d_x",
       {"does not overlap the input 'd_out'"},
       [](ConvCall& c) { c.bwd_out.d_x.data = const_cast<void*>(c.d_out_view.data); }},
      {"DWeightOverlapsDx",
       "d_x",
       {"does not overlap 'd_weight'"},
       [](ConvCall& c) { c.bwd_out.d_weight.data = c.bwd_out.d_x.data; }},
  };
  return all;
}

class ConvValidation : public ::testing::TestWithParam<Rule> {};

// The CPU op and the reference, forward and backward as the rule applies. The references take
// float64 outputs, so only the input, option and cotangent rules run on them (their output
// rules are the CPU op's with f64 for f32); the d_bias rule, an output rule, runs on both.
TEST_P(ConvValidation, Rejects) {
  const Rule& rule = GetParam();
  const std::string arg = rule.argument;
  const bool output_rule = arg == "out" || arg == "final_state" || arg == "d_x" ||
                           arg == "d_weight" || arg == "d_initial_state" ||
                           (arg == "d_bias" && std::string(rule.name) != "DBiasWithoutBias");
  const Op op = op_of(rule);
  for (const bool backward : {false, true}) {
    if ((op == Op::forward && backward) || (op == Op::backward && !backward)) continue;
    for (const bool reference : {false, true}) {
      if (reference && output_rule) continue;
      ConvCall c;
      rule.breaks(c);
      const std::string which = std::string(reference ? "ref::" : "") +
                                (backward ? "causal_conv1d_bwd: " : "causal_conv1d_fwd: ");
      test::expect_rejected(
          [&c, backward, reference] {
            if (backward) {
              reference ? ref::causal_conv1d_bwd(c.backward_inputs(), c.bwd_out64, c.options)
                        : causal_conv1d_bwd(c.backward_inputs(), c.bwd_out, c.options);
            } else {
              reference ? ref::causal_conv1d_fwd(c.in, c.fwd_out64, c.options)
                        : causal_conv1d_fwd(c.in, c.fwd_out, c.options);
            }
          },
          rule.name, rule.argument, rule.words, which, !reference && !backward);
      EXPECT_TRUE(c.untouched()) << which << "an output was written before rule " << rule.name
                                 << " threw";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Conv, ConvValidation, ::testing::ValuesIn(rules()), test::RuleName());

// The unbroken calls are accepted, and write (so the sentinel check above can fail).
TEST(ConvValidation, TheValidCallsRunAndWrite) {
  for (const bool reference : {false, true}) {
    ConvCall c;
    if (reference) {
      ref::causal_conv1d_fwd(c.in, c.fwd_out64, c.options);
      ref::causal_conv1d_bwd(c.backward_inputs(), c.bwd_out64, c.options);
    } else {
      causal_conv1d_fwd(c.in, c.fwd_out, c.options);
      causal_conv1d_bwd(c.backward_inputs(), c.bwd_out, c.options);
    }
    EXPECT_FALSE(c.untouched());
  }
}

}  // namespace
}  // namespace gdn
