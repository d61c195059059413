// validate_backward_test.cc: the core op's backward validation rules
// (gdn::chunk_gated_delta_rule_bwd), one test per rule, each named after it (docs/validation.md
// lists them; the forward's input rules, which the backward shares, are
// tests/api/validate_test.cc). A rule's test breaks one argument of a valid call and checks that
// the call throws gdn::InvalidArgument naming that argument, with "expected" and "given" and the
// rule's own words in the message, and that every gradient still holds its sentinel bytes.
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

// A valid backward call (packed, two sequences, initial states, residuals kept) with
// preallocated gradients filled with a sentinel.
struct BackwardCall {
  test::Problem p;
  test::Cotangents ct;
  ForwardResult fwd;
  BackwardInputs in;
  BackwardResult grads;
  BackwardOutputs out;
  ForwardOptions options;

  BackwardCall() {
    test::ProblemSpec spec;
    spec.lengths = {20, 12};
    spec.hk = 1;
    spec.hv = 2;
    spec.dk = spec.dv = 8;
    spec.initial_state = true;
    p = test::make_problem(spec);
    ct = test::make_cotangents(p, 7);
    options = p.options();
    options.chunk_size = 16;
    fwd = chunk_gated_delta_rule_fwd(p.inputs(), options, Residuals::all);
    in = BackwardInputs::from(p.inputs());
    in.d_o = ct.d_o.view();
    in.d_final_state = ct.d_ht.view();
    in.chunk_states = fwd.chunk_states.view();
    in.t_inv = fwd.t_inv.view();
    grads = chunk_gated_delta_rule_bwd(in, options);
    test::fill_sentinel(tensors());
    out = {grads.dq.mutable_view(),    grads.dk.mutable_view(),
           grads.dv.mutable_view(),    grads.dg.mutable_view(),
           grads.dbeta.mutable_view(), grads.d_initial_state.mutable_view()};
  }
  std::vector<Tensor*> tensors() {
    return {&grads.dq, &grads.dk, &grads.dv, &grads.dg, &grads.dbeta, &grads.d_initial_state};
  }
  bool untouched() { return test::hold_sentinel(tensors()); }
};

using Rule = test::Rule<BackwardCall>;

const std::vector<Rule>& rules() {
  static const std::vector<Rule> all = {
      {"QRankShared", "q", {"rank 3"}, [](BackwardCall& c) { c.in.q.rank = 2; }},
      {"DOutAbsent", "d_o", {"absent"}, [](BackwardCall& c) { c.in.d_o = {}; }},
      {"DOutShape",
       "d_o",
       {"[T, Hv, Dv] (that of o)", "[32, 2, 7]"},
       [](BackwardCall& c) { c.in.d_o.sizes[2] = 7; }},
      {"DOutDtype",
       "d_o",
       {"f32 (the dtype of q)", "f64"},
       [](BackwardCall& c) { c.in.d_o.dtype = DType::f64; }},
      {"DFinalStateDtype",
       "d_final_state",
       {"f64"},
       [](BackwardCall& c) { c.in.d_final_state.dtype = DType::f64; }},
      {"DFinalStateShape",
       "d_final_state",
       {"[N, Hv, Dk, Dv]", "[1, 2, 8, 8]"},
       [](BackwardCall& c) { c.in.d_final_state.sizes[0] = 1; }},
      {"ChunkStatesShape",
       "chunk_states",
       {"[total_chunks, Hv, Dk, Dv]"},
       [](BackwardCall& c) { c.in.chunk_states.sizes[0] = 2; }},
      {"TInvShape",
       "t_inv",
       {"[total_chunks, Hv, C, C]"},
       [](BackwardCall& c) { c.in.t_inv = c.fwd.chunk_states.view(); }},
      {"DqAbsent", "dq", {"absent"}, [](BackwardCall& c) { c.out.dq = {}; }},
      {"DvShape",
       "dv",
       {"(that of v)", "[32, 1, 8]"},
       [](BackwardCall& c) { c.out.dv.sizes[1] = 1; }},
      {"DgDtype", "dg", {"f64"}, [](BackwardCall& c) { c.out.dg.dtype = DType::f64; }},
      {"DInitialStateShape",
       "d_initial_state",
       {"[N, Hv, Dk, Dv]"},
       [](BackwardCall& c) { c.out.d_initial_state.sizes[3] = 4; }},
      {"DbetaOverlapsBeta",
       "dbeta",
       {"does not overlap the input 'beta'"},
       [](BackwardCall& c) { c.out.dbeta.data = const_cast<void*>(c.in.beta.data); }},
      {"DkOverlapsDq",
       "dq",
       {"does not overlap 'dk'"},
       [](BackwardCall& c) { c.out.dk.data = c.out.dq.data; }},
      {"DqMisaligned",
       "dq",
       {"aligned"},
       [](BackwardCall& c) { c.out.dq.data = static_cast<char*>(c.out.dq.data) + 2; }},
      {"ChunkSizeOfTheResidualsDiffers",
       "chunk_states",
       {"[total_chunks, Hv, Dk, Dv] = [2, 2, 8, 8]"},
       [](BackwardCall& c) { c.options.chunk_size = 32; }},
  };
  return all;
}

class BackwardValidation : public ::testing::TestWithParam<Rule> {};

TEST_P(BackwardValidation, ThrowsNamingTheArgumentAndWritesNothing) {
  const Rule& rule = GetParam();
  BackwardCall c;
  rule.breaks(c);
  test::expect_rejected([&c] { chunk_gated_delta_rule_bwd(c.in, c.out, c.options); }, rule.name,
                        rule.argument, rule.words);
  EXPECT_TRUE(c.untouched()) << "a gradient was written before rule " << rule.name << " threw";
}

INSTANTIATE_TEST_SUITE_P(Core, BackwardValidation, ::testing::ValuesIn(rules()), test::RuleName());

// The unbroken call is accepted, and writes (so the sentinel check above can fail).
TEST(BackwardValidation, TheValidCallRunsAndWrites) {
  BackwardCall c;
  chunk_gated_delta_rule_bwd(c.in, c.out, c.options);
  EXPECT_FALSE(c.untouched());
}

}  // namespace
}  // namespace gdn
