// conv_test.cc: the conv op (gdn/conv.h) on the CPU, every compiled ISA variant, against its
// float64 reference: out, final state and every gradient, with and without the SiLU, over taps,
// channel counts (a multiple of the vector width or not), packed sequences (some shorter than
// K - 1 or empty), initial states, strided layouts (the causal-conv1d [D, T] layout seen as
// [T, D]), in-place state updates, 16-bit x, and thread counts.
//
// Tolerance: float32 within 1e-5 of the float64 reference in the shared metric
// (bench/error_stats.h), float64 within 1e-12. 16-bit x: bit for bit the float32 op on the
// same values widened, its out and d_x rounded to nearest even (the op converts on load and
// rounds once on store).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/compare.h"
#include "common/isas.h"
#include "common/problem.h"
#include "common/test_names.h"

namespace gdn {
namespace {

constexpr double kF32Tolerance = 1e-5;
constexpr double kF64Tolerance = 1e-12;

struct ConvSpec {
  std::vector<std::int64_t> lengths = {40};
  std::int64_t channels = 24, taps = 4;
  DType dtype = DType::f32;
  bool bias = true, state = false, rank3 = false;
  bool channels_first = false;  // x stored [D, T] and seen as [T, D] (strides 1, T)
  std::uint64_t seed = 7;
};

// A seeded problem; x is a view into `x_storage`.
struct ConvCase {
  ConvSpec spec;
  Tensor x_storage, weight, bias, state, cu_seqlens, d_out, d_final_state;
  TensorView x;
  std::int64_t tokens = 0;

  ConvInputs inputs() const {
    return {x, weight.view(), bias.view(), state.view(), cu_seqlens.view()};
  }
  ConvBackwardInputs backward_inputs() const {
    return {inputs(), d_out.view(), d_final_state.view()};
  }
};

void fill(Tensor& t, test::Random& rng, double sigma) {
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double v = sigma * rng.normal();
    if (t.dtype() == DType::f64) {
      t.data<double>()[i] = v;
    } else {
      t.data<float>()[i] = static_cast<float>(v);
    }
  }
}

ConvCase make_case(const ConvSpec& spec) {
  ConvCase c;
  c.spec = spec;
  test::Random rng(spec.seed);
  for (std::int64_t len : spec.lengths) c.tokens += len;
  const std::int64_t t = c.tokens, d = spec.channels, k = spec.taps;
  const auto n = static_cast<std::int64_t>(spec.lengths.size());
  const DType cd = spec.dtype == DType::f64 ? DType::f64 : DType::f32;
  c.x_storage = spec.channels_first ? Tensor(cd, {d, t}) : Tensor(cd, {t, d});
  fill(c.x_storage, rng, 1.0);
  c.x = spec.channels_first ? TensorView(c.x_storage.raw(), cd, 2, {t, d, 0, 0}, {1, t, 0, 0})
                            : c.x_storage.view();
  c.weight = spec.rank3 ? Tensor(cd, {d, 1, k}) : Tensor(cd, {d, k});
  fill(c.weight, rng, 1.0 / std::sqrt(static_cast<double>(k)));
  if (spec.bias) {
    c.bias = Tensor(cd, {d});
    fill(c.bias, rng, 0.2);
  }
  if (spec.state) {
    c.state = Tensor(cd, {n, k - 1, d});
    fill(c.state, rng, 1.0);
  }
  c.cu_seqlens = Tensor(DType::i64, {n + 1});
  std::int64_t at = 0;
  for (std::int64_t s = 0; s <= n; ++s) {
    c.cu_seqlens.data<std::int64_t>()[s] = at;
    if (s < n) at += spec.lengths[s];
  }
  c.d_out = Tensor(cd, {t, d});
  fill(c.d_out, rng, 1.0);
  c.d_final_state = Tensor(cd, {n, k - 1, d});
  fill(c.d_final_state, rng, 1.0);
  return c;
}

struct Results {
  ConvForwardResult fwd;
  ConvBackwardResult bwd;
  std::vector<std::pair<const char*, const Tensor*>> all() const {
    return {{"out", &fwd.out},       {"final_state", &fwd.final_state},
            {"d_x", &bwd.d_x},       {"d_weight", &bwd.d_weight},
            {"d_bias", &bwd.d_bias}, {"d_initial_state", &bwd.d_initial_state}};
  }
};

Results run_cpu(const ConvCase& c, const ConvOptions& o) {
  return {causal_conv1d_fwd(c.inputs(), o), causal_conv1d_bwd(c.backward_inputs(), o)};
}
Results run_ref(const ConvCase& c, const ConvOptions& o) {
  return {ref::causal_conv1d_fwd(c.inputs(), o), ref::causal_conv1d_bwd(c.backward_inputs(), o)};
}

std::string name_of(const ConvSpec& s, const ConvOptions& o) {
  std::ostringstream n;
  n << "lengths [";
  for (std::size_t i = 0; i < s.lengths.size(); ++i) n << (i ? "," : "") << s.lengths[i];
  n << "] D=" << s.channels << " K=" << s.taps << " " << dtype_name(s.dtype)
    << (s.bias ? " bias" : "") << (s.state ? " state" : "") << (s.rank3 ? " [D,1,K]" : "")
    << (s.channels_first ? " [D,T] layout" : "")
    << (o.activation == ConvActivation::silu ? " silu" : " none") << " isa " << cpu_isa_name(o.isa);
  return n.str();
}

void expect_matches_reference(const ConvSpec& spec, ConvOptions o) {
  const ConvCase c = make_case(spec);
  const Results want = run_ref(c, o);
  for (CpuIsa isa : test::runnable_isas()) {
    o.isa = isa;
    const Results got = run_cpu(c, o);
    const auto g = got.all(), w = want.all();
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (!g[i].second->present()) continue;
      EXPECT_TRUE(test::within(*g[i].second, *w[i].second,
                               spec.dtype == DType::f64 ? kF64Tolerance : kF32Tolerance,
                               std::string(g[i].first) + ", " + name_of(spec, o)));
    }
  }
}

