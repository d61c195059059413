// precision_test.cc: bf16 and f16 activations (q, k, v, o, d_o, dq, dk, dv) with float32
// gates, states, residuals and accumulation, on every compiled ISA variant.
//
// Two checks per output (docs/numerics.md, "16-bit activations"):
//   - against the float64 reference run on the same 16-bit inputs, within a tolerance derived
//     from the same-precision baseline: the plain float32 recurrence on the 16-bit inputs, its
//     16-bit outputs rounded like ours. Tolerance = 2 x that baseline's error + the float32
//     tolerance of the fast path (a 16-bit output carries at most one more rounding than the
//     float32 one, and the baseline carries it too);
//   - bit for bit against the float32 path on the same values widened to float32, its 16-bit
//     outputs rounded to nearest even: the 16-bit path converts on load and store and computes
//     exactly what the float32 path computes.
//
// The helpers and tolerances shared with the bf16 matrix-operand tests (bf16_operands_test.cc)
// are in precision_common.h.
#include <cstring>

#include "precision_common.h"

namespace gdn {
namespace {

using namespace precision_test;

class HalfActivations : public ::testing::TestWithParam<DType> {};

TEST_P(HalfActivations, ForwardMatchesReferenceAndFloat32Path) {
  const DType dtype = GetParam();
  const Pair p = make_pair(mixed_spec(), dtype);
  const ForwardOptions base_options = p.half.options();
  const ForwardResult ref = ref::recurrent_fwd(p.half.inputs(), base_options);
  const ForwardResult base = test::baseline_f32(p.wide, base_options);
  const double o_tol = 2 * test::compare(to_half(base.o, dtype), ref.o).normalized() +
                       f32_tolerance(test::compare(base.o, ref.o).normalized());
  const double state_tol =
      f32_tolerance(test::compare(base.final_state, ref.final_state).normalized());
  for (CpuIsa isa : compiled_isas()) {
    for (Algorithm algorithm : {Algorithm::chunked, Algorithm::recurrent}) {
      ForwardOptions o = base_options;
      o.isa = isa;
      o.algorithm = algorithm;
      o.chunk_size = 16;
      const std::string what = std::string(dtype_name(dtype)) + ", " + cpu_isa_name(isa) +
                               (algorithm == Algorithm::chunked ? ", chunked" : ", recurrent");
      const ForwardResult r = chunk_gated_delta_rule_fwd(p.half.inputs(), o, Residuals::all);
      ASSERT_EQ(r.o.dtype(), dtype);
      ASSERT_EQ(r.final_state.dtype(), DType::f32);
      EXPECT_TRUE(test::within(r.o, ref.o, o_tol, "o, " + what));
      EXPECT_TRUE(test::within(r.final_state, ref.final_state, state_tol, "final_state, " + what));

      const ForwardResult w = chunk_gated_delta_rule_fwd(p.wide.inputs(), o, Residuals::all);
      EXPECT_TRUE(test::bit_identical(r.o, to_half(w.o, dtype), "o vs float32 path, " + what));
      EXPECT_TRUE(test::bit_identical(r.final_state, w.final_state,
                                      "final_state vs float32 path, " + what));
      EXPECT_TRUE(test::bit_identical(r.chunk_states, w.chunk_states,
                                      "chunk_states vs float32 path, " + what));
      if (algorithm == Algorithm::chunked) {
        EXPECT_TRUE(test::bit_identical(r.t_inv, w.t_inv, "t_inv vs float32 path, " + what));
      }

      // Without o (a remat replay of 16-bit activations): the same states and residuals.
      const bool chunked = algorithm == Algorithm::chunked;
      Tensor ht(DType::f32, 4, r.final_state.sizes());
      Tensor states(DType::f32, 4, r.chunk_states.sizes());
      Tensor t_inv = chunked ? Tensor(DType::f32, 4, r.t_inv.sizes()) : Tensor();
      chunk_gated_delta_rule_fwd(
          p.half.inputs(), {{}, ht.mutable_view(), states.mutable_view(), t_inv.mutable_view()}, o);
      EXPECT_TRUE(test::bit_identical(ht, r.final_state, "final_state without o, " + what));
      EXPECT_TRUE(test::bit_identical(states, r.chunk_states, "chunk_states without o, " + what));
      if (chunked) {
        EXPECT_TRUE(test::bit_identical(t_inv, r.t_inv, "t_inv without o, " + what));
      }
    }
  }
}

TEST_P(HalfActivations, BackwardMatchesReferenceAndFloat32Path) {
  const DType dtype = GetParam();
  const Pair p = make_pair(mixed_spec(), dtype);
  const test::Cotangents c = test::make_cotangents(p.wide, 11);
  const Tensor d_o = to_half(c.d_o, dtype), d_o_wide = widen(d_o);
  const ForwardOptions base_options = p.half.options();
  const BackwardResult ref = ref::recurrent_bwd(backward_inputs(p.half, d_o, c.d_ht), base_options);
  const BackwardResult base = test::baseline_f32_bwd(p.wide, d_o_wide, c.d_ht, base_options);
  const char* const names[6] = {"dq", "dk", "dv", "dg", "dbeta", "d_initial_state"};
  auto grads = [](const BackwardResult& r) {
    return std::vector<const Tensor*>{&r.dq, &r.dk, &r.dv, &r.dg, &r.dbeta, &r.d_initial_state};
  };
  std::vector<double> tol(6);
  for (int i = 0; i < 6; ++i) {
    const Tensor& b = *grads(base)[i];
    const Tensor& rf = *grads(ref)[i];
    tol[i] = f32_tolerance(test::compare(b, rf).normalized());
    if (i < 3) tol[i] += 2 * test::compare(to_half(b, dtype), rf).normalized();
  }
  for (CpuIsa isa : compiled_isas()) {
    ForwardOptions o = base_options;
    o.isa = isa;
    o.chunk_size = 16;
    const std::string what = std::string(dtype_name(dtype)) + ", " + cpu_isa_name(isa);
    const ForwardResult fwd = chunk_gated_delta_rule_fwd(p.half.inputs(), o, Residuals::all);
    BackwardInputs in = backward_inputs(p.half, d_o, c.d_ht);
    in.chunk_states = fwd.chunk_states.view();
    in.t_inv = fwd.t_inv.view();
    const BackwardResult r = chunk_gated_delta_rule_bwd(in, o);
    BackwardInputs in_wide = backward_inputs(p.wide, d_o_wide, c.d_ht);
    const BackwardResult w = chunk_gated_delta_rule_bwd(in_wide, o);
    for (int i = 0; i < 6; ++i) {
      const Tensor& got = *grads(r)[i];
      ASSERT_EQ(got.dtype(), i < 3 ? dtype : DType::f32) << names[i];
      EXPECT_TRUE(test::within(got, *grads(ref)[i], tol[i], std::string(names[i]) + ", " + what));
      const Tensor& wide = *grads(w)[i];
      const std::string vs = std::string(names[i]) + " vs float32 path, " + what;
      if (i < 3) {
        EXPECT_TRUE(test::bit_identical(got, to_half(wide, dtype), vs));
      } else {
        EXPECT_TRUE(test::bit_identical(got, wide, vs));
      }
    }
  }
}

TEST_P(HalfActivations, BitIdenticalForAnyThreadCount) {
  const DType dtype = GetParam();
  const Pair p = make_pair(mixed_spec(), dtype);
  const test::Cotangents c = test::make_cotangents(p.wide, 12);
  const Tensor d_o = to_half(c.d_o, dtype);
  for (CpuIsa isa : compiled_isas()) {
    ForwardOptions o = p.half.options();
    o.isa = isa;
    o.threads = 1;
    const ForwardResult f1 = chunk_gated_delta_rule_fwd(p.half.inputs(), o);
    const BackwardResult b1 = chunk_gated_delta_rule_bwd(backward_inputs(p.half, d_o, c.d_ht), o);
    for (int threads : {2, 3}) {
      o.threads = threads;
      const std::string what = std::string(dtype_name(dtype)) + ", " + cpu_isa_name(isa) + ", " +
                               std::to_string(threads) + " threads";
      const ForwardResult f = chunk_gated_delta_rule_fwd(p.half.inputs(), o);
      EXPECT_TRUE(test::bit_identical(f.o, f1.o, "o, " + what));
      const BackwardResult b = chunk_gated_delta_rule_bwd(backward_inputs(p.half, d_o, c.d_ht), o);
      EXPECT_TRUE(test::bit_identical(b.dq, b1.dq, "dq, " + what));
      EXPECT_TRUE(test::bit_identical(b.dg, b1.dg, "dg, " + what));
    }
  }
}

// A NaN with a payload in v: the 16-bit output's NaN bits are those of the float32 path's
// output rounded with gdn::f16_bits / bf16_bits, on every variant (vector and scalar
// conversions agree on NaNs too).
TEST_P(HalfActivations, NaNPayloadsConvertAlikeOnEveryVariant) {
  const DType dtype = GetParam();
  ProblemSpec spec = mixed_spec();
  Pair p = make_pair(spec, dtype);
  auto* v = static_cast<std::uint16_t*>(p.half.v.raw());
  v[3] = dtype == DType::f16 ? 0x7e01 : 0x7fc1;   // quiet NaNs with a payload
  v[40] = dtype == DType::f16 ? 0xfd05 : 0xff85;  // signalling ones (negative)
  p.wide.v = widen(p.half.v);
  for (CpuIsa isa : compiled_isas()) {
    for (Algorithm algorithm : {Algorithm::chunked, Algorithm::recurrent}) {
      ForwardOptions o = p.half.options();
      o.isa = isa;
      o.algorithm = algorithm;
      const ForwardResult r = chunk_gated_delta_rule_fwd(p.half.inputs(), o);
      const ForwardResult w = chunk_gated_delta_rule_fwd(p.wide.inputs(), o);
      EXPECT_TRUE(test::bit_identical(r.o, to_half(w.o, dtype),
                                      std::string(cpu_isa_name(isa)) + ", " + dtype_name(dtype)));
    }
  }
}

// Gates, states and residuals are float32 with 16-bit activations; anything else is a clear
// error naming the argument.
TEST_P(HalfActivations, ValidationNamesTheArgument) {
  const DType dtype = GetParam();
  ProblemSpec spec = mixed_spec();
  const Pair p = make_pair(spec, dtype);
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ForwardInputs in = p.half.inputs();
  const Tensor g_half = to_half(p.half.g, dtype);
  in.g = g_half.view();
  EXPECT_NE(message([&] { chunk_gated_delta_rule_fwd(in, p.half.options()); }).find("'g'"),
            std::string::npos);
  in = p.half.inputs();
  const Tensor h0_half = to_half(p.half.h0, dtype);
  in.initial_state = h0_half.view();
  const std::string h0_error = message([&] { chunk_gated_delta_rule_fwd(in, p.half.options()); });
  EXPECT_NE(h0_error.find("initial_state"), std::string::npos) << h0_error;
  EXPECT_NE(h0_error.find("f32"), std::string::npos) << h0_error;

  // A float32 o for 16-bit q.
  const ForwardResult good = chunk_gated_delta_rule_fwd(p.half.inputs(), p.half.options());
  Tensor o32(DType::f32, good.o.rank(), good.o.sizes());
  Tensor ht(DType::f32, good.final_state.rank(), good.final_state.sizes());
  const std::string o_error = message([&] {
    chunk_gated_delta_rule_fwd(p.half.inputs(),
                               ForwardOutputs{o32.mutable_view(), ht.mutable_view(), {}, {}},
                               p.half.options());
  });
  EXPECT_NE(o_error.find("'o'"), std::string::npos) << o_error;
  EXPECT_NE(o_error.find(dtype_name(dtype)), std::string::npos) << o_error;
  // k in another 16-bit type than q.
  in = p.half.inputs();
  const Tensor k_other = to_half(widen(p.half.k), dtype == DType::bf16 ? DType::f16 : DType::bf16);
  in.k = k_other.view();
  EXPECT_NE(message([&] { chunk_gated_delta_rule_fwd(in, p.half.options()); }).find("'k'"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Cpu, HalfActivations, ::testing::Values(DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType>& param) {
                           return std::string(dtype_name(param.param));
                         });

TEST_P(HalfActivations, LayerMatchesReferenceAndFloat32Path) {
  const DType dtype = GetParam();
  const test::LayerSpec spec = mixed_layer_spec();
  const test::LayerProblem original = test::make_layer_problem(spec);
  test::LayerProblem half = test::make_layer_problem(spec), wide = test::make_layer_problem(spec);
  for (Tensor test::LayerProblem::*x : {&test::LayerProblem::qkv, &test::LayerProblem::a,
                                        &test::LayerProblem::b, &test::LayerProblem::d_out}) {
    half.*x = to_half(original.*x, dtype);
    wide.*x = widen(half.*x);
  }
  const LayerOptions base = half.options();
  const LayerRun ref{ref::fused_gdn_fwd(half.inputs(), base),
                     ref::fused_gdn_bwd(layer_backward_inputs(half), base)};
  const LayerRun exact{ref::fused_gdn_fwd(original.inputs(), base),
                       ref::fused_gdn_bwd(layer_backward_inputs(original), base)};
  for (CpuIsa isa : compiled_isas()) {
    LayerOptions o = base;
    o.isa = isa;
    const std::string what = std::string(dtype_name(dtype)) + ", " + cpu_isa_name(isa);
    const LayerRun got{fused_gdn_fwd(half.inputs(), o),
                       fused_gdn_bwd(layer_backward_inputs(half), o)};
    const LayerRun f32{fused_gdn_fwd(wide.inputs(), o),
                       fused_gdn_bwd(layer_backward_inputs(wide), o)};
    const auto g = layer_outputs(got), w = layer_outputs(f32), r = layer_outputs(ref);
    for (std::size_t i = 0; i < g.size(); ++i) {
      const auto& [name, x, activation] = g[i];
      const Tensor& want = *std::get<1>(r[i]);
      ASSERT_EQ(x->dtype(), activation ? dtype : DType::f32) << name;
      const double tolerance =
          kLayerF32Tolerance +
          (activation ? 2 * test::compare(to_half(to_f32(want), dtype), want).normalized() : 0.0);
      EXPECT_TRUE(test::within(*x, want, tolerance, std::string(name) + ", " + what));
      const Tensor& same = *std::get<1>(w[i]);
      if (activation) {
        EXPECT_TRUE(test::bit_identical(*x, to_half(same, dtype),
                                        std::string(name) + " vs float32 path, " + what));
      } else {
        EXPECT_TRUE(test::bit_identical(*x, same, std::string(name) + " vs float32 path, " + what));
      }
    }
    EXPECT_GE(cosine(got.bwd.d_A_log, exact.bwd.d_A_log), kMinParameterCosine) << what;
    EXPECT_GE(cosine(got.bwd.d_dt_bias, exact.bwd.d_dt_bias), kMinParameterCosine) << what;
  }
}

// A serving step with 16-bit qkv, a, b and out over float32 pools: 8 decodes, a continued
// prefill and a fresh one, one padding sequence. Bit for bit the float32 step on the widened
// inputs (out rounded once; the pools identical), and within the layer tolerance of the
// float64 reference step on the same values.
TEST_P(HalfActivations, ServingStepMatchesFloat32StepAndReference) {
  const DType dtype = GetParam();
  const std::int64_t hk = 2, hv = 4, dk = 16, dv = 16, k = 4, d = 2 * hk * dk + hv * dv;
  const std::int64_t slots = 16;
  const std::vector<std::int64_t> lengths = {1, 1, 1, 1, 1, 1, 1, 1, 37, 64, 3};
  const std::vector<std::int64_t> history = {9, 1, 30, 2, 5, 7, 100, 4, 20, 0, 0};
  const std::int64_t n = static_cast<std::int64_t>(lengths.size());
  std::int64_t t_count = 0;
  for (std::int64_t len : lengths) t_count += len;
  test::Random rng(dtype == DType::bf16 ? 41 : 42);
  auto normal = [&](std::initializer_list<std::int64_t> shape, double scale) {
    Tensor t(DType::f32, shape);
    for (std::int64_t i = 0; i < t.numel(); ++i)
      t.data<float>()[i] = static_cast<float>(scale * rng.normal());
    return t;
  };
  const Tensor qkv = normal({t_count, d}, 1.0), a = normal({t_count, hv}, 1.0),
               b = normal({t_count, hv}, 1.0), weight = normal({d, k}, 0.5),
               a_log = normal({hv}, 0.5), dt_bias = normal({hv}, 0.5);
  const Tensor conv0 = normal({slots, k - 1, d}, 1.0), rec0 = normal({slots, hv, dk, dv}, 0.3);
  Tensor qsl(DType::i64, {n + 1}), idx(DType::i64, {n}), lens(DType::i64, {n}),
      dist(DType::i64, {3});
  qsl.data<std::int64_t>()[0] = 0;
  for (std::int64_t s = 0; s < n; ++s) {
    qsl.data<std::int64_t>()[s + 1] = qsl.data<std::int64_t>()[s] + lengths[s];
    idx.data<std::int64_t>()[s] = s + 1 < n ? 2 + s : 0;  // padding: slot 0, never looked at
    lens.data<std::int64_t>()[s] = lengths[s] + history[s];
  }
  dist.data<std::int64_t>()[0] = 8;
  dist.data<std::int64_t>()[1] = 10;
  dist.data<std::int64_t>()[2] = 10;
  const Tensor qkv_h = to_half(qkv, dtype), a_h = to_half(a, dtype), b_h = to_half(b, dtype);
  const Tensor qkv_w = widen(qkv_h), a_w = widen(a_h), b_w = widen(b_h);
  StepOptions o;
  o.hk = hk;
  o.hv = hv;
  o.dk = dk;
  o.dv = dv;
  auto inputs = [&](const Tensor& x, const Tensor& av, const Tensor& bv, const Tensor& w,
                    const Tensor& al, const Tensor& dt) {
    return StepInputs{x.view(),   av.view(),  bv.view(),   w.view(),    {}, al.view(), dt.view(),
                      qsl.view(), idx.view(), lens.view(), dist.view(), {}, {}};
  };
  auto copy_of = [](const Tensor& t, DType to) {
    Tensor r(to, t.rank(), t.sizes());
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      if (to == DType::f64) {
        r.data<double>()[i] = t.data<float>()[i];
      } else {
        r.data<float>()[i] = t.data<float>()[i];
      }
    }
    return r;
  };
  // The float64 reference on the same values.
  Tensor conv_r = copy_of(conv0, DType::f64), rec_r = copy_of(rec0, DType::f64);
  const Tensor qkv_r = copy_of(qkv_w, DType::f64), a_r = copy_of(a_w, DType::f64),
               b_r = copy_of(b_w, DType::f64), w_r = copy_of(weight, DType::f64),
               al_r = copy_of(a_log, DType::f64), dt_r = copy_of(dt_bias, DType::f64);
  const Tensor ref_out = ref::fused_gdn_step(inputs(qkv_r, a_r, b_r, w_r, al_r, dt_r),
                                             {conv_r.mutable_view(), rec_r.mutable_view()}, o);
  for (CpuIsa isa : compiled_isas()) {
    o.isa = isa;
    const std::string what = std::string(dtype_name(dtype)) + ", " + cpu_isa_name(isa);
    Tensor conv_h = copy_of(conv0, DType::f32), rec_h = copy_of(rec0, DType::f32);
    Tensor conv_w = copy_of(conv0, DType::f32), rec_w = copy_of(rec0, DType::f32);
    const Tensor out_h = fused_gdn_step(inputs(qkv_h, a_h, b_h, weight, a_log, dt_bias),
                                        {conv_h.mutable_view(), rec_h.mutable_view()}, o);
    const Tensor out_w = fused_gdn_step(inputs(qkv_w, a_w, b_w, weight, a_log, dt_bias),
                                        {conv_w.mutable_view(), rec_w.mutable_view()}, o);
    ASSERT_EQ(out_h.dtype(), dtype);
    EXPECT_TRUE(test::bit_identical(out_h, to_half(out_w, dtype), "out vs float32 step, " + what));
    EXPECT_TRUE(test::bit_identical(conv_h, conv_w, "conv_state pool vs float32 step, " + what));
    EXPECT_TRUE(test::bit_identical(rec_h, rec_w, "recurrent_state pool vs float32 step, " + what));
    const double tolerance =
        kLayerF32Tolerance +
        2 * test::compare(to_half(to_f32(ref_out), dtype), ref_out).normalized();
    EXPECT_TRUE(test::within(out_h, ref_out, tolerance, "out vs reference, " + what));
    EXPECT_TRUE(
        test::within(rec_h, rec_r, kLayerF32Tolerance, "recurrent pool vs reference, " + what));
    EXPECT_TRUE(test::within(conv_h, conv_r, 0.0, "conv pool vs reference (copies), " + what));
    // The padding token's row is zero.
    for (std::int64_t c = 0; c < hv * dv; ++c) {
      ASSERT_EQ(test::value_at(out_h, (t_count - 1) * hv * dv + c), 0.0) << what;
    }
  }
  // f16 pools are a clear error (bf16 pools are allowed: tests/cpu/step_pools_test.cc).
  Tensor conv16(DType::f16, {slots, k - 1, d}), rec16(DType::f16, {slots, hv, dk, dv});
  try {
    fused_gdn_step(inputs(qkv_h, a_h, b_h, weight, a_log, dt_bias),
                   {conv16.mutable_view(), rec16.mutable_view()}, o);
    ADD_FAILURE() << "f16 pools accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "conv_state") << e.what();
  }
}
// The conversions against independent arithmetic: every 16-bit pattern widens to a float that
// rounds back to the same pattern (NaNs to a NaN); random floats and the halfway points between
// neighbours round to the nearer neighbour, ties to the even one.
TEST(HalfConversions, RoundTripAndNearestEven) {
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
      const auto h = static_cast<std::uint16_t>(bits);
      const float x = half_value(dtype, h);
      if (std::isnan(x)) {
        EXPECT_TRUE(std::isnan(half_value(dtype, half_bits(dtype, x)))) << bits;
      } else {
        ASSERT_EQ(half_bits(dtype, x), h) << dtype_name(dtype) << " pattern " << bits;
      }
    }
    // Halfway between consecutive finite positive patterns h and h + 1: ties to even.
    const std::uint16_t last = dtype == DType::bf16 ? 0x7f7f : 0x7bff;
    for (std::uint16_t h = 0; h < last; ++h) {
      const double lo = half_value(dtype, h), hi = half_value(dtype, h + 1);
      const double mid = (lo + hi) / 2;  // exact in double; also exact in float
      const auto midf = static_cast<float>(mid);
      if (static_cast<double>(midf) != mid) continue;
      const std::uint16_t even = (h % 2 == 0) ? h : static_cast<std::uint16_t>(h + 1);
      ASSERT_EQ(half_bits(dtype, midf), even) << dtype_name(dtype) << " tie after " << h;
      ASSERT_EQ(half_bits(dtype, -midf), even | 0x8000) << dtype_name(dtype) << " tie after " << h;
    }
    // Random floats: the result is a neighbour and no other pattern is nearer.
    test::Random rng(dtype == DType::bf16 ? 5 : 6);
    for (int i = 0; i < 200000; ++i) {
      const double magnitude =
          std::ldexp(rng.uniform(1, 2), static_cast<int>(rng.uniform(-26, 17)));
      const auto x = static_cast<float>(rng.uniform() < 0.5 ? -magnitude : magnitude);
      const std::uint16_t h = half_bits(dtype, x);
      if (std::isinf(half_value(dtype, h))) continue;  // beyond f16's range
      const double err = std::fabs(static_cast<double>(half_value(dtype, h)) - x);
      for (int step : {-1, 1}) {
        const auto other = static_cast<std::uint16_t>(h + step);
        const double value = half_value(dtype, other);
        if (std::isnan(value) || ((other ^ h) & 0x8000) != 0) continue;
        ASSERT_LE(err, std::fabs(value - x)) << dtype_name(dtype) << " " << x;
      }
    }
  }
  // NaNs: quiet, the top payload bits kept, as F16C converts (every ISA variant agrees).
  for (std::uint32_t bits = 0x7c01; bits < 0x8000; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    ASSERT_EQ(f16_bits(f16_value(h)), h | 0x200) << "f16 NaN " << bits;
  }
  EXPECT_EQ(bf16_bits(bf16_value(0x7f81)), 0x7fc1);
  EXPECT_EQ(f16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(f16_bits(65520.0f), 0x7c00);  // halfway past the largest: infinity
  EXPECT_EQ(f16_bits(-1e9f), 0xfc00);
  EXPECT_EQ(f16_bits(5.9604645e-08f), 0x0001);  // 2^-24, the smallest subnormal
  EXPECT_EQ(f16_bits(2.9802322e-08f), 0x0000);  // 2^-25: a tie, to even (zero)
  EXPECT_EQ(bf16_bits(3.3895314e38f), 0x7f7f);
  EXPECT_EQ(bf16_bits(std::ldexp(1.0f, -133)), 0x0001);  // bf16 keeps float's subnormals
}

}  // namespace
}  // namespace gdn
