// layer_test.cc: the fused layer op on the CPU (every compiled ISA variant) against its float64
// reference, forward and every gradient, over the case matrix of the layer issue; the A_log
// and dt_bias gradients in direction and size; continuation over two calls; determinism.
//
// Tolerance (docs/numerics.md): float32 results within 1e-4 of the float64 reference in the
// shared metric (bench/error_stats.h); measured at most 3.0e-5 over this matrix. float64
// within 1e-12.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <tuple>
#include <vector>

#include "common/compare.h"
#include "common/isas.h"
#include "common/layer_problem.h"
#include "common/test_names.h"

namespace gdn {
namespace {

constexpr double kF32Tolerance = 1e-4;
constexpr double kF64Tolerance = 1e-12;
// A_log and dt_bias gradients: cosine with the reference, and |x - ref| / |ref| (2-norms).
constexpr double kMinCosine = 0.9999;
constexpr double kParameterRelative = 1e-5;

std::vector<CpuIsa> compiled_isas() { return test::runnable_isas(); }

struct Outputs {
  LayerForwardResult fwd;
  LayerBackwardResult bwd;
  std::vector<std::pair<const char*, const Tensor*>> all() const {
    return {{"out", &fwd.out},
            {"conv_state_out", &fwd.conv_state_out},
            {"recurrent_state_out", &fwd.recurrent_state_out},
            {"d_qkv", &bwd.d_qkv},
            {"d_a", &bwd.d_a},
            {"d_b", &bwd.d_b},
            {"d_conv_weight", &bwd.d_conv_weight},
            {"d_conv_bias", &bwd.d_conv_bias},
            {"d_A_log", &bwd.d_A_log},
            {"d_dt_bias", &bwd.d_dt_bias},
            {"d_conv_state", &bwd.d_conv_state},
            {"d_recurrent_state", &bwd.d_recurrent_state}};
  }
};

LayerBackwardInputs backward_inputs(const test::LayerProblem& p) {
  return {p.inputs(), p.d_out.view(), p.d_conv_state_out.view(), p.d_recurrent_state_out.view(), {},
          {}};
}

Outputs run_cpu(const test::LayerProblem& p, const LayerOptions& o) {
  return {fused_gdn_fwd(p.inputs(), o), fused_gdn_bwd(backward_inputs(p), o)};
}

Outputs run_ref(const test::LayerProblem& p, const LayerOptions& o) {
  return {ref::fused_gdn_fwd(p.inputs(), o), ref::fused_gdn_bwd(backward_inputs(p), o)};
}

// Cosine and relative error of x against ref (2-norms).
std::pair<double, double> direction_and_size(const Tensor& x, const Tensor& ref) {
  double dot = 0, nx = 0, nr = 0, diff = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double a = test::value_at(x, i), b = test::value_at(ref, i);
    dot += a * b;
    nx += a * a;
    nr += b * b;
    diff += (a - b) * (a - b);
  }
  return {dot / std::sqrt(nx * nr), std::sqrt(diff / nr)};
}

class LayerMatchesReference
    : public ::testing::TestWithParam<std::tuple<std::int64_t, bool, bool, int, int>> {};

// The spec of a case (float32; the test runs float64 too), shared by the test and its name so
// that the name cannot drift from what runs.
test::LayerSpec matrix_spec(const LayerMatchesReference::ParamType& param) {
  const auto& [taps, bias, states, group, lengths_case] = param;
  test::LayerSpec spec;
  // Sequences of 0, 1 and 2 tokens are shorter than K - 1 for K = 4: their new conv state
  // reuses the old one. 600 tokens span three of the conv's 256-token items.
  spec.lengths = lengths_case == 0 ? std::vector<std::int64_t>{130}
                                   : std::vector<std::int64_t>{1, 2, 0, 600, 3};
  spec.hk = 2;
  spec.hv = 2 * group;
  spec.dk = 16;
  spec.dv = 24;
  spec.taps = taps;
  spec.conv_bias = bias;
  spec.conv_state = states;
  spec.recurrent_state = states;
  return spec;
}

TEST_P(LayerMatchesReference, EveryOutputAndGradient) {
  test::LayerSpec spec = matrix_spec(GetParam());
  for (DType dtype : {DType::f32, DType::f64}) {
    spec.dtype = dtype;
    const test::LayerProblem p = test::make_layer_problem(spec);
    const Outputs ref = run_ref(p, p.options());
    for (CpuIsa isa : compiled_isas()) {
      LayerOptions o = p.options();
      o.isa = isa;
      const Outputs cpu = run_cpu(p, o);
      const auto got = cpu.all(), want = ref.all();
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (!want[i].second->present()) continue;
        EXPECT_TRUE(test::within(
            *got[i].second, *want[i].second, dtype == DType::f32 ? kF32Tolerance : kF64Tolerance,
            std::string(got[i].first) + ", " + cpu_isa_name(isa) + ", " + spec.name()));
      }
      for (const Tensor* parameter : {&cpu.bwd.d_A_log, &cpu.bwd.d_dt_bias}) {
        const Tensor& reference =
            parameter == &cpu.bwd.d_A_log ? ref.bwd.d_A_log : ref.bwd.d_dt_bias;
        const auto [cosine, relative] = direction_and_size(*parameter, reference);
        EXPECT_GE(cosine, kMinCosine) << spec.name();
        EXPECT_LE(relative, kParameterRelative) << spec.name();
      }
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<LayerMatchesReference::ParamType>& param) {
  const test::LayerSpec s = matrix_spec(param.param);
  // The conv and recurrent states are given or not together.
  return test::shape_name({s.lengths, s.hk, s.hv, s.dk, s.dv}) + "_K" + std::to_string(s.taps) +
         "_" + test::flag_name(s.conv_bias, "Bias") + "_" + test::flag_name(s.conv_state, "States");
}

INSTANTIATE_TEST_SUITE_P(Matrix, LayerMatchesReference,
                         ::testing::Combine(::testing::Values(1, 2, 4),  // conv taps K
                                            ::testing::Bool(),           // conv bias
                                            ::testing::Bool(),           // initial states
                                            ::testing::Values(2, 4),     // value heads per key head
                                            ::testing::Values(0, 1)),    // one or several sequences
                         case_name);

// 32 tokens, then 32 more with both states carried, equal 64 in one call: bit for bit when the
// split falls on a chunk boundary, within tolerance when it does not.
TEST(CpuLayer, ContinuationEqualsOneCall) {
  test::LayerSpec spec;
  spec.lengths = {64};
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 16;
  spec.dv = 16;
  spec.conv_state = true;
  spec.recurrent_state = true;
  const test::LayerProblem p = test::make_layer_problem(spec);
  const std::int64_t hv = spec.hv;
  for (int chunk : {32, 64}) {
    LayerOptions o = p.options();
    o.chunk_size = chunk;
    const LayerForwardResult whole = fused_gdn_fwd(p.inputs(), o);
    auto rows = [](const TensorView& x, std::int64_t from, std::int64_t count) {
      TensorView s = x;
      s.data = static_cast<const char*>(x.data) + from * x.strides[0] * dtype_size(x.dtype);
      s.sizes[0] = count;
      return s;
    };
    LayerInputs first = p.inputs();
    first.qkv = rows(first.qkv, 0, 32);
    first.a = rows(first.a, 0, 32);
    first.b = rows(first.b, 0, 32);
    first.cu_seqlens = {};
    const LayerForwardResult a = fused_gdn_fwd(first, o);
    LayerInputs second = p.inputs();
    second.qkv = rows(second.qkv, 32, 32);
    second.a = rows(second.a, 32, 32);
    second.b = rows(second.b, 32, 32);
    second.cu_seqlens = {};
    second.conv_state = a.conv_state_out.view();
    second.recurrent_state = a.recurrent_state_out.view();
    const LayerForwardResult b = fused_gdn_fwd(second, o);
    Tensor joined(DType::f32, {64, hv * spec.dv});
    std::memcpy(joined.raw(), a.out.raw(), a.out.bytes());
    std::memcpy(static_cast<char*>(joined.raw()) + a.out.bytes(), b.out.raw(), b.out.bytes());
    const std::string what = "chunk " + std::to_string(chunk);
    EXPECT_TRUE(test::bit_identical(b.conv_state_out, whole.conv_state_out, "conv state, " + what));
    if (chunk == 32) {
      EXPECT_TRUE(test::bit_identical(joined, whole.out, "out, " + what));
      EXPECT_TRUE(
          test::bit_identical(b.recurrent_state_out, whole.recurrent_state_out, "state, " + what));
    } else {
      const LayerForwardResult reference = ref::fused_gdn_fwd(p.inputs(), o);
      EXPECT_TRUE(test::within(joined, reference.out, kF32Tolerance, "out, " + what));
    }
  }
}

// Without out the layer writes the same states and residuals, bit for bit (what a JAX remat
// backward asks of it when out is saved or unused): every ISA variant, float32 and float64,
// and the float64 reference's states.
TEST(CpuLayer, WithoutOutWritesTheSameStatesAndResiduals) {
  for (DType dtype : {DType::f32, DType::f64}) {
    test::LayerSpec spec;
    spec.lengths = {130, 0, 2, 65};
    spec.hk = 1;
    spec.hv = 2;
    spec.dk = 16;
    spec.dv = 24;
    spec.conv_state = true;
    spec.recurrent_state = true;
    spec.dtype = dtype;
    const test::LayerProblem p = test::make_layer_problem(spec);
    for (CpuIsa isa : compiled_isas()) {
      LayerOptions o = p.options();
      o.isa = isa;
      o.chunk_size = 32;
      const LayerForwardResult with_out = fused_gdn_fwd(p.inputs(), o, Residuals::all);
      LayerForwardResult r;
      for (auto [to, from] : {std::pair{&r.conv_state_out, &with_out.conv_state_out},
                              {&r.recurrent_state_out, &with_out.recurrent_state_out},
                              {&r.chunk_states, &with_out.chunk_states},
                              {&r.t_inv, &with_out.t_inv}}) {
        *to = Tensor(from->dtype(), from->rank(), from->sizes());
      }
      fused_gdn_fwd(p.inputs(),
                    {{},
                     r.conv_state_out.mutable_view(),
                     r.recurrent_state_out.mutable_view(),
                     r.chunk_states.mutable_view(),
                     r.t_inv.mutable_view()},
                    o);
      const std::string what = std::string(cpu_isa_name(isa)) + ", " + dtype_name(dtype) + ": ";
      EXPECT_TRUE(
          test::bit_identical(r.conv_state_out, with_out.conv_state_out, what + "conv_state_out"));
      EXPECT_TRUE(test::bit_identical(r.recurrent_state_out, with_out.recurrent_state_out,
                                      what + "recurrent_state_out"));
      EXPECT_TRUE(
          test::bit_identical(r.chunk_states, with_out.chunk_states, what + "chunk_states"));
      EXPECT_TRUE(test::bit_identical(r.t_inv, with_out.t_inv, what + "t_inv"));
    }
    if (dtype != DType::f32) continue;
    const LayerForwardResult ref_out = ref::fused_gdn_fwd(p.inputs(), p.options());
    Tensor conv(DType::f64, ref_out.conv_state_out.rank(), ref_out.conv_state_out.sizes());
    Tensor rec(DType::f64, ref_out.recurrent_state_out.rank(), ref_out.recurrent_state_out.sizes());
    ref::fused_gdn_fwd(p.inputs(), {{}, conv.mutable_view(), rec.mutable_view(), {}, {}},
                       p.options());
    EXPECT_TRUE(test::bit_identical(conv, ref_out.conv_state_out, "reference: conv_state_out"));
    EXPECT_TRUE(
        test::bit_identical(rec, ref_out.recurrent_state_out, "reference: recurrent_state_out"));
  }
}

// Parameter gradients are sums over every token: bit for bit the same for any thread count.
TEST(CpuLayer, BitIdenticalForAnyThreadCount) {
  test::LayerSpec spec;
  spec.lengths = {700, 3, 0, 257};  // several conv items, one ending a token past a block
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 16;
  spec.dv = 16;
  spec.conv_state = true;
  spec.recurrent_state = true;
  const test::LayerProblem p = test::make_layer_problem(spec);
  LayerOptions o = p.options();
  o.threads = 1;
  const Outputs one = run_cpu(p, o);
  for (int threads : {2, 3, 7}) {
    o.threads = threads;
    const Outputs r = run_cpu(p, o);
    const auto got = r.all(), want = one.all();
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(test::bit_identical(
          *got[i].second, *want[i].second,
          std::string(got[i].first) + ", " + std::to_string(threads) + " threads"));
    }
  }
}

// A channel count that is not a multiple of the vector width, and a conv_weight given as
// [D, 1, K].
TEST(CpuLayer, AwkwardChannelCount) {
  test::LayerSpec spec;
  spec.lengths = {40, 9};
  spec.hk = 3;
  spec.hv = 9;
  spec.dk = 37;
  spec.dv = 61;  // D = 2 * 3 * 37 + 9 * 61 = 771
  spec.taps = 3;
  spec.conv_state = true;
  spec.weight_rank3 = true;
  const test::LayerProblem p = test::make_layer_problem(spec);
  const Outputs ref = run_ref(p, p.options());
  for (CpuIsa isa : compiled_isas()) {
    LayerOptions o = p.options();
    o.isa = isa;
    const Outputs cpu = run_cpu(p, o);
    const auto got = cpu.all(), want = ref.all();
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(test::within(*got[i].second, *want[i].second, kF32Tolerance,
                               std::string(got[i].first) + ", " + cpu_isa_name(isa)));
    }
  }
}

