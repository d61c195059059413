// backward.cc: the CPU backward driver. One work item per (sequence, key head): an item runs
// every value head that reads the key head, so that their dq and dk are summed inside the
// item, in head order, and no two threads write the same gradient. Items go to OpenMP threads
// dynamically; results are bit-identical for any thread count. The rebuild segment and the
// threads come from the tiling plan (src/cpu/plan.cc).
#include "cpu/backward.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/plan.h"
#include "gdn/error.h"

namespace gdn::cpu {

void backward(const detail::BackwardProblem& bp, CpuIsa isa) {
  backward(bp, make_plan(plan_problem(bp), plan_options(bp.fwd, isa), PlanForce{}));
}

void backward(const detail::BackwardProblem& bp, const Plan& plan) {
  const detail::ForwardProblem& p = bp.fwd;
  const bool kept_states = bp.chunk_states.data != nullptr;
  // Every item holds all value heads of its key head (their dq, dk are summed inside it), and
  // the rebuild segment sizes every item's workspace.
  if (plan.op != PlanOp::backward || plan.chunk_size != p.chunk_size ||
      plan.heads_per_item != p.group || (plan.rebuild_segment == 0) != kept_states) {
    throw RuntimeError("backward: a plan for " + std::string(plan_op_name(plan.op)) + ", chunk " +
                       std::to_string(plan.chunk_size) + ", " +
                       std::to_string(plan.heads_per_item) + " heads per item, segment " +
                       std::to_string(plan.rebuild_segment) +
                       " does not fit this backward problem");
  }
  const KernelTable& table = kernel_table(plan.isa);
  const BackwardItemFn item_fn = table.backward[activations(p.shape.dtype)];
  const std::int64_t heads = p.group;
  const std::int64_t items = p.shape.num_seqs * p.shape.hk;

  std::int64_t max_chunks = 0;
  for (std::int64_t s = 0; s < p.shape.num_seqs; ++s) {
    const std::int64_t chunks = (p.seqs[s].length + p.chunk_size - 1) / p.chunk_size;
    if (chunks > max_chunks) max_chunks = chunks;
  }
  // One segment length for the whole call (the longest sequence decides), so that every item
  // fits the same workspace.
  const std::int64_t segment = plan.rebuild_segment;
  const std::int64_t step = segment == 0 ? 1 : segment;
  for_each_item(plan.threads, items, backward_workspace_bytes(bp, heads, max_chunks, segment),
                [&](std::int64_t item, std::byte* workspace) {
                  const std::int64_t s = item / p.shape.hk, hk = item % p.shape.hk;
                  item_fn(bp, s, hk * heads, heads, step, workspace);
                });
}

}  // namespace gdn::cpu
