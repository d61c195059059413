// sysinfo.h: what the benchmark reports about the machine and the process.
#pragma once

#include <cstdint>
#include <string>

namespace gdn::cli {

// "AMD EPYC ..." from /proc/cpuinfo, or "unknown CPU".
std::string cpu_model_name();

// Resets the kernel's peak-RSS counter of this process (Linux: /proc/self/clear_refs), so that
// peak_rss_bytes() afterwards reports the peak of what ran in between. False if unsupported.
bool reset_peak_rss();

// Peak resident set size of this process (VmHWM), in bytes; 0 if unknown.
std::int64_t peak_rss_bytes();

// Nanoseconds this process's threads have run on a CPU and waited for one while ready to run
// (the first two fields of /proc/self/task/*/schedstat, summed over the live threads); both
// -1 if unknown. The difference of two readings says how much of the CPU time the threads
// wanted they did not get: other work had the cores.
struct SchedTimes {
  std::int64_t run_ns = -1, wait_ns = -1;
};
SchedTimes sched_times();

// The share of the runnable time spent waiting between two readings; -1 if unknown.
double cpu_wait_fraction(const SchedTimes& before, const SchedTimes& after);

}  // namespace gdn::cli
