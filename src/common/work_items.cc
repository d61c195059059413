// work_items.cc: the library's pool, the executor scope and the item loop (work_items.h).
//
// Why a pool of our own rather than OpenMP: an OpenMP parallel region ends at a barrier that
// waits for every thread of the team to arrive, and a thread of the team that the scheduler
// has not run yet holds everyone up. On a shared host (a serving engine's threads, XLA's pool,
// another program's OpenMP) that turned a 0.25 ms decode into 21-24 ms. Here the caller takes
// items from the first moment and waits only for items a helper has taken (docs/architecture.md,
// "Threads").
#include "common/work_items.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "gdn/error.h"
#include "gdn/runtime.h"
#include "gdn/threads.h"

#ifdef __unix__
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace gdn {
namespace {

void relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// How long a pool thread keeps looking for a new task after its last one before it sleeps,
// and how long a caller spins for a helper's last item before it sleeps: long enough that the
// back-to-back calls of a model's layers find their helpers awake, short enough that an idle
// pool gives its cores back to the host within a fraction of a millisecond. On the 2-vCPU
// development host, decode-1 on 2 threads took 0.20-0.23 ms with 50 us, 0.18-0.19 with 200
// and 0.18 with 500, against 0.19-0.23 ms on OpenMP (whose threads spin longer); a caller
// that spun 20 us instead of 200 was slower under load (docs/perf.md, "Under load"). GDN_SPIN_US
// overrides it (0: sleep at once); a value that is not a whole number of microseconds from 0
// to 1000000 makes every call that would start helpers throw.
struct SpinSetting {
  std::chrono::microseconds time{200};
  std::string error;  // empty when GDN_SPIN_US is unset or valid
};

const SpinSetting& spin_setting() {
  static const SpinSetting value = [] {
    SpinSetting setting;
    if (const char* text = std::getenv("GDN_SPIN_US"); text != nullptr) {
      char* end = nullptr;
      const long parsed = std::strtol(text, &end, 10);
      if (*text == '\0' || end == text || *end != '\0' || parsed < 0 || parsed > 1000000) {
        setting.error = std::string(
                            "GDN_SPIN_US: expected a whole number of microseconds from 0 "
                            "to 1000000, given '") +
                        text + "'";
      } else {
        setting.time = std::chrono::microseconds(parsed);
      }
    }
    return setting;
  }();
  return value;
}

std::chrono::microseconds spin_time() { return spin_setting().time; }

// Spins until done() or `time` has passed, yielding the core every 16 looks; true when done()
// held. (Stopping early when a gap between two looks at the clock showed that the spinner had
// lost its core was tried: decode-1 under load got no faster, docs/perf.md "Under load".)
template <class Done>
bool spin_until(std::chrono::microseconds time, Done done) {
  const auto deadline = std::chrono::steady_clock::now() + time;
  for (;;) {
    for (int i = 0; i < 16; ++i) {
      if (done()) return true;
      relax();
    }
    // On an idle core the yield returns at once; on a shared one it hands the core to a thread
    // that has work (with Linux's autogroups, often the caller this spinner would help).
    std::this_thread::yield();
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

std::atomic<bool> forked_child{false};

// Registered at load time, before the pool could have started a thread.
const bool fork_handler_registered = [] {
#ifdef __unix__
  pthread_atfork(nullptr, nullptr, [] { forked_child.store(true, std::memory_order_relaxed); });
#endif
  return true;
}();

// The library's own executor: a FIFO of tasks and threads that spin briefly, then sleep on a
// condition variable. Threads start when a call first needs them and live until the process
// ends (the pool is never destroyed, so no thread outlives a destructor it depends on).
class Pool final : public Executor {
 public:
  int helpers() const override { return kMaxHelpers; }

  void schedule(std::function<void()> task) override {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back(std::move(task));
      queued_.fetch_add(1, std::memory_order_release);
    }
    // A thread that counted itself asleep did so under the mutex, before our push: we see it.
    if (sleeping_.load(std::memory_order_relaxed) > 0) wake_.notify_one();
  }

  // Starts threads until there are at least `count`. A thread the system refuses is not an
  // error: the call's caller runs the items that no helper takes.
  void reserve(int count) noexcept {
    if (started_.load(std::memory_order_acquire) >= count) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    int started = started_.load(std::memory_order_relaxed);
    try {
      for (; started < count; ++started) std::thread([this] { work(); }).detach();
    } catch (...) {
    }
    started_.store(started, std::memory_order_release);
  }

  static constexpr int kMaxHelpers = 1023;  // the options allow 1024 threads

#ifdef __linux__
  // set_pool_cpus: each thread moves itself before its next task (place), so no thread handle
  // is kept and no thread is moved by another.
  void set_cpus(const cpu_set_t& cpus) {
    const std::lock_guard<std::mutex> lock(mutex_);
    cpus_ = cpus;
    cpus_generation_.fetch_add(1, std::memory_order_release);
  }
#endif

 private:
  // Moves the calling pool thread to the CPUs last set, if they changed since `placed` (the
  // generation it last applied; 0: never set, the thread stays where it was started).
  void place(unsigned& placed) {
#ifdef __linux__
    if (cpus_generation_.load(std::memory_order_acquire) == placed) return;
    cpu_set_t cpus;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      cpus = cpus_;
      placed = cpus_generation_.load(std::memory_order_relaxed);
    }
    // Refused (none of the CPUs is the process's): the thread runs where it ran.
    pthread_setaffinity_np(pthread_self(), sizeof cpus, &cpus);
#else
    (void)placed;
#endif
  }

  bool try_take(std::function<void()>& task) {
    if (queued_.load(std::memory_order_acquire) == 0) return false;
    const std::lock_guard<std::mutex> lock(mutex_);
    if (tasks_.empty()) return false;
    task = std::move(tasks_.front());
    tasks_.pop_front();
    queued_.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }

  void work() {
#ifdef __linux__
    pthread_setname_np(pthread_self(), "gdn-worker");
#endif
    unsigned placed = 0;
    place(placed);
    for (;;) {
      std::function<void()> task;
      if (!spin_until(spin_time(), [&] { return try_take(task); })) {
        std::unique_lock<std::mutex> lock(mutex_);
        sleeping_.fetch_add(1, std::memory_order_relaxed);
        wake_.wait(lock, [&] { return !tasks_.empty(); });
        sleeping_.fetch_sub(1, std::memory_order_relaxed);
        task = std::move(tasks_.front());
        tasks_.pop_front();
        queued_.fetch_sub(1, std::memory_order_relaxed);
      }
      place(placed);
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  std::atomic<int> queued_{0};
  std::atomic<int> sleeping_{0};
  std::atomic<int> started_{0};
#ifdef __linux__
  cpu_set_t cpus_{};  // guarded by mutex_
#endif
  std::atomic<unsigned> cpus_generation_{0};
};

Pool& pool() {
  static Pool* const instance = new Pool;  // never destroyed: see Pool
  return *instance;
}

thread_local Executor* current_executor = nullptr;

// One call's items. Shared with the tasks it schedules, which may start after the call has
// returned: such a task sees no item left and touches nothing else. `state` packs the next
// item to hand out (low 40 bits) and the number of items in flight (the bits above): taking an
// item and counting it in flight is one atomic step, so a caller that sees no item left and
// none in flight knows that no helper is inside, or will enter, the caller's body.
struct Job {
  static constexpr std::uint64_t kNextMask = (std::uint64_t{1} << 40) - 1;
  static constexpr std::uint64_t kInFlight = std::uint64_t{1} << 40;

  std::atomic<std::uint64_t> state{0};
  std::atomic<int> joined{0};
  std::int64_t items = 0;
  int max_helpers = 0;
  detail::ItemBody body = nullptr;
  void* context = nullptr;
  std::mutex error_mutex;
  std::exception_ptr error;

  bool take(std::int64_t& item) {
    std::uint64_t s = state.load(std::memory_order_relaxed);
    do {
      if (static_cast<std::int64_t>(s & kNextMask) >= items) return false;
    } while (!state.compare_exchange_weak(s, s + 1 + kInFlight, std::memory_order_acq_rel,
                                          std::memory_order_relaxed));
    item = static_cast<std::int64_t>(s & kNextMask);
    return true;
  }

  void stop_handing_out() {
    std::uint64_t s = state.load(std::memory_order_relaxed);
    while (!state.compare_exchange_weak(s, (s & ~kNextMask) | static_cast<std::uint64_t>(items),
                                        std::memory_order_acq_rel, std::memory_order_relaxed)) {
    }
  }

  // Runs items until none is left. A helper that finishes the last item in flight wakes the
  // caller (which may be asleep in wait_for_helpers).
  void participate(int participant) {
    std::int64_t item = 0;
    while (take(item)) {
      try {
        body(context, item, participant);
      } catch (...) {
        {
          const std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
        }
        stop_handing_out();
      }
      const std::uint64_t after = state.fetch_sub(kInFlight, std::memory_order_acq_rel) - kInFlight;
      if (participant != 0 && after < kInFlight &&
          static_cast<std::int64_t>(after & kNextMask) >= items) {
        state.notify_all();
      }
    }
  }

  void wait_for_helpers() {
    if (spin_until(spin_time(),
                   [&] { return state.load(std::memory_order_acquire) < kInFlight; })) {
      return;
    }
    for (std::uint64_t s = state.load(std::memory_order_acquire); s >= kInFlight;
         s = state.load(std::memory_order_acquire)) {
      state.wait(s, std::memory_order_acquire);
    }
  }
};

}  // namespace

ScopedExecutor::ScopedExecutor(Executor& executor) : previous_(current_executor) {
  current_executor = &executor;
}

ScopedExecutor::~ScopedExecutor() { current_executor = previous_; }

Executor& default_executor() { return pool(); }

void set_pool_cpus(const std::vector<int>& cpus) {
  if (cpus.empty()) throw InvalidArgument("cpus", "at least one CPU", "an empty list");
#ifdef __unix__
  const long configured = sysconf(_SC_NPROCESSORS_CONF);
#else
  const long configured = static_cast<long>(std::thread::hardware_concurrency());
#endif
  long limit = configured > 0 ? configured : 1;
#ifdef __linux__
  if (limit > CPU_SETSIZE) limit = CPU_SETSIZE;
#endif
  for (std::size_t i = 0; i < cpus.size(); ++i) {
    if (cpus[i] < 0 || cpus[i] >= limit) {
      throw InvalidArgument(
          "cpus", "CPU numbers from 0 to " + std::to_string(limit - 1) + " (this system's CPUs)",
          std::to_string(cpus[i]) + " at index " + std::to_string(i));
    }
  }
#ifdef __linux__
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int cpu : cpus) CPU_SET(cpu, &set);
  pool().set_cpus(set);
#endif
}

int default_threads() {
#ifdef GDN_SINGLE_THREADED
  return 1;
#else
  // OMP_NUM_THREADS keeps the meaning it had when the library ran on OpenMP (its first number).
  if (const char* text = std::getenv("OMP_NUM_THREADS"); text != nullptr && *text != '\0') {
    char* end = nullptr;
    const long parsed = std::strtol(text, &end, 10);
    if (end != text && (*end == '\0' || *end == ',') && parsed >= 1) {
      return parsed > 1024 ? 1024 : static_cast<int>(parsed);
    }
  }
#ifdef __linux__
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof cpus, &cpus) == 0) {
    const int count = CPU_COUNT(&cpus);
    if (count >= 1) return count > 1024 ? 1024 : count;
  }
#endif
  const unsigned hardware = std::thread::hardware_concurrency();
  return hardware == 0 ? 1 : (hardware > 1024 ? 1024 : static_cast<int>(hardware));
#endif
}

