// forward.cc: the CPU forward driver. Splits a validated problem into work items, each one
// sequence and a group of the value heads that share a key head, and runs them on OpenMP
// threads with one workspace per thread.
//
// Every value head is computed start to finish by one thread with the same code whatever its
// group, and items share no output, so the result is bit-identical for any thread count, any
// schedule and any grouping. Items are handed out dynamically (sequences of a packed batch
// differ in length).
#include "cpu/forward.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "gdn/error.h"

namespace gdn::cpu {
namespace {

// Value heads per item: the largest divisor of Hv / Hk (at most kMaxGroup) that still leaves
// two items per thread. A group shares the packing of q and k, their L2 norm and [Q;K] K^T,
// and reads the q and k rows once instead of once per value head. Measured at 8k tokens,
// Qwen3-Next shape (2 value heads per key head), one thread, best of 6 runs in 4 alternations:
// 238-261 ms grouped, 308-332 ms with one value head per item (docs/perf.md). Each further
// head costs one state (64 KiB at d = 128) of workspace.
constexpr std::int64_t kMaxGroup = 8;

std::int64_t heads_per_item(const detail::ForwardProblem& p, int threads) {
  const std::int64_t group = p.group;
  for (std::int64_t g = group < kMaxGroup ? group : kMaxGroup; g > 1; --g) {
    if (group % g == 0 &&
        p.shape.num_seqs * p.shape.hk * (group / g) >= 2 * std::int64_t{threads}) {
      return g;
    }
  }
  return 1;
}

}  // namespace

void forward(const detail::ForwardProblem& p, CpuIsa isa) {
  const KernelTable& table = kernel_table(isa);
  const ForwardItemFn chunked = table.chunked[activations(p.shape.dtype)];
  const ForwardItemFn recurrent = table.recurrent[activations(p.shape.dtype)];
  const bool residuals = p.chunk_states.data != nullptr || p.t_inv.data != nullptr;

  const int threads = p.threads > 0 ? p.threads : default_threads();
  const std::int64_t heads = heads_per_item(p, threads);
  const std::int64_t groups = p.shape.hv / heads;
  const std::int64_t items = p.shape.num_seqs * groups;

  for_each_item(threads, items, forward_workspace_bytes(p, heads),
                [&](std::int64_t item, std::byte* workspace) {
                  const std::int64_t s = item / groups, h = item % groups * heads;
                  const std::int64_t length = p.seqs[s].length;
                  const bool use_recurrent =
                      p.algorithm == Algorithm::recurrent ||
                      (p.algorithm == Algorithm::automatic && !residuals && length < p.chunk_size);
                  (use_recurrent ? recurrent : chunked)(p, s, h, heads, workspace);
                });
}

}  // namespace gdn::cpu
