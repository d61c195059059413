// bench_util.h: what the benchmarks of `gdn bench` share: seeded inputs, progress on a
// terminal, timed repeats, token counts with a k suffix.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "args.h"
#include "gdn/runtime.h"
#include "gdn/tensor.h"

namespace gdn::cli {

// Deterministic, fast uniform numbers in [lo, hi) (splitmix64).
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  double uniform(double lo, double hi) {
    state_ += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return lo + (hi - lo) * static_cast<double>(z >> 11) * 0x1.0p-53;
  }

 private:
  std::uint64_t state_;
};

// Progress goes to stderr when it is a terminal, one line rewritten in place.
void progress(const char* format, ...) __attribute__((format(printf, 1, 2)));

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  std::int64_t peak_rss = 0;
  int repeats = 0;
  // The share of the process's runnable time spent waiting for a CPU during the repeats
  // (sysinfo.h); -1 if unknown. A sign of other work on the cores (bench_noise.h).
  double cpu_wait = -1;
};

// Runs `run` `repeats` times (after whatever warm-up the caller did), showing progress under
// `label`; median, min, max and the CPU wait over the repeats.
Timing time_runs(const std::function<void()>& run, int repeats, const std::string& label);

// A token count such as 8192, 8k or 64k (at most 2^24).
std::int64_t parse_token_count(const std::string& option, const std::string& text);

// --tokens or --seq (the same; --seq accepts a k suffix), else `fallback`.
std::int64_t parse_tokens(const Args& args, std::int64_t fallback);

// 16-bit activations in the benchmarks: element i of a float32, bf16 or f16 tensor; a float32
// tensor rounded to `dtype` (itself for f32 or an absent tensor); and the error of a float64
// result rounded to `dtype` against itself, what a 16-bit output cannot avoid (0 for f32),
// which the checks add twice to their float32 tolerance (docs/numerics.md).
double element_value(const Tensor& t, std::int64_t i);
Tensor rounded_to(Tensor x, DType dtype);
double rounding_error(const Tensor& ref, DType dtype);

// The chunk size the tiling plan chooses for a forward of this shape on this machine (what
// options.chunk_size = 0 runs; `gdn plan` says why).
int planned_chunk_size(std::int64_t hk, std::int64_t hv, std::int64_t dk, std::int64_t dv,
                       DType dtype, CpuIsa isa);

}  // namespace gdn::cli
