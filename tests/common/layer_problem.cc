// layer_problem.cc: see layer_problem.h.
#include "layer_problem.h"

#include <cmath>
#include <sstream>

#include "problem.h"

namespace gdn::test {

std::string LayerSpec::name() const {
  std::ostringstream s;
  s << "lengths [";
  for (std::size_t i = 0; i < lengths.size(); ++i) s << (i ? ", " : "") << lengths[i];
  s << "] Hk=" << hk << " Hv=" << hv << " Dk=" << dk << " Dv=" << dv << " K=" << taps << " "
    << dtype_name(dtype) << (conv_bias ? " bias" : "") << (conv_state ? " conv_state" : "")
    << (recurrent_state ? " recurrent_state" : "") << (weight_rank3 ? " [D,1,K]" : "") << " seed "
    << seed;
  return s.str();
}

namespace {

void fill(Tensor& t, Random& rng, double lo, double hi, bool normal) {
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double x = normal ? lo + hi * rng.normal() : rng.uniform(lo, hi);
    if (t.dtype() == DType::f32) {
      t.data<float>()[i] = static_cast<float>(x);
    } else {
      t.data<double>()[i] = x;
    }
  }
}

}  // namespace

LayerProblem make_layer_problem(const LayerSpec& spec) {
  LayerProblem p;
  p.spec = spec;
  Random rng(spec.seed);
  std::int64_t total = 0;
  for (std::int64_t len : spec.lengths) total += len;
  const std::int64_t n = static_cast<std::int64_t>(spec.lengths.size());
  const std::int64_t d = spec.channels(), k = spec.taps;
  const DType dt = spec.dtype;
  p.qkv = Tensor(dt, {total, d});
  fill(p.qkv, rng, 0.0, 1.0, true);
  p.a = Tensor(dt, {total, spec.hv});
  p.b = Tensor(dt, {total, spec.hv});
  fill(p.a, rng, 0.0, 1.0, true);
  fill(p.b, rng, 0.0, 1.0, true);
  p.conv_weight = spec.weight_rank3 ? Tensor(dt, {d, 1, k}) : Tensor(dt, {d, k});
  fill(p.conv_weight, rng, 0.0, 1.0 / std::sqrt(static_cast<double>(k)), true);
  if (spec.conv_bias) {
    p.conv_bias = Tensor(dt, {d});
    fill(p.conv_bias, rng, 0.0, 0.2, true);
  }
  p.A_log = Tensor(dt, {spec.hv});
  p.dt_bias = Tensor(dt, {spec.hv});
  fill(p.A_log, rng, -2.0, 1.0, false);
  fill(p.dt_bias, rng, -1.0, 1.0, false);
  if (spec.conv_state) {
    p.conv_state = Tensor(dt, {n, k - 1, d});
    fill(p.conv_state, rng, 0.0, 1.0, true);
  }
  if (spec.recurrent_state) {
    p.recurrent_state = Tensor(dt, {n, spec.hv, spec.dk, spec.dv});
    fill(p.recurrent_state, rng, 0.0, 0.5, true);
  }
  p.cu_seqlens = Tensor(DType::i64, {n + 1});
  std::int64_t at = 0;
  for (std::int64_t s = 0; s < n; ++s) {
    p.cu_seqlens.data<std::int64_t>()[s] = at;
    at += spec.lengths[s];
  }
  p.cu_seqlens.data<std::int64_t>()[n] = at;
  p.d_out = Tensor(dt, {total, spec.hv * spec.dv});
  p.d_conv_state_out = Tensor(dt, {n, k - 1, d});
  p.d_recurrent_state_out = Tensor(dt, {n, spec.hv, spec.dk, spec.dv});
  fill(p.d_out, rng, 0.0, 1.0, true);
  fill(p.d_conv_state_out, rng, 0.0, 1.0, true);
  fill(p.d_recurrent_state_out, rng, 0.0, 1.0, true);
  return p;
}

LayerInputs LayerProblem::inputs() const {
  return {
      qkv.view(),   a.view(),       b.view(),          conv_weight.view(),     conv_bias.view(),
      A_log.view(), dt_bias.view(), conv_state.view(), recurrent_state.view(), cu_seqlens.view()};
}

LayerOptions LayerProblem::options() const {
  LayerOptions o;
  o.hk = spec.hk;
  o.hv = spec.hv;
  o.dk = spec.dk;
  o.dv = spec.dv;
  return o;
}

}  // namespace gdn::test
