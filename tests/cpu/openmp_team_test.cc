// gdn/threads.h's openmp_executor(): in a process with an OpenMP runtime, a call installed on
// it runs its items on the runtime's team (the framework's own threads), starts no pool thread
// of the library, and gives the bits of a one-thread call. Built only where CMake finds OpenMP
// (this executable links the runtime, as torch's ATen does).
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/isas.h"
#include "common/problem.h"
#include "gdn/gdn.h"
#include "gdn/threads.h"

namespace gdn {
namespace {

// Threads of this process named as the library names its pool's threads.
int pool_threads_started() {
  int count = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name == "gdn-worker") ++count;
  }
  return count;
}

ForwardResult forward(const test::Problem& p, CpuIsa isa, int threads) {
  ForwardOptions o = p.options();
  o.isa = isa;
  o.threads = threads;
  return chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
}

TEST(OpenMPTeam, FoundInAProcessWithARuntimeWithItsThreadCount) {
  omp_set_num_threads(3);
  Executor* team = openmp_executor();
  ASSERT_NE(team, nullptr) << "this test links an OpenMP runtime";
  EXPECT_EQ(team->helpers(), 2) << "omp_get_max_threads() - 1";
  EXPECT_EQ(openmp_executor(), team) << "one executor per process";
}

TEST(OpenMPTeam, RunTeamRunsEachMemberOnceOnTheTeamsThreads) {
  omp_set_dynamic(0);  // a team of the size asked for, whatever OMP_DYNAMIC says
  auto* team = dynamic_cast<TeamExecutor*>(openmp_executor());
  ASSERT_NE(team, nullptr) << "the OpenMP executor runs calls as a team";
  struct Seen {
    std::atomic<int> calls[2] = {0, 0};
    std::atomic<long> tid[2] = {0, 0};
  } seen;
  team->run_team(
      2,
      [](void* context, int index) {
        auto& s = *static_cast<Seen*>(context);
        if (index < 0 || index > 1) return;
        s.calls[index].fetch_add(1);
        s.tid[index].store(static_cast<long>(syscall(SYS_gettid)));
      },
      &seen);
  EXPECT_EQ(seen.calls[0].load(), 1);
  EXPECT_EQ(seen.calls[1].load(), 1);
  const long caller = static_cast<long>(syscall(SYS_gettid));
  EXPECT_NE(seen.tid[0].load(), seen.tid[1].load()) << "two threads of the team";
  EXPECT_TRUE(seen.tid[0].load() == caller || seen.tid[1].load() == caller)
      << "the calling thread is one of them";
}

TEST(OpenMPTeam, CallOnTheTeamGivesTheSameBitsAndStartsNoPoolThread) {
  test::ProblemSpec spec;
  spec.lengths = {130, 7, 64, 200, 1, 90, 33, 150};
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 32;
  spec.dv = 24;
  spec.initial_state = true;
  const test::Problem p = test::make_problem(spec);
  omp_set_num_threads(2);
  omp_set_dynamic(0);
  Executor* team = openmp_executor();
  ASSERT_NE(team, nullptr);
  for (CpuIsa isa : test::runnable_isas()) {
    const ForwardResult one = forward(p, isa, 1);
    ForwardResult r;
    {
      const ScopedExecutor scope(*team);
      r = forward(p, isa, 2);
    }
    const std::string what = std::string(cpu_isa_name(isa)) + ", OpenMP team";
    EXPECT_TRUE(test::bit_identical(r.o, one.o, "o, " + what));
    EXPECT_TRUE(test::bit_identical(r.final_state, one.final_state, "final_state, " + what));
    EXPECT_TRUE(test::bit_identical(r.chunk_states, one.chunk_states, "chunk_states, " + what));
  }
  EXPECT_EQ(pool_threads_started(), 0) << "the calls ran on the OpenMP team alone";
}

}  // namespace
}  // namespace gdn