bool built_with_threads() {
#ifdef GDN_SINGLE_THREADED
  return false;
#else
  return true;
#endif
}

namespace detail {

bool in_forked_child() { return forked_child.load(std::memory_order_relaxed); }

int usable_threads(int threads) {
#ifdef GDN_SINGLE_THREADED
  return 1;
#else
  if (threads <= 1 || in_forked_child()) return 1;
  const Executor& executor = current_executor != nullptr ? *current_executor : pool();
  const int helpers = executor.helpers() > 0 ? executor.helpers() : 0;
  return threads - 1 > helpers ? helpers + 1 : threads;
#endif
}

void run_items(int threads, std::int64_t items, ItemBody body, void* context) {
  if (items <= 0) return;
  auto job = std::make_shared<Job>();
  job->items = items;
  job->body = body;
  job->context = context;
  threads = usable_threads(threads);
  const std::int64_t helpers = threads < items ? threads - 1 : items - 1;
  Executor& executor = current_executor != nullptr ? *current_executor : pool();
  if (helpers > 0 && !spin_setting().error.empty()) throw RuntimeError(spin_setting().error);
  if (helpers > 0) {
    job->max_helpers = static_cast<int>(helpers);
    // A team runs every participant at once and returns when all are done: nothing to wait for.
    const auto member = [](void* team_context, int index) {
      Job& team_job = *static_cast<Job*>(team_context);
      if (index >= 0 && index <= team_job.max_helpers) team_job.participate(index);
    };
    if (auto* team = dynamic_cast<TeamExecutor*>(&executor)) {
      team->run_team(static_cast<int>(helpers) + 1, member, job.get());
      if (job->error) std::rethrow_exception(job->error);
      return;
    }
    if (&executor == &pool()) pool().reserve(static_cast<int>(helpers));
    for (std::int64_t h = 0; h < helpers; ++h) {
      executor.schedule([job] {
        const int participant = job->joined.fetch_add(1, std::memory_order_relaxed) + 1;
        if (participant <= job->max_helpers) job->participate(participant);
      });
    }
  }
  job->participate(0);
  job->wait_for_helpers();
  if (job->error) std::rethrow_exception(job->error);
}

}  // namespace detail
}  // namespace gdn