class ConvMatchesReference
    : public ::testing::TestWithParam<std::tuple<std::int64_t, std::int64_t, bool, bool, int>> {};

// The spec of a case, shared by the test and its name so that the name cannot drift from
// what runs.
ConvSpec matrix_spec(const ConvMatchesReference::ParamType& param) {
  const auto& [taps, channels, silu, state, lengths_case] = param;
  ConvSpec spec;
  spec.taps = taps;
  spec.channels = channels;
  spec.state = state;
  spec.bias = lengths_case != 1;
  spec.rank3 = lengths_case == 1;
  spec.channels_first = lengths_case == 2;
  // One sequence; several, some shorter than K - 1 and one empty; one in the [D, T] layout.
  spec.lengths = lengths_case == 1 ? std::vector<std::int64_t>{37, 1, 0, 2, 70}
                                   : std::vector<std::int64_t>{lengths_case == 2 ? 45 : 130};
  return spec;
}

TEST_P(ConvMatchesReference, OutFinalStateAndGradients) {
  ConvOptions o;
  o.activation = std::get<2>(GetParam()) ? ConvActivation::silu : ConvActivation::none;
  expect_matches_reference(matrix_spec(GetParam()), o);
}

std::string case_name(const ::testing::TestParamInfo<ConvMatchesReference::ParamType>& param) {
  const ConvSpec s = matrix_spec(param.param);
  return test::lengths_name(s.lengths) + "_D" + std::to_string(s.channels) + "_K" +
         std::to_string(s.taps) + "_" + test::flag_name(std::get<2>(param.param), "Silu") + "_" +
         test::flag_name(s.state, "State") + "_" + test::flag_name(s.bias, "Bias") + "_" +
         (s.rank3 ? "WeightDx1xK" : "WeightDxK") + "_" +
         (s.channels_first ? "LayoutDT" : "LayoutTD");
}

INSTANTIATE_TEST_SUITE_P(Matrix, ConvMatchesReference,
                         ::testing::Combine(::testing::Values(1, 2, 4, 8),  // taps K
                                            ::testing::Values(24, 64, 5),   // channels D
                                            ::testing::Bool(),              // SiLU or none
                                            ::testing::Bool(),              // initial states
                                            ::testing::Values(0, 1, 2)),    // sequences, layout
                         case_name);