// qkv given as a transposed view (channel stride T) and d_qkv written through an interleaved
// view (channel stride 2): the conv stages those rows instead of reading them in place, with
// bit-identical results.
TEST(CpuLayer, StridedQkvAndGradientViews) {
  test::LayerSpec spec;
  spec.lengths = {300, 2};  // a sequence spanning two conv items, one shorter than K - 1
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 16;
  spec.dv = 16;
  spec.conv_state = true;
  const test::LayerProblem p = test::make_layer_problem(spec);
  const std::int64_t t = p.qkv.size(0), d = p.qkv.size(1);
  Tensor transposed(DType::f32, {d, t});  // [D, T] memory holding qkv^T
  for (std::int64_t i = 0; i < t; ++i) {
    for (std::int64_t c = 0; c < d; ++c)
      transposed.data<float>()[c * t + i] = p.qkv.data<float>()[i * d + c];
  }
  LayerBackwardInputs in = backward_inputs(p);
  in.forward.qkv = TensorView(transposed.data<float>(), {t, d}, {1, t});
  const LayerOptions o = p.options();
  const Outputs contiguous = run_cpu(p, o);
  const LayerForwardResult fwd = fused_gdn_fwd(in.forward, o);
  EXPECT_TRUE(test::bit_identical(fwd.out, contiguous.fwd.out, "out"));
  EXPECT_TRUE(
      test::bit_identical(fwd.conv_state_out, contiguous.fwd.conv_state_out, "conv_state_out"));
  LayerBackwardResult grads = fused_gdn_bwd(in, o);
  Tensor wide(DType::f32, {t, 2 * d});
  const LayerBackwardOutputs out{MutableTensorView(wide.data<float>(), {t, d}, {2 * d, 2}),
                                 grads.d_a.mutable_view(),
                                 grads.d_b.mutable_view(),
                                 grads.d_conv_weight.mutable_view(),
                                 grads.d_conv_bias.mutable_view(),
                                 grads.d_A_log.mutable_view(),
                                 grads.d_dt_bias.mutable_view(),
                                 grads.d_conv_state.mutable_view(),
                                 grads.d_recurrent_state.mutable_view()};
  fused_gdn_bwd(in, out, o);
  Tensor d_qkv(DType::f32, {t, d});
  for (std::int64_t i = 0; i < t * d; ++i) d_qkv.data<float>()[i] = wide.data<float>()[2 * i];
  EXPECT_TRUE(test::bit_identical(d_qkv, contiguous.bwd.d_qkv, "d_qkv through a strided view"));
  EXPECT_TRUE(test::bit_identical(grads.d_qkv, contiguous.bwd.d_qkv, "d_qkv from transposed qkv"));
  EXPECT_TRUE(
      test::bit_identical(grads.d_conv_weight, contiguous.bwd.d_conv_weight, "d_conv_weight"));
  EXPECT_TRUE(test::bit_identical(grads.d_conv_state, contiguous.bwd.d_conv_state, "d_conv_state"));
  for (std::int64_t i = 0; i < t * d; ++i) {
    ASSERT_EQ(wide.data<float>()[2 * i + 1], 0.0f) << "wrote between the view's elements";
  }
  const Outputs ref = run_ref(p, o);
  EXPECT_TRUE(test::within(d_qkv, ref.bwd.d_qkv, kF32Tolerance, "d_qkv vs reference"));
}

