// parallel.h: the work-item loop the CPU drivers share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/work_items.h"
#include "cpu/float_env.h"
#include "gdn/error.h"

namespace gdn::cpu {

// Runs fn(item, workspace) for every item in [0, items) on the calling thread and up to
// `threads` - 1 helpers (never more threads than items), handing items out one at a time as
// threads come free (common/work_items.h: the caller never waits for a helper to start). Each
// thread gets its own 64-byte aligned workspace of `bytes`, allocated before any item runs (an
// exception cannot leave one) and freed after the last. Which thread runs an item must not
// change its result. Items run with subnormals as zero (cpu/float_env.h), whatever mode the
// thread that runs them was in.
template <class Fn>
void for_each_item(int threads, std::int64_t items, std::size_t bytes, Fn&& fn) {
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  threads = detail::usable_threads(threads);
  if (threads > items) threads = static_cast<int>(items > 0 ? items : 1);
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
  if (threads == 1) {
    const SubnormalsAsZero mode;
    for (std::int64_t item = 0; item < items; ++item) fn(item, workspaces[0].get());
    return;
  }
  auto run = [&fn, &workspaces](std::int64_t item, int participant) {
    const SubnormalsAsZero mode;  // a helper keeps whatever mode its pool left it in
    fn(item, workspaces[static_cast<std::size_t>(participant)].get());
  };
  detail::run_items(threads, items, run);
}

}  // namespace gdn::cpu
