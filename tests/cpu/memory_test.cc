// memory_test.cc: the memory a call takes beyond its inputs and outputs, measured, held to the
// formula of docs/memory.md (issue 16 req. 7), so that a memory regression fails like a wrong
// result. Each case runs the op once to start the thread pool, then measures one call: the
// process's peak resident set (VmHWM, reset through /proc/self/clear_refs) above its resident
// set before the call, with transparent huge pages off (they would round each buffer up to
// 2 MiB) and freed heap pages returned first (malloc_trim). Outputs are allocated and touched
// before the call, so what is measured is the call's own temporaries and workspaces.
//
// The shapes are chosen so that the slack (1 MiB + 512 KiB per thread: page tables, the
// kernel's batched RSS counters, thread stacks) is small beside any temporary that grows with
// the tokens: one more [T, D] buffer in the layer op, or a copy of a pool in the step, fails.
// Under AddressSanitizer or ThreadSanitizer the resident set is the sanitizer's, so the cases
// are skipped there.
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "common/layer_problem.h"
#include "common/problem.h"
#include "step_harness.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GDN_TEST_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define GDN_TEST_UNDER_SANITIZER 1
#endif
#endif

namespace gdn {
namespace {

constexpr int kThreads = 2;
constexpr std::int64_t kF32 = 4;
constexpr std::int64_t kMiB = std::int64_t{1} << 20;

std::int64_t status_bytes(const char* key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key))) * 1024;
  }
  return -1;
}

// Bytes the process's resident set rose by, at its peak, while fn ran.
template <class Fn>
std::int64_t peak_rise(Fn&& fn) {
  malloc_trim(0);
  const std::int64_t before = status_bytes("VmRSS:");
  {
    std::ofstream reset("/proc/self/clear_refs");
    reset << "5";  // resets VmHWM to the current resident set
  }
  fn();
  return status_bytes("VmHWM:") - before;
}

class Memory : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef GDN_TEST_UNDER_SANITIZER
    GTEST_SKIP() << "resident set sizes under a sanitizer are the sanitizer's";
#else
    if (prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0) GTEST_SKIP() << "PR_SET_THP_DISABLE failed";
    if (status_bytes("VmHWM:") < 0) GTEST_SKIP() << "no VmHWM in /proc/self/status";
    std::ofstream probe("/proc/self/clear_refs");
    if (!probe) GTEST_SKIP() << "/proc/self/clear_refs is not writable";
#endif
  }
  // Runs fn twice (the first starts the thread pool) and checks the second's rise.
  template <class Fn>
  void expect_within(const std::string& what, std::int64_t formula, Fn&& fn) {
    fn();
    const std::int64_t rise = peak_rise(fn);
    const std::int64_t slack = kMiB + kThreads * kMiB / 2;
    std::printf("[ MEMORY   ] %s: measured %.2f MiB, formula %.2f MiB (+ %.2f MiB slack)\n",
                what.c_str(), static_cast<double>(rise) / kMiB, static_cast<double>(formula) / kMiB,
                static_cast<double>(slack) / kMiB);
    EXPECT_LE(rise, formula + slack) << what << ": the call's peak memory exceeds docs/memory.md";
  }
};

void touch(Tensor& t) { std::memset(t.raw(), 0, static_cast<std::size_t>(t.bytes())); }

PlanProblem plan_problem(PlanOp op, const test::ProblemSpec& s, bool residuals) {
  PlanProblem p;
  p.op = op;
  p.tokens = *std::max_element(s.lengths.begin(), s.lengths.end());
  p.num_seqs = static_cast<std::int64_t>(s.lengths.size());
  p.total_tokens = 0;
  for (std::int64_t len : s.lengths) p.total_tokens += len;
  p.hk = s.hk;
  p.hv = s.hv;
  p.dk = s.dk;
  p.dv = s.dv;
  p.residuals = residuals;
  return p;
}

// The core op's workspaces: the threads that run times the plan's bytes per thread.
std::int64_t workspaces(const PlanProblem& problem, const ForwardOptions& o) {
  const Plan plan = make_plan(problem, o);
  return plan.threads * ((plan.workspace_bytes + 63) / 64 * 64);
}

