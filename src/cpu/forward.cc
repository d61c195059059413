// forward.cc: the CPU forward driver. Splits a validated problem into work items, each one
// sequence and a group of value heads (some of a key head's, or all of several key heads', as
// the tiling plan says, src/cpu/plan.cc), and runs them on OpenMP threads with one workspace
// per thread.
//
// Every value head is computed start to finish by one thread with the same code whatever its
// group, and items share no output, so the result is bit-identical for any thread count, any
// schedule and any grouping. Items are handed out dynamically (sequences of a packed batch
// differ in length).
#include "cpu/forward.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/plan.h"
#include "gdn/error.h"

namespace gdn::cpu {

void forward(const detail::ForwardProblem& p, CpuIsa isa) {
  forward(p, make_plan(plan_problem(p), plan_options(p, isa), PlanForce{}));
}

void forward(const detail::ForwardProblem& p, const Plan& plan) {
  const std::int64_t heads = plan.heads_per_item;
  const std::vector<std::int64_t> allowed = heads_candidates(p.shape.hk, p.shape.hv);
  if (plan.op != PlanOp::forward || plan.chunk_size != p.chunk_size ||
      std::find(allowed.begin(), allowed.end(), heads) == allowed.end()) {
    throw RuntimeError("forward: a plan for " + std::string(plan_op_name(plan.op)) + ", chunk " +
                       std::to_string(plan.chunk_size) + ", " + std::to_string(heads) +
                       " heads per item does not fit a forward problem of chunk " +
                       std::to_string(p.chunk_size) +
                       ": expected heads per item dividing Hv / Hk = " + std::to_string(p.group) +
                       " or a multiple of it dividing Hv = " + std::to_string(p.shape.hv) +
                       ", at most " + std::to_string(kMaxGroup));
  }
  const KernelTable& table = kernel_table(plan.isa);
  const ForwardItemFn chunked = table.chunked[activations(p.shape.dtype)];
  const ForwardItemFn recurrent = table.recurrent[activations(p.shape.dtype)];
  const bool residuals = p.chunk_states.data != nullptr || p.t_inv.data != nullptr;
  const std::int64_t groups = p.shape.hv / heads;
  const std::int64_t items = p.shape.num_seqs * groups;

  for_each_item(plan.threads, items, forward_workspace_bytes(p, heads),
                [&](std::int64_t item, std::byte* workspace) {
                  const std::int64_t s = item / groups, h = item % groups * heads;
                  const std::int64_t length = p.seqs[s].length;
                  const bool use_recurrent = p.algorithm == Algorithm::recurrent ||
                                             (p.algorithm == Algorithm::automatic && !residuals &&
                                              !p.bf16_operands && length < p.chunk_size);
                  (use_recurrent ? recurrent : chunked)(p, s, h, heads, workspace);
                });
}

}  // namespace gdn::cpu
