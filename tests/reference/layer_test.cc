// layer_test.cc: the float64 reference of the fused layer op against central finite
// differences of its own forward, for every input and parameter.
//
// L = <W, out> + <W_c, conv_state_out> + <W_s, recurrent_state_out>, random W; each element
// of qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_state and recurrent_state is
// moved by +-1e-5.
#include <gtest/gtest.h>

#include <cmath>

#include "common/layer_problem.h"

namespace gdn {
namespace {

constexpr double kStep = 1e-5;
constexpr double kAbsolute = 1e-7;
constexpr double kRelative = 1e-6;

double loss(const test::LayerProblem& p, const LayerOptions& o) {
  const LayerForwardResult r = ref::fused_gdn_fwd(p.inputs(), o);
  double l = 0;
  for (const auto& [x, w] :
       {std::pair{&r.out, &p.d_out}, std::pair{&r.conv_state_out, &p.d_conv_state_out},
        std::pair{&r.recurrent_state_out, &p.d_recurrent_state_out}}) {
    for (std::int64_t i = 0; i < x->numel(); ++i) l += x->data<double>()[i] * w->data<double>()[i];
  }
  return l;
}

void check(test::LayerSpec spec) {
  spec.dtype = DType::f64;
  test::LayerProblem p = test::make_layer_problem(spec);
  LayerOptions o = p.options();
  o.chunk_size = 4;
  const LayerBackwardInputs in{
      p.inputs(), p.d_out.view(), p.d_conv_state_out.view(), p.d_recurrent_state_out.view(), {},
      {}};
  const LayerBackwardResult g = ref::fused_gdn_bwd(in, o);
  const std::pair<const char*, std::pair<Tensor*, const Tensor*>> pairs[] = {
      {"qkv", {&p.qkv, &g.d_qkv}},
      {"a", {&p.a, &g.d_a}},
      {"b", {&p.b, &g.d_b}},
      {"conv_weight", {&p.conv_weight, &g.d_conv_weight}},
      {"conv_bias", {&p.conv_bias, &g.d_conv_bias}},
      {"A_log", {&p.A_log, &g.d_A_log}},
      {"dt_bias", {&p.dt_bias, &g.d_dt_bias}},
      {"conv_state", {&p.conv_state, &g.d_conv_state}},
      {"recurrent_state", {&p.recurrent_state, &g.d_recurrent_state}}};
  int checked = 0;
  for (const auto& [name, tensors] : pairs) {
    Tensor& x = *tensors.first;
    if (!x.present()) continue;
    const Tensor& analytic = *tensors.second;
    ASSERT_EQ(x.numel(), analytic.numel()) << name;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      double& value = x.data<double>()[i];
      const double saved = value;
      value = saved + kStep;
      const double up = loss(p, o);
      value = saved - kStep;
      const double down = loss(p, o);
      value = saved;
      const double numeric = (up - down) / (2 * kStep);
      ASSERT_NEAR(analytic.data<double>()[i], numeric, kAbsolute + kRelative * std::fabs(numeric))
          << "d" << name << "[" << i << "], " << spec.name();
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(ReferenceLayer, GradientsMatchFiniteDifferences) {
  test::LayerSpec spec;
  spec.lengths = {6, 2, 0, 5};  // 2 < K - 1: the new conv state reuses the old one
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 2;
  spec.dv = 3;
  spec.taps = 4;
  spec.conv_state = true;
  spec.recurrent_state = true;
  check(spec);
  spec.conv_state = false;
  spec.recurrent_state = false;
  spec.conv_bias = false;
  spec.weight_rank3 = true;
  check(spec);
}

TEST(ReferenceLayer, GradientsMatchFiniteDifferencesOtherTaps) {
  test::LayerSpec spec;
  spec.lengths = {5, 1};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 2;
  spec.dv = 2;
  spec.conv_state = true;
  spec.recurrent_state = true;
  for (std::int64_t taps : {1, 2, 6}) {
    spec.taps = taps;
    check(spec);
  }
}

}  // namespace
}  // namespace gdn
