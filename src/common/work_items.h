// work_items.h: the one loop that hands a call's work items to threads (gdn/threads.h says
// the contract). Below both the fast path (cpu/parallel.h adds workspaces) and the reference.
#pragma once

#include <cstdint>

namespace gdn::detail {

// Runs body(context, item, participant) once for every item in [0, items): the calling thread
// is participant 0 and takes items from the start; up to min(threads, items) - 1 helpers from
// the current executor join as participants 1, 2, ... when they start, and take items too.
// Returns once every item has run; it waits only for items a helper has taken. An exception
// from an item stops the handing out of further items and is rethrown here after the items
// already taken have finished. A call made from a forked child (GNU/Linux: the pool's threads
// did not survive the fork) runs on the calling thread alone.
using ItemBody = void (*)(void* context, std::int64_t item, int participant);
void run_items(int threads, std::int64_t items, ItemBody body, void* context);

// Runs fn(item, participant) for every item: run_items over a callable.
template <class Fn>
void run_items(int threads, std::int64_t items, Fn& fn) {
  run_items(
      threads, items,
      [](void* context, std::int64_t item, int participant) {
        (*static_cast<Fn*>(context))(item, participant);
      },
      &fn);
}

// True in a process forked after gdn started its pool, until it execs.
bool in_forked_child();

// How many threads a call asking for `threads` can run on here: at most the current
// executor's helpers() + 1, 1 in a forked child or a build with GDN_THREADS=OFF (a caller
// sizes per-thread workspaces by it).
int usable_threads(int threads);

}  // namespace gdn::detail
