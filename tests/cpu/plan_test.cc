// plan_test.cc: the tiling plan (gdn/plan.h, src/cpu/plan.h). The plan is a function of the
// shape, the options and the machine; the drivers run exactly the plan make_plan returns;
// every alternative `gdn plan --time` tries (each chunk size, each value-heads-per-item
// candidate, each decode column split) matches the float64 reference, and the alternatives of
// one chunk size agree bit for bit; a fixed plan is bit-identical for 1, 2 and 3 threads;
// options.chunk_size = 0 lays the residuals out by the planned chunk size.
//
// Tolerances as tests/cpu/forward_test.cc, backward_test.cc and step_test.cc
// (docs/numerics.md): float32 within a multiple of the plain float32 recurrence's error against
// the float64 reference (forward 4 x + 32 eps, backward 8 x (baseline + 8 eps)); a serving
// step within 1e-4.
#include "cpu/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "api/step_plan.h"
#include "api/validate.h"
#include "common/compare.h"
#include "common/layer_problem.h"
#include "common/problem.h"
#include "cpu/backward.h"
#include "cpu/forward.h"

namespace gdn {
namespace {

using test::make_problem;
using test::Problem;
using test::ProblemSpec;

constexpr double kEpsF32 = 1.1920928955078125e-07;
constexpr double kStepTolerance = 1e-4;

double forward_tolerance(double baseline_error) { return 4.0 * baseline_error + 32 * kEpsF32; }
double backward_tolerance(double baseline_error) { return 8.0 * (baseline_error + 8 * kEpsF32); }

// Two value-head groups per key head and three sequences, one shorter than a chunk and one of
// exactly 64 tokens: every heads-per-item candidate (1, 2, 4) and both chunk sizes differ.
ProblemSpec grouped_spec() {
  ProblemSpec spec;
  spec.lengths = {100, 21, 64};
  spec.hk = 2;
  spec.hv = 8;
  spec.dk = 32;
  spec.dv = 24;
  spec.initial_state = true;
  spec.l2norm = true;
  spec.g_lo = -2.0;
  return spec;
}

bool same_plan(const Plan& a, const Plan& b) {
  return a.op == b.op && a.isa == b.isa && a.isa_reason == b.isa_reason &&
         a.chunk_size == b.chunk_size && a.chunk_reason == b.chunk_reason &&
         a.heads_per_item == b.heads_per_item && a.items == b.items &&
         a.items_reason == b.items_reason && a.threads == b.threads &&
         a.threads_reason == b.threads_reason && a.rebuild_segment == b.rebuild_segment &&
         a.segment_reason == b.segment_reason && a.vblocks == b.vblocks &&
         a.vblocks_reason == b.vblocks_reason && a.workspace_bytes == b.workspace_bytes;
}

// The problem the CLI (`gdn plan`) describes for a test problem: its longest sequence.
PlanProblem plan_problem_of(const ProblemSpec& spec, PlanOp op, bool residuals) {
  PlanProblem p;
  p.op = op;
  for (std::int64_t len : spec.lengths) {
    p.tokens = std::max(p.tokens, len);
    p.total_tokens += len;  // unequal lengths: the rule weighs the longest against all
  }
  p.num_seqs = static_cast<std::int64_t>(spec.lengths.size());
  p.hk = spec.hk;
  p.hv = spec.hv;
  p.dk = spec.dk;
  p.dv = spec.dv;
  p.dtype = spec.dtype;
  p.residuals = residuals;
  return p;
}

// The forward under a plan with `heads` value heads per item forced (0: as planned), keeping
// every residual. `plan` receives the plan that ran.
ForwardResult forward_with(const Problem& p, const ForwardOptions& o, std::int64_t heads,
                           Plan* plan = nullptr) {
  const ForwardShape shape = forward_shape(p.inputs(), o);
  ForwardResult r;
  r.o = Tensor(shape.dtype, shape.o_rank(), shape.o_sizes());
  r.final_state = Tensor(shape.compute_dtype, 4, shape.state_sizes());
  r.chunk_states = Tensor(shape.compute_dtype, 4, shape.chunk_states_sizes());
  r.t_inv = Tensor(shape.compute_dtype, 4, shape.t_inv_sizes());
  detail::ValidatedForward v;
  detail::validate_forward(p.inputs(),
                           {r.o.mutable_view(), r.final_state.mutable_view(),
                            r.chunk_states.mutable_view(), r.t_inv.mutable_view()},
                           o, detail::OutputPrecision::native, &v);
  const Plan ran = cpu::make_plan(cpu::plan_problem(v.problem), cpu::plan_options(v.problem, o.isa),
                                  cpu::PlanForce{heads, 0});
  cpu::forward(v.problem, ran);
  if (plan != nullptr) *plan = ran;
  return r;
}

::testing::AssertionResult forward_bit_identical(const ForwardResult& a, const ForwardResult& b,
                                                 const std::string& what) {
  for (auto [x, y, name] :
       {std::tuple{&a.o, &b.o, "o"}, std::tuple{&a.final_state, &b.final_state, "final_state"},
        std::tuple{&a.chunk_states, &b.chunk_states, "chunk_states"},
        std::tuple{&a.t_inv, &b.t_inv, "t_inv"}}) {
    auto r = test::bit_identical(*x, *y, std::string(name) + ", " + what);
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

BackwardInputs backward_inputs(const Problem& p, const Tensor& d_o) {
  BackwardInputs in = BackwardInputs::from(p.inputs());
  in.d_o = d_o.view();
  return in;
}

::testing::AssertionResult backward_bit_identical(const BackwardResult& a, const BackwardResult& b,
                                                  const std::string& what) {
  for (auto [x, y, name] : {std::tuple{&a.dq, &b.dq, "dq"}, std::tuple{&a.dk, &b.dk, "dk"},
                            std::tuple{&a.dv, &b.dv, "dv"}, std::tuple{&a.dg, &b.dg, "dg"},
                            std::tuple{&a.dbeta, &b.dbeta, "dbeta"},
                            std::tuple{&a.d_initial_state, &b.d_initial_state, "dh0"}}) {
    auto r = test::bit_identical(*x, *y, std::string(name) + ", " + what);
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// The plan itself.

TEST(Plan, MachineInfoIsSane) {
  const MachineInfo& m = machine_info();
  EXPECT_GE(m.cores, 1);
  EXPECT_GT(m.l1d_bytes, 0);
  EXPECT_GE(m.l2_bytes, m.l1d_bytes);
  EXPECT_GE(m.l3_sharing, 1);
  EXPECT_FALSE(m.source.empty());
}

TEST(Plan, DeterministicForAShapeWithAReasonPerChoice) {
  for (PlanOp op : {PlanOp::forward, PlanOp::backward, PlanOp::decode}) {
    for (int threads : {0, 1, 3}) {
      PlanProblem p;
      p.op = op;
      p.tokens = op == PlanOp::decode ? 1 : 2048;
      p.num_seqs = 2;
      p.hk = 16;
      p.hv = 32;
      ForwardOptions o;
      o.threads = threads;
      o.chunk_size = 0;
      const Plan a = make_plan(p, o), b = make_plan(p, o);
      const std::string what =
          std::string(plan_op_name(op)) + ", threads " + std::to_string(threads);
      EXPECT_TRUE(same_plan(a, b)) << what;
      EXPECT_EQ(a.op, op) << what;
      EXPECT_NE(a.isa, CpuIsa::automatic) << what;
      EXPECT_FALSE(a.isa_reason.empty()) << what;
      EXPECT_FALSE(a.chunk_reason.empty()) << what;
      EXPECT_FALSE(a.items_reason.empty()) << what;
      EXPECT_FALSE(a.threads_reason.empty()) << what;
      EXPECT_GE(a.threads, 1) << what;
      EXPECT_LE(a.threads, a.items) << what;
      EXPECT_GT(a.workspace_bytes, 0) << what;
      if (op == PlanOp::decode) {
        EXPECT_EQ(a.chunk_size, 0) << what;
        EXPECT_FALSE(a.vblocks_reason.empty()) << what;
        EXPECT_EQ(a.items, p.num_seqs * p.hv * a.vblocks) << what;
      } else {
        // The planned chunk size is one of the candidates and never depends on the threads.
        EXPECT_TRUE(a.chunk_size == 32 || a.chunk_size == 64) << what;
        ForwardShape shape;
        shape.dk = p.dk;
        shape.dv = p.dv;
        shape.dtype = p.dtype;
        EXPECT_EQ(a.chunk_size, cpu::planned_chunk_size(shape, o.isa)) << what;
      }
      if (op == PlanOp::backward) {
        EXPECT_EQ(a.heads_per_item, 2) << what;  // all value heads of a key head
        EXPECT_EQ(a.items, p.num_seqs * p.hk) << what;
        // Nothing kept: the rebuilt states of all chunks fit the budget, one segment.
        EXPECT_EQ(a.rebuild_segment, 2048 / a.chunk_size) << what;
        EXPECT_FALSE(a.segment_reason.empty()) << what;
      }
    }
  }
}

TEST(Plan, GivenChunkSizeIsKept) {
  PlanProblem p;
  ForwardOptions o;
  o.chunk_size = 16;
  const Plan plan = make_plan(p, o);
  EXPECT_EQ(plan.chunk_size, 16);
  EXPECT_NE(plan.chunk_reason.find("options.chunk_size"), std::string::npos) << plan.chunk_reason;
}

TEST(Plan, BackwardRebuildSegment) {
  PlanProblem p;
  p.op = PlanOp::backward;
  p.hk = 16;
  p.hv = 32;
  p.residuals = true;  // chunk_states kept
  ForwardOptions o;    // chunk_size 64
  EXPECT_EQ(make_plan(p, o).rebuild_segment, 0);
  p.residuals = false;
  p.tokens = 8192;  // 128 chunks x 2 states of 64 KiB: 16 MiB, within the budget
  EXPECT_EQ(make_plan(p, o).rebuild_segment, 128);
  p.tokens = 65536;  // 1024 chunks: 128 MiB, checkpoints every 32 chunks
  const Plan plan = make_plan(p, o);
  EXPECT_EQ(plan.rebuild_segment, 32);
  EXPECT_NE(plan.segment_reason.find("ceil sqrt 1024"), std::string::npos) << plan.segment_reason;
}

TEST(Plan, Candidates) {
  EXPECT_EQ(cpu::heads_candidates(1, 1), (std::vector<std::int64_t>{1}));
  EXPECT_EQ(cpu::heads_candidates(1, 4), (std::vector<std::int64_t>{1, 2, 4}));
  EXPECT_EQ(cpu::heads_candidates(1, 12), (std::vector<std::int64_t>{1, 2, 3, 4, 6}));
  // Whole groups of consecutive key heads: Hk = 16, Hv = 32 (Qwen3-Next) and Hv = Hk = 6.
  EXPECT_EQ(cpu::heads_candidates(16, 32), (std::vector<std::int64_t>{1, 2, 4, 8}));
  EXPECT_EQ(cpu::heads_candidates(6, 6), (std::vector<std::int64_t>{1, 2, 3, 6}));
  EXPECT_EQ(cpu::heads_candidates(3, 12), (std::vector<std::int64_t>{1, 2, 4}));
  EXPECT_EQ(cpu::vblocks_candidates(16), (std::vector<std::int64_t>{1}));
  EXPECT_EQ(cpu::vblocks_candidates(128), (std::vector<std::int64_t>{1, 2, 4, 8}));
}

// Items of several key heads (their token rows share memory pages) are chosen only while the
// workspace, a state per head, stays within 3/4 of this machine's L2, then the largest that
// does, and never where they would give the busiest thread more heads than one key head's
// group would.
TEST(Plan, WholeKeyHeadGroupsWithinThreeQuartersOfTheL2AndNoBusierThread) {
  PlanProblem p;
  p.tokens = 8192;
  p.hk = 16;
  p.hv = 32;
  ForwardOptions o;
  o.threads = 1;
  o.chunk_size = 64;
  const Plan plan = make_plan(p, o);
  const std::int64_t l2 = machine_info().l2_bytes;
  auto fits = [&o, l2](const PlanProblem& problem, std::int64_t heads) {
    return cpu::make_plan(problem, o, cpu::PlanForce{heads, 0}).workspace_bytes * 4 <= l2 * 3;
  };
  ASSERT_GE(plan.heads_per_item, 2) << plan.items_reason;  // at least the key head's group
  if (plan.heads_per_item > 2) {
    EXPECT_TRUE(fits(p, plan.heads_per_item)) << plan.items_reason;
    EXPECT_NE(plan.items_reason.find("key heads whose token rows share memory pages"),
              std::string::npos)
        << plan.items_reason;
  }
  if (plan.heads_per_item < cpu::kMaxGroup) {
    EXPECT_FALSE(fits(p, plan.heads_per_item * 2)) << plan.items_reason;
  }
  // 3 threads: 8 heads per item (4 items) would give one thread 16 heads, 2 per item 12, and
  // 4 per item 12 as well.
  o.threads = 3;
  EXPECT_EQ(make_plan(p, o).heads_per_item, fits(p, 4) ? 4 : 2);
  // Every thread still gets an item: Hv = Hk = 4 on 4 threads runs one head per item.
  PlanProblem q = p;
  q.hk = q.hv = 4;
  o.threads = 4;
  EXPECT_EQ(make_plan(q, o).heads_per_item, 1);
  o.threads = 2;
  EXPECT_EQ(make_plan(q, o).heads_per_item, fits(q, 2) ? 2 : 1);
}

// Items of several key heads run each head exactly as one head per item does, whichever key
// head they start at (h0 > 0) and for Hv = Hk, on sequences longer and shorter than a chunk.
TEST(Plan, ItemsOfSeveralKeyHeadsMatchOneHeadPerItemBitForBit) {
  for (auto [hk, hv] : {std::pair<std::int64_t, std::int64_t>{4, 8}, {4, 4}}) {
    ProblemSpec spec = grouped_spec();
    spec.lengths = {100, 3, 64};
    spec.hk = hk;
    spec.hv = hv;
    const Problem p = make_problem(spec);
    ForwardOptions o = p.options();
    o.chunk_size = 32;
    const ForwardResult ref = ref::recurrent_fwd(p.inputs(), o);
    const ForwardResult base = test::baseline_f32(p, o);
    const double tol_o = forward_tolerance(test::compare(base.o, ref.o).normalized());
    const ForwardResult one = forward_with(p, o, 1);
    for (std::int64_t heads : cpu::heads_candidates(hk, hv)) {
      if (heads <= hv / hk) continue;  // within one key head: Plan.EveryForwardAlternative...
      const std::string what = "Hk = " + std::to_string(hk) + ", Hv = " + std::to_string(hv) +
                               ", " + std::to_string(heads) + " heads per item";
      const ForwardResult r = forward_with(p, o, heads);
      EXPECT_TRUE(test::within(r.o, ref.o, tol_o, "o, " + what));
      EXPECT_TRUE(forward_bit_identical(r, one, what + " vs 1 head per item"));
    }
  }
}

TEST(Plan, ImpossibleProblemsAndForcedChoicesAreErrors) {
  auto expect_invalid = [](const std::string& argument, const std::function<void()>& call) {
    try {
      call();
      ADD_FAILURE() << "no error for " << argument;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  PlanProblem p;
  p.hk = 2;
  p.hv = 8;
  expect_invalid("problem.hv", [&] {
    PlanProblem q = p;
    q.hv = 5;
    make_plan(q);
  });
  expect_invalid("problem.dk", [&] {
    PlanProblem q = p;
    q.dk = 0;
    make_plan(q);
  });
  expect_invalid("options.chunk_size", [&] {
    ForwardOptions o;
    o.chunk_size = -1;
    make_plan(p, o);
  });
  expect_invalid("heads_per_item", [&] { cpu::make_plan(p, {}, cpu::PlanForce{3, 0}); });
  expect_invalid("vblocks", [&] {
    PlanProblem q = p;
    q.op = PlanOp::decode;
    cpu::make_plan(q, {}, cpu::PlanForce{0, 129});
  });
}

// What `gdn plan` prints for a problem is what the drivers run for it.
TEST(Plan, DriversRunTheMadePlan) {
  const ProblemSpec spec = grouped_spec();
  const Problem p = make_problem(spec);
  for (int threads : {1, 2, 3}) {
    ForwardOptions o = p.options();
    o.threads = threads;
    o.chunk_size = 0;
    Plan ran;
    forward_with(p, o, 0, &ran);
    Plan made = make_plan(plan_problem_of(spec, PlanOp::forward, true), o);
    // The driver sees the planned chunk size as given; every choice is the same.
    made.chunk_reason = ran.chunk_reason;
    EXPECT_TRUE(same_plan(made, ran)) << "forward, " << threads << " threads";

    detail::ValidatedBackward v;
    const test::Cotangents c = test::make_cotangents(p, 5);
    BackwardResult r{Tensor(spec.dtype, p.q.rank(), p.q.sizes()),
                     Tensor(spec.dtype, p.k.rank(), p.k.sizes()),
                     Tensor(spec.dtype, p.v.rank(), p.v.sizes()),
                     Tensor(spec.dtype, p.g.rank(), p.g.sizes()),
                     Tensor(spec.dtype, p.beta.rank(), p.beta.sizes()),
                     Tensor(spec.dtype, p.h0.rank(), p.h0.sizes())};
    detail::validate_backward(
        backward_inputs(p, c.d_o),
        {r.dq.mutable_view(), r.dk.mutable_view(), r.dv.mutable_view(), r.dg.mutable_view(),
         r.dbeta.mutable_view(), r.d_initial_state.mutable_view()},
        o, detail::OutputPrecision::native, &v);
    const Plan bwd =
        cpu::make_plan(cpu::plan_problem(v.problem), cpu::plan_options(v.problem.fwd, o.isa), {});
    made = make_plan(plan_problem_of(spec, PlanOp::backward, false), o);
    made.chunk_reason = bwd.chunk_reason;
    EXPECT_TRUE(same_plan(made, bwd)) << "backward, " << threads << " threads";
  }
}

// ---------------------------------------------------------------------------------------------
// Every alternative against the reference.

TEST(Plan, EveryForwardAlternativeMatchesReference) {
  const Problem p = make_problem(grouped_spec());
  const ForwardOptions options = p.options();
  const ForwardResult ref = ref::recurrent_fwd(p.inputs(), options);
  const ForwardResult base = test::baseline_f32(p, options);
  const double tol_o = forward_tolerance(test::compare(base.o, ref.o).normalized());
  const double tol_ht =
      forward_tolerance(test::compare(base.final_state, ref.final_state).normalized());
  for (int chunk : cpu::kChunkCandidates) {
    ForwardOptions o = options;
    o.chunk_size = chunk;
    const ForwardResult first = forward_with(p, o, 1);
    for (std::int64_t heads : cpu::heads_candidates(p.spec.hk, p.spec.hv)) {
      const std::string what =
          "C = " + std::to_string(chunk) + ", " + std::to_string(heads) + " heads per item";
      const ForwardResult r = forward_with(p, o, heads);
      EXPECT_TRUE(test::within(r.o, ref.o, tol_o, "o, " + what));
      EXPECT_TRUE(test::within(r.final_state, ref.final_state, tol_ht, "final_state, " + what));
      EXPECT_TRUE(forward_bit_identical(r, first, what + " vs 1 head per item"));
    }
  }
}

TEST(Plan, EveryBackwardChunkSizeMatchesReference) {
  const Problem p = make_problem(grouped_spec());
  const test::Cotangents c = test::make_cotangents(p, 7);
  const ForwardOptions options = p.options();
  const BackwardInputs in = backward_inputs(p, c.d_o);
  const BackwardResult ref = ref::recurrent_bwd(in, options);
  const BackwardResult base = test::baseline_f32_bwd(p, c.d_o, Tensor{}, options);
  for (int chunk : cpu::kChunkCandidates) {
    ForwardOptions o = options;
    o.chunk_size = chunk;
    const BackwardResult r = chunk_gated_delta_rule_bwd(in, o);
    for (auto [x, y, b, name] :
         {std::tuple{&r.dq, &ref.dq, &base.dq, "dq"}, std::tuple{&r.dk, &ref.dk, &base.dk, "dk"},
          std::tuple{&r.dv, &ref.dv, &base.dv, "dv"}, std::tuple{&r.dg, &ref.dg, &base.dg, "dg"},
          std::tuple{&r.dbeta, &ref.dbeta, &base.dbeta, "dbeta"},
          std::tuple{&r.d_initial_state, &ref.d_initial_state, &base.d_initial_state, "dh0"}}) {
      EXPECT_TRUE(test::within(*x, *y, backward_tolerance(test::compare(*b, *y).normalized()),
                               std::string(name) + ", C = " + std::to_string(chunk)));
    }
  }
}

// A decode-only step: two single-token decodes and a window of 2 tokens, each with history.
struct DecodeStep {
  test::LayerProblem layer;
  Tensor conv_pool, rec_pool;
  std::vector<std::int64_t> query_start_loc{0, 1, 2, 4}, state_indices{1, 2, 3};
  std::vector<std::int64_t> seq_lens{11, 11, 12}, distribution{3, 3, 3};
  StepOptions options;

  StepInputs inputs() const {
    return {layer.qkv.view(),
            layer.a.view(),
            layer.b.view(),
            layer.conv_weight.view(),
            layer.conv_bias.view(),
            layer.A_log.view(),
            layer.dt_bias.view(),
            TensorView(query_start_loc.data(), {4}),
            TensorView(state_indices.data(), {3}),
            TensorView(seq_lens.data(), {3}),
            TensorView(distribution.data(), {3}),
            TensorView{},
            TensorView{}};
  }
};

Tensor clone(const Tensor& t) {
  Tensor r(t.dtype(), t.rank(), t.sizes());
  std::memcpy(r.raw(), t.raw(), t.bytes());
  return r;
}

DecodeStep make_decode_step(DType dtype) {
  test::LayerSpec spec;
  spec.lengths = {1, 1, 2};
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 16;
  spec.dv = 64;  // column splits 1, 2, 4
  spec.dtype = dtype;
  DecodeStep d;
  d.layer = test::make_layer_problem(spec);
  const std::int64_t slots = 5, channels = spec.channels();
  d.conv_pool = Tensor(dtype, {slots, spec.taps - 1, channels});
  d.rec_pool = Tensor(dtype, {slots, spec.hv, spec.dk, spec.dv});
  test::Random rng(11);
  for (Tensor* t : {&d.conv_pool, &d.rec_pool}) {
    for (std::int64_t i = 0; i < t->numel(); ++i) {
      const double x = rng.uniform(-0.5, 0.5);
      if (dtype == DType::f64) {
        t->data<double>()[i] = x;
      } else {
        t->data<float>()[i] = static_cast<float>(x);
      }
    }
  }
  static_cast<LayerOptions&>(d.options) = d.layer.options();
  d.options.num_spec = 1;
  return d;
}

struct StepOut {
  Tensor out, conv_pool, rec_pool;
};

StepOut step_with(const DecodeStep& d, const StepOptions& o, std::int64_t vblocks) {
  StepOut r{Tensor(d.layer.qkv.dtype(), {4, d.options.hv * d.options.dv}), clone(d.conv_pool),
            clone(d.rec_pool)};
  detail::fused_gdn_step(d.inputs(), {r.conv_pool.mutable_view(), r.rec_pool.mutable_view()},
                         r.out.mutable_view(), o, cpu::PlanForce{0, vblocks});
  return r;
}

TEST(Plan, EveryDecodeSplitMatchesReference) {
  const DecodeStep d = make_decode_step(DType::f32);
  DecodeStep d64 = make_decode_step(DType::f64);
  StepOut ref{Tensor(DType::f64, {4, d.options.hv * d.options.dv}), clone(d64.conv_pool),
              clone(d64.rec_pool)};
  ref::fused_gdn_step(d64.inputs(), {ref.conv_pool.mutable_view(), ref.rec_pool.mutable_view()},
                      ref.out.mutable_view(), d64.options);
  const StepOut first = step_with(d, d.options, 1);
  for (std::int64_t vblocks : cpu::vblocks_candidates(d.options.dv)) {
    for (int threads : {1, 2, 3}) {
      StepOptions o = d.options;
      o.threads = threads;
      const std::string what =
          std::to_string(vblocks) + " column blocks, " + std::to_string(threads) + " threads";
      const StepOut r = step_with(d, o, vblocks);
      EXPECT_TRUE(test::within(r.out, ref.out, kStepTolerance, "out, " + what));
      EXPECT_TRUE(test::within(r.rec_pool, ref.rec_pool, kStepTolerance, "rec pool, " + what));
      EXPECT_TRUE(test::within(r.conv_pool, ref.conv_pool, kStepTolerance, "conv pool, " + what));
      EXPECT_TRUE(test::bit_identical(r.out, first.out, "out vs 1 block, " + what));
      EXPECT_TRUE(test::bit_identical(r.rec_pool, first.rec_pool, "rec pool vs 1 block, " + what));
    }
  }
  // The plan fused_gdn_step runs is make_plan's for the same decodes.
  detail::ValidatedStep v;
  StepOut r = step_with(d, d.options, 0);
  detail::validate_step(d.inputs(), {r.conv_pool.mutable_view(), r.rec_pool.mutable_view()},
                        r.out.mutable_view(), d.options, detail::OutputPrecision::native, &v);
  PlanProblem p;
  p.op = PlanOp::decode;
  p.tokens = 2;
  p.num_seqs = 3;
  p.hk = 2;
  p.hv = 4;
  p.dk = 16;
  p.dv = 64;
  EXPECT_TRUE(same_plan(detail::decode_plan(d.options, v, {}), make_plan(p)));
}

// The same over bf16 pools (gdn/step.h): every split and thread count gives the bytes of one
// block on one thread, and those are the float32 pools' (holding the same values) rounded once.
TEST(Plan, EveryDecodeSplitOverBf16PoolsIsBitIdentical) {
  DecodeStep d = make_decode_step(DType::f32);
  auto rounded = [](const Tensor& t) {
    Tensor r(DType::bf16, t.rank(), t.sizes());
    for (std::int64_t i = 0; i < t.numel(); ++i)
      static_cast<std::uint16_t*>(r.raw())[i] = bf16_bits(t.data<float>()[i]);
    return r;
  };
  auto widened = [](const Tensor& t) {
    Tensor r(DType::f32, t.rank(), t.sizes());
    for (std::int64_t i = 0; i < t.numel(); ++i)
      r.data<float>()[i] = static_cast<float>(test::value_at(t, i));
    return r;
  };
  DecodeStep d16 = make_decode_step(DType::f32);
  d16.conv_pool = rounded(d.conv_pool);
  d16.rec_pool = rounded(d.rec_pool);
  d.conv_pool = widened(d16.conv_pool);
  d.rec_pool = widened(d16.rec_pool);
  const StepOut f32 = step_with(d, d.options, 1);
  const StepOut first = step_with(d16, d16.options, 1);
  EXPECT_TRUE(test::bit_identical(first.out, f32.out, "out vs float32 pools"));
  EXPECT_TRUE(test::bit_identical(first.rec_pool, rounded(f32.rec_pool),
                                  "rec pool vs float32 pools, rounded"));
  EXPECT_TRUE(test::bit_identical(first.conv_pool, rounded(f32.conv_pool),
                                  "conv pool vs float32 pools, rounded"));
  for (std::int64_t vblocks : cpu::vblocks_candidates(d16.options.dv)) {
    for (int threads : {1, 2, 3}) {
      StepOptions o = d16.options;
      o.threads = threads;
      const std::string what =
          std::to_string(vblocks) + " column blocks, " + std::to_string(threads) + " threads";
      const StepOut r = step_with(d16, o, vblocks);
      EXPECT_TRUE(test::bit_identical(r.out, first.out, "out vs 1 block, " + what));
      EXPECT_TRUE(test::bit_identical(r.rec_pool, first.rec_pool, "rec pool vs 1 block, " + what));
      EXPECT_TRUE(
          test::bit_identical(r.conv_pool, first.conv_pool, "conv pool vs 1 block, " + what));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Threads and the chunk size the plan chooses.

TEST(Plan, FixedPlanIsBitIdenticalForAnyThreadCount) {
  const Problem p = make_problem(grouped_spec());
  for (int chunk : cpu::kChunkCandidates) {
    ForwardOptions o = p.options();
    o.chunk_size = chunk;
    o.threads = 1;
    const ForwardResult one = forward_with(p, o, 2);
    for (int threads : {2, 3}) {
      o.threads = threads;
      EXPECT_TRUE(forward_bit_identical(
          forward_with(p, o, 2), one,
          "C = " + std::to_string(chunk) + ", " + std::to_string(threads) + " threads"));
    }
  }
  // The plan's own choices (chunk_size = 0): the chunk size does not follow the threads.
  const test::Cotangents c = test::make_cotangents(p, 9);
  ForwardOptions o = p.options();
  o.chunk_size = 0;
  o.threads = 1;
  const ForwardResult fwd1 = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
  const BackwardResult bwd1 = chunk_gated_delta_rule_bwd(backward_inputs(p, c.d_o), o);
  for (int threads : {2, 3}) {
    o.threads = threads;
    const std::string what = "chunk_size 0, " + std::to_string(threads) + " threads";
    EXPECT_TRUE(forward_bit_identical(chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all),
                                      fwd1, what));
    EXPECT_TRUE(backward_bit_identical(chunk_gated_delta_rule_bwd(backward_inputs(p, c.d_o), o),
                                       bwd1, what));
  }
}

TEST(Plan, ChunkSizeZeroLaysResidualsOutByThePlannedChunk) {
  const Problem p = make_problem(grouped_spec());
  ForwardOptions planned = p.options();
  planned.chunk_size = 0;
  const ForwardShape shape = forward_shape(p.inputs(), planned);
  const int c = cpu::planned_chunk_size(shape, planned.isa);
  EXPECT_EQ(shape.chunk_size, c);
  EXPECT_EQ(shape.total_chunks, (100 + c - 1) / c + (21 + c - 1) / c + (64 + c - 1) / c);
  ForwardOptions fixed = p.options();
  fixed.chunk_size = c;

  const ForwardResult fwd = chunk_gated_delta_rule_fwd(p.inputs(), planned, Residuals::all);
  EXPECT_EQ(fwd.t_inv.size(0), shape.total_chunks);
  EXPECT_EQ(fwd.t_inv.size(2), c);
  EXPECT_TRUE(forward_bit_identical(
      fwd, chunk_gated_delta_rule_fwd(p.inputs(), fixed, Residuals::all), "0 vs C given"));

  const test::Cotangents cot = test::make_cotangents(p, 4);
  BackwardInputs in = backward_inputs(p, cot.d_o);
  in.chunk_states = fwd.chunk_states.view();
  in.t_inv = fwd.t_inv.view();
  EXPECT_TRUE(backward_bit_identical(chunk_gated_delta_rule_bwd(in, planned),
                                     chunk_gated_delta_rule_bwd(in, fixed), "0 vs C given"));

  // Residuals of the other chunk size: a clear error naming t_inv and the planned layout.
  ForwardOptions other = p.options();
  other.chunk_size = c == 64 ? 32 : 64;
  const ForwardResult wrong = chunk_gated_delta_rule_fwd(p.inputs(), other, Residuals::t_inv);
  in.chunk_states = {};
  in.t_inv = wrong.t_inv.view();
  try {
    chunk_gated_delta_rule_bwd(in, planned);
    ADD_FAILURE() << "no error for t_inv of chunk size " << other.chunk_size;
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "t_inv") << e.what();
    char expected[64];
    std::snprintf(expected, sizeof expected, "[%lld, 8, %d, %d]",
                  static_cast<long long>(shape.total_chunks), c, c);
    EXPECT_NE(e.expected().find(expected), std::string::npos) << e.what();
    EXPECT_NE(e.expected().find("[total_chunks, Hv, C, C]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gdn