TEST(CpuConv, Float64MatchesReference) {
  ConvSpec spec;
  spec.dtype = DType::f64;
  spec.state = true;
  spec.lengths = {50, 2, 17};
  expect_matches_reference(spec, {});
  ConvOptions none;
  none.activation = ConvActivation::none;
  expect_matches_reference(spec, none);
}

// A 16-bit copy of a float32 [T, D] view.
Tensor rounded(const TensorView& x, DType dtype) {
  Tensor t(dtype, {x.sizes[0], x.sizes[1]});
  auto* to = static_cast<std::uint16_t*>(t.raw());
  for (std::int64_t i = 0; i < x.sizes[0]; ++i) {
    for (std::int64_t c = 0; c < x.sizes[1]; ++c) {
      const float v = static_cast<const float*>(x.data)[i * x.strides[0] + c * x.strides[1]];
      to[i * x.sizes[1] + c] = dtype == DType::bf16 ? bf16_bits(v) : f16_bits(v);
    }
  }
  return t;
}
Tensor widened(const Tensor& h) {
  Tensor t(DType::f32, {h.size(0), h.size(1)});
  const auto* from = static_cast<const std::uint16_t*>(h.raw());
  for (std::int64_t i = 0; i < h.numel(); ++i) {
    t.data<float>()[i] = h.dtype() == DType::bf16 ? bf16_value(from[i]) : f16_value(from[i]);
  }
  return t;
}

TEST(CpuConv, SixteenBitXIsTheFloat32OpRoundedOnce) {
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (bool silu : {true, false}) {
      ConvSpec spec;
      spec.lengths = {33, 2, 60};
      spec.channels = 40;
      spec.state = true;
      ConvCase c = make_case(spec);
      // The float32 problem on the 16-bit values, then x and d_out as 16-bit tensors.
      const Tensor x16 = rounded(c.x, dtype), d16 = rounded(c.d_out.view(), dtype);
      c.x_storage = widened(x16);
      c.x = c.x_storage.view();
      c.d_out = widened(d16);
      ConvOptions o;
      o.activation = silu ? ConvActivation::silu : ConvActivation::none;
      for (CpuIsa isa : test::runnable_isas()) {
        o.isa = isa;
        const Results wide = run_cpu(c, o);
        ConvInputs half_in = c.inputs();
        half_in.x = x16.view();
        const Results got{causal_conv1d_fwd(half_in, o),
                          causal_conv1d_bwd({half_in, d16.view(), c.d_final_state.view()}, o)};
        const std::string what = std::string(dtype_name(dtype)) + (silu ? " silu" : " none") +
                                 " isa " + cpu_isa_name(isa);
        EXPECT_TRUE(
            test::bit_identical(got.fwd.out, rounded(wide.fwd.out.view(), dtype), "out, " + what));
        EXPECT_TRUE(
            test::bit_identical(got.bwd.d_x, rounded(wide.bwd.d_x.view(), dtype), "d_x, " + what));
        for (const auto& [name, a, b] :
             {std::tuple{"final_state", &got.fwd.final_state, &wide.fwd.final_state},
              std::tuple{"d_weight", &got.bwd.d_weight, &wide.bwd.d_weight},
              std::tuple{"d_bias", &got.bwd.d_bias, &wide.bwd.d_bias},
              std::tuple{"d_initial_state", &got.bwd.d_initial_state, &wide.bwd.d_initial_state}}) {
          EXPECT_TRUE(test::bit_identical(*a, *b, std::string(name) + ", " + what));
        }
      }
    }
  }
}

