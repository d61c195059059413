// xla_threads.h: a custom call's helper threads come from XLA's intra-op thread pool.
//
// XLA:CPU runs its own pool of intra-op threads (Eigen's, one per core by default) and hands
// a typed FFI handler that pool as a context. A handler that let the library start its own
// pool would put a second set of threads on the same cores, each set waking for work while
// the other holds the cores. Instead every handler builds an XlaThreads from the context
// before its library call: the call's helper tasks are scheduled on XLA's pool
// (gdn/threads.h, ScopedExecutor), and the library's pool never starts in a process that
// only runs gdn.jax ops.
//
// How many: the handler's thread runs items itself and is often not one of the pool's threads
// (with jax 0.10 a jitted program's custom call ran on the Python thread that called it, the
// pool's threads idle), so a call takes at most num_threads() - 1 helpers: with the calling
// thread that makes the pool's size, one thread per CPU XLA was given, never one more. The
// `threads` attribute: 0 means the pool's size, a count above it is lowered to it (the tiling
// plan then sizes its items for the threads that can take them), 1 keeps the call on the
// handler's thread.
//
// A context without a pool (num_threads() == 0: an XLA runtime that passes custom calls no
// intra-op pool) installs nothing: the call keeps the library's defaults, its own pool and
// `threads` as given (0: default_threads()). Running on the caller alone instead would
// silently make such an embedding single-threaded, while there is no XLA pool in sight for the
// library's threads to compete with, and the library's pool never makes a call wait for a
// helper that does not run.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

#include "gdn/threads.h"
#include "xla/ffi/api/ffi.h"

namespace gdn::bindings {

// The Executor over XLA's pool. The library calls schedule() only inside the handler's library
// call, while the FFI context it schedules through is valid; a task that XLA starts after the
// call returned finds no item left and returns.
class XlaPoolExecutor final : public Executor {
 public:
  XlaPoolExecutor(xla::ffi::ThreadPool pool, int pool_threads)
      : pool_(pool), pool_threads_(pool_threads) {}

  int helpers() const override { return pool_threads_ > 1 ? pool_threads_ - 1 : 0; }

  // ThreadPool::Schedule runs the task on the calling thread when XLA refuses it, which the
  // Executor contract allows.
  void schedule(std::function<void()> task) override { pool_.Schedule(std::move(task)); }

 private:
  xla::ffi::ThreadPool pool_;
  int pool_threads_;
};

// While alive, the library calls on this thread take their helpers from XLA's pool (when the
// context has one); threads() is the count to put in the call's options. Build it before the
// library call and keep it for the whole handler.
class XlaThreads {
 public:
  XlaThreads(xla::ffi::ThreadPool pool, std::int64_t threads_attribute)
      : threads_(threads_attribute) {
    const std::int64_t size = pool.num_threads();
    if (size <= 0) return;  // no pool: the library's defaults (see the top of this file)
    const int pool_threads = size > kMaxThreads ? kMaxThreads : static_cast<int>(size);
    // Out-of-range counts go to the library as given, whose validation names them.
    if (threads_ == 0 || (threads_ > pool_threads && threads_ <= kMaxThreads)) {
      threads_ = pool_threads;
    }
    executor_.emplace(pool, pool_threads);
    scope_.emplace(*executor_);
  }
  XlaThreads(const XlaThreads&) = delete;
  XlaThreads& operator=(const XlaThreads&) = delete;

  std::int64_t threads() const { return threads_; }

 private:
  static constexpr int kMaxThreads = 1024;  // the options' limit

  std::int64_t threads_;
  std::optional<XlaPoolExecutor> executor_;
  std::optional<ScopedExecutor> scope_;  // destroyed first: uninstalls before the executor goes
};

}  // namespace gdn::bindings
