// reference_test.cc: the float64 reference against itself and against exact arithmetic.
//   - the chunked float64 form equals the token recurrence (the definition) to 1e-12;
//   - cases whose answer is known in closed form (beta = 0, exact retrieval);
//   - residual semantics: chunk_states are the states entering the chunks, t_inv T = I.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/problem.h"
#include "common/test_names.h"

namespace gdn {
namespace {

using test::make_problem;
using test::ProblemSpec;

// The chunked float64 form reassociates the recurrence; in float64 the two agree to within
// a thousand ulps of the output scale (measured: 0 to 1.4e-13 over this matrix).
constexpr double kChunkedVsRecurrent = 1e-12;

// Both reference forms, allocating.
using AllocatingForward = ForwardResult (*)(const ForwardInputs&, const ForwardOptions&, Residuals);
const AllocatingForward kReferences[] = {&ref::recurrent_fwd, &ref::chunked_fwd};

using test::Shape;

class ChunkedReference
    : public ::testing::TestWithParam<std::tuple<Shape, bool, bool, double, int>> {};

TEST_P(ChunkedReference, MatchesTokenRecurrence) {
  const auto& [shape, h0, l2norm, g_lo, chunk] = GetParam();
  ProblemSpec spec = test::spec_for(shape, DType::f64);
  spec.initial_state = h0;
  spec.l2norm = l2norm;
  spec.g_lo = g_lo;
  const test::Problem p = make_problem(spec);
  ForwardOptions options = p.options();
  options.chunk_size = chunk;
  const ForwardResult chunked = ref::chunked_fwd(p.inputs(), options, Residuals::all);
  const ForwardResult recurrent = ref::recurrent_fwd(p.inputs(), options, Residuals::all);
  EXPECT_TRUE(test::within(chunked.o, recurrent.o, kChunkedVsRecurrent, "o, " + spec.name()));
  EXPECT_TRUE(test::within(chunked.final_state, recurrent.final_state, kChunkedVsRecurrent,
                           "final_state, " + spec.name()));
  EXPECT_TRUE(test::within(chunked.chunk_states, recurrent.chunk_states, kChunkedVsRecurrent,
                           "chunk_states, " + spec.name()));
}

std::string case_name(const ::testing::TestParamInfo<ChunkedReference::ParamType>& param) {
  const auto& [shape, h0, l2norm, g_lo, chunk] = param.param;
  return test::shape_name(shape) + "_" + test::flag_name(h0, "H0") + "_" +
         test::flag_name(l2norm, "L2norm") + "_Glo" + test::number_name(g_lo) + "_Chunk" +
         std::to_string(chunk);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ChunkedReference,
    ::testing::Combine(::testing::Values(Shape{{1}, 1, 1, 16, 16}, Shape{{63}, 2, 2, 32, 24},
                                         Shape{{64}, 1, 2, 16, 32}, Shape{{65}, 1, 4, 32, 16},
                                         Shape{{127}, 2, 4, 24, 40}, Shape{{1000}, 1, 1, 32, 32},
                                         Shape{{40, 0, 64, 129, 1}, 2, 2, 16, 16}),
                       ::testing::Bool(),               // initial state
                       ::testing::Bool(),               // l2norm
                       ::testing::Values(-1.0, -20.0),  // g in [g_lo, 0]
                       ::testing::Values(64, 16)),      // chunk size
    case_name);

// beta = 0: nothing is written; the state only decays, S_t = exp(G_t) S_0, o_t = scale S_t^T q_t.
TEST(Reference, BetaZeroStateOnlyDecays) {
  ProblemSpec spec;
  spec.lengths = {37, 70};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 8;
  spec.dv = 4;
  spec.initial_state = true;
  spec.beta_lo = spec.beta_hi = 0.0;
  spec.g_lo = -0.5;
  spec.dtype = DType::f64;
  const test::Problem p = make_problem(spec);
  for (AllocatingForward fwd : kReferences) {
    const ForwardResult r = fwd(p.inputs(), {}, Residuals::none);
    const double* g = p.g.data<double>();
    const double* h0 = p.h0.data<double>();
    const double* q = p.q.data<double>();
    std::int64_t start = 0;
    for (std::size_t s = 0; s < spec.lengths.size(); ++s) {
      for (std::int64_t h = 0; h < spec.hv; ++h) {
        double G = 0;
        for (std::int64_t t = start; t < start + spec.lengths[s]; ++t) {
          G += g[t * spec.hv + h];
          for (std::int64_t j = 0; j < spec.dv; ++j) {
            double expected = 0;
            for (std::int64_t i = 0; i < spec.dk; ++i) {
              expected += std::exp(G) * h0[((s * spec.hv + h) * spec.dk + i) * spec.dv + j] *
                          q[t * spec.dk + i];
            }
            expected /= std::sqrt(static_cast<double>(spec.dk));
            EXPECT_NEAR(r.o.data<double>()[(t * spec.hv + h) * spec.dv + j], expected, 1e-13);
          }
        }
        for (std::int64_t e = 0; e < spec.dk * spec.dv; ++e) {
          EXPECT_NEAR(r.final_state.data<double>()[(s * spec.hv + h) * spec.dk * spec.dv + e],
                      std::exp(G) * h0[(s * spec.hv + h) * spec.dk * spec.dv + e], 1e-13);
        }
      }
      start += spec.lengths[s];
    }
  }
}

// beta = 1 with orthonormal keys and g = 0 is an exact associative memory: after writing
// (k_i, v_i), a query q = k_j reads back v_j (times scale).
TEST(Reference, OrthonormalKeysRetrieveExactly) {
  const std::int64_t dk = 8, dv = 5, writes = 8, reads = 8, total = writes + reads;
  // Orthonormal rows of a Householder reflection I - 2 w w^T / |w|^2.
  const double w[dk] = {0.3, -1.2, 0.7, 0.1, 2.0, -0.4, 0.9, 0.5};
  double ww = 0;
  for (double x : w) ww += x * x;
  Tensor q(DType::f64, {total, 1, dk}), k(DType::f64, {total, 1, dk}),
      v(DType::f64, {total, 1, dv});
  Tensor g(DType::f64, {total, 1}), beta(DType::f64, {total, 1});
  test::Random rng(7);
  for (std::int64_t t = 0; t < total; ++t) {
    const std::int64_t row =
        t < writes ? t : (t * 5) % writes;  // reads visit the keys in another order
    for (std::int64_t d = 0; d < dk; ++d) {
      const double key = (row == d ? 1.0 : 0.0) - 2 * w[row] * w[d] / ww;
      k.data<double>()[t * dk + d] = key;
      q.data<double>()[t * dk + d] = key;
    }
    for (std::int64_t e = 0; e < dv; ++e) v.data<double>()[t * dv + e] = rng.normal();
    beta.data<double>()[t] = t < writes ? 1.0 : 0.0;
  }
  const ForwardInputs in{q.view(), k.view(), v.view(), g.view(), beta.view(), {}, {}};
  ForwardOptions options;
  options.scale = 1.0;
  options.chunk_size = 4;
  for (AllocatingForward fwd : kReferences) {
    const ForwardResult r = fwd(in, options, Residuals::none);
    for (std::int64_t t = writes; t < total; ++t) {
      const std::int64_t row = (t * 5) % writes;
      for (std::int64_t e = 0; e < dv; ++e) {
        EXPECT_NEAR(r.o.data<double>()[t * dv + e], v.data<double>()[row * dv + e], 1e-13)
            << "token " << t;
      }
    }
  }
}

// t_inv holds A = T^-1 for every chunk: A T = I on the chunk's n x n block, zeros elsewhere.
TEST(Reference, TInvInvertsT) {
  ProblemSpec spec;
  spec.lengths = {100, 7};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 16;
  spec.dv = 8;
  spec.l2norm = true;
  spec.dtype = DType::f64;
  const test::Problem p = make_problem(spec);
  ForwardOptions options = p.options();
  options.chunk_size = 32;
  const ForwardResult r = ref::chunked_fwd(p.inputs(), options, Residuals::all);
  const std::int64_t c = 32;
  ASSERT_EQ(r.t_inv.size(0), 4 + 1);
  const double* k = p.k.data<double>();
  const double* beta = p.beta.data<double>();
  const double* g = p.g.data<double>();
  std::int64_t chunk = 0;
  std::int64_t start = 0;
  for (std::int64_t len : spec.lengths) {
    for (std::int64_t t0 = 0; t0 < len; t0 += c, ++chunk) {
      const std::int64_t n = std::min(c, len - t0);
      for (std::int64_t h = 0; h < spec.hv; ++h) {
        // T from the definition.
        std::vector<double> kn(n * spec.dk), G(n), T(n * n, 0.0);
        double run = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          const std::int64_t t = start + t0 + i;
          double ss = 0;
          for (std::int64_t d = 0; d < spec.dk; ++d) ss += k[t * spec.dk + d] * k[t * spec.dk + d];
          for (std::int64_t d = 0; d < spec.dk; ++d)
            kn[i * spec.dk + d] = k[t * spec.dk + d] / std::sqrt(ss + 1e-6);
          run += g[t * spec.hv + h];
          G[i] = run;
        }
        for (std::int64_t i = 0; i < n; ++i) {
          T[i * n + i] = 1;
          for (std::int64_t j = 0; j < i; ++j) {
            double kk = 0;
            for (std::int64_t d = 0; d < spec.dk; ++d)
              kk += kn[i * spec.dk + d] * kn[j * spec.dk + d];
            T[i * n + j] = beta[(start + t0 + i) * spec.hv + h] * kk * std::exp(G[i] - G[j]);
          }
        }
        const double* a = r.t_inv.data<double>() + (chunk * spec.hv + h) * c * c;
        for (std::int64_t i = 0; i < c; ++i) {
          for (std::int64_t j = 0; j < c; ++j) {
            if (i >= n || j >= n) {
              EXPECT_EQ(a[i * c + j], 0.0) << "padding of chunk " << chunk;
              continue;
            }
            double at = 0;
            for (std::int64_t m = 0; m < n; ++m) at += a[i * c + m] * T[m * n + j];
            EXPECT_NEAR(at, i == j ? 1.0 : 0.0, 1e-12) << "chunk " << chunk << " head " << h;
          }
        }
      }
    }
    start += len;
  }
}

}  // namespace
}  // namespace gdn
