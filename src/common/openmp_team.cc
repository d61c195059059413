// openmp_team.cc: gdn/threads.h's openmp_executor(), a call's threads as an OpenMP team.
//
// The library does not link an OpenMP runtime: it finds the one the process already has, by
// the entry points GCC's `#pragma omp parallel` compiles to (GOMP_parallel, which LLVM's and
// Intel's runtimes also export), so a call runs on the same threads as the framework around it.
// Looked up at each call until found (a framework may load its runtime after the first call).
#include <atomic>
#include <functional>
#include <utility>

#include "gdn/threads.h"

#if defined(__linux__) && !defined(GDN_SINGLE_THREADED)
#include <dlfcn.h>
#define GDN_OPENMP_LOOKUP 1
#endif

namespace gdn {
namespace {

#ifdef GDN_OPENMP_LOOKUP
using ParallelEntry = void (*)(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
using CountEntry = int (*)();

class OpenMPTeam final : public Executor {
 public:
  OpenMPTeam(ParallelEntry parallel, CountEntry thread_num, CountEntry max_threads)
      : parallel_(parallel), thread_num_(thread_num), max_threads_(max_threads) {}

  int helpers() const override {
    const int n = max_threads_();
    return n > 1 ? n - 1 : 0;
  }

  // run_items never schedules on a team (run_team takes every call); running a task here,
  // on the calling thread, keeps the Executor contract for any other caller.
  void schedule(std::function<void()> task) override { task(); }

  bool run_team(int threads, void (*member)(void* context, int index), void* context) override {
    struct Region {
      void (*member)(void*, int);
      void* context;
      CountEntry thread_num;
    } region{member, context, thread_num_};
    // The team's master is the calling thread (index 0); a region nested in another one gets
    // a team of one from the runtime, and the caller then runs every item.
    parallel_(
        [](void* data) {
          const Region& r = *static_cast<const Region*>(data);
          r.member(r.context, r.thread_num());
        },
        &region, threads > 0 ? static_cast<unsigned>(threads) : 1u, 0u);
    return true;
  }

 private:
  ParallelEntry parallel_;
  CountEntry thread_num_;
  CountEntry max_threads_;
};

OpenMPTeam* find_runtime() {
  void* parallel = dlsym(RTLD_DEFAULT, "GOMP_parallel");
  void* thread_num = dlsym(RTLD_DEFAULT, "omp_get_thread_num");
  void* max_threads = dlsym(RTLD_DEFAULT, "omp_get_max_threads");
  if (parallel == nullptr || thread_num == nullptr || max_threads == nullptr) return nullptr;
  // Never freed: the runtime is not unloaded while the process can still call it.
  return new OpenMPTeam(reinterpret_cast<ParallelEntry>(parallel),
                        reinterpret_cast<CountEntry>(thread_num),
                        reinterpret_cast<CountEntry>(max_threads));
}
#endif

}  // namespace

Executor* openmp_executor() {
#ifdef GDN_OPENMP_LOOKUP
  static std::atomic<OpenMPTeam*> found{nullptr};
  OpenMPTeam* team = found.load(std::memory_order_acquire);
  if (team != nullptr) return team;
  team = find_runtime();
  if (team == nullptr) return nullptr;
  OpenMPTeam* expected = nullptr;
  if (!found.compare_exchange_strong(expected, team, std::memory_order_acq_rel)) {
    delete team;  // another thread found it first
    return expected;
  }
  return team;
#else
  return nullptr;
#endif
}

}  // namespace gdn