test::ProblemSpec core_spec() {
  test::ProblemSpec s;
  s.lengths = {16384};
  s.hk = 2;
  s.hv = 4;
  s.dk = s.dv = 128;
  s.initial_state = true;
  s.seed = 91;
  return s;
}

// The forward takes its workspaces and nothing that grows with T (16384 tokens: a [T, Hv, Dv]
// temporary would be 32 MiB), with and without residuals.
TEST_F(Memory, CoreForwardTakesOnlyItsWorkspaces) {
  const test::ProblemSpec s = core_spec();
  const test::Problem p = test::make_problem(s);
  ForwardOptions o = p.options();
  o.threads = kThreads;
  for (const Residuals r : {Residuals::none, Residuals::all}) {
    ForwardResult out = chunk_gated_delta_rule_fwd(p.inputs(), o, r);
    for (Tensor* t : {&out.o, &out.final_state, &out.chunk_states, &out.t_inv}) {
      if (t->present()) touch(*t);
    }
    const ForwardOutputs views{out.o.mutable_view(), out.final_state.mutable_view(),
                               out.chunk_states.mutable_view(), out.t_inv.mutable_view()};
    expect_within(std::string("forward, residuals ") + (r == Residuals::all ? "all" : "none"),
                  workspaces(plan_problem(PlanOp::forward, s, r == Residuals::all), o),
                  [&] { chunk_gated_delta_rule_fwd(p.inputs(), views, o); });
  }
}

// The backward's workspaces hold the states it rebuilds when none were kept (up to the 32 MiB
// rebuild budget per item): the formula is the plan's workspace under each policy.
TEST_F(Memory, CoreBackwardTakesOnlyItsWorkspacesUnderEachPolicy) {
  const test::ProblemSpec s = core_spec();
  const test::Problem p = test::make_problem(s);
  const test::Cotangents ct = test::make_cotangents(p, 92);
  ForwardOptions o = p.options();
  o.threads = kThreads;
  const ForwardResult fwd = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
  BackwardResult grads = chunk_gated_delta_rule_bwd(
      [&] {
        BackwardInputs b = BackwardInputs::from(p.inputs());
        b.d_o = ct.d_o.view();
        return b;
      }(),
      o);
  for (Tensor* t :
       {&grads.dq, &grads.dk, &grads.dv, &grads.dg, &grads.dbeta, &grads.d_initial_state}) {
    touch(*t);
  }
  const BackwardOutputs views{grads.dq.mutable_view(),    grads.dk.mutable_view(),
                              grads.dv.mutable_view(),    grads.dg.mutable_view(),
                              grads.dbeta.mutable_view(), grads.d_initial_state.mutable_view()};
  for (const Residuals r : {Residuals::all, Residuals::t_inv, Residuals::none}) {
    BackwardInputs b = BackwardInputs::from(p.inputs());
    b.d_o = ct.d_o.view();
    b.d_final_state = ct.d_ht.view();
    if (r == Residuals::all) b.chunk_states = fwd.chunk_states.view();
    if (r != Residuals::none) b.t_inv = fwd.t_inv.view();
    const char* name = r == Residuals::all ? "all" : r == Residuals::t_inv ? "t_inv" : "none";
    expect_within(std::string("backward, residuals ") + name,
                  workspaces(plan_problem(PlanOp::backward, s, r == Residuals::all), o),
                  [&] { chunk_gated_delta_rule_bwd(b, views, o); });
  }
}

test::LayerSpec layer_spec() {
  test::LayerSpec s;
  s.lengths = {6000, 2192};
  s.hk = 2;
  s.hv = 4;
  s.dk = s.dv = 128;
  s.taps = 4;
  s.conv_state = true;
  s.recurrent_state = true;
  s.seed = 93;
  return s;
}

test::ProblemSpec core_of(const test::LayerSpec& l) {
  test::ProblemSpec s;
  s.lengths = l.lengths;
  s.hk = l.hk;
  s.hv = l.hv;
  s.dk = l.dk;
  s.dv = l.dv;
  return s;
}

