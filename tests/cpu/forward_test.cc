// forward_test.cc: the CPU forward (every compiled ISA variant, both algorithms, float32 and
// float64) against the float64 reference, plus the properties the op promises: exact cases,
// residuals, continuation, determinism across thread counts, strided and batched layouts,
// in-place state update, zero-length sequences, long-sequence drift.
//
// Tolerance (docs/numerics.md): a float32 result passes when its error is at most
// 4 x the error of a plain float32 token recurrence on the same inputs + 32 eps_f32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "common/compare.h"
#include "common/isas.h"
#include "common/problem.h"
#include "common/test_names.h"

namespace gdn {
namespace {

using test::make_problem;
using test::Problem;
using test::ProblemSpec;

constexpr double kEpsF32 = 1.1920928955078125e-07;
constexpr double kBaselineFactor = 4.0;
constexpr double kFloor = 32 * kEpsF32;
// float64 kernels against the float64 reference (measured 1e-15 to 2e-14).
constexpr double kF64Tolerance = 1e-12;

double f32_tolerance(double baseline_error) { return kBaselineFactor * baseline_error + kFloor; }

std::vector<CpuIsa> compiled_isas() { return test::runnable_isas(); }

const char* algorithm_name(Algorithm a) {
  return a == Algorithm::chunked     ? "chunked"
         : a == Algorithm::recurrent ? "recurrent"
                                     : "automatic";
}

std::string variant(CpuIsa isa, Algorithm a) {
  return std::string(cpu_isa_name(isa)) + "/" + algorithm_name(a);
}

TEST(CpuForward, GenericVariantIsAlwaysAvailable) {
  EXPECT_TRUE(cpu_isa_available(CpuIsa::generic));
  EXPECT_NE(resolve_cpu_isa(CpuIsa::automatic), CpuIsa::automatic);
}

// ---------------------------------------------------------------------------------------------
// Against the reference over the case matrix of spec section 8.
// ---------------------------------------------------------------------------------------------

using test::Shape;

class MatchesReference : public ::testing::TestWithParam<std::tuple<Shape, double, bool, bool>> {};

TEST_P(MatchesReference, Float32) {
  const auto& [shape, g_lo, h0, l2norm] = GetParam();
  ProblemSpec spec = test::spec_for(shape);
  spec.g_lo = g_lo;
  spec.initial_state = h0;
  spec.l2norm = l2norm;
  const Problem p = make_problem(spec);
  const ForwardOptions options = p.options();
  const ForwardResult ref = ref::recurrent_fwd(p.inputs(), options);
  const ForwardResult base = test::baseline_f32(p, options);
  const double tol_o = f32_tolerance(test::compare(base.o, ref.o).normalized());
  const double tol_ht =
      f32_tolerance(test::compare(base.final_state, ref.final_state).normalized());
  for (CpuIsa isa : compiled_isas()) {
    for (Algorithm algorithm : {Algorithm::chunked, Algorithm::recurrent, Algorithm::automatic}) {
      ForwardOptions o = options;
      o.isa = isa;
      o.algorithm = algorithm;
      const ForwardResult r = chunk_gated_delta_rule_fwd(p.inputs(), o);
      const std::string what = variant(isa, algorithm) + ", " + spec.name();
      EXPECT_TRUE(test::within(r.o, ref.o, tol_o, "o, " + what));
      EXPECT_TRUE(test::within(r.final_state, ref.final_state, tol_ht, "final_state, " + what));
    }
  }
}

TEST_P(MatchesReference, Float64) {
  const auto& [shape, g_lo, h0, l2norm] = GetParam();
  ProblemSpec spec = test::spec_for(shape, DType::f64);
  spec.g_lo = g_lo;
  spec.initial_state = h0;
  spec.l2norm = l2norm;
  const Problem p = make_problem(spec);
  const ForwardResult ref = ref::recurrent_fwd(p.inputs(), p.options());
  for (CpuIsa isa : compiled_isas()) {
    for (Algorithm algorithm : {Algorithm::chunked, Algorithm::recurrent}) {
      ForwardOptions o = p.options();
      o.isa = isa;
      o.algorithm = algorithm;
      const ForwardResult r = chunk_gated_delta_rule_fwd(p.inputs(), o);
      ASSERT_EQ(r.o.dtype(), DType::f64);
      const std::string what = variant(isa, algorithm) + ", " + spec.name();
      EXPECT_TRUE(test::within(r.o, ref.o, kF64Tolerance, "o, " + what));
      EXPECT_TRUE(
          test::within(r.final_state, ref.final_state, kF64Tolerance, "final_state, " + what));
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<MatchesReference::ParamType>& param) {
  const auto& [shape, g_lo, h0, l2norm] = param.param;
  return test::shape_name(shape) + "_Glo" + test::number_name(g_lo) + "_" +
         test::flag_name(h0, "H0") + "_" + test::flag_name(l2norm, "L2norm");
}

INSTANTIATE_TEST_SUITE_P(
    Spec8, MatchesReference,
    ::testing::Combine(
        ::testing::Values(Shape{{1}, 2, 2, 32, 32},      // one token
                          Shape{{63}, 1, 2, 64, 32},     // C - 1, Hv = 2 Hk, Dk != Dv
                          Shape{{64}, 2, 4, 32, 48},     // C, Hv = 2 Hk
                          Shape{{65}, 1, 4, 48, 64},     // C + 1, Hv = 4 Hk
                          Shape{{127}, 2, 2, 128, 128},  // 2C - 1, the model's head dims
                          Shape{{1000}, 1, 2, 64, 96},   // many chunks
                          Shape{{200, 0, 63, 1, 129}, 2, 4, 40, 24},  // packed, a zero-length one
                          Shape{{70}, 3, 3, 17, 5},                   // odd heads and dims
                          Shape{{65}, 1, 1, 256, 256},                // the largest head dims
                          Shape{{50}, 1, 1, 1, 1}),                   // the smallest
        ::testing::Values(-1.0, -20.0),                               // g in [g_lo, 0]
        ::testing::Bool(),                                            // initial state
        ::testing::Bool()),                                           // L2 norm in the kernel
    case_name);

// Chunk sizes other than 64, including ones that are not a multiple of the vector width.
TEST(CpuForward, ChunkSizes) {
  ProblemSpec spec;
  spec.lengths = {150, 33};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 32;
  spec.dv = 16;
  spec.initial_state = true;
  spec.l2norm = true;
  const Problem p = make_problem(spec);
  const ForwardResult ref = ref::recurrent_fwd(p.inputs(), p.options());
  const ForwardResult base = test::baseline_f32(p, p.options());
  const double tol = f32_tolerance(test::compare(base.o, ref.o).normalized());
  for (int chunk : {1, 7, 16, 32, 100, 128, 256}) {
    for (CpuIsa isa : compiled_isas()) {
      ForwardOptions o = p.options();
      o.chunk_size = chunk;
      o.isa = isa;
      o.algorithm = Algorithm::chunked;
      const ForwardResult r = chunk_gated_delta_rule_fwd(p.inputs(), o);
      EXPECT_TRUE(test::within(r.o, ref.o, tol,
                               "chunk " + std::to_string(chunk) + ", " + cpu_isa_name(isa)));
    }
  }
}

// Strong decay: exp(G_i) alone underflows (G reaches -60000 in a chunk); the kernels only
// exponentiate differences G_i - G_j <= 0, so nothing overflows into inf * 0 = NaN.
TEST(CpuForward, ExtremeDecayStaysFinite) {
  ProblemSpec spec;
  spec.lengths = {300};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 16;
  spec.dv = 16;
  spec.initial_state = true;
  spec.g_lo = -1000;
  spec.g_hi = -100;
  const Problem p = make_problem(spec);
  const ForwardResult ref = ref::recurrent_fwd(p.inputs(), p.options());
  const ForwardResult base = test::baseline_f32(p, p.options());
  for (CpuIsa isa : compiled_isas()) {
    ForwardOptions o = p.options();
    o.isa = isa;
    o.algorithm = Algorithm::chunked;
    const ForwardResult r = chunk_gated_delta_rule_fwd(p.inputs(), o);
    for (std::int64_t i = 0; i < r.o.numel(); ++i)
      ASSERT_TRUE(std::isfinite(r.o.data<float>()[i])) << i;
    EXPECT_TRUE(test::within(r.o, ref.o, f32_tolerance(test::compare(base.o, ref.o).normalized()),
                             std::string("o, ") + cpu_isa_name(isa)));
  }
}

// A 16k-token sequence: the error at the end is no worse than the baseline's (no drift).
TEST(CpuForward, LongSequenceDoesNotDrift) {
  ProblemSpec spec;
  spec.lengths = {16384};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 128;
  spec.dv = 128;
  spec.l2norm = true;
  spec.g_lo = -0.1;  // slow decay: a long memory, where drift would show
  const Problem p = make_problem(spec);
  const ForwardResult ref = ref::recurrent_fwd(p.inputs(), p.options());
  const ForwardResult base = test::baseline_f32(p, p.options());
  ForwardOptions o = p.options();
  o.algorithm = Algorithm::chunked;
  const ForwardResult r = chunk_gated_delta_rule_fwd(p.inputs(), o);
  EXPECT_TRUE(
      test::within(r.o, ref.o, f32_tolerance(test::compare(base.o, ref.o).normalized()), "o"));
  EXPECT_TRUE(test::within(
      r.final_state, ref.final_state,
      f32_tolerance(test::compare(base.final_state, ref.final_state).normalized()), "ht"));
  // The last 1024 tokens alone.
  const std::int64_t tail = 1024 * spec.hv * spec.dv, offset = r.o.numel() - tail;
  const auto tail_error = [&](const Tensor& x) {
    return bench::error_stats(
               tail, [&](std::int64_t i) { return test::value_at(x, offset + i); },
               [&](std::int64_t i) { return ref.o.data<double>()[offset + i]; })
        .normalized();
  };
  EXPECT_LE(tail_error(r.o), f32_tolerance(tail_error(base.o)));
}

// ---------------------------------------------------------------------------------------------
// Exact cases: inputs whose every intermediate is a small integer, so float32 must be exact.
// ---------------------------------------------------------------------------------------------

// One-hot keys (repeats allowed), beta in {0, 1}, g = 0, integer q, v and h0, scale 1: the
// delta rule overwrites row key_t of S with v_t; T^-1 has entries in {-1, 0, 1}.
Problem integer_problem(std::uint64_t seed, double beta_one_fraction) {
  ProblemSpec spec;
  spec.lengths = {1, 64, 0, 131};
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 16;
  spec.dv = 24;
  spec.initial_state = true;
  spec.seed = seed;
  Problem p = make_problem(spec);
  test::Random rng(seed);
  auto integer = [&rng](double lo, double hi) { return std::floor(rng.uniform(lo, hi + 1)); };
  float* q = p.q.data<float>();
  float* k = p.k.data<float>();
  const std::int64_t rows = p.q.numel() / spec.dk;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto hot = static_cast<std::int64_t>(integer(0, spec.dk - 1));
    for (std::int64_t d = 0; d < spec.dk; ++d) {
      k[r * spec.dk + d] = d == hot ? 1.0f : 0.0f;
      q[r * spec.dk + d] = static_cast<float>(integer(-3, 3));
    }
  }
  for (std::int64_t i = 0; i < p.v.numel(); ++i)
    p.v.data<float>()[i] = static_cast<float>(integer(-8, 8));
  for (std::int64_t i = 0; i < p.h0.numel(); ++i)
    p.h0.data<float>()[i] = static_cast<float>(integer(-8, 8));
  for (std::int64_t i = 0; i < p.g.numel(); ++i) {
    p.g.data<float>()[i] = 0.0f;
    p.beta.data<float>()[i] = rng.uniform() < beta_one_fraction ? 1.0f : 0.0f;
  }
  return p;
}

TEST(CpuForward, IntegerInputsAreExact) {
  for (double fraction : {0.0, 0.5, 1.0}) {  // beta = 0 everywhere, mixed, beta = 1 everywhere
    const Problem p = integer_problem(11, fraction);
    ForwardOptions options;
    options.scale = 1.0;
    options.chunk_size = 16;
    const ForwardResult ref = ref::recurrent_fwd(p.inputs(), options);
    for (CpuIsa isa : compiled_isas()) {
      for (Algorithm algorithm : {Algorithm::chunked, Algorithm::recurrent}) {
        ForwardOptions o = options;
        o.isa = isa;
        o.algorithm = algorithm;
        const ForwardResult r = chunk_gated_delta_rule_fwd(p.inputs(), o);
        const std::string what =
            variant(isa, algorithm) + ", beta = 1 fraction " + std::to_string(fraction);
        const bench::ErrorStats so = test::compare(r.o, ref.o);
        const bench::ErrorStats sh = test::compare(r.final_state, ref.final_state);
        EXPECT_EQ(so.max_abs, 0.0) << "o, " << what << ": " << so.summary();
        EXPECT_EQ(sh.max_abs, 0.0) << "final_state, " << what << ": " << sh.summary();
        if (fraction == 0.0) {  // beta = 0: nothing written, the state passes through
          EXPECT_TRUE(test::bit_identical(r.final_state, p.h0, "final_state = h0, " + what));
        }
      }
    }
  }
}

// beta = 1, g = 0 and orthonormal keys: querying a written key returns its value.
TEST(CpuForward, OrthonormalKeysRetrieve) {
  const std::int64_t dk = 16, dv = 8, writes = 16, total = 2 * writes;
  Tensor q(DType::f32, {total, 1, dk}), k(DType::f32, {total, 1, dk}),
      v(DType::f32, {total, 1, dv});
  Tensor g(DType::f32, {total, 1}), beta(DType::f32, {total, 1});
  test::Random rng(3);
  std::vector<double> w(dk);
  double ww = 0;
  for (double& x : w) {
    x = rng.normal();
    ww += x * x;
  }
  for (std::int64_t t = 0; t < total; ++t) {
    const std::int64_t row = t < writes ? t : (t * 7) % writes;
    for (std::int64_t d = 0; d < dk; ++d) {
      const double key = (row == d ? 1.0 : 0.0) - 2 * w[row] * w[d] / ww;  // Householder rows
      k.data<float>()[t * dk + d] = static_cast<float>(key);
      q.data<float>()[t * dk + d] = static_cast<float>(key);
    }
    for (std::int64_t e = 0; e < dv; ++e)
      v.data<float>()[t * dv + e] = static_cast<float>(rng.normal());
    beta.data<float>()[t] = t < writes ? 1.0f : 0.0f;
  }
  const ForwardInputs in{q.view(), k.view(), v.view(), g.view(), beta.view(), {}, {}};
  for (CpuIsa isa : compiled_isas()) {
    for (Algorithm algorithm : {Algorithm::chunked, Algorithm::recurrent}) {
      ForwardOptions o;
      o.scale = 1.0;
      o.isa = isa;
      o.algorithm = algorithm;
      o.chunk_size = 8;
      const ForwardResult r = chunk_gated_delta_rule_fwd(in, o);
      for (std::int64_t t = writes; t < total; ++t) {
        const std::int64_t row = (t * 7) % writes;
        for (std::int64_t e = 0; e < dv; ++e) {
          // Keys are orthonormal only to float32 rounding: ~1e-6 of |v|.
          EXPECT_NEAR(r.o.data<float>()[t * dv + e], v.data<float>()[row * dv + e], 2e-5)
              << variant(isa, algorithm) << " token " << t;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Residuals.
// ---------------------------------------------------------------------------------------------

TEST(CpuForward, ResidualsMatchReference) {
  ProblemSpec spec;
  spec.lengths = {130, 0, 64, 5};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 32;
  spec.dv = 40;
  spec.initial_state = true;
  spec.l2norm = true;
  const Problem p = make_problem(spec);
  ForwardOptions options = p.options();
  options.chunk_size = 32;
  const ForwardResult ref_states = ref::recurrent_fwd(p.inputs(), options, Residuals::all);
  const ForwardResult ref_chunked = ref::chunked_fwd(p.inputs(), options, Residuals::all);
  const ForwardResult base = test::baseline_f32(p, options);
  const double tol =
      f32_tolerance(test::compare(base.final_state, ref_states.final_state).normalized());
  ASSERT_EQ(ref_states.chunk_states.size(0), 5 + 0 + 2 + 1);
  for (CpuIsa isa : compiled_isas()) {
    ForwardOptions o = options;
    o.isa = isa;
    const ForwardResult r = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
    ASSERT_EQ(r.chunk_states.dtype(), DType::f32);
    EXPECT_TRUE(test::within(r.chunk_states, ref_states.chunk_states, tol,
                             std::string("chunk_states vs the recurrence, ") + cpu_isa_name(isa)));
    EXPECT_TRUE(test::within(r.t_inv, ref_chunked.t_inv, 64 * kEpsF32,
                             std::string("t_inv, ") + cpu_isa_name(isa)));
    // Padding of the short chunks is exactly zero (chunk 4 has 2 tokens, chunk 7 has 5).
    for (std::int64_t chunk : {4, 7}) {
      const std::int64_t n = chunk == 4 ? 2 : 5;
      for (std::int64_t h = 0; h < spec.hv; ++h) {
        const float* a = r.t_inv.data<float>() + (chunk * spec.hv + h) * 32 * 32;
        for (std::int64_t i = 0; i < 32; ++i) {
          for (std::int64_t j = 0; j < 32; ++j) {
            if (i >= n || j >= n) {
              ASSERT_EQ(a[i * 32 + j], 0.0f) << "chunk " << chunk << " [" << i << ", " << j << "]";
            }
          }
        }
      }
    }
    // Chunk 0's entering state is h0 itself, exactly.
    for (std::int64_t e = 0; e < spec.hv * spec.dk * spec.dv; ++e) {
      ASSERT_EQ(r.chunk_states.data<float>()[e], p.h0.data<float>()[e]);
    }
  }
}

// The recurrent algorithm can keep chunk_states too (but forms no T^-1).
TEST(CpuForward, RecurrentKeepsChunkStates) {
  ProblemSpec spec;
  spec.lengths = {100, 40};
  spec.l2norm = true;
  spec.initial_state = true;
  const Problem p = make_problem(spec);
  ForwardOptions o = p.options();
  o.algorithm = Algorithm::recurrent;
  const ForwardResult r = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
  EXPECT_FALSE(r.t_inv.present());
  const ForwardResult ref = ref::recurrent_fwd(p.inputs(), p.options(), Residuals::all);
  const ForwardResult base = test::baseline_f32(p, p.options());
  EXPECT_TRUE(
      test::within(r.chunk_states, ref.chunk_states,
                   f32_tolerance(test::compare(base.final_state, ref.final_state).normalized()),
                   "chunk_states"));
}

// ---------------------------------------------------------------------------------------------
// Properties.
// ---------------------------------------------------------------------------------------------

// Running T1 tokens, then the other T - T1 with the state carried, equals running T at once:
// bit for bit when the split falls on a chunk boundary (or with the token recurrence), within
// tolerance otherwise.
TEST(CpuForward, ContinuationEqualsOneCall) {
  ProblemSpec spec;
  spec.lengths = {300};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 32;
  spec.dv = 32;
  spec.initial_state = true;
  spec.l2norm = true;
  const Problem p = make_problem(spec);
  const std::int64_t T = 300;
  for (CpuIsa isa : compiled_isas()) {
    for (Algorithm algorithm : {Algorithm::chunked, Algorithm::recurrent}) {
      ForwardOptions o = p.options();
      o.isa = isa;
      o.algorithm = algorithm;
      const ForwardResult whole = chunk_gated_delta_rule_fwd(p.inputs(), o);
      for (std::int64_t t1 : {64, 128, 1, 100, 299}) {
        const ForwardInputs& in = p.inputs();
        auto rows = [](const TensorView& x, std::int64_t from, std::int64_t count) {
          TensorView s = x;
          s.data = static_cast<const char*>(x.data) + from * x.strides[0] * dtype_size(x.dtype);
          s.sizes[0] = count;
          return s;
        };
        const ForwardInputs first{rows(in.q, 0, t1),
                                  rows(in.k, 0, t1),
                                  rows(in.v, 0, t1),
                                  rows(in.g, 0, t1),
                                  rows(in.beta, 0, t1),
                                  in.initial_state,
                                  {}};
        const ForwardResult a = chunk_gated_delta_rule_fwd(first, o);
        const ForwardInputs second{rows(in.q, t1, T - t1),
                                   rows(in.k, t1, T - t1),
                                   rows(in.v, t1, T - t1),
                                   rows(in.g, t1, T - t1),
                                   rows(in.beta, t1, T - t1),
                                   a.final_state.view(),
                                   {}};
        const ForwardResult b = chunk_gated_delta_rule_fwd(second, o);
        Tensor joined(DType::f32, {T, spec.hv, spec.dv});
        std::memcpy(joined.raw(), a.o.raw(), a.o.bytes());
        std::memcpy(static_cast<char*>(joined.raw()) + a.o.bytes(), b.o.raw(), b.o.bytes());
        const std::string what = variant(isa, algorithm) + ", split at " + std::to_string(t1);
        if (t1 % 64 == 0 || algorithm == Algorithm::recurrent) {
          EXPECT_TRUE(test::bit_identical(joined, whole.o, "o, " + what));
          EXPECT_TRUE(
              test::bit_identical(b.final_state, whole.final_state, "final_state, " + what));
        } else {
          const ForwardResult ref = ref::recurrent_fwd(p.inputs(), p.options());
          const ForwardResult base = test::baseline_f32(p, p.options());
          EXPECT_TRUE(test::within(joined, ref.o,
                                   f32_tolerance(test::compare(base.o, ref.o).normalized()),
                                   "o, " + what));
        }
      }
    }
  }
}

// Also covers the grouping of value heads into work items, which follows the thread count:
// here (r = 3 value heads per key head, 10 (sequence, key head) pairs) 1 to 3 threads run the
// 3 value heads of a key head in one item, 7 threads run one value head per item.
TEST(CpuForward, BitIdenticalForAnyThreadCount) {
  ProblemSpec spec;
  spec.lengths = {200, 3, 0, 90, 64};
  spec.hk = 2;
  spec.hv = 6;
  spec.dk = 32;
  spec.dv = 24;
  spec.initial_state = true;
  spec.l2norm = true;
  const Problem p = make_problem(spec);
  for (CpuIsa isa : compiled_isas()) {
    for (Algorithm algorithm : {Algorithm::automatic, Algorithm::chunked, Algorithm::recurrent}) {
      ForwardOptions o = p.options();
      o.isa = isa;
      o.algorithm = algorithm;
      o.threads = 1;
      const ForwardResult one = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
      for (int threads : {2, 3, 7}) {
        o.threads = threads;
        const ForwardResult r = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
        const std::string what =
            variant(isa, algorithm) + ", " + std::to_string(threads) + " threads";
        EXPECT_TRUE(test::bit_identical(r.o, one.o, "o, " + what));
        EXPECT_TRUE(test::bit_identical(r.final_state, one.final_state, "final_state, " + what));
        EXPECT_TRUE(test::bit_identical(r.chunk_states, one.chunk_states, "chunk_states, " + what));
        if (algorithm != Algorithm::recurrent) {
          EXPECT_TRUE(test::bit_identical(r.t_inv, one.t_inv, "t_inv, " + what));
        }
      }
    }
  }
}

// Non-contiguous inputs and outputs (padded rows, transposed storage, interleaved and reversed
// elements) give bit for bit the result of the contiguous call.
TEST(CpuForward, StridedViewsEqualContiguous) {
  ProblemSpec spec;
  spec.lengths = {70, 33};
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 16;
  spec.dv = 12;
  spec.initial_state = true;
  spec.l2norm = true;
  const Problem p = make_problem(spec);
  const std::int64_t T = 103, N = 2, hk = 2, hv = 4, dk = 16, dv = 12;
  const float* q = p.q.data<float>();
  const float* k = p.k.data<float>();
  const float* v = p.v.data<float>();
  const float* g = p.g.data<float>();
  const float* beta = p.beta.data<float>();
  const float* h0 = p.h0.data<float>();
  // q: rows padded to 2 dk. k: stored head-major [Hk][T][Dk]. v: elements interleaved with
  // junk (dim stride 2). g: stored [Hv][T]. beta: tokens in reverse order (negative stride).
  // h0: stored transposed, [N][Hv][Dv][Dk].
  std::vector<float> qs(T * hk * 2 * dk, NAN), ks(hk * T * dk), vs(T * hv * dv * 2, NAN),
      gs(hv * T), bs(T * hv), h0s(N * hv * dv * dk);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t h = 0; h < hk; ++h) {
      for (std::int64_t d = 0; d < dk; ++d) {
        qs[(t * hk + h) * 2 * dk + d] = q[(t * hk + h) * dk + d];
        ks[(h * T + t) * dk + d] = k[(t * hk + h) * dk + d];
      }
    }
    for (std::int64_t h = 0; h < hv; ++h) {
      for (std::int64_t e = 0; e < dv; ++e)
        vs[((t * hv + h) * dv + e) * 2] = v[(t * hv + h) * dv + e];
      gs[h * T + t] = g[t * hv + h];
      bs[(T - 1 - t) * hv + h] = beta[t * hv + h];
    }
  }
  for (std::int64_t s = 0; s < N * hv; ++s) {
    for (std::int64_t i = 0; i < dk; ++i) {
      for (std::int64_t e = 0; e < dv; ++e) h0s[(s * dv + e) * dk + i] = h0[(s * dk + i) * dv + e];
    }
  }
  const ForwardInputs strided{
      TensorView(qs.data(), {T, hk, dk}, {hk * 2 * dk, 2 * dk, 1}),
      TensorView(ks.data(), {T, hk, dk}, {dk, T * dk, 1}),
      TensorView(vs.data(), {T, hv, dv}, {hv * dv * 2, dv * 2, 2}),
      TensorView(gs.data(), {T, hv}, {1, T}),
      TensorView(bs.data() + (T - 1) * hv, {T, hv}, {-hv, 1}),
      TensorView(h0s.data(), {N, hv, dk, dv}, {hv * dv * dk, dv * dk, 1, dk}),
      p.cu_seqlens.view()};
  for (CpuIsa isa : compiled_isas()) {
    for (Algorithm algorithm : {Algorithm::chunked, Algorithm::recurrent}) {
      ForwardOptions o = p.options();
      o.isa = isa;
      o.algorithm = algorithm;
      const ForwardResult contiguous = chunk_gated_delta_rule_fwd(p.inputs(), o);
      // Outputs strided too: o with padded heads, final_state transposed.
      std::vector<float> os(T * hv * (dv + 3), -1.0f), hts(N * hv * dv * dk);
      chunk_gated_delta_rule_fwd(
          strided,
          {MutableTensorView(os.data(), {T, hv, dv}, {hv * (dv + 3), dv + 3, 1}),
           MutableTensorView(hts.data(), {N, hv, dk, dv}, {hv * dv * dk, dv * dk, 1, dk}),
           {},
           {}},
          o);
      const std::string what = variant(isa, algorithm);
      for (std::int64_t t = 0; t < T; ++t) {
        for (std::int64_t h = 0; h < hv; ++h) {
          for (std::int64_t e = 0; e < dv; ++e) {
            ASSERT_EQ(os[(t * hv + h) * (dv + 3) + e],
                      contiguous.o.data<float>()[(t * hv + h) * dv + e])
                << what << " o[" << t << ", " << h << ", " << e << "]";
          }
          for (std::int64_t e = dv; e < dv + 3; ++e)
            ASSERT_EQ(os[(t * hv + h) * (dv + 3) + e], -1.0f) << "padding written";
        }
      }
      for (std::int64_t s = 0; s < N * hv; ++s) {
        for (std::int64_t i = 0; i < dk; ++i) {
          for (std::int64_t e = 0; e < dv; ++e) {
            ASSERT_EQ(hts[(s * dv + e) * dk + i],
                      contiguous.final_state.data<float>()[(s * dk + i) * dv + e])
                << what;
          }
        }
      }
    }
  }
}

// A dense [B, T, H, D] batch is the packed case with equal lengths, bit for bit.
TEST(CpuForward, BatchedLayoutEqualsPacked) {
  ProblemSpec spec;
  spec.lengths = {77, 77, 77};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 16;
  spec.dv = 16;
  spec.initial_state = true;
  spec.l2norm = true;
  const Problem packed = make_problem(spec);
  spec.batched = true;
  const Problem batched = make_problem(spec);  // same seed: same values, [B, T, ...] shapes
  for (Algorithm algorithm : {Algorithm::chunked, Algorithm::recurrent}) {
    ForwardOptions o = packed.options();
    o.algorithm = algorithm;
    const ForwardResult a = chunk_gated_delta_rule_fwd(packed.inputs(), o);
    const ForwardResult b = chunk_gated_delta_rule_fwd(batched.inputs(), o);
    ASSERT_EQ(b.o.rank(), 4);
    EXPECT_EQ(std::memcmp(a.o.raw(), b.o.raw(), a.o.bytes()), 0) << algorithm_name(algorithm);
    EXPECT_TRUE(test::bit_identical(a.final_state, b.final_state, "final_state"));
  }
}

// final_state may be the very view of initial_state: the update happens in place.
TEST(CpuForward, InPlaceStateUpdate) {
  ProblemSpec spec;
  spec.lengths = {90, 0, 17};
  spec.initial_state = true;
  spec.l2norm = true;
  const Problem p = make_problem(spec);
  for (Algorithm algorithm : {Algorithm::chunked, Algorithm::recurrent}) {
    ForwardOptions o = p.options();
    o.algorithm = algorithm;
    const ForwardResult expected = chunk_gated_delta_rule_fwd(p.inputs(), o);
    Tensor state(DType::f32, 4, p.h0.sizes());
    std::memcpy(state.raw(), p.h0.raw(), p.h0.bytes());
    ForwardInputs in = p.inputs();
    in.initial_state = state.view();
    Tensor out(DType::f32, 3, expected.o.sizes());
    chunk_gated_delta_rule_fwd(in, {out.mutable_view(), state.mutable_view(), {}, {}}, o);
    EXPECT_TRUE(test::bit_identical(out, expected.o, "o"));
    EXPECT_TRUE(test::bit_identical(state, expected.final_state, "state updated in place"));
  }
}

// Zero-length sequences pass their state through unchanged; T = 0 is a valid call.
TEST(CpuForward, ZeroLengthSequences) {
  ProblemSpec spec;
  spec.lengths = {0, 5, 0};
  spec.initial_state = true;
  const Problem p = make_problem(spec);
  const std::int64_t per_seq = spec.hv * spec.dk * spec.dv;
  for (Algorithm algorithm : {Algorithm::chunked, Algorithm::recurrent}) {
    ForwardOptions o = p.options();
    o.algorithm = algorithm;
    const ForwardResult r = chunk_gated_delta_rule_fwd(p.inputs(), o);
    for (std::int64_t s : {0, 2}) {
      EXPECT_EQ(std::memcmp(r.final_state.data<float>() + s * per_seq,
                            p.h0.data<float>() + s * per_seq, per_seq * sizeof(float)),
                0)
          << "sequence " << s;
    }
  }
  spec.lengths = {0};
  const Problem empty = make_problem(spec);
  const ForwardResult r =
      chunk_gated_delta_rule_fwd(empty.inputs(), empty.options(), Residuals::all);
  EXPECT_EQ(r.o.numel(), 0);
  EXPECT_EQ(r.chunk_states.numel(), 0);
  EXPECT_TRUE(test::bit_identical(r.final_state, empty.h0, "T = 0"));
}

// Without o the forward writes the same final states and residuals, bit for bit (what a JAX
// remat backward asks of it when o is saved or unused): every ISA variant, both algorithms,
// bf16 operands, the float64 reference; short last chunks, a zero-length sequence, Dk != Dv.
TEST(CpuForward, WithoutOutputWritesTheSameStatesAndResiduals) {
  ProblemSpec spec;
  spec.lengths = {130, 0, 64, 5};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 32;
  spec.dv = 40;
  spec.initial_state = true;
  spec.l2norm = true;
  const Problem p = make_problem(spec);
  auto check = [&](const ForwardResult& with_o, DType dtype, const ForwardOptions& o,
                   bool has_t_inv, auto&& run, const std::string& what) {
    Tensor ht(dtype, 4, with_o.final_state.sizes());
    Tensor states(dtype, 4, with_o.chunk_states.sizes());
    Tensor t_inv = has_t_inv ? Tensor(dtype, 4, with_o.t_inv.sizes()) : Tensor();
    run(p.inputs(),
        ForwardOutputs{{},
                       ht.mutable_view(),
                       states.mutable_view(),
                       has_t_inv ? t_inv.mutable_view() : MutableTensorView()},
        o);
    EXPECT_TRUE(test::bit_identical(ht, with_o.final_state, what + ": final_state"));
    EXPECT_TRUE(test::bit_identical(states, with_o.chunk_states, what + ": chunk_states"));
    if (has_t_inv) {
      EXPECT_TRUE(test::bit_identical(t_inv, with_o.t_inv, what + ": t_inv"));
    }
  };
  auto cpu = [](const ForwardInputs& in, const ForwardOutputs& out, const ForwardOptions& o) {
    chunk_gated_delta_rule_fwd(in, out, o);
  };
  for (CpuIsa isa : compiled_isas()) {
    for (Algorithm algorithm : {Algorithm::chunked, Algorithm::recurrent}) {
      for (MatmulPrecision precision : {MatmulPrecision::compute, MatmulPrecision::bf16}) {
        if (algorithm == Algorithm::recurrent && precision == MatmulPrecision::bf16) continue;
        ForwardOptions o = p.options();
        o.chunk_size = 32;
        o.isa = isa;
        o.algorithm = algorithm;
        o.matmul_precision = precision;
        const bool chunked = algorithm == Algorithm::chunked;
        const ForwardResult with_o = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
        check(
            with_o, DType::f32, o, chunked, cpu,
            variant(isa, algorithm) + (precision == MatmulPrecision::bf16 ? " bf16 operands" : ""));
      }
    }
  }
  ForwardOptions o = p.options();
  o.chunk_size = 32;
  const ForwardResult ref_o = ref::chunked_fwd(p.inputs(), o, Residuals::all);
  check(
      ref_o, DType::f64, o, true,
      [](const ForwardInputs& in, const ForwardOutputs& out, const ForwardOptions& opt) {
        ref::chunked_fwd(in, out, opt);
      },
      "reference, chunked");
  const ForwardResult ref_rec = ref::recurrent_fwd(p.inputs(), o, Residuals::all);
  check(
      ref_rec, DType::f64, o, false,
      [](const ForwardInputs& in, const ForwardOutputs& out, const ForwardOptions& opt) {
        ref::recurrent_fwd(in, out, opt);
      },
      "reference, recurrent");
}

// The forced-ISA environment variable and option reach the dispatch.
TEST(CpuForward, UnavailableIsaIsAClearError) {
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512_bf16}) {
    if (cpu_isa_available(isa)) continue;
    const Problem p = make_problem({});
    ForwardOptions o;
    o.isa = isa;
    EXPECT_THROW(chunk_gated_delta_rule_fwd(p.inputs(), o), RuntimeError);
  }
  EXPECT_EQ(resolve_cpu_isa(CpuIsa::generic), CpuIsa::generic);
}

}  // namespace
}  // namespace gdn
