// Every fast-path op runs with subnormals as zero (src/cpu/float_env.h, docs/numerics.md
// "Subnormals"), whatever floating-point mode its caller has: the same inputs give the same
// bits from a plain thread and from one with FTZ and DAZ on (as XLA's threads run), and the
// caller's mode is left as it was. The problems carry subnormal inputs (which must read as
// zero) and strong decays (which drive products into the subnormal range), so a call that ran
// in its caller's mode would differ between the two.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define GDN_TEST_MXCSR 1
#endif

#include "common/compare.h"
#include "common/isas.h"
#include "common/layer_problem.h"
#include "common/problem.h"
#include "step_harness.h"

namespace gdn {
namespace {

constexpr float kSubnormal = 1e-39f;  // below FLT_MIN (1.18e-38)

#ifdef GDN_TEST_MXCSR
constexpr unsigned kFtzDaz = 0x8040;

// Runs fn with the calling thread's FTZ and DAZ bits set (or cleared), checks that fn left
// the mode as it found it, and restores the test's own mode.
template <class Fn>
auto in_caller_mode(bool flush, Fn&& fn) {
  const unsigned saved = _mm_getcsr();
  const unsigned mode = flush ? (saved | kFtzDaz) : (saved & ~kFtzDaz);
  _mm_setcsr(mode);
  auto result = fn();
  const unsigned after = _mm_getcsr();
  _mm_setcsr(saved);
  EXPECT_EQ(after & ~0x3Fu, mode & ~0x3Fu) << "the call changed its caller's MXCSR";  // not flags
  return result;
}
#endif

using Named = std::vector<std::pair<std::string, const Tensor*>>;

void expect_identical(const Named& a, const Named& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].second->present()) continue;
    EXPECT_TRUE(test::bit_identical(*a[i].second, *b[i].second, a[i].first + ", " + what));
  }
}

std::string case_name(CpuIsa isa, int threads) {
  return std::string(cpu_isa_name(isa)) + ", " + std::to_string(threads) + " threads";
}

test::Problem core_problem() {
  test::ProblemSpec spec;
  spec.lengths = {70, 1, 130};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 24;
  spec.dv = 20;
  spec.g_lo = -12.0;  // a chunk's decay from e^-12 per token down to e^-800
  spec.g_hi = 0.0;
  spec.initial_state = true;
  test::Problem p = test::make_problem(spec);
  // Value head 1 gets subnormal values: with them read as zero, its output is exactly zero.
  const std::int64_t t = p.v.size(0), hv = spec.hv, dv = spec.dv;
  for (std::int64_t i = 0; i < t; ++i) {
    for (std::int64_t c = 0; c < dv; ++c) p.v.data<float>()[(i * hv + 1) * dv + c] = kSubnormal;
  }
  float* h0 = p.h0.data<float>();
  for (std::int64_t s = 0; s < p.h0.size(0); ++s) {
    for (std::int64_t e = 0; e < spec.dk * dv; ++e) h0[(s * hv + 1) * spec.dk * dv + e] = 0;
  }
  return p;
}

TEST(SubnormalsAsZero, CoreForwardAndBackwardIgnoreTheCallersMode) {
#ifndef GDN_TEST_MXCSR
  GTEST_SKIP() << "no MXCSR on this architecture: the mode is the platform's";
#else
  const test::Problem p = core_problem();
  Tensor d_o(DType::f32, p.v.rank(), p.v.sizes());
  test::Random rng(7);
  for (std::int64_t i = 0; i < d_o.numel(); ++i) d_o.data<float>()[i] = rng.uniform(-1, 1);
  for (CpuIsa isa : test::runnable_isas()) {
    for (int threads : {1, 2}) {
      ForwardOptions o = p.options();
      o.isa = isa;
      o.threads = threads;
      auto run = [&] {
        ForwardResult f = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
        BackwardInputs b = BackwardInputs::from(p.inputs());
        b.d_o = d_o.view();
        b.chunk_states = f.chunk_states.view();
        b.t_inv = f.t_inv.view();
        return std::make_pair(std::move(f), chunk_gated_delta_rule_bwd(b, o));
      };
      const auto plain = in_caller_mode(false, run), flushed = in_caller_mode(true, run);
      const auto named = [](const std::pair<ForwardResult, BackwardResult>& r) {
        return Named{{"o", &r.first.o},
                     {"final_state", &r.first.final_state},
                     {"chunk_states", &r.first.chunk_states},
                     {"t_inv", &r.first.t_inv},
                     {"dq", &r.second.dq},
                     {"dk", &r.second.dk},
                     {"dv", &r.second.dv},
                     {"dg", &r.second.dg},
                     {"dbeta", &r.second.dbeta},
                     {"dh0", &r.second.d_initial_state}};
      };
      expect_identical(named(plain), named(flushed), case_name(isa, threads));
      // Value head 1 read its subnormal v as zero: its output is exactly zero.
      const Tensor& out = plain.first.o;
      const std::int64_t dv = p.spec.dv;
      for (std::int64_t i = 0; i < out.size(0); ++i) {
        for (std::int64_t c = 0; c < dv; ++c) {
          ASSERT_EQ(out.data<float>()[(i * 2 + 1) * dv + c], 0.0f)
              << "token " << i << ", " << case_name(isa, threads);
        }
      }
    }
  }
#endif
}

