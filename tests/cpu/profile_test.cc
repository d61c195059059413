// profile_test.cc: the stage clocks of the chunked forward and backward (src/cpu/profile.h),
// which `gdn bench --breakdown` and the suite's targets section read, and those of a serving
// step's prefill around them (dev/layer_step_bench.cc). A profiled call gives
// bit for bit the same results as an unprofiled one; every stage a pass runs records time and
// no other does; at one thread the stages add up to no more than the call's wall time; nothing
// is recorded into a profile that is not installed; and the per-stage FLOPs of the cost model
// add up to its totals.
#include "cpu/profile.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "bench/cost_model.h"
#include "common/compare.h"
#include "common/isas.h"
#include "common/problem.h"
#include "gdn/gdn.h"
#include "step_harness.h"

namespace gdn {
namespace {

using cpu::Stage;
using test::make_problem;
using test::Problem;
using test::ProblemSpec;

ProblemSpec spec() {
  ProblemSpec s;
  s.lengths = {130, 7, 64};
  s.hk = 2;
  s.hv = 4;
  s.dk = 32;
  s.dv = 24;
  s.initial_state = true;
  s.l2norm = true;
  s.g_lo = -2;
  return s;
}

std::vector<CpuIsa> compiled_isas() { return test::runnable_isas(); }

std::set<Stage> stages_with_time(const cpu::StageProfile& profile) {
  std::set<Stage> stages;
  for (int i = 0; i < cpu::kStageCount; ++i) {
    if (profile.ns[i].load() > 0) stages.insert(static_cast<Stage>(i));
  }
  return stages;
}

std::int64_t total_ns(const cpu::StageProfile& profile) {
  std::int64_t sum = 0;
  for (const auto& ns : profile.ns) sum += ns.load();
  return sum;
}

BackwardInputs backward_inputs(const Problem& p, const test::Cotangents& c,
                               const ForwardResult& residuals) {
  return {p.q.view(),
          p.k.view(),
          p.v.view(),
          p.g.view(),
          p.beta.view(),
          p.h0.view(),
          p.cu_seqlens.view(),
          c.d_o.view(),
          c.d_ht.view(),
          residuals.chunk_states.view(),
          residuals.t_inv.view()};
}

TEST(StageProfile, ForwardStagesAndSameResults) {
  const Problem p = make_problem(spec());
  for (CpuIsa isa : compiled_isas()) {
    for (Residuals kept : {Residuals::none, Residuals::all}) {
      ForwardOptions o = p.options();
      o.isa = isa;
      o.threads = 1;
      o.chunk_size = 32;
      const ForwardResult plain = chunk_gated_delta_rule_fwd(p.inputs(), o, kept);
      cpu::StageProfile profile;
      ForwardResult profiled;
      std::int64_t wall = 0;
      {
        const cpu::ScopedStageProfile scope(&profile);
        const std::int64_t start = cpu::stage_clock_ns();
        profiled = chunk_gated_delta_rule_fwd(p.inputs(), o, kept);
        wall = cpu::stage_clock_ns() - start;
      }
      const std::string what = std::string(cpu_isa_name(isa)) +
                               (kept == Residuals::all ? ", residuals all" : ", residuals none");
      EXPECT_TRUE(test::bit_identical(profiled.o, plain.o, "o, " + what));
      EXPECT_TRUE(test::bit_identical(profiled.final_state, plain.final_state, "state, " + what));
      if (kept == Residuals::all) {
        EXPECT_TRUE(test::bit_identical(profiled.chunk_states, plain.chunk_states, what));
        EXPECT_TRUE(test::bit_identical(profiled.t_inv, plain.t_inv, what));
      }
      std::set<Stage> expected = {Stage::states,  Stage::pack_qk, Stage::gram, Stage::pack_v,
                                  Stage::kkt,     Stage::solve,   Stage::wy,   Stage::output,
                                  Stage::write_o, Stage::state};
      // Without residuals the stage only tests for absent tensors: it may or may not read as
      // a nanosecond; with them it writes.
      std::set<Stage> got = stages_with_time(profile);
      if (kept == Residuals::all) {
        expected.insert(Stage::residuals);
      } else {
        got.erase(Stage::residuals);
      }
      EXPECT_EQ(got, expected) << what;
      EXPECT_LE(total_ns(profile), wall) << what;
    }
  }
}

TEST(StageProfile, BackwardStagesByPolicyAndSameResults) {
  const Problem p = make_problem(spec());
  const test::Cotangents c = test::make_cotangents(p, 3);
  for (CpuIsa isa : compiled_isas()) {
    ForwardOptions o = p.options();
    o.isa = isa;
    o.threads = 1;
    o.chunk_size = 32;
    for (Residuals kept : {Residuals::all, Residuals::t_inv, Residuals::none}) {
      const ForwardResult residuals = chunk_gated_delta_rule_fwd(p.inputs(), o, kept);
      const BackwardInputs in = backward_inputs(p, c, residuals);
      const BackwardResult plain = chunk_gated_delta_rule_bwd(in, o);
      cpu::StageProfile profile;
      BackwardResult profiled;
      std::int64_t wall = 0;
      {
        const cpu::ScopedStageProfile scope(&profile);
        const std::int64_t start = cpu::stage_clock_ns();
        profiled = chunk_gated_delta_rule_bwd(in, o);
        wall = cpu::stage_clock_ns() - start;
      }
      const std::string what = std::string(cpu_isa_name(isa)) + ", residuals " +
                               (kept == Residuals::all     ? "all"
                                : kept == Residuals::t_inv ? "t_inv"
                                                           : "none");
      for (const auto& [a, b, name] :
           {std::tuple{&profiled.dq, &plain.dq, "dq"}, std::tuple{&profiled.dk, &plain.dk, "dk"},
            std::tuple{&profiled.dv, &plain.dv, "dv"}, std::tuple{&profiled.dg, &plain.dg, "dg"},
            std::tuple{&profiled.dbeta, &plain.dbeta, "dbeta"},
            std::tuple{&profiled.d_initial_state, &plain.d_initial_state, "dh0"}}) {
        EXPECT_TRUE(test::bit_identical(*a, *b, std::string(name) + ", " + what));
      }
      std::set<Stage> expected = {Stage::states,   Stage::pack_qk,   Stage::gram,    Stage::pack_v,
                                  Stage::kkt,      Stage::recompute, Stage::read_do, Stage::values,
                                  Stage::mst,      Stage::gates,     Stage::dqk,     Stage::dstate,
                                  Stage::write_dqk};
      if (kept == Residuals::all) expected.insert(Stage::residuals);  // T^-1 and S loaded
      if (kept == Residuals::t_inv) expected.insert({Stage::residuals, Stage::rebuild});
      if (kept == Residuals::none) expected.insert({Stage::solve, Stage::rebuild});
      EXPECT_EQ(stages_with_time(profile), expected) << what;
      EXPECT_LE(total_ns(profile), wall) << what;
    }
  }
}

// A step's prefill with 16-bit activations: the layer's stages (conv parameters, gates, conv
// states), the step's slots and the delta rule's own, bit for bit the same results.
TEST(StageProfile, StepPrefillStagesAndSameResults) {
  step_test::StepSpec spec;
  spec.num_slots = 4;
  spec.prefills = {{150, 2, 20}, {70, 3, 0}};
  step_test::StepProblem p = step_test::make_step_problem(spec);
  p.spec.dtype = DType::bf16;  // float32 pools, bf16 activations
  for (Tensor* t : {&p.qkv, &p.a, &p.b}) {
    Tensor r(DType::bf16, t->rank(), t->sizes());
    for (std::int64_t i = 0; i < t->numel(); ++i) {
      static_cast<std::uint16_t*>(r.raw())[i] = bf16_bits(t->data<float>()[i]);
    }
    *t = std::move(r);
  }
  for (CpuIsa isa : compiled_isas()) {
    StepOptions o = p.options();
    o.isa = isa;
    o.threads = 1;
    const step_test::StepResult plain = step_test::run_step(p, o);
    cpu::StageProfile profile;
    step_test::StepResult profiled;
    std::int64_t wall = 0;
    {
      const cpu::ScopedStageProfile scope(&profile);
      const std::int64_t start = cpu::stage_clock_ns();
      profiled = step_test::run_step(p, o);
      wall = cpu::stage_clock_ns() - start;
    }
    const std::string what = cpu_isa_name(isa);
    EXPECT_TRUE(test::bit_identical(profiled.out, plain.out, "out, " + what));
    EXPECT_TRUE(test::bit_identical(profiled.conv_pool, plain.conv_pool, "conv pool, " + what));
    EXPECT_TRUE(test::bit_identical(profiled.rec_pool, plain.rec_pool, "rec pool, " + what));
    std::set<Stage> got = stages_with_time(profile);
    got.erase(Stage::residuals);  // only tests for absent tensors (see above)
    const std::set<Stage> expected = {Stage::states,
                                      Stage::pack_qk,
                                      Stage::gram,
                                      Stage::pack_v,
                                      Stage::kkt,
                                      Stage::solve,
                                      Stage::wy,
                                      Stage::output,
                                      Stage::write_o,
                                      Stage::state,
                                      Stage::layer_conv,
                                      Stage::layer_gates,
                                      Stage::layer_conv_state,
                                      Stage::step_slots};
    EXPECT_EQ(got, expected) << what;
    EXPECT_LE(total_ns(profile), wall) << what;
  }
}

// With no profile installed (or after its scope) the kernels record nothing anywhere; scopes
// nest.
TEST(StageProfile, OnlyTheInstalledProfileRecords) {
  const Problem p = make_problem(spec());
  cpu::StageProfile outer, inner;
  EXPECT_EQ(cpu::active_stage_profile(), nullptr);
  chunk_gated_delta_rule_fwd(p.inputs(), p.options());
  {
    const cpu::ScopedStageProfile a(&outer);
    {
      const cpu::ScopedStageProfile b(&inner);
      EXPECT_EQ(cpu::active_stage_profile(), &inner);
      chunk_gated_delta_rule_fwd(p.inputs(), p.options());
    }
    EXPECT_EQ(cpu::active_stage_profile(), &outer);
  }
  EXPECT_EQ(cpu::active_stage_profile(), nullptr);
  EXPECT_GT(total_ns(inner), 0);
  EXPECT_EQ(total_ns(outer), 0);
  chunk_gated_delta_rule_fwd(p.inputs(), p.options());
  EXPECT_EQ(total_ns(outer), 0);
  EXPECT_STREQ(cpu::stage_name(Stage::pack_qk), "pack_qk");
  EXPECT_STREQ(cpu::stage_name(Stage::write_dqk), "write_dqk");
  EXPECT_STREQ(cpu::stage_name(Stage::step_slots), "step_slots");
}

// The stage split of the cost model adds up to its totals (one key head per value head).
TEST(StageProfile, CostModelStagesSumToTheTotals) {
  for (const double n : {1.0, 17.0, 32.0, 64.0}) {
    for (const auto& [dk, dv] : {std::pair{128.0, 128.0}, std::pair{32.0, 24.0}}) {
      const bench::StageFlops f = bench::forward_stage_flops(n, dk, dv);
      EXPECT_DOUBLE_EQ(f.gram + f.solve + f.wy + f.output + f.state,
                       bench::chunked_forward_flops_per_chunk(n, dk, dv));
      const bench::StageFlops b = bench::backward_stage_flops(n, dk, dv);
      EXPECT_DOUBLE_EQ(b.gram + b.recompute + b.values + b.mst + b.dqk + b.dstate,
                       bench::chunked_backward_flops_per_chunk(n, dk, dv));
    }
  }
}

}  // namespace
}  // namespace gdn
