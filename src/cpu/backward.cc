// backward.cc: the CPU backward driver. One work item per (sequence, key head): an item runs
// every value head that reads the key head, so that their dq and dk are summed inside the
// item, in head order, and no two threads write the same gradient. Items go to OpenMP threads
// dynamically; results are bit-identical for any thread count.
#include "cpu/backward.h"

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "gdn/error.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace gdn::cpu {
namespace {

// Without kept chunk states, each item rebuilds its states. All of them when they fit in
// kRebuildBudget (one forward pass); else checkpoints every `segment` chunks and one segment
// at a time, segment = ceil(sqrt(chunks)): O(sqrt(chunks)) states per head and thread for
// one extra pass over the chunks.
constexpr std::int64_t kRebuildBudget = std::int64_t{32} << 20;

std::int64_t rebuild_segment(std::int64_t chunks, std::int64_t state_bytes_per_chunk) {
  if (chunks <= 0) return 1;
  if ((chunks + 1) * state_bytes_per_chunk <= kRebuildBudget) return chunks;
  return static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(chunks))));
}

}  // namespace

void backward(const detail::BackwardProblem& bp, CpuIsa isa) {
  const detail::ForwardProblem& p = bp.fwd;
  const KernelTable& table = kernel_table(isa);
  const BackwardItemFn item_fn = table.backward[activations(p.shape.dtype)];
  const std::int64_t heads = p.group;
  const std::int64_t items = p.shape.num_seqs * p.shape.hk;
  const bool kept_states = bp.chunk_states.data != nullptr;

  std::int64_t max_chunks = 0;
  for (std::int64_t s = 0; s < p.shape.num_seqs; ++s) {
    const std::int64_t chunks = (p.seqs[s].length + p.chunk_size - 1) / p.chunk_size;
    if (chunks > max_chunks) max_chunks = chunks;
  }
  const std::int64_t state_bytes = heads * p.shape.dk * ((p.shape.dv + 15) / 16 * 16) *
                                   static_cast<std::int64_t>(dtype_size(p.shape.compute_dtype));
  // One segment length for the whole call (the longest sequence decides), so that every item
  // fits the same workspace.
  const std::int64_t segment = kept_states ? 0 : rebuild_segment(max_chunks, state_bytes);

  const int threads = p.threads > 0 ? p.threads : default_threads();
  const std::int64_t step = segment == 0 ? 1 : segment;
  for_each_item(threads, items, backward_workspace_bytes(bp, heads, max_chunks, segment),
                [&](std::int64_t item, std::byte* workspace) {
                  const std::int64_t s = item / p.shape.hk, hk = item % p.shape.hk;
                  item_fn(bp, s, hk * heads, heads, step, workspace);
                });
}

}  // namespace gdn::cpu
