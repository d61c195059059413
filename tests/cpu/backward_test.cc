// backward_test.cc: the CPU backward (every compiled ISA variant, float32 and float64) against
// the float64 reference backward, and the properties it promises: every remat policy gives
// bit-identical gradients (including the checkpointed rebuild of long sequences), no gradient
// crosses a sequence boundary, determinism across thread counts, the batched layout.
//
// Tolerance (docs/numerics.md): a float32 gradient passes when its error is at most
// 8 x (the error of a plain float32 reverse-mode recurrence on the same inputs + 8 eps_f32).
#include <gtest/gtest.h>

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
using test::Shape;

constexpr double kEpsF32 = 1.1920928955078125e-07;
constexpr double kBaselineFactor = 8.0;
constexpr double kF64Tolerance = 1e-12;

double f32_tolerance(double baseline_error) {
  return kBaselineFactor * (baseline_error + 8 * kEpsF32);
}

std::vector<CpuIsa> compiled_isas() { return test::runnable_isas(); }

BackwardInputs backward_inputs(const Problem& p, const test::Cotangents& c, bool dht) {
  return {p.q.view(),
          p.k.view(),
          p.v.view(),
          p.g.view(),
          p.beta.view(),
          p.h0.view(),
          p.cu_seqlens.view(),
          c.d_o.view(),
          dht ? c.d_ht.view() : TensorView{},
          {},
          {}};
}

struct Grads {
  const Tensor* t[6];
};
Grads grads(const BackwardResult& r) {
  return {{&r.dq, &r.dk, &r.dv, &r.dg, &r.dbeta, &r.d_initial_state}};
}
const char* const kNames[6] = {"dq", "dk", "dv", "dg", "dbeta", "d_initial_state"};