// docs/memory.md, the layer op's forward: the gates g, beta [T, Hv], the conv's weight layout
// and initial states, and the core op's workspaces with the conv rows each thread stages (its
// conv runs inside the core's packing: no xh).
std::int64_t layer_forward_formula(const test::LayerSpec& l, const ForwardOptions& core,
                                   bool residuals) {
  std::int64_t t = 0;
  for (std::int64_t len : l.lengths) t += len;
  const std::int64_t d = l.channels(), cpad = (d + 15) / 16 * 16, k = l.taps;
  const auto n = static_cast<std::int64_t>(l.lengths.size());
  const std::int64_t row = (std::max(l.dk, l.dv) + 15) / 16 * 16;
  return kF32 * (2 * t * l.hv + (k + 1) * cpad + (l.conv_state ? n * (k - 1) * d : 0)) +
         kThreads * kF32 * ((k - 1 + 16) * row + (k + 1) * 16) +
         workspaces(plan_problem(PlanOp::forward, core_of(l), residuals), core);
}

// The layer op's forward as the backward recomputes it: xh [T, D] and g, beta [T, Hv], the
// conv's buffers and workspaces.
std::int64_t layer_recompute_formula(const test::LayerSpec& l) {
  std::int64_t t = 0;
  for (std::int64_t len : l.lengths) t += len;
  const std::int64_t d = l.channels(), cpad = (d + 15) / 16 * 16, k = l.taps;
  const auto n = static_cast<std::int64_t>(l.lengths.size());
  return kF32 * (t * d + 2 * t * l.hv + (k + 1) * cpad + (l.conv_state ? n * (k - 1) * d : 0)) +
         kThreads * kF32 * ((k - 1 + 16) * cpad + 256);
}

ForwardOptions layer_core_options() {
  ForwardOptions o;
  o.use_qk_l2norm = true;
  o.threads = kThreads;
  return o;
}

// The layer forward (T = 8192, D = 1024: an xh of every token would be 32 MiB, one of a window
// of 4096 tokens 16 MiB; the fused conv takes neither).
TEST_F(Memory, LayerForwardTakesGatesAndWorkspacesButNoXh) {
  const test::LayerSpec s = layer_spec();
  const test::LayerProblem p = test::make_layer_problem(s);
  LayerOptions o = p.options();
  o.threads = kThreads;
  LayerForwardResult out = fused_gdn_fwd(p.inputs(), o);
  for (Tensor* t : {&out.out, &out.conv_state_out, &out.recurrent_state_out}) touch(*t);
  const LayerOutputs views{out.out.mutable_view(),
                           out.conv_state_out.mutable_view(),
                           out.recurrent_state_out.mutable_view(),
                           {},
                           {}};
  expect_within("layer forward", layer_forward_formula(s, layer_core_options(), false),
                [&] { fused_gdn_fwd(p.inputs(), views, o); });
}

// The layer backward: the forward's temporaries again (it recomputes the conv and the gates),
// dxh [T, D], dg and dbeta [T, Hv], the conv's per-item partial weight gradients, the conv's
// state-gradient buffers and workspaces, the core backward's workspaces (nothing kept: the
// core backward rebuilds its states).
TEST_F(Memory, LayerBackwardTakesTheForwardsTemporariesDxhAndWorkspaces) {
  const test::LayerSpec s = layer_spec();
  const test::LayerProblem p = test::make_layer_problem(s);
  LayerOptions o = p.options();
  o.threads = kThreads;
  const LayerBackwardInputs in{
      p.inputs(), p.d_out.view(), p.d_conv_state_out.view(), p.d_recurrent_state_out.view(), {},
      {}};
  LayerBackwardResult g = fused_gdn_bwd(in, o);
  for (Tensor* t : {&g.d_qkv, &g.d_a, &g.d_b, &g.d_conv_weight, &g.d_conv_bias, &g.d_A_log,
                    &g.d_dt_bias, &g.d_conv_state, &g.d_recurrent_state}) {
    touch(*t);
  }
  const LayerBackwardOutputs views{g.d_qkv.mutable_view(),
                                   g.d_a.mutable_view(),
                                   g.d_b.mutable_view(),
                                   g.d_conv_weight.mutable_view(),
                                   g.d_conv_bias.mutable_view(),
                                   g.d_A_log.mutable_view(),
                                   g.d_dt_bias.mutable_view(),
                                   g.d_conv_state.mutable_view(),
                                   g.d_recurrent_state.mutable_view()};
  std::int64_t t = 0, items = 0;
  for (std::int64_t len : s.lengths) {
    t += len;
    items += (len + 255) / 256;
  }
  const std::int64_t d = s.channels(), cpad = (d + 15) / 16 * 16, k = s.taps;
  const auto n = static_cast<std::int64_t>(s.lengths.size());
  const ForwardOptions core = layer_core_options();
  const std::int64_t forward_part = layer_recompute_formula(s);
  const std::int64_t formula =
      forward_part + kF32 * (t * d + 2 * t * s.hv) + kF32 * items * (k + 1) * cpad +
      kF32 * (2 * n * (k - 1) * d + (k + 1) * cpad) + kThreads * kF32 * (2 * k - 1 + 48) * cpad +
      std::max(workspaces(plan_problem(PlanOp::forward, core_of(s), false), core),
               workspaces(plan_problem(PlanOp::backward, core_of(s), false), core));
  expect_within("layer backward", formula, [&] { fused_gdn_bwd(in, views, o); });
}

