// backward_test.cc: the float64 reference backward (reverse mode through the token
// recurrence) against central finite differences of the float64 forward.
//
// L = <W_o, o> + <W_h, final_state> with random W; dL/dx for every element x of q, k, v, g,
// beta and the initial states, by (L(x + h) - L(x - h)) / 2h with h = 1e-5: truncation error
// ~h^2 |L'''| ~ 1e-10, rounding ~1e-16 |L| / h ~ 1e-11.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/problem.h"

namespace gdn {
namespace {

using test::make_problem;
using test::Problem;
using test::ProblemSpec;

constexpr double kStep = 1e-5;
constexpr double kAbsolute = 1e-7;
constexpr double kRelative = 1e-6;

Tensor random_like(DType dtype, int rank, const Dims& sizes, std::uint64_t seed) {
  Tensor t(dtype, rank, sizes);
  test::Random rng(seed);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = rng.normal();
  return t;
}

double loss(const Problem& p, const ForwardOptions& options, const Tensor& w_o, const Tensor& w_h) {
  const ForwardResult r = ref::recurrent_fwd(p.inputs(), options);
  double l = 0;
  for (std::int64_t i = 0; i < r.o.numel(); ++i) l += w_o.data<double>()[i] * r.o.data<double>()[i];
  for (std::int64_t i = 0; i < r.final_state.numel(); ++i) {
    l += w_h.data<double>()[i] * r.final_state.data<double>()[i];
  }
  return l;
}

void check_gradients(ProblemSpec spec, const ForwardOptions& base_options, bool with_dht) {
  spec.dtype = DType::f64;
  Problem p = make_problem(spec);
  if (!p.h0.present())
    p.h0 = Tensor(DType::f64,
                  {static_cast<std::int64_t>(spec.lengths.size()), spec.hv, spec.dk, spec.dv});
  ForwardOptions options = base_options;
  options.use_qk_l2norm = spec.l2norm;
  const ForwardShape shape = forward_shape(p.inputs(), options);
  const Tensor w_o = random_like(DType::f64, shape.o_rank(), shape.o_sizes(), 101);
  Tensor w_h = random_like(DType::f64, 4, shape.state_sizes(), 202);
  if (!with_dht) w_h = Tensor(DType::f64, 4, shape.state_sizes());
  BackwardInputs in{p.q.view(),
                    p.k.view(),
                    p.v.view(),
                    p.g.view(),
                    p.beta.view(),
                    p.h0.view(),
                    p.cu_seqlens.view(),
                    w_o.view(),
                    with_dht ? w_h.view() : TensorView{},
                    {},
                    {}};
  const BackwardResult grad = ref::recurrent_bwd(in, options);
  const std::pair<const char*, std::pair<Tensor*, const Tensor*>> pairs[] = {
      {"q", {&p.q, &grad.dq}},          {"k", {&p.k, &grad.dk}},
      {"v", {&p.v, &grad.dv}},          {"g", {&p.g, &grad.dg}},
      {"beta", {&p.beta, &grad.dbeta}}, {"h0", {&p.h0, &grad.d_initial_state}}};
  int checked = 0;
  for (const auto& [name, tensors] : pairs) {
    Tensor& x = *tensors.first;
    const Tensor& analytic = *tensors.second;
    ASSERT_EQ(x.numel(), analytic.numel()) << name;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      double& value = x.data<double>()[i];
      const double saved = value;
      value = saved + kStep;
      const double up = loss(p, options, w_o, w_h);
      value = saved - kStep;
      const double down = loss(p, options, w_o, w_h);
      value = saved;
      const double numeric = (up - down) / (2 * kStep);
      const double a = analytic.data<double>()[i];
      ASSERT_NEAR(a, numeric, kAbsolute + kRelative * std::fabs(numeric))
          << "d" << name << "[" << i << "], " << spec.name();
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(ReferenceBackward, MatchesFiniteDifferences) {
  ProblemSpec spec;
  spec.lengths = {5, 0, 4};  // a zero-length sequence in the middle
  spec.hk = 1;
  spec.hv = 2;  // GVA: dq, dk sum over two value heads
  spec.dk = 3;
  spec.dv = 2;
  spec.g_lo = -2.0;
  for (bool l2norm : {false, true}) {
    for (bool h0 : {false, true}) {
      for (bool dht : {false, true}) {
        spec.l2norm = l2norm;
        spec.initial_state = h0;
        check_gradients(spec, {}, dht);
      }
    }
  }
}

TEST(ReferenceBackward, MatchesFiniteDifferencesOtherShapes) {
  ProblemSpec spec;
  spec.lengths = {7};
  spec.hk = 2;
  spec.hv = 4;  // r = 2 over two key heads
  spec.dk = 2;
  spec.dv = 3;
  spec.initial_state = true;
  spec.l2norm = true;
  ForwardOptions options;
  options.scale = 0.7;  // a custom scale
  check_gradients(spec, options, true);
  spec.lengths = {6, 6};
  spec.batched = true;  // the [B, T, H, D] layout
  spec.hk = 1;
  spec.hv = 1;
  check_gradients(spec, {}, true);
  spec.batched = false;
  spec.lengths = {70};  // longer than the reference's 64-token recompute segments
  spec.dk = 2;
  spec.dv = 2;
  spec.g_lo = -0.3;
  check_gradients(spec, {}, true);
}

}  // namespace
}  // namespace gdn
