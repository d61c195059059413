// conv_test.cc: the float64 reference of the conv op (gdn/conv.h) against central finite
// differences of its own forward, for x, weight, bias and the initial state, with and without
// the SiLU; and its forward against the definition written out by hand for one small case.
//
// L = <W, out> + <W_s, final_state>, random W; each input element is moved by +-1e-5.
#include "gdn/conv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/problem.h"

namespace gdn {
namespace {

constexpr double kStep = 1e-5;
constexpr double kAbsolute = 1e-8;
constexpr double kRelative = 1e-6;

struct Case {
  Tensor x, weight, bias, state, cu_seqlens, w_out, w_state;
  ConvInputs inputs() const {
    return {x.view(), weight.view(), bias.view(), state.view(), cu_seqlens.view()};
  }
};

Tensor random(test::Random& rng, std::initializer_list<std::int64_t> shape) {
  Tensor t(DType::f64, shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = rng.normal();
  return t;
}

Case make(const std::vector<std::int64_t>& lengths, std::int64_t d, std::int64_t k, bool bias,
          bool state, bool rank3) {
  test::Random rng(11);
  Case c;
  std::int64_t t = 0;
  for (std::int64_t len : lengths) t += len;
  const auto n = static_cast<std::int64_t>(lengths.size());
  c.x = random(rng, {t, d});
  c.weight = rank3 ? random(rng, {d, 1, k}) : random(rng, {d, k});
  if (bias) c.bias = random(rng, {d});
  if (state) c.state = random(rng, {n, k - 1, d});
  c.cu_seqlens = Tensor(DType::i64, {n + 1});
  std::int64_t at = 0;
  for (std::int64_t s = 0; s <= n; ++s) {
    c.cu_seqlens.data<std::int64_t>()[s] = at;
    if (s < n) at += lengths[s];
  }
  c.w_out = random(rng, {t, d});
  c.w_state = random(rng, {n, k - 1, d});
  return c;
}

double loss(const Case& c, const ConvOptions& o) {
  const ConvForwardResult r = ref::causal_conv1d_fwd(c.inputs(), o);
  double l = 0;
  for (std::int64_t i = 0; i < r.out.numel(); ++i)
    l += r.out.data<double>()[i] * c.w_out.data<double>()[i];
  for (std::int64_t i = 0; i < r.final_state.numel(); ++i)
    l += r.final_state.data<double>()[i] * c.w_state.data<double>()[i];
  return l;
}

void check(Case c, ConvActivation activation, const std::string& what) {
  ConvOptions o;
  o.activation = activation;
  const ConvBackwardResult g =
      ref::causal_conv1d_bwd({c.inputs(), c.w_out.view(), c.w_state.view()}, o);
  const std::pair<const char*, std::pair<Tensor*, const Tensor*>> pairs[] = {
      {"x", {&c.x, &g.d_x}},
      {"weight", {&c.weight, &g.d_weight}},
      {"bias", {&c.bias, &g.d_bias}},
      {"initial_state", {&c.state, &g.d_initial_state}}};
  int checked = 0;
  for (const auto& [name, tensors] : pairs) {
    Tensor& x = *tensors.first;
    if (!x.present()) continue;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      double& value = x.data<double>()[i];
      const double saved = value;
      value = saved + kStep;
      const double up = loss(c, o);
      value = saved - kStep;
      const double down = loss(c, o);
      value = saved;
      const double numeric = (up - down) / (2 * kStep);
      ASSERT_NEAR(tensors.second->data<double>()[i], numeric,
                  kAbsolute + kRelative * std::fabs(numeric))
          << "d" << name << "[" << i << "], " << what;
      ++checked;
    }
  }
  EXPECT_GE(checked, 16) << what;  // every element of x, weight and the rest
}

TEST(ReferenceConv, GradientsMatchFiniteDifferences) {
  for (ConvActivation a : {ConvActivation::silu, ConvActivation::none}) {
    const std::string act = a == ConvActivation::silu ? "silu" : "none";
    // 2 < K - 1 and an empty sequence: the final state reuses the initial one.
    check(make({6, 2, 0, 5}, 3, 4, true, true, false), a, "K=4 bias state, " + act);
    check(make({7}, 2, 4, false, false, true), a, "K=4 [D,1,K], " + act);
    for (std::int64_t k : {1, 2, 6}) {
      check(make({5, 1}, 2, k, true, true, false), a, "K=" + std::to_string(k) + ", " + act);
    }
  }
}

// y_1 = w0 x_-1 + w1 x_0 + w2 x_1 + b with x_-1, x_0 from the state: the definition by hand.
TEST(ReferenceConv, ForwardIsTheDefinition) {
  Tensor x(DType::f64, {2, 1}), w(DType::f64, {1, 3}), b(DType::f64, {1}), s(DType::f64, {1, 2, 1});
  x.data<double>()[0] = 0.5;
  x.data<double>()[1] = -1.5;
  w.data<double>()[0] = 2;
  w.data<double>()[1] = -1;
  w.data<double>()[2] = 0.25;
  b.data<double>()[0] = 0.125;
  s.data<double>()[0] = 3;
  s.data<double>()[1] = -2;
  ConvOptions none;
  none.activation = ConvActivation::none;
  const ConvForwardResult r =
      ref::causal_conv1d_fwd({x.view(), w.view(), b.view(), s.view(), {}}, none);
  EXPECT_EQ(r.out.data<double>()[0], 2 * 3 + -1 * -2 + 0.25 * 0.5 + 0.125);
  EXPECT_EQ(r.out.data<double>()[1], 2 * -2 + -1 * 0.5 + 0.25 * -1.5 + 0.125);
  EXPECT_EQ(r.final_state.data<double>()[0], 0.5);
  EXPECT_EQ(r.final_state.data<double>()[1], -1.5);
  const ConvForwardResult silu =
      ref::causal_conv1d_fwd({x.view(), w.view(), b.view(), s.view(), {}});
  const double y = r.out.data<double>()[0];
  EXPECT_DOUBLE_EQ(silu.out.data<double>()[0], y / (1 + std::exp(-y)));
}

}  // namespace
}  // namespace gdn