// Two calls with the state carried equal one call, bit for bit (the decode pattern of
// causal_conv1d_update: a token at a time, the state updated in place).
TEST(CpuConv, TokenByTokenWithStateInPlaceEqualsOneCall) {
  ConvSpec spec;
  spec.lengths = {12};
  spec.channels = 48;
  spec.state = true;
  const ConvCase c = make_case(spec);
  const ConvForwardResult whole = causal_conv1d_fwd(c.inputs(), {});
  Tensor state(DType::f32, {1, spec.taps - 1, spec.channels});
  std::memcpy(state.raw(), c.state.raw(), c.state.bytes());
  Tensor out(DType::f32, {c.tokens, spec.channels});
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    TensorView x = c.x;
    x.data = static_cast<const float*>(c.x.data) + t * c.x.strides[0];
    x.sizes[0] = 1;
    MutableTensorView o(out.data<float>() + t * spec.channels, {1, spec.channels},
                        {spec.channels, 1});
    causal_conv1d_fwd({x, c.weight.view(), c.bias.view(), state.view(), {}},
                      {o, state.mutable_view()}, {});
  }
  EXPECT_TRUE(test::bit_identical(out, whole.out, "out"));
  EXPECT_TRUE(test::bit_identical(state, whole.final_state, "state"));
}

// Any layout: a strided out and d_x hold the same values as contiguous ones, and a transposed
// d_out gives the same gradients.
TEST(CpuConv, StridedOutputsAndCotangentEqualContiguous) {
  ConvSpec spec;
  spec.lengths = {20, 9};
  spec.state = true;
  const ConvCase c = make_case(spec);
  const Results contiguous = run_cpu(c, {});
  const std::int64_t t = c.tokens, d = spec.channels;
  Tensor out_t(DType::f32, {d, t}), dx_t(DType::f32, {d, t});
  const MutableTensorView out(out_t.raw(), DType::f32, 2, {t, d, 0, 0}, {1, t, 0, 0});
  const MutableTensorView dx(dx_t.raw(), DType::f32, 2, {t, d, 0, 0}, {1, t, 0, 0});
  causal_conv1d_fwd(c.inputs(), {out, {}}, {});
  Tensor dw(DType::f32, {d, spec.taps});
  causal_conv1d_bwd(c.backward_inputs(), {dx, dw.mutable_view(), {}, {}}, {});
  for (std::int64_t i = 0; i < t; ++i) {
    for (std::int64_t ch = 0; ch < d; ++ch) {
      ASSERT_EQ(out_t.data<float>()[ch * t + i], contiguous.fwd.out.data<float>()[i * d + ch]);
      ASSERT_EQ(dx_t.data<float>()[ch * t + i], contiguous.bwd.d_x.data<float>()[i * d + ch]);
    }
  }
  EXPECT_TRUE(test::bit_identical(dw, contiguous.bwd.d_weight, "d_weight"));
  // A transposed d_out (token stride 1) gives the same gradients.
  Tensor d_out_t(DType::f32, {d, t});
  for (std::int64_t i = 0; i < t; ++i) {
    for (std::int64_t ch = 0; ch < d; ++ch)
      d_out_t.data<float>()[ch * t + i] = c.d_out.data<float>()[i * d + ch];
  }
  const TensorView d_out(d_out_t.raw(), DType::f32, 2, {t, d, 0, 0}, {1, t, 0, 0});
  const ConvBackwardResult from_transposed =
      causal_conv1d_bwd({c.inputs(), d_out, c.d_final_state.view()}, {});
  EXPECT_TRUE(test::bit_identical(from_transposed.d_x, contiguous.bwd.d_x, "d_x, d_out [D, T]"));
  EXPECT_TRUE(test::bit_identical(from_transposed.d_weight, contiguous.bwd.d_weight,
                                  "d_weight, d_out [D, T]"));
}

TEST(CpuConv, BitIdenticalForAnyThreadCount) {
  ConvSpec spec;
  spec.lengths = {700, 3, 0, 257};
  spec.channels = 72;
  spec.state = true;
  const ConvCase c = make_case(spec);
  ConvOptions o;
  o.threads = 1;
  const Results one = run_cpu(c, o);
  for (int threads : {2, 3, 7}) {
    o.threads = threads;
    const Results r = run_cpu(c, o);
    const auto got = r.all(), want = one.all();
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(
          test::bit_identical(*got[i].second, *want[i].second,
                              std::string(got[i].first) + ", threads " + std::to_string(threads)));
    }
  }
}

// Bad arguments: tests/api/validate_conv_test.cc, one test per rule.

}  // namespace
}  // namespace gdn