::testing::AssertionResult all_bit_identical(const BackwardResult& a, const BackwardResult& b,
                                             const std::string& what) {
  for (int i = 0; i < 6; ++i) {
    auto r =
        test::bit_identical(*grads(a).t[i], *grads(b).t[i], std::string(kNames[i]) + ", " + what);
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

class BackwardMatchesReference
    : public ::testing::TestWithParam<std::tuple<Shape, double, bool, bool, bool>> {};

TEST_P(BackwardMatchesReference, Float32) {
  const auto& [shape, g_lo, h0, l2norm, dht] = GetParam();
  ProblemSpec spec = test::spec_for(shape);
  spec.g_lo = g_lo;
  spec.initial_state = h0;
  spec.l2norm = l2norm;
  const Problem p = make_problem(spec);
  const test::Cotangents c = test::make_cotangents(p, 17);
  const BackwardInputs in = backward_inputs(p, c, dht);
  const BackwardResult ref = ref::recurrent_bwd(in, p.options());
  const Tensor no_dht;
  const BackwardResult base = test::baseline_f32_bwd(p, c.d_o, dht ? c.d_ht : no_dht, p.options());
  const ForwardResult fwd = chunk_gated_delta_rule_fwd(p.inputs(), p.options(), Residuals::all);
  BackwardInputs with_residuals = in;
  with_residuals.chunk_states = fwd.chunk_states.view();
  with_residuals.t_inv = fwd.t_inv.view();
  for (CpuIsa isa : compiled_isas()) {
    ForwardOptions o = p.options();
    o.isa = isa;
    const BackwardResult r =
        chunk_gated_delta_rule_bwd(isa == CpuIsa::generic ? in : with_residuals, o);
    for (int i = 0; i < 6; ++i) {
      const double tol =
          f32_tolerance(test::compare(*grads(base).t[i], *grads(ref).t[i]).normalized());
      EXPECT_TRUE(test::within(*grads(r).t[i], *grads(ref).t[i], tol,
                               std::string(kNames[i]) + ", " + cpu_isa_name(isa) + ", " +
                                   spec.name() + (dht ? ", d_final_state" : "")));
    }
  }
}

TEST_P(BackwardMatchesReference, Float64) {
  const auto& [shape, g_lo, h0, l2norm, dht] = GetParam();
  ProblemSpec spec = test::spec_for(shape, DType::f64);
  spec.g_lo = g_lo;
  spec.initial_state = h0;
  spec.l2norm = l2norm;
  const Problem p = make_problem(spec);
  const test::Cotangents c = test::make_cotangents(p, 17);
  const BackwardInputs in = backward_inputs(p, c, dht);
  const BackwardResult ref = ref::recurrent_bwd(in, p.options());
  for (CpuIsa isa : compiled_isas()) {
    ForwardOptions o = p.options();
    o.isa = isa;
    const BackwardResult r = chunk_gated_delta_rule_bwd(in, o);
    for (int i = 0; i < 6; ++i) {
      ASSERT_EQ(grads(r).t[i]->dtype(), DType::f64);
      EXPECT_TRUE(
          test::within(*grads(r).t[i], *grads(ref).t[i], kF64Tolerance,
                       std::string(kNames[i]) + ", " + cpu_isa_name(isa) + ", " + spec.name()));
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<BackwardMatchesReference::ParamType>& param) {
  const auto& [shape, g_lo, h0, l2norm, dht] = param.param;
  return test::shape_name(shape) + "_Glo" + test::number_name(g_lo) + "_" +
         test::flag_name(h0, "H0") + "_" + test::flag_name(l2norm, "L2norm") + "_" +
         test::flag_name(dht, "Dht");
}

INSTANTIATE_TEST_SUITE_P(
    Spec8, BackwardMatchesReference,
    ::testing::Combine(::testing::Values(Shape{{1}, 2, 2, 32, 32},      // one token
                                         Shape{{63}, 1, 2, 64, 32},     // C - 1, GVA 2
                                         Shape{{64}, 2, 4, 32, 48},     // C, Dk != Dv
                                         Shape{{65}, 1, 4, 48, 64},     // C + 1, GVA 4
                                         Shape{{127}, 2, 2, 128, 128},  // model head dims
                                         Shape{{1000}, 1, 2, 64, 96},   // many chunks
                                         Shape{{200, 0, 63, 1, 129}, 2, 4, 40, 24},  // packed
                                         Shape{{70}, 3, 3, 17, 5}),                  // odd sizes
                       ::testing::Values(-1.0, -20.0),  // g in [g_lo, 0]
                       ::testing::Bool(),               // initial state
                       ::testing::Bool(),               // L2 norm in the kernel
                       ::testing::Bool()),              // d_final_state given
    case_name);

// Chunk sizes other than 64 and a custom scale.
TEST(CpuBackward, ChunkSizesAndScale) {
  ProblemSpec spec;
  spec.lengths = {150, 33};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 24;
  spec.dv = 16;
  spec.initial_state = true;
  spec.l2norm = true;
  const Problem p = make_problem(spec);
  const test::Cotangents c = test::make_cotangents(p, 3);
  const BackwardInputs in = backward_inputs(p, c, true);
  ForwardOptions options = p.options();
  options.scale = 0.3;
  const BackwardResult ref = ref::recurrent_bwd(in, options);
  const BackwardResult base = test::baseline_f32_bwd(p, c.d_o, c.d_ht, options);
  for (int chunk : {1, 7, 16, 32, 100, 256}) {
    ForwardOptions o = options;
    o.chunk_size = chunk;
    const BackwardResult r = chunk_gated_delta_rule_bwd(in, o);
    for (int i = 0; i < 6; ++i) {
      EXPECT_TRUE(test::within(
          *grads(r).t[i], *grads(ref).t[i],
          f32_tolerance(test::compare(*grads(base).t[i], *grads(ref).t[i]).normalized()),
          std::string(kNames[i]) + ", chunk " + std::to_string(chunk)));
    }
  }
}

// The L2-norm backward reads x_hat off the packed rows (Q~ = scale x_hat): a negative scale
// and a zero one (Q~ = 0, so dq = 0) must still give the reference's gradients, on every
// variant, with a head dim that leaves padding in the rows.
TEST(CpuBackward, L2NormBackwardWithNegativeAndZeroScale) {
  ProblemSpec spec;
  spec.lengths = {90, 7};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 20;
  spec.dv = 12;
  spec.initial_state = true;
  spec.l2norm = true;
  const Problem p = make_problem(spec);
  const test::Cotangents c = test::make_cotangents(p, 5);
  const BackwardInputs in = backward_inputs(p, c, true);
  for (double scale : {-0.4, 0.0}) {
    ForwardOptions options = p.options();
    options.scale = scale;
    options.chunk_size = 32;
    const BackwardResult ref = ref::recurrent_bwd(in, options);
    const BackwardResult base = test::baseline_f32_bwd(p, c.d_o, c.d_ht, options);
    for (CpuIsa isa : compiled_isas()) {
      ForwardOptions o = options;
      o.isa = isa;
      const BackwardResult r = chunk_gated_delta_rule_bwd(in, o);
      for (int i = 0; i < 6; ++i) {
        EXPECT_TRUE(test::within(
            *grads(r).t[i], *grads(ref).t[i],
            f32_tolerance(test::compare(*grads(base).t[i], *grads(ref).t[i]).normalized()),
            std::string(kNames[i]) + ", scale " + std::to_string(scale) + ", " +
                cpu_isa_name(isa)));
      }
      if (scale == 0.0) {
        const float* dq = r.dq.data<float>();
        bool zero = true;
        for (std::int64_t e = 0; e < r.dq.numel(); ++e) zero = zero && dq[e] == 0.0f;
        EXPECT_TRUE(zero) << "dq at scale 0, " << cpu_isa_name(isa);
      }
    }
  }
}

// Keep both residuals, t_inv only, chunk_states only, or nothing: the same gradients, bit for
// bit, on every variant.
TEST(CpuBackward, RematPoliciesAreBitIdentical) {
  ProblemSpec spec;
  spec.lengths = {130, 0, 64, 5, 77};
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 32;
  spec.dv = 24;
  spec.initial_state = true;
  spec.l2norm = true;
  spec.g_lo = -5;
  for (DType dtype : {DType::f32, DType::f64}) {
    spec.dtype = dtype;
    const Problem p = make_problem(spec);
    const test::Cotangents c = test::make_cotangents(p, 8);
    for (CpuIsa isa : compiled_isas()) {
      ForwardOptions o = p.options();
      o.isa = isa;
      o.chunk_size = 16;
      const ForwardResult fwd = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
      BackwardInputs in = backward_inputs(p, c, true);
      const BackwardResult none = chunk_gated_delta_rule_bwd(in, o);
      in.t_inv = fwd.t_inv.view();
      const BackwardResult t_inv = chunk_gated_delta_rule_bwd(in, o);
      in.chunk_states = fwd.chunk_states.view();
      const BackwardResult all = chunk_gated_delta_rule_bwd(in, o);
      in.t_inv = {};
      const BackwardResult states = chunk_gated_delta_rule_bwd(in, o);
      const std::string what = std::string(cpu_isa_name(isa)) + ", " + dtype_name(dtype);
      EXPECT_TRUE(all_bit_identical(none, all, "none vs all, " + what));
      EXPECT_TRUE(all_bit_identical(t_inv, all, "t_inv vs all, " + what));
      EXPECT_TRUE(all_bit_identical(states, all, "chunk_states only vs all, " + what));
    }
  }
}

// A sequence long enough that its rebuilt states exceed the rebuild budget (32 MiB): the
// backward checkpoints every ceil(sqrt(chunks)) chunks and rebuilds one segment at a time.
// Still bit-identical to the backward from kept residuals.
TEST(CpuBackward, CheckpointedRebuildIsBitIdentical) {
  ProblemSpec spec;
  spec.lengths = {9000};  // 563 chunks of 16 x 64 KiB states = 35 MiB
  spec.hk = 1;
  spec.hv = 1;
  spec.dk = 128;
  spec.dv = 128;
  spec.l2norm = true;
  spec.g_lo = -0.5;
  const Problem p = make_problem(spec);
  const test::Cotangents c = test::make_cotangents(p, 4);
  ForwardOptions o = p.options();
  o.chunk_size = 16;
  const ForwardResult fwd = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
  BackwardInputs in = backward_inputs(p, c, true);
  const BackwardResult none = chunk_gated_delta_rule_bwd(in, o);
  in.t_inv = fwd.t_inv.view();
  const BackwardResult t_inv = chunk_gated_delta_rule_bwd(in, o);
  in.chunk_states = fwd.chunk_states.view();
  const BackwardResult all = chunk_gated_delta_rule_bwd(in, o);
  EXPECT_TRUE(all_bit_identical(none, all, "none vs all"));
  EXPECT_TRUE(all_bit_identical(t_inv, all, "t_inv vs all"));
}

// Residuals past 32 MiB go out with non-temporal stores (src/cpu/chunked_fwd-inl.h): the
// states and T^-1 they hold are the ones the smaller, cached path writes. A chunk state is the
// final state of a forward over the tokens before it; T^-1 of a chunk is that of a sequence of
// the chunk's tokens alone; and the backward from them equals the backward that rebuilds both.
TEST(CpuBackward, StreamedResidualsAreBitIdentical) {
  ProblemSpec spec;
  spec.lengths = {4096};  // 128 chunks of 32 x 4 heads x (64 + 4) KiB = 34 MiB
  spec.hk = 1;
  spec.hv = 4;
  spec.dk = 128;
  spec.dv = 128;
  spec.l2norm = true;
  spec.g_lo = -0.5;
  const Problem p = make_problem(spec);
  const test::Cotangents c = test::make_cotangents(p, 5);
  for (CpuIsa isa : compiled_isas()) {
    ForwardOptions o = p.options();
    o.isa = isa;
    o.chunk_size = 32;
    const ForwardResult fwd = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
    ASSERT_GE(fwd.chunk_states.bytes() + fwd.t_inv.bytes(), std::size_t{32} << 20);
    const std::string what = cpu_isa_name(isa);
    // Tokens [from, from + count) of a [T, H, D] or [T, H] float32 tensor.
    const auto tokens = [](const Tensor& x, std::int64_t from, std::int64_t count) {
      const std::int64_t row = x.numel() / x.size(0);
      const float* at = x.data<float>() + from * row;
      return x.rank() == 3 ? TensorView(at, {count, x.size(1), x.size(2)})
                           : TensorView(at, {count, x.size(1)});
    };
    // Whether matrix `index` of a [n, Hv, R, C] float32 tensor equals matrix 0 of another.
    const auto same_matrix = [](const Tensor& a, std::int64_t index, const Tensor& b) {
      const std::int64_t block = a.numel() / a.size(0);
      return std::memcmp(a.data<float>() + index * block, b.data<float>(),
                         static_cast<std::size_t>(block) * sizeof(float)) == 0;
    };
    for (const std::int64_t chunk : {std::int64_t{1}, std::int64_t{77}, std::int64_t{127}}) {
      const std::int64_t t0 = chunk * 32;
      // The state entering the chunk: a forward over tokens [0, t0).
      const ForwardInputs prefix{tokens(p.q, 0, t0),
                                 tokens(p.k, 0, t0),
                                 tokens(p.v, 0, t0),
                                 tokens(p.g, 0, t0),
                                 tokens(p.beta, 0, t0),
                                 {},
                                 {}};
      const ForwardResult before = chunk_gated_delta_rule_fwd(prefix, o);
      EXPECT_TRUE(same_matrix(fwd.chunk_states, chunk, before.final_state))
          << "chunk state " << chunk << ", " << what;
      // T^-1 of the chunk: a forward over its 32 tokens alone.
      const ForwardInputs alone{tokens(p.q, t0, 32),
                                tokens(p.k, t0, 32),
                                tokens(p.v, t0, 32),
                                tokens(p.g, t0, 32),
                                tokens(p.beta, t0, 32),
                                {},
                                {}};
      const ForwardResult own = chunk_gated_delta_rule_fwd(alone, o, Residuals::all);
      EXPECT_TRUE(same_matrix(fwd.t_inv, chunk, own.t_inv)) << "t_inv " << chunk << ", " << what;
    }
    BackwardInputs in = backward_inputs(p, c, true);
    const BackwardResult none = chunk_gated_delta_rule_bwd(in, o);
    in.chunk_states = fwd.chunk_states.view();
    in.t_inv = fwd.t_inv.view();
    const BackwardResult all = chunk_gated_delta_rule_bwd(in, o);
    EXPECT_TRUE(all_bit_identical(none, all, "none vs streamed all, " + what));
  }
}

// Outputs past 32 MiB (o; dq, dk; dv) go out with non-temporal stores (src/cpu/io-inl.h:
// write_row), and the forward prefetches its next chunk's rows: each sequence of such a call
// gives, bit for bit, what the same sequence gives alone (16 MiB outputs: ordinary stores),
// forward and backward, in every variant.
TEST(CpuBackward, StreamedOutputsAreBitIdentical) {
  ProblemSpec spec;
  spec.lengths = {4096, 4096};  // [8192, 8 heads, 128] float32 = 32 MiB for o, dq, dk, dv
  spec.hk = 8;
  spec.hv = 8;
  spec.dk = 128;
  spec.dv = 128;
  spec.l2norm = true;
  spec.g_lo = -0.5;
  const Problem p = make_problem(spec);
  const test::Cotangents c = test::make_cotangents(p, 7);
  // Tokens [from, from + count) of a [T, H, D] or [T, H] float32 tensor.
  const auto tokens = [](const Tensor& x, std::int64_t from, std::int64_t count) {
    const std::int64_t row = x.numel() / x.size(0);
    const float* at = x.data<float>() + from * row;
    return x.rank() == 3 ? TensorView(at, {count, x.size(1), x.size(2)})
                         : TensorView(at, {count, x.size(1)});
  };
  // Whether tokens [from, from + count) of `big` equal all of `alone`.
  const auto same_tokens = [](const Tensor& big, std::int64_t from, const Tensor& alone) {
    const std::int64_t row = big.numel() / big.size(0);
    return std::memcmp(big.data<float>() + from * row, alone.data<float>(),
                       static_cast<std::size_t>(alone.numel()) * sizeof(float)) == 0;
  };
  for (CpuIsa isa : compiled_isas()) {
    ForwardOptions o = p.options();
    o.isa = isa;
    o.chunk_size = 64;
    o.algorithm = Algorithm::chunked;
    const std::string what = cpu_isa_name(isa);
    const ForwardResult fwd = chunk_gated_delta_rule_fwd(p.inputs(), o);
    ASSERT_GE(fwd.o.bytes(), std::size_t{32} << 20);
    const BackwardResult bwd = chunk_gated_delta_rule_bwd(backward_inputs(p, c, false), o);
    for (std::int64_t from : {std::int64_t{0}, std::int64_t{4096}}) {
      const ForwardInputs alone{tokens(p.q, from, 4096),
                                tokens(p.k, from, 4096),
                                tokens(p.v, from, 4096),
                                tokens(p.g, from, 4096),
                                tokens(p.beta, from, 4096),
                                {},
                                {}};
      const ForwardResult own = chunk_gated_delta_rule_fwd(alone, o);
      EXPECT_TRUE(same_tokens(fwd.o, from, own.o)) << "o from token " << from << ", " << what;
      BackwardInputs in = BackwardInputs::from(alone);
      in.d_o = tokens(c.d_o, from, 4096);
      const BackwardResult own_bwd = chunk_gated_delta_rule_bwd(in, o);
      const Grads big = grads(bwd), small = grads(own_bwd);
      for (int g = 0; g < 5; ++g) {
        EXPECT_TRUE(same_tokens(*big.t[g], from, *small.t[g]))
            << kNames[g] << " from token " << from << ", " << what;
      }
    }
  }
}

TEST(CpuBackward, BitIdenticalForAnyThreadCount) {
  ProblemSpec spec;
  spec.lengths = {200, 3, 0, 90, 64};
  spec.hk = 2;
  spec.hv = 6;
  spec.dk = 32;
  spec.dv = 24;
  spec.initial_state = true;
  spec.l2norm = true;
  const Problem p = make_problem(spec);
  const test::Cotangents c = test::make_cotangents(p, 5);
  const BackwardInputs in = backward_inputs(p, c, true);
  for (CpuIsa isa : compiled_isas()) {
    ForwardOptions o = p.options();
    o.isa = isa;
    o.threads = 1;
    const BackwardResult one = chunk_gated_delta_rule_bwd(in, o);
    for (int threads : {2, 3, 7}) {
      o.threads = threads;
      EXPECT_TRUE(all_bit_identical(
          chunk_gated_delta_rule_bwd(in, o), one,
          std::string(cpu_isa_name(isa)) + ", " + std::to_string(threads) + " threads"));
    }
  }
}

// Perturbing every input of sequence 2 (and its cotangents) leaves sequence 1's gradients bit
// for bit unchanged: nothing crosses a sequence boundary.
TEST(CpuBackward, NoGradientCrossesSequences) {
  ProblemSpec spec;
  spec.lengths = {100, 77};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 16;
  spec.dv = 16;
  spec.initial_state = true;
  spec.l2norm = true;
  Problem p = make_problem(spec);
  test::Cotangents c = test::make_cotangents(p, 6);
  const BackwardResult before =
      chunk_gated_delta_rule_bwd(backward_inputs(p, c, true), p.options());
  auto perturb = [](Tensor& t, std::int64_t from) {
    for (std::int64_t i = from; i < t.numel(); ++i)
      t.data<float>()[i] = t.data<float>()[i] * 0.5f + 0.25f;
  };
  perturb(p.q, 100 * 16);
  perturb(p.k, 100 * 16);
  perturb(p.v, 100 * 2 * 16);
  perturb(p.g, 100 * 2);
  perturb(p.beta, 100 * 2);
  perturb(p.h0, 2 * 16 * 16);
  perturb(c.d_o, 100 * 2 * 16);
  perturb(c.d_ht, 2 * 16 * 16);
  const BackwardResult after = chunk_gated_delta_rule_bwd(backward_inputs(p, c, true), p.options());
  const std::int64_t per_token[6] = {16, 16, 32, 2, 2, 0};
  for (int i = 0; i < 6; ++i) {
    const std::int64_t first_seq = i == 5 ? 2 * 16 * 16 : 100 * per_token[i];
    EXPECT_EQ(
        std::memcmp(grads(before).t[i]->raw(), grads(after).t[i]->raw(), first_seq * sizeof(float)),
        0)
        << kNames[i] << " of sequence 1 changed";
    EXPECT_NE(std::memcmp(grads(before).t[i]->data<float>() + first_seq,
                          grads(after).t[i]->data<float>() + first_seq,
                          (grads(before).t[i]->numel() - first_seq) * sizeof(float)),
              0)
        << kNames[i] << " of sequence 2 did not change: the perturbation reached nothing";
  }
}

// The dense [B, T, H, D] layout gives the packed layout's gradients bit for bit; a zero-length
// sequence passes d_final_state through to d_initial_state.
TEST(CpuBackward, BatchedLayoutAndZeroLength) {
  ProblemSpec spec;
  spec.lengths = {77, 77};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 16;
  spec.dv = 8;
  spec.initial_state = true;
  spec.l2norm = true;
  const Problem packed = make_problem(spec);
  spec.batched = true;
  const Problem batched = make_problem(spec);
  const test::Cotangents cp = test::make_cotangents(packed, 2);
  test::Cotangents cb = test::make_cotangents(batched, 2);
  const BackwardResult a =
      chunk_gated_delta_rule_bwd(backward_inputs(packed, cp, true), packed.options());
  const BackwardResult b =
      chunk_gated_delta_rule_bwd(backward_inputs(batched, cb, true), batched.options());
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(std::memcmp(grads(a).t[i]->raw(), grads(b).t[i]->raw(), grads(a).t[i]->bytes()), 0)
        << kNames[i];
  }
  spec.batched = false;
  spec.lengths = {0, 9, 0};
  const Problem z = make_problem(spec);
  const test::Cotangents cz = test::make_cotangents(z, 3);
  const BackwardResult r = chunk_gated_delta_rule_bwd(backward_inputs(z, cz, true), z.options());
  const std::int64_t per_seq = 2 * 16 * 8;
  for (std::int64_t s : {0, 2}) {
    EXPECT_EQ(std::memcmp(r.d_initial_state.data<float>() + s * per_seq,
                          cz.d_ht.data<float>() + s * per_seq, per_seq * sizeof(float)),
              0)
        << "sequence " << s;
  }
}

TEST(CpuBackward, ValidationErrors) {
  ProblemSpec spec;
  spec.lengths = {20, 12};
  spec.initial_state = true;
  const Problem p = make_problem(spec);
  const test::Cotangents c = test::make_cotangents(p, 1);
  BackwardInputs in = backward_inputs(p, c, true);
  BackwardResult out = chunk_gated_delta_rule_bwd(in, p.options());
  auto outputs = [&out]() {
    return BackwardOutputs{out.dq.mutable_view(),    out.dk.mutable_view(),
                           out.dv.mutable_view(),    out.dg.mutable_view(),
                           out.dbeta.mutable_view(), out.d_initial_state.mutable_view()};
  };
  auto expect_error = [&](const BackwardInputs& bad_in, const BackwardOutputs& bad_out,
                          const std::string& argument) {
    std::memset(out.dq.raw(), 0x5A, out.dq.bytes());
    try {
      chunk_gated_delta_rule_bwd(bad_in, bad_out, p.options());
      ADD_FAILURE() << "no error for a bad '" << argument << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
    for (std::size_t b = 0; b < out.dq.bytes(); ++b) {
      ASSERT_EQ(static_cast<unsigned char*>(out.dq.raw())[b], 0x5A)
          << "dq written before the error";
    }
  };
  BackwardInputs bad = in;
  bad.d_o.sizes[2] = 7;
  expect_error(bad, outputs(), "d_o");
  bad = in;
  bad.d_o = {};
  expect_error(bad, outputs(), "d_o");
  bad = in;
  bad.d_final_state.dtype = DType::f64;
  expect_error(bad, outputs(), "d_final_state");
  const ForwardResult fwd = chunk_gated_delta_rule_fwd(p.inputs(), p.options(), Residuals::all);
  bad = in;
  bad.t_inv = fwd.chunk_states.view();  // wrong shape
  expect_error(bad, outputs(), "t_inv");
  BackwardOutputs bad_out = outputs();
  bad_out.dv.sizes[1] = 1;
  expect_error(in, bad_out, "dv");
  bad_out = outputs();
  bad_out.dg = {};
  expect_error(in, bad_out, "dg");
  bad_out = outputs();
  bad_out.dbeta.data = const_cast<void*>(in.beta.data);  // a gradient over its own input
  expect_error(in, bad_out, "dbeta");
}

}  // namespace
}  // namespace gdn
