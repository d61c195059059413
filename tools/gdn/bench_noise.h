// bench_noise.h: whether the host was quiet enough to trust a benchmark's timings, judged one
// way for every mode of `gdn bench` and for `gdn plan --time` (docs/perf.md, "Noise").
//
// Three signs of a busy host, each with its threshold:
//   - the repeats of a case spread: the median repeat more than kNoisyMedianOverMin times the
//     fastest, or (cases of at least kMaxOverMinFloorMs) the slowest more than
//     kNoisyMaxOverMin times the fastest;
//   - the process's threads waited for a CPU (ready to run, not running: the run queue of
//     /proc/self/task/*/schedstat) more than kNoisyCpuWait of the time they were runnable
//     while the case ran: other work took the cores;
//   - the fp32 FMA peak measured just before and just after the case differs by more than
//     kNoisyPeakChange: the machine's speed changed under the case (load, clocks).
// A verdict is about interference the run could see; a quiet verdict does not make a 2 %
// difference between two cases significant.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "gdn/runtime.h"

namespace gdn::cli {

struct Timing;

// The thresholds, with what a quiet host showed (docs/perf.md, "Noise").
inline constexpr double kNoisyMedianOverMin = 1.25;
inline constexpr double kNoisyMaxOverMin = 2.0;
// Below this a single interrupt or page fault can double one repeat; the median still counts.
inline constexpr double kMaxOverMinFloorMs = 1.0;
inline constexpr double kNoisyCpuWait = 0.10;
inline constexpr double kNoisyPeakChange = 0.15;

// What one timed case shows; a figure < 0 (CPU wait) or 0 (peaks) is unknown and not judged.
struct NoiseFigures {
  double min_ms = 0, median_ms = 0, max_ms = 0;
  int repeats = 0;
  double cpu_wait = -1;                    // a fraction of the runnable time
  double peak_before = 0, peak_after = 0;  // GFLOP/s
};

struct NoiseVerdict {
  bool noisy = false;
  std::vector<std::string> reasons;  // each with its figures and threshold; empty when quiet
  std::string why() const;           // the reasons joined with "; "
  // Takes in the verdict on a measurement the case's figures depend on (a same-run baseline),
  // its reasons prefixed with `what`.
  void add(const std::string& what, const NoiseVerdict& other);
};

// The verdict on one case from its figures alone (no clock, no /proc: the unit tests call it).
NoiseVerdict judge_noise(const NoiseFigures& figures);

// The case's figures and verdict as one JSON member for its line: "noise": {...}.
std::string noise_json(const NoiseFigures& figures, const NoiseVerdict& verdict);

// The --help paragraph that says what the WARN line means and the thresholds.
std::string noise_help();

// A run's watch over its cases: the peak before each case is the one measured after the
// previous (the first: the run's own peak), so each case is judged by its own before and after.
class NoiseWatch {
 public:
  explicit NoiseWatch(CpuIsa isa) : isa_(isa) {}
  // Before cases on `threads` threads: the fp32 FMA peak the run measured just before them
  // (0: no peak checks, for runs that report no peak: the conv, the serving step, the plan).
  void start(int threads, double peak_gflops);

  // After a case's repeats (`timing` from time_runs): measures the peak again (0.1 s) when
  // peak checks are on, and judges the case; `label` names it in the WARN line.
  NoiseVerdict judge(const std::string& label, const Timing& timing);
  // The figures of the last judged case (for noise_json).
  const NoiseFigures& last() const { return last_; }

  // One WARN line on `out` when a case was noisy: how many, and the first one's figures; nothing
  // when every case was quiet. `tool` starts the line ("gdn bench").
  void warn(std::FILE* out, const char* tool) const;
  bool noisy() const { return !noisy_cases_.empty(); }

 private:
  CpuIsa isa_;
  int threads_ = 1;
  double peak_ = 0;
  NoiseFigures last_;
  std::vector<std::string> noisy_cases_;  // "label: why"
  int cases_ = 0;
};

}  // namespace gdn::cli
