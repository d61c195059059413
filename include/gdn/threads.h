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
// of starting its own.
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