TEST(SubnormalsAsZero, LayerForwardAndBackwardIgnoreTheCallersMode) {
#ifndef GDN_TEST_MXCSR
  GTEST_SKIP() << "no MXCSR on this architecture: the mode is the platform's";
#else
  test::LayerSpec spec;
  spec.lengths = {90, 3, 140};
  spec.hk = 1;
  spec.hv = 2;
  spec.dk = 16;
  spec.dv = 12;
  spec.conv_state = true;
  spec.recurrent_state = true;
  test::LayerProblem p = test::make_layer_problem(spec);
  // Strong gates (A up to e^2.7 ~ 15, as in the benchmark) and subnormal qkv channels.
  for (std::int64_t h = 0; h < spec.hv; ++h) p.A_log.data<float>()[h] = 2.0f + 0.7f * h;
  const std::int64_t d = spec.channels();
  for (std::int64_t t = 0; t < p.qkv.size(0); ++t) {
    for (std::int64_t c = d - spec.dv; c < d; ++c) p.qkv.data<float>()[t * d + c] = kSubnormal;
  }
  for (CpuIsa isa : test::runnable_isas()) {
    for (int threads : {1, 2}) {
      LayerOptions o = p.options();
      o.isa = isa;
      o.threads = threads;
      auto run = [&] {
        LayerForwardResult f = fused_gdn_fwd(p.inputs(), o, Residuals::all);
        LayerBackwardInputs b;
        b.forward = p.inputs();
        b.d_out = p.d_out.view();
        b.d_conv_state_out = p.d_conv_state_out.view();
        b.d_recurrent_state_out = p.d_recurrent_state_out.view();
        b.chunk_states = f.chunk_states.view();
        b.t_inv = f.t_inv.view();
        return std::make_pair(std::move(f), fused_gdn_bwd(b, o));
      };
      const auto plain = in_caller_mode(false, run), flushed = in_caller_mode(true, run);
      const auto named = [](const std::pair<LayerForwardResult, LayerBackwardResult>& r) {
        return Named{{"out", &r.first.out},
                     {"conv_state_out", &r.first.conv_state_out},
                     {"recurrent_state_out", &r.first.recurrent_state_out},
                     {"d_qkv", &r.second.d_qkv},
                     {"d_a", &r.second.d_a},
                     {"d_b", &r.second.d_b},
                     {"d_conv_weight", &r.second.d_conv_weight},
                     {"d_conv_bias", &r.second.d_conv_bias},
                     {"d_A_log", &r.second.d_A_log},
                     {"d_dt_bias", &r.second.d_dt_bias},
                     {"d_conv_state", &r.second.d_conv_state},
                     {"d_recurrent_state", &r.second.d_recurrent_state}};
      };
      expect_identical(named(plain), named(flushed), case_name(isa, threads));
    }
  }
#endif
}

TEST(SubnormalsAsZero, StepIgnoresTheCallersMode) {
#ifndef GDN_TEST_MXCSR
  GTEST_SKIP() << "no MXCSR on this architecture: the mode is the platform's";
#else
  using namespace step_test;
  StepSpec spec;
  spec.num_slots = 6;
  spec.decodes = {{1, 1, 5}, {1, 2, 9}};
  spec.prefills = {{40, 3, 0}, {70, 4, 20}};
  StepProblem p = make_step_problem(spec);
  // Subnormal v channels and a decode's subnormal states: the values of the last value head
  // stay subnormal all through the step unless they read as zero.
  fill_slot(p.rec_pool, 2, kSubnormal);
  fill_slot(p.conv_pool, 2, kSubnormal);
  const std::int64_t d = spec.channels();
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    for (std::int64_t c = d - spec.dv; c < d; ++c) p.qkv.data<float>()[t * d + c] = kSubnormal;
  }
  for (std::int64_t c = d - spec.dv; c < d; ++c) p.conv_bias.data<float>()[c] = 0;
  for (std::int64_t h = 0; h < spec.hv; ++h) p.A_log.data<float>()[h] = 2.0f + 0.2f * h;
  for (CpuIsa isa : test::runnable_isas()) {
    for (int threads : {1, 2}) {
      StepOptions o = p.options();
      o.isa = isa;
      o.threads = threads;
      const auto run = [&] { return run_step(p, o); };
      const StepResult plain = in_caller_mode(false, run), flushed = in_caller_mode(true, run);
      expect_identical(
          {{"out", &plain.out}, {"conv_pool", &plain.conv_pool}, {"rec_pool", &plain.rec_pool}},
          {{"out", &flushed.out},
           {"conv_pool", &flushed.conv_pool},
           {"rec_pool", &flushed.rec_pool}},
          case_name(isa, threads));
    }
  }
#endif
}

}  // namespace
}  // namespace gdn
