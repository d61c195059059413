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

}  // namespace gdn::cli
