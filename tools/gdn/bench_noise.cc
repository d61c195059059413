// bench_noise.cc: see bench_noise.h.
#include "bench_noise.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bench_util.h"
#include "cpu/kernels.h"

namespace gdn::cli {

namespace {

std::string format(const char* fmt, double a, double b = 0, double c = 0, double d = 0) {
  char text[256];
  std::snprintf(text, sizeof text, fmt, a, b, c, d);
  return text;
}

// A JSON number, or null for an unknown figure.
std::string number(double x, bool known, const char* fmt = "%.4f") {
  return known && std::isfinite(x) ? format(fmt, x) : "null";
}

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string NoiseVerdict::why() const {
  std::string text;
  for (const std::string& r : reasons) text += (text.empty() ? "" : "; ") + r;
  return text;
}

NoiseVerdict judge_noise(const NoiseFigures& f) {
  NoiseVerdict v;
  if (f.repeats >= 2 && f.min_ms > 0) {
    const double median_ratio = f.median_ms / f.min_ms;
    const double max_ratio = f.max_ms / f.min_ms;
    if (median_ratio > kNoisyMedianOverMin) {
      v.reasons.push_back(
          format("the median repeat took %.2fx the fastest (%.3f against %.3f ms; "
                 "limit %.2fx)",
                 median_ratio, f.median_ms, f.min_ms, kNoisyMedianOverMin));
    }
    if (f.min_ms >= kMaxOverMinFloorMs && max_ratio > kNoisyMaxOverMin) {
      v.reasons.push_back(format("the repeats spread from %.3f to %.3f ms (%.2fx; limit %.2fx)",
                                 f.min_ms, f.max_ms, max_ratio, kNoisyMaxOverMin));
    }
  }
  if (f.cpu_wait > kNoisyCpuWait) {
    v.reasons.push_back(
        format("its threads waited for a CPU %.0f%% of the time they were ready "
               "to run (limit %.0f%%): the cores were shared",
               100 * f.cpu_wait, 100 * kNoisyCpuWait));
  }
  if (f.peak_before > 0 && f.peak_after > 0) {
    const double change =
        std::max(f.peak_before, f.peak_after) / std::min(f.peak_before, f.peak_after) - 1;
    if (change > kNoisyPeakChange) {
      v.reasons.push_back(
          format("the fp32 FMA peak was %.1f GFLOP/s before and %.1f after "
                 "(%.0f%% apart; limit %.0f%%)",
                 f.peak_before, f.peak_after, 100 * change, 100 * kNoisyPeakChange));
    }
  }
  v.noisy = !v.reasons.empty();
  return v;
}

std::string noise_json(const NoiseFigures& f, const NoiseVerdict& v) {
  const bool spread = f.repeats >= 2 && f.min_ms > 0;
  return "\"noise\": {\"noisy\": " + std::string(v.noisy ? "true" : "false") +
         ", \"why\": " + quoted(v.why()) +
         ", \"median_over_min\": " + number(f.median_ms / f.min_ms, spread) +
         ", \"max_over_min\": " + number(f.max_ms / f.min_ms, spread) +
         ", \"cpu_wait\": " + number(f.cpu_wait, f.cpu_wait >= 0) +
         ", \"peak_before_gflops\": " + number(f.peak_before, f.peak_before > 0, "%.2f") +
         ", \"peak_after_gflops\": " + number(f.peak_after, f.peak_after > 0, "%.2f") + "}";
}

std::string noise_help() {
  char text[768];
  std::snprintf(
      text, sizeof text,
      "Noise: a case is marked noisy, and a WARN line printed after the run (with --json on\n"
      "stderr; each JSON line's \"noise\" object has the figures and the verdict), when its\n"
      "median repeat took more than %.2fx its fastest, or its repeats spread more than %.1fx\n"
      "(cases of %.0f ms and more), or the process's threads waited for a CPU more than %.0f%%\n"
      "of the time they were ready to run, or the fp32 FMA peak measured before and after it\n"
      "differs by more than %.0f%% (docs/perf.md, \"Noise\"). Its figures are then not to be\n"
      "trusted: run again on a quieter host.",
      kNoisyMedianOverMin, kNoisyMaxOverMin, kMaxOverMinFloorMs, 100 * kNoisyCpuWait,
      100 * kNoisyPeakChange);
  return text;
}

void NoiseVerdict::add(const std::string& what, const NoiseVerdict& other) {
  for (const std::string& r : other.reasons) reasons.push_back(what + ": " + r);
  noisy = noisy || other.noisy;
}

void NoiseWatch::start(int threads, double peak_gflops) {
  threads_ = threads;
  peak_ = peak_gflops;
}

NoiseVerdict NoiseWatch::judge(const std::string& label, const Timing& timing) {
  NoiseFigures f;
  f.min_ms = timing.min_ms;
  f.median_ms = timing.median_ms;
  f.max_ms = timing.max_ms;
  f.repeats = timing.repeats;
  f.cpu_wait = timing.cpu_wait;
  if (peak_ > 0) {
    // A shorter measurement than the run's first (0.3 s): five trials of 20 ms, the best
    // counts, which a quiet core repeats to within a few per cent.
    progress("  %s: measuring the fp32 FMA peak again...", label.c_str());
    f.peak_before = peak_;
    f.peak_after = cpu::measure_fma_peak_gflops(isa_, threads_, 0.1);
    progress("%s", "");
    peak_ = f.peak_after;
  }
  last_ = f;
  ++cases_;
  NoiseVerdict v = judge_noise(f);
  if (v.noisy) noisy_cases_.push_back(label + ": " + v.why());
  return v;
}

void NoiseWatch::warn(std::FILE* out, const char* tool) const {
  if (noisy_cases_.empty()) return;
  const int more = static_cast<int>(noisy_cases_.size()) - 1;
  std::fprintf(out,
               "WARN: %s: the host was too busy to trust these timings (%d of %d case%s noisy): "
               "%s%s; run again on a quieter host\n",
               tool, static_cast<int>(noisy_cases_.size()), cases_, cases_ == 1 ? "" : "s",
               noisy_cases_.front().c_str(),
               more == 0 ? "" : ("; and " + std::to_string(more) + " more, marked noisy").c_str());
}

}  // namespace gdn::cli