// A decode step takes what grows with its tokens, never with the pools: 64 decodes over pools of
// 1024 slots (256 MiB of recurrent state).
TEST_F(Memory, DecodeStepTakesNothingThatGrowsWithThePools) {
  step_test::StepSpec spec;
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = spec.dv = 128;
  for (std::int64_t s = 0; s < 64; ++s) spec.decodes.push_back({1, 1 + 16 * s, 100});
  spec.num_slots = 1024;
  spec.seed = 94;
  step_test::StepProblem p = step_test::make_step_problem(spec);
  StepOptions o = p.options();
  o.threads = kThreads;
  Tensor out(DType::f32, {p.tokens, spec.hv * spec.dv});
  touch(out);
  const std::int64_t d = spec.channels(), cpad = (d + 15) / 16 * 16, k = spec.taps;
  const std::int64_t n = p.n, tokens = p.tokens;
  PlanProblem decode;
  decode.op = PlanOp::decode;
  decode.tokens = 1;
  decode.num_seqs = n;
  decode.hk = spec.hk;
  decode.hv = spec.hv;
  decode.dk = spec.dk;
  decode.dv = spec.dv;
  ForwardOptions fo;
  fo.threads = kThreads;
  const std::int64_t formula =
      kF32 * ((k + 1) * cpad + tokens * d + n * (k - 1) * d + 2 * tokens * spec.hv) +
      workspaces(decode, fo) + kThreads * kF32 * ((k - 1 + 16) * cpad + 256);
  const StatePools pools{p.conv_pool.mutable_view(), p.rec_pool.mutable_view()};
  expect_within("64 decodes, 1024 slots", formula,
                [&] { fused_gdn_step(p.inputs(), pools, out.mutable_view(), o); });
}

// A prefill step: the prefills' start states gathered into a [P, ...] batch, then the layer
// forward's temporaries over their tokens.
TEST_F(Memory, PrefillStepTakesGatheredStatesAndTheLayerForwards) {
  step_test::StepSpec spec;
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = spec.dv = 128;
  spec.prefills = {{4000, 3, 50}, {3000, 7, 0}};
  spec.num_slots = 256;
  spec.seed = 95;
  step_test::StepProblem p = step_test::make_step_problem(spec);
  StepOptions o = p.options();
  o.threads = kThreads;
  Tensor out(DType::f32, {p.tokens, spec.hv * spec.dv});
  touch(out);
  test::LayerSpec l;
  l.lengths = {4000, 3000};
  l.hk = spec.hk;
  l.hv = spec.hv;
  l.dk = spec.dk;
  l.dv = spec.dv;
  l.taps = spec.taps;
  l.conv_state = true;
  const std::int64_t count = 2, d = spec.channels();
  const std::int64_t formula = 8 * (count + 1) +
                               kF32 * count * ((spec.taps - 1) * d + spec.hv * spec.dk * spec.dv) +
                               layer_forward_formula(l, layer_core_options(), false);
  const StatePools pools{p.conv_pool.mutable_view(), p.rec_pool.mutable_view()};
  expect_within("2 prefills of 4000 and 3000 tokens", formula,
                [&] { fused_gdn_step(p.inputs(), pools, out.mutable_view(), o); });
}

}  // namespace
}  // namespace gdn
