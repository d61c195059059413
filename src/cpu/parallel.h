// parallel.h: the work-item loop the CPU drivers share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cpu/float_env.h"
#include "gdn/error.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace gdn::cpu {

// True in a process forked after gdn's first parallel call, until it execs: GNU libgomp's
// thread pool does not survive fork (the child's first parallel region waits forever on the
// parent's threads), so every call there runs on the calling thread alone. Results do not
// depend on the thread count, so nothing else changes.
bool in_forked_child();

// Runs fn(item, workspace) for every item in [0, items) on up to `threads` OpenMP threads
// (never more than items), handing items out dynamically; each thread gets its own 64-byte
// aligned workspace of `bytes`, allocated before the parallel region (an exception cannot
// leave one) and freed after it. Which thread runs an item must not change its result. Items
// run with subnormals as zero (cpu/float_env.h).
template <class Fn>
void for_each_item(int threads, std::int64_t items, std::size_t bytes, Fn&& fn) {
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  if (threads > items) threads = static_cast<int>(items > 0 ? items : 1);
  if (threads > 1 && in_forked_child()) threads = 1;
  bytes = (bytes + 63) / 64 * 64;
  std::vector<std::unique_ptr<std::byte[], Free>> workspaces;
  for (int t = 0; t < threads; ++t) {
    void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
    if (p == nullptr) {
      throw RuntimeError("out of memory allocating a workspace of " + std::to_string(bytes) +
                         " bytes");
    }
    workspaces.emplace_back(static_cast<std::byte*>(p));
  }
  if (threads <= 1) {  // no OpenMP region: one thread needs none, and a forked child can't
    const SubnormalsAsZero mode;
    for (std::int64_t item = 0; item < items; ++item) fn(item, workspaces[0].get());
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  {
    const SubnormalsAsZero mode;  // a pool thread keeps whatever mode it was created with
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t item = 0; item < items; ++item) {
      fn(item, workspaces[static_cast<std::size_t>(omp_get_thread_num())].get());
    }
  }
#else
  const SubnormalsAsZero mode;
  for (std::int64_t item = 0; item < items; ++item) fn(item, workspaces[0].get());
#endif
}

}  // namespace gdn::cpu