// A conv output of at least 32 MiB (src/cpu/workspace.h: kConvStreamBytes) is written with
// non-temporal stores where a vector is a whole cache line (AVX-512), with cached stores
// elsewhere: the forward matches the reference on every ISA either way.
TEST(CpuLayer, LargeConvOutputStreamedPastTheCaches) {
  test::LayerSpec spec;
  spec.lengths = {4000, 96};  // 4096 tokens x D = 2048 channels of float: 32 MiB
  spec.hk = 4;
  spec.hv = 8;
  spec.dk = 128;
  spec.dv = 128;
  spec.conv_state = true;
  const test::LayerProblem p = test::make_layer_problem(spec);
  const LayerForwardResult ref = ref::fused_gdn_fwd(p.inputs(), p.options());
  for (CpuIsa isa : compiled_isas()) {
    LayerOptions o = p.options();
    o.isa = isa;
    const LayerForwardResult cpu = fused_gdn_fwd(p.inputs(), o);
    EXPECT_TRUE(test::within(cpu.out, ref.out, kF32Tolerance, cpu_isa_name(isa)));
    EXPECT_TRUE(
        test::within(cpu.conv_state_out, ref.conv_state_out, kF32Tolerance, cpu_isa_name(isa)));
  }
}

TEST(CpuLayer, ValidationErrors) {
  test::LayerSpec spec;
  spec.lengths = {10, 6};
  spec.conv_state = true;
  const test::LayerProblem p = test::make_layer_problem(spec);
  auto expect_error = [](const std::function<void()>& call, const std::string& argument) {
    try {
      call();
      ADD_FAILURE() << "no error for a bad '" << argument << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  LayerOptions o = p.options();
  o.dk = 9;
  expect_error([&] { fused_gdn_fwd(p.inputs(), o); }, "qkv");
  o = p.options();
  o.hk = 2;
  o.hv = 3;
  expect_error([&] { fused_gdn_fwd(p.inputs(), o); }, "options.hv");
  o = p.options();
  LayerInputs in = p.inputs();
  in.conv_weight.sizes[1] = 9;
  expect_error([&] { fused_gdn_fwd(in, o); }, "conv_weight");
  in = p.inputs();
  in.conv_state.sizes[1] = 2;
  expect_error([&] { fused_gdn_fwd(in, o); }, "conv_state");
  in = p.inputs();
  in.A_log.dtype = DType::f64;
  expect_error([&] { fused_gdn_fwd(in, o); }, "A_log");
  LayerBackwardInputs bin = backward_inputs(p);
  bin.d_out.sizes[1] = 3;
  expect_error([&] { fused_gdn_bwd(bin, o); }, "d_out");
  // The fused buffer's q, k and v parts interleave row by row but share no element: accepted.
  LayerForwardResult out = fused_gdn_fwd(p.inputs(), o);
  EXPECT_EQ(out.out.size(1), spec.hv * spec.dv);
}

// options.chunk_size = 0: the layer lays its residuals out by the tiling plan's chunk size and
// computes exactly what that chunk size given explicitly computes, forward and backward.
TEST(CpuLayer, ChunkSizeZeroRunsThePlannedChunk) {
  test::LayerSpec spec;
  spec.lengths = {70, 3, 129};
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 16;
  spec.dv = 16;
  spec.conv_state = true;
  spec.recurrent_state = true;
  const test::LayerProblem p = test::make_layer_problem(spec);
  LayerOptions o = p.options();
  o.chunk_size = 0;
  PlanProblem plan;
  plan.hk = spec.hk;
  plan.hv = spec.hv;
  plan.dk = spec.dk;
  plan.dv = spec.dv;
  plan.tokens = 129;
  plan.num_seqs = 3;
  ForwardOptions planned;
  planned.chunk_size = 0;
  const int chunk = make_plan(plan, planned).chunk_size;
  ASSERT_GT(chunk, 0);
  const LayerForwardResult automatic = fused_gdn_fwd(p.inputs(), o, Residuals::all);
  LayerOptions fixed = p.options();
  fixed.chunk_size = chunk;
  const LayerForwardResult given = fused_gdn_fwd(p.inputs(), fixed, Residuals::all);
  EXPECT_EQ(automatic.t_inv.size(2), chunk);
  EXPECT_TRUE(test::bit_identical(automatic.out, given.out, "out"));
  EXPECT_TRUE(test::bit_identical(automatic.t_inv, given.t_inv, "t_inv"));
  LayerBackwardInputs bin = backward_inputs(p);
  bin.chunk_states = automatic.chunk_states.view();
  bin.t_inv = automatic.t_inv.view();
  const LayerBackwardResult b0 = fused_gdn_bwd(bin, o);
  const LayerBackwardResult b1 = fused_gdn_bwd(bin, fixed);
  EXPECT_TRUE(test::bit_identical(b0.d_qkv, b1.d_qkv, "d_qkv"));
  EXPECT_TRUE(test::bit_identical(b0.d_A_log, b1.d_A_log, "d_A_log"));
  // A t_inv laid out by another chunk size is a clear error.
  fixed.chunk_size = chunk == 64 ? 32 : 64;
  const LayerForwardResult other = fused_gdn_fwd(p.inputs(), fixed, Residuals::all);
  bin.chunk_states = {};
  bin.t_inv = other.t_inv.view();
  try {
    fused_gdn_bwd(bin, o);
    ADD_FAILURE() << "a t_inv of chunk " << fixed.chunk_size << " was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "t_inv") << e.what();
  }
}

}  // namespace
}  // namespace gdn
