// validate_layer_test.cc: the layer op's validation rules (gdn::fused_gdn_fwd / _bwd, and
// their float64 references), one test per rule, each named after it (docs/validation.md lists
// them). A rule's test breaks one argument of a valid call and checks that the call throws
// gdn::InvalidArgument naming that argument, with "expected" and "given" and the rule's own
// words in the message, and that every output still holds its sentinel bytes: nothing is
// written before validation passes.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "common/layer_problem.h"
#include "common/validation.h"

namespace gdn {
namespace {

// A valid layer call with preallocated outputs and gradients filled with a sentinel.
struct LayerCall {
  test::LayerProblem p;
  LayerInputs in;
  LayerOptions options;
  LayerBackwardInputs bin;
  Tensor out, conv_out, rec_out;
  Tensor d_qkv, d_a, d_b, d_w, d_bias, d_alog, d_dt, d_conv, d_rec;
  LayerOutputs fwd_out;
  LayerBackwardOutputs bwd_out;

  LayerCall() {
    test::LayerSpec spec;
    spec.lengths = {10, 0, 7};
    spec.hk = 1;
    spec.hv = 2;
    spec.dk = spec.dv = 8;
    spec.conv_state = spec.recurrent_state = true;
    p = test::make_layer_problem(spec);
    in = p.inputs();
    options = p.options();
    bin = {in, p.d_out.view(), p.d_conv_state_out.view(), p.d_recurrent_state_out.view(), {}, {}};
    const std::int64_t t = p.qkv.size(0), d = p.qkv.size(1), n = 3, hv = spec.hv;
    out = Tensor(DType::f32, {t, hv * spec.dv});
    conv_out = Tensor(DType::f32, {n, spec.taps - 1, d});
    rec_out = Tensor(DType::f32, {n, hv, spec.dk, spec.dv});
    d_qkv = Tensor(DType::f32, {t, d});
    d_a = Tensor(DType::f32, {t, hv});
    d_b = Tensor(DType::f32, {t, hv});
    d_w = Tensor(DType::f32, p.conv_weight.rank(), p.conv_weight.sizes());
    d_bias = Tensor(DType::f32, {d});
    d_alog = Tensor(DType::f32, {hv});
    d_dt = Tensor(DType::f32, {hv});
    d_conv = Tensor(DType::f32, {n, spec.taps - 1, d});
    d_rec = Tensor(DType::f32, {n, hv, spec.dk, spec.dv});
    test::fill_sentinel(outputs());
    fwd_out = {out.mutable_view(), conv_out.mutable_view(), rec_out.mutable_view(), {}, {}};
    bwd_out = {d_qkv.mutable_view(), d_a.mutable_view(),    d_b.mutable_view(),
               d_w.mutable_view(),   d_bias.mutable_view(), d_alog.mutable_view(),
               d_dt.mutable_view(),  d_conv.mutable_view(), d_rec.mutable_view()};
  }
  std::vector<Tensor*> outputs() {
    return {&out, &conv_out, &rec_out, &d_qkv, &d_a,    &d_b,
            &d_w, &d_bias,   &d_alog,  &d_dt,  &d_conv, &d_rec};
  }
  bool untouched() { return test::hold_sentinel(outputs()); }
};

enum class Op { forward, backward };

struct Rule {
  const char* name;  // the test's name
  Op op;
  const char* argument;
  std::vector<const char*> words;  // in the message besides "expected" and "given"
  std::function<void(LayerCall&)> breaks;
};

// The forward's rules also hold for the backward, which validates the same inputs first.
const std::vector<Rule>& rules() {
  static const std::vector<Rule> all = {
      {"QkvRankNot2",
       Op::forward,
       "qkv",
       {"rank 2 [T, D]"},
       [](LayerCall& c) { c.in.qkv.rank = 3; }},
      {"QkvIntegerDtype",
       Op::forward,
       "qkv",
       {"f32, f64, bf16 or f16", "i64"},
       [](LayerCall& c) { c.in.qkv.dtype = DType::i64; }},
      {"QkvWidthNotTheHeadLayout",
       Op::forward,
       "qkv",
       {"D = 2 Hk Dk + Hv Dv = 32", "[17, 47]"},
       [](LayerCall& c) { c.in.qkv.sizes[1] = 47; }},
      {"QkvNegativeTokens",
       Op::forward,
       "qkv",
       {"-1"},
       [](LayerCall& c) { c.in.qkv.sizes[0] = -1; }},
      {"QkvOverflowingSize",
       Op::forward,
       "qkv",
       {"an element count that fits in int64"},
       [](LayerCall& c) { c.in.qkv.sizes[0] = std::int64_t{1} << 60; }},
      {"QkvMisaligned",
       Op::forward,
       "qkv",
       {"aligned"},
       [](LayerCall& c) { c.in.qkv.data = static_cast<const char*>(c.in.qkv.data) + 1; }},
      {"HeadCountBelowOne",
       Op::forward,
       "options.hk",
       {">= 1", "0"},
       [](LayerCall& c) { c.options.hk = 0; }},
      {"HvNotAMultipleOfHk",
       Op::forward,
       "options.hv",
       {"a multiple of options.hk = 2", "3"},
       [](LayerCall& c) {
         c.options.hk = 2;
         c.options.hv = 3;
       }},
      {"DkAbove256",
       Op::forward,
       "options.dk",
       {"<= 256", "300"},
       [](LayerCall& c) { c.options.dk = 300; }},
      {"DvAbove256",
       Op::forward,
       "options.dv",
       {"<= 256", "257"},
       [](LayerCall& c) { c.options.dv = 257; }},
      {"ChunkSizeAbove256",
       Op::forward,
       "options.chunk_size",
       {"[1, 256]", "512"},
       [](LayerCall& c) { c.options.chunk_size = 512; }},
      {"ThreadsNegative",
       Op::forward,
       "options.threads",
       {"-2"},
       [](LayerCall& c) { c.options.threads = -2; }},
      {"AShapeNotTokensByHv",
       Op::forward,
       "a",
       {"[17, 3]"},
       [](LayerCall& c) { c.in.a.sizes[1] = 3; }},
      {"BDtypeNotTheCompute",
       Op::forward,
       "b",
       {"f64"},
       [](LayerCall& c) { c.in.b.dtype = DType::f64; }},
      {"ConvWeightChannels",
       Op::forward,
       "conv_weight",
       {"47"},
       [](LayerCall& c) { c.in.conv_weight.sizes[0] = 47; }},
      {"ConvBiasChannels",
       Op::forward,
       "conv_bias",
       {"47"},
       [](LayerCall& c) { c.in.conv_bias.sizes[0] = 47; }},
      {"ALogDtype",
       Op::forward,
       "A_log",
       {"f64"},
       [](LayerCall& c) { c.in.A_log.dtype = DType::f64; }},
      {"DtBiasShape",
       Op::forward,
       "dt_bias",
       {"[3]"},
       [](LayerCall& c) { c.in.dt_bias.sizes[0] = 3; }},
      {"ConvStateShape",
       Op::forward,
       "conv_state",
       {"[N, K - 1, D] = [3, 3, 32]", "[3, 2, 32]"},
       [](LayerCall& c) { c.in.conv_state.sizes[1] = 2; }},
      {"RecurrentStateShape",
       Op::forward,
       "recurrent_state",
       {"[N, Hv, Dk, Dv]"},
       [](LayerCall& c) { c.in.recurrent_state.sizes[0] = 2; }},
      {"CuSeqlensNotEndingAtT",
       Op::forward,
       "cu_seqlens",
       {"cu_seqlens[N] = T = 17"},
       [](LayerCall& c) {
         static std::int64_t cu[4] = {0, 10, 10, 16};
         c.in.cu_seqlens = TensorView(cu, {4});
       }},
      {"OutShape",
       Op::forward,
       "out",
       {"[T, Hv Dv]"},
       [](LayerCall& c) { c.fwd_out.out.sizes[1] = 15; }},
      // out alone may be left out (tests/cpu/layer_test.cc, WithoutOut...); not everything.
      {"NoOutputAtAll",
       Op::forward,
       "out",
       {"at least one of conv_state_out", "no output at all"},
       [](LayerCall& c) { c.fwd_out = {}; }},
      {"OutOverlapsQkv",
       Op::forward,
       "out",
       {"does not overlap the input 'qkv'"},
       [](LayerCall& c) { c.fwd_out.out.data = const_cast<void*>(c.in.qkv.data); }},
      {"ConvStateOutOverlapsOut",
       Op::forward,
       "out",
       {"does not overlap 'conv_state_out'"},
       [](LayerCall& c) { c.fwd_out.conv_state_out.data = c.fwd_out.out.data; }},
      {"RecurrentStateOutDtype",
       Op::forward,
       "recurrent_state_out",
       {"f64"},
       [](LayerCall& c) { c.fwd_out.recurrent_state_out.dtype = DType::f64; }},
      {"DOutShape",
       Op::backward,
       "d_out",
       {"[T, Hv Dv]"},
       [](LayerCall& c) { c.bin.d_out.sizes[1] = 3; }},
      {"DOutAbsent", Op::backward, "d_out", {"absent"}, [](LayerCall& c) { c.bin.d_out = {}; }},
      {"DConvStateOutShape",
       Op::backward,
       "d_conv_state_out",
       {"[N, K - 1, D]"},
       [](LayerCall& c) { c.bin.d_conv_state_out.sizes[2] = 40; }},
      {"DRecurrentStateOutDtype",
       Op::backward,
       "d_recurrent_state_out",
       {"f64"},
       [](LayerCall& c) { c.bin.d_recurrent_state_out.dtype = DType::f64; }},
      {"ChunkStatesShape",
       Op::backward,
       "chunk_states",
       {"[total_chunks, Hv, Dk, Dv]"},
       [](LayerCall& c) {
         c.bin.chunk_states = TensorView(c.p.recurrent_state.raw(), DType::f32, {1, 2, 8, 8});
       }},
      {"DQkvShape",
       Op::backward,
       "d_qkv",
       {"[17, 32]", "[16, 32]"},
       [](LayerCall& c) { c.bwd_out.d_qkv.sizes[0] = 16; }},
      {"DQkvOverlapsQkv",
       Op::backward,
       "d_qkv",
       {"does not overlap the input 'qkv'"},
       [](LayerCall& c) { c.bwd_out.d_qkv.data = const_cast<void*>(c.in.qkv.data); }},
      {"DALogAbsent",
       Op::backward,
       "d_A_log",
       {"absent"},
       [](LayerCall& c) { c.bwd_out.d_A_log = {}; }},
      {"DConvWeightOverlapsDQkv",
       Op::backward,
       "d_qkv",
       {"does not overlap 'd_conv_weight'"},
       [](LayerCall& c) { c.bwd_out.d_conv_weight.data = c.bwd_out.d_qkv.data; }},
      {"BackwardQkvWidth",
       Op::backward,
       "qkv",
       {"D = 2 Hk Dk + Hv Dv = 32", "[17, 47]"},
       [](LayerCall& c) { c.bin.forward.qkv.sizes[1] = 47; }},
  };
  return all;
}

void PrintTo(const Rule& rule, std::ostream* os) { *os << rule.name; }

class LayerValidation : public ::testing::TestWithParam<Rule> {};

TEST_P(LayerValidation, ThrowsNamingTheArgumentAndWritesNothing) {
  const Rule& rule = GetParam();
  for (const bool reference : {false, true}) {
    LayerCall c;
    rule.breaks(c);
    // The float64 references take float64 outputs: their output rules are those of the CPU op
    // with f64 in place of f32, so only the input rules run on them here.
    const std::string arg = rule.argument;
    const bool output_rule = arg == "out" || arg == "conv_state_out" ||
                             arg == "recurrent_state_out" || arg.rfind("d_", 0) == 0;
    if (reference && output_rule && arg != "d_out" && arg != "d_conv_state_out" &&
        arg != "d_recurrent_state_out") {
      continue;
    }
    const std::string which = reference ? "ref::" : "";
    test::expect_rejected(
        [&c, &rule, reference] {
          if (rule.op == Op::forward) {
            reference ? ref::fused_gdn_fwd(c.in, c.fwd_out, c.options)
                      : fused_gdn_fwd(c.in, c.fwd_out, c.options);
          } else {
            reference ? ref::fused_gdn_bwd(c.bin, c.bwd_out, c.options)
                      : fused_gdn_bwd(c.bin, c.bwd_out, c.options);
          }
        },
        rule.name, rule.argument, rule.words, which, !reference);
    EXPECT_TRUE(c.untouched()) << which << "an output was written before rule " << rule.name
                               << " threw";
  }
}

INSTANTIATE_TEST_SUITE_P(Layer, LayerValidation, ::testing::ValuesIn(rules()), test::RuleName());

// The unbroken call is accepted, and writes (so the sentinel check above can fail).
TEST(LayerValidation, TheValidCallRunsAndWrites) {
  LayerCall c;
  fused_gdn_fwd(c.in, c.fwd_out, c.options);
  fused_gdn_bwd(c.bin, c.bwd_out, c.options);
  EXPECT_FALSE(c.untouched());
}

}  // namespace
}  // namespace gdn
