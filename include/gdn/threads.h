// gdn/threads.h: where a call's helper threads come from.
//
// A call with `threads = n` splits its work into items (gdn plan names them) and runs them on
// the calling thread and at most n - 1 helpers. The calling thread takes items itself from the
// start and never waits for a helper to start: when no helper gets a core (a busy host, a
// framework's pool that is full), the caller runs every item alone. It waits only for items
// a helper has already taken. Which thread runs an item never changes its result, so the
// outputs are bit-identical for any thread count and any interleaving.
//
// Helpers come from the library's own pool (threads that spin briefly after each task, then
// sleep), unless the calling thread has installed an Executor with ScopedExecutor: gdn.jax
// installs XLA's intra-op pool, so an op inside a jitted function shares XLA's threads instead
// of starting its own. An executor over a fork-join team (openmp_executor(): the process's
// OpenMP runtime, as gdn.vllm uses in vLLM's worker) runs each parallel stage of the call as
// one team instead (a TeamExecutor).
//
//   struct MyPool : gdn::Executor {
//     int helpers() const override { return 7; }
//     void schedule(std::function<void()> task) override { pool.submit(std::move(task)); }
//   } executor;
//   gdn::ScopedExecutor scope(executor);  // calls on this thread take helpers from `executor`
//   gdn::chunk_gated_delta_rule_fwd(inputs, outputs, options);
#pragma once

#include <functional>
#include <vector>

namespace gdn {

class Executor {
 public:
  virtual ~Executor() = default;
  // How many tasks may run at once besides the calling thread; a call schedules at most this
  // many (and at most threads - 1). 0 makes every call run on the calling thread alone.
  virtual int helpers() const = 0;
  // Runs `task` once, on any thread, now or later (even after the call returned: a task that
  // starts too late finds nothing to do and returns at once). It may also run the task on the
  // calling thread before returning. It must not throw.
  virtual void schedule(std::function<void()> task) = 0;
};

// An executor over a fork-join team (an OpenMP runtime's) runs a call's threads as one team
// instead of scheduling tasks: run_team runs member(context, i) once for each i in [0, n),
// where n (1 <= n <= threads) is the team it got, each on its own thread of the team (the
// calling thread among them) at the same time, and returns once every member has returned;
// member does not throw. A call finds it by its type; schedule() is not used for such a call.
class TeamExecutor : public Executor {
 public:
  virtual void run_team(int threads, void (*member)(void* context, int index), void* context) = 0;
};

// While alive, gdn calls made on the constructing thread take their helpers from `executor`
// (which must outlive the scope); scopes nest. Not copyable; destroy on the same thread.
class ScopedExecutor {
 public:
  explicit ScopedExecutor(Executor& executor);
  ~ScopedExecutor();
  ScopedExecutor(const ScopedExecutor&) = delete;
  ScopedExecutor& operator=(const ScopedExecutor&) = delete;

 private:
  Executor* previous_;
};

// The library's own pool, which calls use when no ScopedExecutor is installed: helpers()
// is default_threads() - 1 or more, its threads are started when a call first needs them.
Executor& default_executor();

// The OpenMP runtime this process has loaded, as an executor whose helpers are that runtime's
// team: the runtime the process's global symbol scope resolves GOMP_parallel to (GCC's libgomp;
// LLVM's and Intel's runtimes export it too), which is the one a framework built on it (torch's
// ATen with its OpenMP backend) runs its own parallel regions on. A call on a thread that
// installs it runs its items on that thread's team, like the framework's own ops, instead of
// adding the library's pool to the cores the team's threads spin on (docs/vllm.md, "Threads").
// Each parallel stage of a call (a serving step has two: its conv and its delta rule) is then
// one parallel region, which ends at a barrier that waits for every thread of the team: a team
// thread whose core another program holds makes the call wait, as it makes the framework's own
// ops wait (the library's pool never does; docs/architecture.md, "Threads"). helpers() is the
// runtime's omp_get_max_threads() - 1 for the calling thread (a thread other than the one that
// set the runtime's count sees the runtime's default). With libgomp each calling thread gets a
// team of its own. nullptr where no OpenMP runtime is in the process's global scope (nothing is
// loaded by this call), in a build with GDN_THREADS=OFF, or outside GNU/Linux.
//
//   if (gdn::Executor* team = gdn::openmp_executor()) {
//     gdn::ScopedExecutor scope(*team);
//     gdn::chunk_gated_delta_rule_fwd(inputs, outputs, options);  // on the OpenMP team
//   }
Executor* openmp_executor();

// Where the library's pool threads run: each may run on any CPU of `cpus` (the system's CPU
// numbers), from its next task on for the threads already started, from the start for later
// ones. Until it is called a pool thread runs where the thread that started it could (a new
// thread inherits its creator's CPU mask): in a process whose OpenMP runtime bound the main
// thread to one CPU, as vLLM's CPU worker does, every helper would share the caller's CPU
// (docs/vllm.md, "Threads"). The calling threads themselves are left alone. The system keeps a
// thread within the CPUs its process may use: CPUs outside them are ignored, and a thread stays
// where it was if none is left. No effect outside GNU/Linux.
// Throws gdn::InvalidArgument naming `cpus` for an empty list or a number that is not one of
// this system's CPUs, and then changes nothing.
void set_pool_cpus(const std::vector<int>& cpus);

}  // namespace gdn
