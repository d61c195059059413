// bench_util.cc: see bench_util.h.
#include "bench_util.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/error_stats.h"
#include "gdn/plan.h"
#include "sysinfo.h"

namespace gdn::cli {

void progress(const char* format, ...) {
  static const bool tty = isatty(2);
  if (!tty) return;
  va_list args;
  va_start(args, format);
  std::fprintf(stderr, "\r\033[K");
  std::vfprintf(stderr, format, args);
  va_end(args);
}

Timing time_runs(const std::function<void()>& run, int repeats, const std::string& label) {
  std::vector<double> ms;
  const SchedTimes sched_before = sched_times();
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
    progress("  %s: run %d/%d took %.2f ms", label.c_str(), r + 1, repeats, ms.back());
  }
  const SchedTimes sched_after = sched_times();
  progress("%s", "");
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.repeats = repeats;
  t.cpu_wait = cpu_wait_fraction(sched_before, sched_after);
  t.min_ms = ms.front();
  t.max_ms = ms.back();
  t.median_ms =
      ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  return t;
}

std::int64_t parse_token_count(const std::string& option, const std::string& given) {
  std::string text = given;
  std::int64_t multiplier = 1;
  if (!text.empty() && (text.back() == 'k' || text.back() == 'K')) {
    multiplier = 1024;
    text.pop_back();
  }
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < 1 || value > (std::int64_t{1} << 24) / multiplier) {
    throw UsageError("option '--" + option +
                     "': expected a token count such as 8192, 8k or 64k, given '" + given + "'");
  }
  return value * multiplier;
}

std::int64_t parse_tokens(const Args& args, std::int64_t fallback) {
  if (!args.has("seq")) return args.integer("tokens", fallback, 1, std::int64_t{1} << 24);
  if (args.has("tokens")) throw UsageError("options '--seq' and '--tokens' are the same; give one");
  return parse_token_count("seq", args.text("seq", ""));
}

double element_value(const Tensor& t, std::int64_t i) {
  const auto* half = static_cast<const std::uint16_t*>(t.raw());
  if (t.dtype() == DType::bf16) return bf16_value(half[i]);
  if (t.dtype() == DType::f16) return f16_value(half[i]);
  return t.data<float>()[i];
}

Tensor rounded_to(Tensor x, DType dtype) {
  if (dtype == DType::f32 || !x.present()) return x;
  Tensor r(dtype, x.rank(), x.sizes());
  auto* out = static_cast<std::uint16_t*>(r.raw());
  const float* in = x.data<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i)
    out[i] = dtype == DType::bf16 ? bf16_bits(in[i]) : f16_bits(in[i]);
  return r;
}

double rounding_error(const Tensor& ref, DType dtype) {
  if (dtype == DType::f32) return 0;
  const double* r = ref.data<double>();
  return bench::error_stats(
             ref.numel(),
             [&](std::int64_t i) {
               const auto x = static_cast<float>(r[i]);
               return dtype == DType::bf16 ? bf16_value(bf16_bits(x)) : f16_value(f16_bits(x));
             },
             [&](std::int64_t i) { return r[i]; })
      .normalized();
}

int planned_chunk_size(std::int64_t hk, std::int64_t hv, std::int64_t dk, std::int64_t dv,
                       DType dtype, CpuIsa isa) {
  PlanProblem problem;
  problem.op = PlanOp::forward;
  problem.tokens = 8192;
  problem.hk = hk;
  problem.hv = hv;
  problem.dk = dk;
  problem.dv = dv;
  problem.dtype = dtype;
  ForwardOptions options;
  options.chunk_size = 0;
  options.isa = isa;
  return make_plan(problem, options).chunk_size;
}

}  // namespace gdn::cli
