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

class OpenMPTeam final : public TeamExecutor {
 public:
  OpenMPTeam(ParallelEntry parallel, CountEntry max_threads)
      : parallel_(parallel), max_threads_(max_threads) {}

  int helpers() const override {
    const int n = max_threads_();
    return n > 1 ? n - 1 : 0;
  }

  // A call finds run_team by the executor's type and never schedules on it; running a task
  // here, on the calling thread, keeps the Executor contract for any other caller.
  void schedule(std::function<void()> task) override { task(); }

  void run_team(int threads, void (*member)(void* context, int index), void* context) override {
    struct Region {
      void (*member)(void*, int);
      void* context;
      std::atomic<int> next{0};
    } region{member, context};
    // Members number themselves in the order they start (not by omp_get_thread_num): each
    // index is taken once whatever the runtime reports. A region nested in another one gets a
    // team of one from the runtime, and that member runs every item.
    parallel_(
        [](void* data) {
          Region& r = *static_cast<Region*>(data);
          r.member(r.context, r.next.fetch_add(1, std::memory_order_relaxed));
        },
        &region, threads > 0 ? static_cast<unsigned>(threads) : 1u, 0u);
  }

 private:
  ParallelEntry parallel_;
  CountEntry max_threads_;
};

// The runtime that GOMP_parallel resolves to in the global scope, and its thread count from
// that same library (a second runtime, or a stub library, may define omp_get_max_threads too).
OpenMPTeam* find_runtime() {
  void* parallel = dlsym(RTLD_DEFAULT, "GOMP_parallel");
  if (parallel == nullptr) return nullptr;
  Dl_info info{};
  if (dladdr(parallel, &info) == 0 || info.dli_fname == nullptr) return nullptr;
  // Never closed: the runtime is not unloaded while the process can still call it.
  void* runtime = dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY);
  if (runtime == nullptr) return nullptr;
  void* max_threads = dlsym(runtime, "omp_get_max_threads");
  if (max_threads == nullptr) return nullptr;
  return new OpenMPTeam(reinterpret_cast<ParallelEntry>(parallel),
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
