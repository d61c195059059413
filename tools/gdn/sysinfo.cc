// sysinfo.cc: see sysinfo.h (Linux /proc; elsewhere the functions report "unknown").
#include "sysinfo.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

namespace gdn::cli {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  return static_cast<bool>(out.flush());
}

std::int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      std::int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

SchedTimes sched_times() {
  SchedTimes t;
  std::error_code error;
  std::filesystem::directory_iterator tasks("/proc/self/task", error);
  if (error) return t;
  std::int64_t run = 0, wait = 0;
  for (const auto& task : tasks) {
    std::ifstream in(task.path() / "schedstat");
    std::int64_t task_run = 0, task_wait = 0;
    // A thread that exited since the listing has no file: it counts as nothing.
    if (in >> task_run >> task_wait) {
      run += task_run;
      wait += task_wait;
    }
  }
  if (run == 0) return t;  // no schedstat (kernel without CONFIG_SCHED_INFO)
  t.run_ns = run;
  t.wait_ns = wait;
  return t;
}

double cpu_wait_fraction(const SchedTimes& before, const SchedTimes& after) {
  if (before.run_ns < 0 || after.run_ns < 0) return -1;
  const double run = static_cast<double>(after.run_ns - before.run_ns);
  const double wait = static_cast<double>(after.wait_ns - before.wait_ns);
  // Threads that exited in between take their times with them: then the sums can shrink.
  if (run <= 0 || wait < 0) return -1;
  return wait / (run + wait);
}

}  // namespace gdn::cli
