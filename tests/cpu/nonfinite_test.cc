// nonfinite_test.cc: a NaN or an Inf in one sequence's inputs (or cotangents, or initial
// states) never changes another sequence's outputs, final states or gradients, bit for bit, in
// the core op's forward and backward and the layer op's forward and backward, on every ISA
// variant this CPU runs (issue 16, requirement 5; the serving step's case is
// CpuStep.NanInAnotherSlotChangesNothing). Parameter gradients (conv weight and bias, A_log,
// dt_bias) are sums over every sequence and take the NaN by definition; they are not checked.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/isas.h"
#include "common/layer_problem.h"
#include "common/problem.h"
#include "step_harness.h"

namespace gdn {
namespace {

// Rows [row0, row1) of a tensor whose first dimension is tokens (or sequences), `row` elements
// each: equal bit for bit in a and b.
::testing::AssertionResult rows_identical(const Tensor& a, const Tensor& b, std::int64_t row0,
                                          std::int64_t row1, const std::string& what) {
  const std::int64_t row = a.numel() / a.size(0);
  const std::size_t bytes = static_cast<std::size_t>((row1 - row0) * row) * dtype_size(a.dtype());
  if (std::memcmp(static_cast<const std::byte*>(a.raw()) + row0 * row * dtype_size(a.dtype()),
                  static_cast<const std::byte*>(b.raw()) + row0 * row * dtype_size(b.dtype()),
                  bytes) == 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << what << ": rows " << row0 << " to " << row1 << " changed";
}

// Writes `bad` into element `index` of row `row` of t (float32).
void poison(Tensor& t, std::int64_t row, std::int64_t index, float bad) {
  const std::int64_t per_row = t.numel() / t.size(0);
  t.data<float>()[row * per_row + index % per_row] = bad;
}

const float kBad[] = {std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()};

BackwardInputs core_backward_inputs(const test::Problem& p, const test::Cotangents& c) {
  BackwardInputs in;
  in.q = p.q.view();
  in.k = p.k.view();
  in.v = p.v.view();
  in.g = p.g.view();
  in.beta = p.beta.view();
  in.initial_state = p.h0.view();
  in.cu_seqlens = p.cu_seqlens.view();
  in.d_o = c.d_o.view();
  in.d_final_state = c.d_ht.view();
  return in;
}

// Sequences of 40, 70 and 33 tokens (chunk 32: each spans chunks of its own); sequence 1 gets a
// non-finite value in each of q, k, v, g, beta, its initial state, d_o and d_final_state.
TEST(NonFinite, CoreOpOneSequencesNanOrInfLeavesTheOthersBitIdentical) {
  test::ProblemSpec spec;
  spec.lengths = {40, 70, 33};
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 16;
  spec.dv = 16;
  spec.initial_state = true;
  spec.l2norm = true;
  spec.seed = 81;
  const std::int64_t first = 40, last = 110;  // sequence 1's tokens
  for (float bad : kBad) {
    test::Problem clean = test::make_problem(spec);
    test::Problem dirty = test::make_problem(spec);
    const test::Cotangents clean_c = test::make_cotangents(clean, 82);
    test::Cotangents dirty_c = test::make_cotangents(dirty, 82);
    poison(dirty.q, first + 3, 5, bad);
    poison(dirty.k, first + 50, 17, bad);
    poison(dirty.v, last - 1, 9, bad);
    poison(dirty.g, first + 20, 1, bad);
    poison(dirty.beta, first + 33, 2, bad);
    poison(dirty.h0, 1, 100, bad);
    poison(dirty_c.d_o, first + 7, 30, bad);
    poison(dirty_c.d_ht, 1, 7, bad);
    for (CpuIsa isa : test::runnable_isas()) {
      ForwardOptions o = clean.options();
      o.isa = isa;
      o.chunk_size = 32;
      const std::string what = std::string(cpu_isa_name(isa)) + ", " + std::to_string(bad);
      const ForwardResult fc = chunk_gated_delta_rule_fwd(clean.inputs(), o);
      const ForwardResult fd = chunk_gated_delta_rule_fwd(dirty.inputs(), o);
      const BackwardResult bc = chunk_gated_delta_rule_bwd(core_backward_inputs(clean, clean_c), o);
      const BackwardResult bd = chunk_gated_delta_rule_bwd(core_backward_inputs(dirty, dirty_c), o);
      for (const auto& [name, c, d] :
           {std::tuple{"o", &fc.o, &fd.o}, std::tuple{"dq", &bc.dq, &bd.dq},
            std::tuple{"dk", &bc.dk, &bd.dk}, std::tuple{"dv", &bc.dv, &bd.dv},
            std::tuple{"dg", &bc.dg, &bd.dg}, std::tuple{"dbeta", &bc.dbeta, &bd.dbeta}}) {
        EXPECT_TRUE(
            rows_identical(*c, *d, 0, first, std::string(name) + " of sequence 0, " + what));
        EXPECT_TRUE(rows_identical(*c, *d, last, c->size(0),
                                   std::string(name) + " of sequence 2, " + what));
      }
      for (const auto& [name, c, d] :
           {std::tuple{"final_state", &fc.final_state, &fd.final_state},
            std::tuple{"d_initial_state", &bc.d_initial_state, &bd.d_initial_state}}) {
        EXPECT_TRUE(rows_identical(*c, *d, 0, 1, std::string(name) + " of sequence 0, " + what));
        EXPECT_TRUE(rows_identical(*c, *d, 2, 3, std::string(name) + " of sequence 2, " + what));
      }
      // The poison reached sequence 1 (else the test proves nothing).
      EXPECT_FALSE(std::isfinite(fd.o.data<float>()[(first + 3) * spec.hv * spec.dv + 5]) &&
                   std::isfinite(fd.final_state.data<float>()[spec.hv * spec.dk * spec.dv]))
          << what;
    }
  }
}

// The layer op: sequences of 5, 2 and 70 tokens with both initial states; the middle one (2
// tokens: shorter than K - 1, so its conv state passes through) gets a non-finite value in qkv,
// a, b, its conv and recurrent states and its cotangents.
TEST(NonFinite, LayerOpOneSequencesNanOrInfLeavesTheOthersBitIdentical) {
  test::LayerSpec spec;
  spec.lengths = {5, 2, 70};
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 16;
  spec.dv = 8;
  spec.conv_state = true;
  spec.recurrent_state = true;
  spec.seed = 91;
  const std::int64_t first = 5, last = 7;
  for (float bad : kBad) {
    const test::LayerProblem clean = test::make_layer_problem(spec);
    test::LayerProblem dirty = test::make_layer_problem(spec);
    poison(dirty.qkv, first, 3, bad);
    poison(dirty.a, first + 1, 1, bad);
    poison(dirty.b, first, 2, bad);
    poison(dirty.conv_state, 1, 40, bad);
    poison(dirty.recurrent_state, 1, 77, bad);
    poison(dirty.d_out, first + 1, 4, bad);
    poison(dirty.d_conv_state_out, 1, 9, bad);
    poison(dirty.d_recurrent_state_out, 1, 5, bad);
    for (CpuIsa isa : test::runnable_isas()) {
      LayerOptions o = clean.options();
      o.isa = isa;
      const std::string what = std::string(cpu_isa_name(isa)) + ", " + std::to_string(bad);
      auto run = [&o](const test::LayerProblem& p) {
        const LayerBackwardInputs in{p.inputs(),
                                     p.d_out.view(),
                                     p.d_conv_state_out.view(),
                                     p.d_recurrent_state_out.view(),
                                     {},
                                     {}};
        return std::pair{fused_gdn_fwd(p.inputs(), o), fused_gdn_bwd(in, o)};
      };
      const auto [fc, bc] = run(clean);
      const auto [fd, bd] = run(dirty);
      for (const auto& [name, c, d] :
           {std::tuple{"out", &fc.out, &fd.out}, std::tuple{"d_qkv", &bc.d_qkv, &bd.d_qkv},
            std::tuple{"d_a", &bc.d_a, &bd.d_a}, std::tuple{"d_b", &bc.d_b, &bd.d_b}}) {
        EXPECT_TRUE(
            rows_identical(*c, *d, 0, first, std::string(name) + " of sequence 0, " + what));
        EXPECT_TRUE(rows_identical(*c, *d, last, c->size(0),
                                   std::string(name) + " of sequence 2, " + what));
      }
      for (const auto& [name, c, d] :
           {std::tuple{"conv_state_out", &fc.conv_state_out, &fd.conv_state_out},
            std::tuple{"recurrent_state_out", &fc.recurrent_state_out, &fd.recurrent_state_out},
            std::tuple{"d_conv_state", &bc.d_conv_state, &bd.d_conv_state},
            std::tuple{"d_recurrent_state", &bc.d_recurrent_state, &bd.d_recurrent_state}}) {
        EXPECT_TRUE(rows_identical(*c, *d, 0, 1, std::string(name) + " of sequence 0, " + what));
        EXPECT_TRUE(rows_identical(*c, *d, 2, 3, std::string(name) + " of sequence 2, " + what));
      }
      EXPECT_FALSE(std::isfinite(fd.recurrent_state_out.data<float>()[spec.hv * spec.dk * spec.dv]))
          << "the poison did not reach sequence 1's state, " << what;
    }
  }
}

// The error a call throws, or an empty text when it returns.
template <class Call>
std::string non_finite_message(Call&& call, std::string* tensor = nullptr,
                               std::string* index = nullptr) {
  try {
    call();
  } catch (const NonFiniteError& e) {
    if (tensor) *tensor = e.tensor();
    if (index) *index = e.index();
    return e.what();
  }
  return "";
}

// Check mode, core op: a NaN in g at token 41, head 3 is named with its position before
// anything is written (o and the final state keep their sentinel); without the mode the call
// runs; a finite input whose output overflows (scale 1e30) is named as an output.
TEST(CheckFinite, CoreForwardNamesTheFirstNonFiniteInputAndWritesNothing) {
  test::ProblemSpec spec;
  spec.lengths = {30, 40};
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 8;
  spec.dv = 8;
  spec.seed = 95;
  test::Problem p = test::make_problem(spec);
  p.g.data<float>()[41 * spec.hv + 3] = std::numeric_limits<float>::quiet_NaN();
  p.g.data<float>()[60 * spec.hv + 0] = std::numeric_limits<float>::infinity();  // not the first
  ForwardOptions o = p.options();
  o.check_finite = true;
  const ForwardShape shape = forward_shape(p.inputs(), o);
  Tensor out(DType::f32, shape.o_rank(), shape.o_sizes());
  Tensor state(DType::f32, 4, shape.state_sizes());
  for (Tensor* t : {&out, &state}) {
    for (std::int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = 7.0f;
  }
  std::string tensor, index;
  const std::string message = non_finite_message(
      [&] {
        chunk_gated_delta_rule_fwd(p.inputs(), {out.mutable_view(), state.mutable_view(), {}, {}},
                                   o);
      },
      &tensor, &index);
  EXPECT_EQ(tensor, "g");
  EXPECT_EQ(index, "[41, 3]");
  EXPECT_NE(message.find("input 'g' holds nan at [41, 3] (nothing was written)"), std::string::npos)
      << message;
  for (const Tensor* t : {&out, &state}) {
    for (std::int64_t i = 0; i < t->numel(); ++i) ASSERT_EQ(t->data<float>()[i], 7.0f) << i;
  }
  o.check_finite = false;
  EXPECT_EQ(non_finite_message([&] { chunk_gated_delta_rule_fwd(p.inputs(), o); }), "");

  // Finite inputs whose output overflows: v of 1e20 read by q scaled by 1e30.
  test::Problem finite = test::make_problem(spec);
  for (std::int64_t i = 0; i < finite.v.numel(); ++i) finite.v.data<float>()[i] *= 1e20f;
  ForwardOptions huge = finite.options();
  huge.check_finite = true;
  huge.scale = 1e30;
  EXPECT_EQ(non_finite_message([&] { chunk_gated_delta_rule_fwd(finite.inputs(), huge); }, &tensor,
                               &index)
                .find("output 'o' holds"),
            0u + std::string("gdn: check_finite: ").size());
  EXPECT_EQ(tensor, "o");
}

// Check mode, core backward and the layer op: a NaN in a cotangent or a state is named.
TEST(CheckFinite, BackwardAndLayerNameTheirInputs) {
  test::ProblemSpec spec;
  spec.lengths = {20};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 8;
  spec.dv = 8;
  spec.initial_state = true;
  const test::Problem p = test::make_problem(spec);
  test::Cotangents c = test::make_cotangents(p, 96);
  c.d_ht.data<float>()[1 * 64 + 2 * 8 + 5] = std::numeric_limits<float>::quiet_NaN();
  ForwardOptions o = p.options();
  o.check_finite = true;
  std::string tensor, index;
  non_finite_message([&] { chunk_gated_delta_rule_bwd(core_backward_inputs(p, c), o); }, &tensor,
                     &index);
  EXPECT_EQ(tensor, "d_final_state");
  EXPECT_EQ(index, "[0, 1, 2, 5]");

  test::LayerSpec ls;
  ls.lengths = {3, 9};
  ls.conv_state = true;
  test::LayerProblem lp = test::make_layer_problem(ls);
  const std::int64_t d = ls.channels();
  lp.conv_state.data<float>()[(1 * (ls.taps - 1) + 2) * d + 11] =
      -std::numeric_limits<float>::infinity();
  LayerOptions lo = lp.options();
  lo.check_finite = true;
  const std::string message =
      non_finite_message([&] { fused_gdn_fwd(lp.inputs(), lo); }, &tensor, &index);
  EXPECT_EQ(tensor, "conv_state");
  EXPECT_EQ(index, "[1, 2, 11]");
  EXPECT_NE(message.find("holds -inf"), std::string::npos) << message;
}

// Check mode, serving step: NaN in a padding token's row (past the live tokens) is not an
// error; NaN in a live token's row is, and both pools are left as they were.
TEST(CheckFinite, StepLooksAtLiveTokensOnlyAndLeavesThePoolsOnError) {
  using namespace step_test;
  StepSpec spec;
  spec.num_slots = 6;
  spec.decodes = {{1, 1, 5}};
  spec.prefills = {{9, 3, 0}};
  spec.trailing = 4;
  StepProblem p = make_step_problem(spec);
  const std::int64_t d = spec.channels();
  const std::int64_t live = p.query_start_loc[p.mixed_end()];
  p.qkv.data<float>()[(live + 2) * d + 7] = std::numeric_limits<float>::quiet_NaN();
  StepOptions o = p.options();
  o.check_finite = true;
  EXPECT_EQ(non_finite_message([&] { run_step(p, o); }), "");

  p.qkv.data<float>()[4 * d + 7] = std::numeric_limits<float>::quiet_NaN();
  Tensor conv = clone(p.conv_pool), rec = clone(p.rec_pool);
  Tensor out(DType::f32, {p.tokens, spec.hv * spec.dv});
  std::string tensor, index;
  non_finite_message(
      [&] {
        fused_gdn_step(p.inputs(), {conv.mutable_view(), rec.mutable_view()}, out.mutable_view(),
                       o);
      },
      &tensor, &index);
  EXPECT_EQ(tensor, "qkv");
  EXPECT_EQ(index, "[4, 7]");
  EXPECT_TRUE(rows_identical(conv, p.conv_pool, 0, conv.size(0), "conv pool"));
  EXPECT_TRUE(rows_identical(rec, p.rec_pool, 0, rec.size(0), "recurrent pool"));
}

// A v channel c of qkv whose conv overflows float32 from finite inputs: weight 1 on every tap,
// no bias, and `big` inputs at the given token rows of qkv (and, for a sequence with history,
// in its read slot's conv state rows). SiLU(inf) = inf, so every output of a value head that
// reads channel c is non-finite, and so is its new state.
constexpr float kBig = 3e38f;
void overflow_channel(Tensor& conv_weight, Tensor& conv_bias, std::int64_t c) {
  const std::int64_t k = conv_weight.numel() / conv_weight.size(0);
  for (std::int64_t i = 0; i < k; ++i) conv_weight.data<float>()[c * k + i] = 1.0f;
  conv_bias.data<float>()[c] = 0.0f;
}

// Check mode, serving step: a step whose out (or a written slot) turns out non-finite from
// finite inputs throws, and leaves both pools bit-identical to before the call (every slot
// it wrote put back), so that an engine that retries it does not advance a sequence twice;
// out holds the step's values. Once for an overflow in a decode (the decode kernel), once in a
// prefill (the layer op). Without check mode the same step runs and advances the slots.
TEST(CheckFinite, StepThatThrowsLeavesEveryPoolSlot) {
  using namespace step_test;
  for (const bool in_decode : {true, false}) {
    StepSpec spec;
    spec.num_slots = 12;
    spec.num_spec = 2;
    spec.decodes = {{1, 2, 5}, {3, 4, 9}};  // a decode (slot 2), a window (slots 4 to 6)
    spec.prefills = {{9, 8, 0}};
    spec.continued = {{6, 10, 20}};
    StepProblem p = make_step_problem(spec);
    const std::int64_t d = spec.channels(), c = 2 * spec.hk * spec.dk + 3;  // a v channel
    overflow_channel(p.conv_weight, p.conv_bias, c);
    if (in_decode) {  // the decode's token and its history in slot 2
      p.qkv.data<float>()[0 * d + c] = kBig;
      for (std::int64_t r = 0; r < spec.taps - 1; ++r) {
        p.conv_pool.data<float>()[(2 * (spec.taps - 1) + r) * d + c] = kBig;
      }
    } else {  // four tokens of the fresh prefill (rows 4 to 12)
      for (std::int64_t t = 5; t < 9; ++t) p.qkv.data<float>()[t * d + c] = kBig;
    }
    const std::string what = in_decode ? "overflow in a decode" : "overflow in a prefill";
    StepOptions o = p.options();
    const StepResult unchecked = run_step(p, o);  // runs: out non-finite, slots advanced
    bool non_finite = false;
    for (std::int64_t i = 0; i < unchecked.out.numel(); ++i) {
      non_finite = non_finite || !std::isfinite(unchecked.out.data<float>()[i]);
    }
    EXPECT_TRUE(non_finite) << what;
    EXPECT_FALSE(rows_identical(unchecked.rec_pool, p.rec_pool, 0, spec.num_slots, "pool")) << what;
    o.check_finite = true;
    for (CpuIsa isa : step_test::compiled_isas()) {
      o.isa = isa;
      Tensor conv = clone(p.conv_pool), rec = clone(p.rec_pool);
      Tensor out(DType::f32, {p.tokens, spec.hv * spec.dv});
      std::string tensor, index;
      const std::string message = non_finite_message(
          [&] {
            fused_gdn_step(p.inputs(), {conv.mutable_view(), rec.mutable_view()},
                           out.mutable_view(), o);
          },
          &tensor, &index);
      const std::string where = what + ", " + cpu_isa_name(isa);
      EXPECT_EQ(tensor, "out") << where;
      EXPECT_NE(message.find("(out is written; every pool slot is as before the call)"),
                std::string::npos)
          << message;
      EXPECT_TRUE(rows_identical(conv, p.conv_pool, 0, spec.num_slots, "conv pool, " + where));
      EXPECT_TRUE(rows_identical(rec, p.rec_pool, 0, spec.num_slots, "recurrent pool, " + where));
    }
  }
}

// Check mode, serving step: a NaN in the state a live sequence reads is an input, named with
// its slot; a NaN in a slot no live sequence reads is not looked at.
TEST(CheckFinite, StepNamesANonFiniteReadSlot) {
  using namespace step_test;
  StepSpec spec;
  spec.num_slots = 8;
  spec.decodes = {{1, 2, 5}};
  spec.continued = {{6, 5, 20}};
  StepProblem p = make_step_problem(spec);
  StepOptions o = p.options();
  o.check_finite = true;
  p.rec_pool.data<float>()[7 * slot_numel(p.rec_pool) + 3] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(non_finite_message([&] { run_step(p, o); }), "");
  p.rec_pool.data<float>()[5 * slot_numel(p.rec_pool) + 1 * spec.dk * spec.dv + 2 * spec.dv + 3] =
      std::numeric_limits<float>::quiet_NaN();
  std::string tensor, index;
  const std::string message = non_finite_message([&] { run_step(p, o); }, &tensor, &index);
  EXPECT_EQ(tensor, "recurrent_state");
  EXPECT_EQ(index, "[5, 1, 2, 3]");
  EXPECT_NE(message.find("(nothing was written)"), std::string::npos) << message;
}

// Check mode, core and layer forward with their state updated in place (the output the view of
// the input): an output that overflows from finite inputs throws and the state is put back,
// bit for bit; without check mode the call advances it.
TEST(CheckFinite, InPlaceStateIsPutBackWhenAnOutputIsNonFinite) {
  test::ProblemSpec spec;
  spec.lengths = {30, 40};
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = spec.dv = 8;
  spec.initial_state = true;
  spec.seed = 98;
  test::Problem p = test::make_problem(spec);
  for (std::int64_t i = 0; i < p.v.numel(); ++i) p.v.data<float>()[i] *= 1e20f;
  ForwardOptions o = p.options();
  o.scale = 1e30;  // o = 1e30 q . (1e20 v): past float32
  const ForwardShape shape = forward_shape(p.inputs(), o);
  for (const bool check : {false, true}) {
    o.check_finite = check;
    Tensor state = step_test::clone(p.h0), out(DType::f32, shape.o_rank(), shape.o_sizes());
    ForwardInputs in = p.inputs();
    in.initial_state = state.view();
    const std::string message = non_finite_message([&] {
      chunk_gated_delta_rule_fwd(in, {out.mutable_view(), state.mutable_view(), {}, {}}, o);
    });
    if (!check) {
      EXPECT_EQ(message, "");
      EXPECT_FALSE(rows_identical(state, p.h0, 0, state.size(0), "state")) << "unchecked";
      continue;
    }
    EXPECT_NE(message.find("output 'o' holds"), std::string::npos) << message;
    EXPECT_NE(message.find("the states it updates in place are as before it"), std::string::npos)
        << message;
    EXPECT_TRUE(rows_identical(state, p.h0, 0, state.size(0), "core forward's in-place state"));
  }

  test::LayerSpec ls;
  ls.lengths = {12, 20};
  ls.conv_state = ls.recurrent_state = true;
  test::LayerProblem lp = test::make_layer_problem(ls);
  const std::int64_t d = ls.channels(), c = 2 * ls.hk * ls.dk + 1;
  overflow_channel(lp.conv_weight, lp.conv_bias, c);
  for (std::int64_t t = 14; t < 18; ++t) lp.qkv.data<float>()[t * d + c] = kBig;
  LayerOptions lo = lp.options();
  for (const bool check : {false, true}) {
    lo.check_finite = check;
    Tensor conv = step_test::clone(lp.conv_state), rec = step_test::clone(lp.recurrent_state);
    Tensor out(DType::f32, {lp.qkv.size(0), ls.hv * ls.dv});
    LayerInputs in = lp.inputs();
    in.conv_state = conv.view();
    in.recurrent_state = rec.view();
    const std::string message = non_finite_message([&] {
      fused_gdn_fwd(in, {out.mutable_view(), conv.mutable_view(), rec.mutable_view(), {}, {}}, lo);
    });
    if (!check) {
      EXPECT_EQ(message, "");
      EXPECT_FALSE(rows_identical(rec, lp.recurrent_state, 0, rec.size(0), "state")) << "unchecked";
      continue;
    }
    EXPECT_NE(message.find("output 'out' holds"), std::string::npos) << message;
    EXPECT_TRUE(
        rows_identical(conv, lp.conv_state, 0, conv.size(0), "layer's in-place conv state"));
    EXPECT_TRUE(rows_identical(rec, lp.recurrent_state, 0, rec.size(0),
                               "layer's in-place recurrent state"));
  }
}

// Without the in-kernel L2 norm, check mode warns (stderr, no error) about the first token and
// value head whose beta ||k||^2 passes 2 (the transition then expands the state: docs/numerics.md
// "Under stress"), counting all of them; unit keys, the L2 norm on, or check mode off: silent.
TEST(CheckFinite, WarnsWhenBetaTimesKeyNormSquaredPassesTwo) {
  test::ProblemSpec spec;
  spec.lengths = {20};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = spec.dv = 8;
  spec.beta_lo = spec.beta_hi = 1.0;
  spec.seed = 97;
  test::Problem p = test::make_problem(spec);  // unit-norm keys: beta ||k||^2 = 1
  ForwardOptions o = p.options();
  o.check_finite = true;
  auto stderr_of = [&](const ForwardOptions& options) {
    ::testing::internal::CaptureStderr();
    chunk_gated_delta_rule_fwd(p.inputs(), options);
    return ::testing::internal::GetCapturedStderr();
  };
  EXPECT_EQ(stderr_of(o), "");
  for (std::int64_t i = 0; i < spec.dk; ++i) p.k.data<float>()[7 * spec.dk + i] *= 1.5f;  // 2.25
  const std::string warning = stderr_of(o);
  EXPECT_NE(warning.find("beta ||k||^2 = 2.25 > 2 at [token, value head] [7, 0] (2 such"),
            std::string::npos)
      << warning;
  ForwardOptions normalised = o;
  normalised.use_qk_l2norm = true;
  EXPECT_EQ(stderr_of(normalised), "");
  o.check_finite = false;
  if (std::getenv("GDN_CHECK_FINITE") == nullptr) {
    EXPECT_EQ(stderr_of(o), "");
  }
}

}  // namespace
}  // namespace gdn
