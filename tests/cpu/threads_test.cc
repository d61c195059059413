// The item loop's promise (gdn/threads.h): a call never waits for a helper that has not
// started, runs every item exactly once, and gives the same bits whichever threads ran them.
#include "gdn/threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifdef __linux__
#include <pthread.h>
#include <sched.h>
#endif

#include "common/compare.h"
#include "common/isas.h"
#include "common/problem.h"
#include "gdn/gdn.h"
#include "src/common/work_items.h"

namespace gdn {
namespace {

using test::make_problem;
using test::Problem;
using test::ProblemSpec;

// Many items (sequences x value heads), so a call with several threads has work to hand out.
Problem many_items_problem() {
  ProblemSpec spec;
  spec.lengths = {130, 7, 64, 200, 1, 90, 33, 150};
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 32;
  spec.dv = 24;
  spec.initial_state = true;
  spec.l2norm = true;
  return make_problem(spec);
}

ForwardResult forward_with_threads(const Problem& p, CpuIsa isa, int threads) {
  ForwardOptions o = p.options();
  o.isa = isa;
  o.threads = threads;
  return chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
}

void expect_same_bits(const ForwardResult& r, const ForwardResult& one, const std::string& what) {
  EXPECT_TRUE(test::bit_identical(r.o, one.o, "o, " + what));
  EXPECT_TRUE(test::bit_identical(r.final_state, one.final_state, "final_state, " + what));
  EXPECT_TRUE(test::bit_identical(r.chunk_states, one.chunk_states, "chunk_states, " + what));
  EXPECT_TRUE(test::bit_identical(r.t_inv, one.t_inv, "t_inv, " + what));
}

// Keeps every task it is given and runs none until asked: a host where no helper ever gets a
// core while the call lasts.
struct NeverStartingExecutor final : Executor {
  std::vector<std::function<void()>> tasks;
  int helpers() const override { return 15; }
  void schedule(std::function<void()> task) override { tasks.push_back(std::move(task)); }
};

// Runs each task on the calling thread inside schedule(), as XLA's FFI does when its pool
// cannot take the task.
struct InlineExecutor final : Executor {
  int scheduled = 0;
  int helpers() const override { return 3; }
  void schedule(std::function<void()> task) override {
    ++scheduled;
    task();
  }
};

// A fork-join team (what an OpenMP runtime gives): run_team starts threads - 1 members on
// threads of its own, runs member 0 on the caller and joins them all before returning.
struct ThreadTeamExecutor final : TeamExecutor {
  int team_calls = 0;
  int scheduled = 0;
  std::atomic<int> members{0};
  int helpers() const override { return 3; }
  void schedule(std::function<void()> task) override {
    ++scheduled;
    task();
  }
  void run_team(int threads, void (*member)(void*, int), void* context) override {
    ++team_calls;
    std::vector<std::thread> team;
    for (int i = 1; i < threads; ++i) {
      team.emplace_back([&, i] {
        members.fetch_add(1);
        member(context, i);
      });
    }
    members.fetch_add(1);
    member(context, 0);
    for (auto& t : team) t.join();
  }
};

TEST(CpuThreads, TeamExecutorRunsTheCallAsOneTeamAndGivesTheSameBits) {
  const Problem p = many_items_problem();
  for (CpuIsa isa : test::runnable_isas()) {
    const ForwardResult one = forward_with_threads(p, isa, 1);
    ThreadTeamExecutor executor;
    ForwardResult r;
    {
      const ScopedExecutor scope(executor);
      r = forward_with_threads(p, isa, 8);
    }
    EXPECT_GE(executor.team_calls, 1);
    EXPECT_EQ(executor.scheduled, 0) << "a team executor is never given tasks";
    EXPECT_EQ(executor.members.load(), 4 * executor.team_calls) << "helpers() + 1 members";
    expect_same_bits(r, one, std::string(cpu_isa_name(isa)) + ", team executor");
  }
}

TEST(CpuThreads, CallFinishesOnTheCallerAloneWhenNoHelperEverStarts) {
  const Problem p = many_items_problem();
  for (CpuIsa isa : test::runnable_isas()) {
    const ForwardResult one = forward_with_threads(p, isa, 1);
    NeverStartingExecutor executor;
    ForwardResult r;
    {
      const ScopedExecutor scope(executor);
      r = forward_with_threads(p, isa, 4);
    }
    EXPECT_EQ(executor.tasks.size(), 3u) << "a 4-thread call schedules 3 helpers";
    expect_same_bits(r, one, std::string(cpu_isa_name(isa)) + ", no helper started");
    // The helpers start after the call has returned (and its stack is gone): they must find
    // nothing to do and touch nothing (ASan checks the "touch nothing").
    for (auto& task : executor.tasks) task();
    expect_same_bits(r, one, std::string(cpu_isa_name(isa)) + ", after late helpers");
  }
}

TEST(CpuThreads, ExecutorThatRunsTasksInsideScheduleGivesTheSameBits) {
  const Problem p = many_items_problem();
  for (CpuIsa isa : test::runnable_isas()) {
    const ForwardResult one = forward_with_threads(p, isa, 1);
    InlineExecutor executor;
    ForwardResult r;
    {
      const ScopedExecutor scope(executor);
      r = forward_with_threads(p, isa, 8);
    }
    EXPECT_EQ(executor.scheduled, 3) << "at most helpers() tasks";
    expect_same_bits(r, one, std::string(cpu_isa_name(isa)) + ", inline executor");
  }
}

// Blocks every thread of the library's pool, then calls with 3 threads: the call must finish
// on its own thread (its helper tasks wait in the queue behind the blocked ones).
TEST(CpuThreads, CallFinishesWhileEveryPoolThreadIsBlocked) {
  const Problem p = many_items_problem();
  const CpuIsa isa = test::runnable_isas().back();
  const ForwardResult one = forward_with_threads(p, isa, 1);
  (void)forward_with_threads(p, isa, 3);  // the pool has at least 2 threads from here on

  std::mutex mutex;
  std::condition_variable released;
  bool release = false;
  std::atomic<int> blocked{0}, finished{0};
  constexpr int kTasks = 64;  // more than the pool's threads: the rest wait in its queue
  for (int t = 0; t < kTasks; ++t) {
    default_executor().schedule([&] {
      blocked.fetch_add(1);
      {
        std::unique_lock<std::mutex> lock(mutex);
        released.wait(lock, [&] { return release; });
      }
      blocked.fetch_sub(1);
      finished.fetch_add(1);  // the task's last touch of this test's locals
    });
  }
  // Every pool thread is blocked once the count has stopped growing for a while.
  int seen = -1;
  while (blocked.load() != seen) {
    seen = blocked.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_GE(seen, 2);

  const auto start = std::chrono::steady_clock::now();
  const ForwardResult r = forward_with_threads(p, isa, 3);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(blocked.load(), seen) << "the call ran while every pool thread stayed blocked";
  {
    const std::lock_guard<std::mutex> lock(mutex);
    release = true;
  }
  released.notify_all();
  // Every task, the queued ones too, must be done before the locals they use go: blocked can
  // be 0 while queued tasks have not started (TSan saw one touch this frame after the test).
  while (finished.load() != kTasks) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  expect_same_bits(r, one, "every pool thread blocked");
  EXPECT_LT(seconds, 30.0);
}

#ifdef __linux__
std::vector<int> cpus_of_this_thread() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (pthread_getaffinity_np(pthread_self(), sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// The CPUs the pool thread that runs a 2-thread call's helper may run on: the call's first item
// waits (up to 10 s) until a helper has taken an item, so a helper surely runs one.
std::vector<int> cpus_of_a_helper() {
  std::atomic<bool> helper_ran{false};
  std::mutex mutex;
  std::vector<int> seen;
  auto body = [&](std::int64_t, int participant) {
    if (participant != 0) {
      if (!helper_ran.exchange(true)) {
        const std::lock_guard<std::mutex> lock(mutex);
        seen = cpus_of_this_thread();
      }
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!helper_ran.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  };
  detail::run_items(2, 64, body);
  const std::lock_guard<std::mutex> lock(mutex);
  return seen;
}

// vLLM's CPU worker binds its main thread to one CPU; pool threads it starts inherit that CPU
// until they are placed elsewhere. Threads already started move before their next task.
TEST(CpuThreads, PoolThreadsMoveToTheCpusSetForThePool) {
  const std::vector<int> all = cpus_of_this_thread();
  if (all.size() < 2) GTEST_SKIP() << "needs a thread that may run on 2 CPUs";
  (void)cpus_of_a_helper();  // the pool has started threads before the first placement
  set_pool_cpus(std::vector<int>{all[1]});
  EXPECT_EQ(cpus_of_a_helper(), std::vector<int>{all[1]});
  set_pool_cpus(std::vector<int>{all[0]});
  EXPECT_EQ(cpus_of_a_helper(), std::vector<int>{all[0]});
  set_pool_cpus(all);  // as they were
  EXPECT_EQ(cpus_of_a_helper(), all);
  EXPECT_EQ(cpus_of_this_thread(), all) << "the calling thread is never moved";
}

TEST(CpuThreads, SetPoolCpusRefusesAnEmptyListAndCpusTheSystemLacksChangingNothing) {
  const std::vector<int> all = cpus_of_this_thread();
  ASSERT_FALSE(all.empty());
  set_pool_cpus(std::vector<int>{all.back()});
  const auto refused = [](std::vector<int> cpus, const std::string& given) {
    try {
      set_pool_cpus(cpus);
      ADD_FAILURE() << "expected gdn::InvalidArgument for " << given;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), "cpus");
      EXPECT_EQ(e.given(), given);
    }
  };
  refused({}, "an empty list");
  refused({all.front(), -1}, "-1 at index 1");
  refused({all.front(), 1 << 20}, std::to_string(1 << 20) + " at index 1");
  EXPECT_EQ(cpus_of_a_helper(), std::vector<int>{all.back()}) << "a refused call moved the pool";
  set_pool_cpus(all);
}
#endif

TEST(WorkItems, EveryItemRunsExactlyOnceOnManyHelpers) {
  constexpr std::int64_t kItems = 10000;
  std::vector<std::atomic<int>> runs(kItems);
  std::vector<std::atomic<int>> by_participant(8);
  auto body = [&](std::int64_t item, int participant) {
    runs[static_cast<std::size_t>(item)].fetch_add(1);
    by_participant[static_cast<std::size_t>(participant)].fetch_add(1);
  };
  detail::run_items(8, kItems, body);
  for (std::int64_t i = 0; i < kItems; ++i) {
    ASSERT_EQ(runs[static_cast<std::size_t>(i)].load(), 1) << "item " << i;
  }
  int total = 0;
  for (auto& count : by_participant) total += count.load();
  EXPECT_EQ(total, kItems);
}

TEST(WorkItems, TeamRunsEveryItemOnceAndAnItemsExceptionReachesTheCaller) {
  ThreadTeamExecutor executor;
  const ScopedExecutor scope(executor);
  constexpr std::int64_t kItems = 500;
  std::vector<std::atomic<int>> runs(kItems);
  std::atomic<int> bad_participant{0};
  auto count = [&](std::int64_t item, int participant) {
    if (participant < 0 || participant > 3) bad_participant.fetch_add(1);
    runs[static_cast<std::size_t>(item)].fetch_add(1);
  };
  detail::run_items(4, kItems, count);
  for (std::int64_t i = 0; i < kItems; ++i) {
    ASSERT_EQ(runs[static_cast<std::size_t>(i)].load(), 1) << "item " << i;
  }
  EXPECT_EQ(bad_participant.load(), 0) << "participants are 0 .. threads - 1";
  auto failing = [&](std::int64_t item, int) {
    if (item == 7) throw std::runtime_error("item 7 failed");
  };
  try {
    detail::run_items(4, kItems, failing);
    FAIL() << "expected the item's exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "item 7 failed");
  }
}

TEST(WorkItems, ExceptionFromAnItemReachesTheCallerAfterTakenItemsFinish) {
  std::atomic<int> finished{0};
  auto body = [&](std::int64_t item, int) {
    if (item == 5) throw std::runtime_error("item 5 failed");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    finished.fetch_add(1);
  };
  try {
    detail::run_items(4, 1000, body);
    FAIL() << "expected the item's exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "item 5 failed");
  }
  // Items after the failure are not handed out (at most those already taken ran).
  EXPECT_LT(finished.load(), 1000 - 1);
  const int after = finished.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(finished.load(), after) << "no item may run after the call returned";
}

}  // namespace
}  // namespace gdn
