// error_stats.h: how far a result is from the float64 reference, in the one metric that the
// tests, the benchmark's check and docs/numerics.md share.
//
//   error = max_i |x_i - ref_i| / max(rms(ref), tiny)
//
// i.e. the worst absolute error in units of the typical magnitude of the reference (outputs of
// GDN have no natural per-element scale: an element near zero has no meaningful relative
// error, so normalising by the tensor's RMS is the honest choice). A NaN or infinity in x
// where the reference is finite is an infinite error.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

namespace gdn::bench {

struct ErrorStats {
  double max_abs = 0;       // max |x - ref|
  double mean_abs = 0;      // mean |x - ref|
  double ref_rms = 0;       // sqrt(mean ref^2)
  double ref_max = 0;       // max |ref|
  std::int64_t worst = -1;  // flat index of max_abs
  std::int64_t count = 0;
  double x_worst = 0, ref_worst = 0;

  double normalized() const {
    const double scale = ref_rms > 1e-300 ? ref_rms : 1e-300;
    return max_abs / scale;
  }
  std::string summary() const {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "error %.3g (max |diff| %.3g at [%lld]: %.9g vs ref %.9g; mean |diff| %.3g; "
                  "ref rms %.3g, max %.3g; %lld values)",
                  normalized(), max_abs, static_cast<long long>(worst), x_worst, ref_worst,
                  mean_abs, ref_rms, ref_max, static_cast<long long>(count));
    return buf;
  }
};

// x and ref: `count` values each, read through accessors (so strided and typed data work).
template <class X, class Ref>
ErrorStats error_stats(std::int64_t count, X&& x_at, Ref&& ref_at) {
  ErrorStats s;
  s.count = count;
  double sum_abs = 0, sum_sq = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    const double x = static_cast<double>(x_at(i)), r = static_cast<double>(ref_at(i));
    double diff = std::fabs(x - r);
    if (std::isnan(diff) || std::isinf(diff)) {
      diff = (std::isnan(x) && std::isnan(r)) ? 0.0 : std::numeric_limits<double>::infinity();
    }
    sum_abs += diff;
    sum_sq += r * r;
    if (std::fabs(r) > s.ref_max) s.ref_max = std::fabs(r);
    if (s.worst < 0 || diff > s.max_abs) {
      s.max_abs = diff;
      s.worst = i;
      s.x_worst = x;
      s.ref_worst = r;
    }
  }
  if (count > 0) {
    s.mean_abs = sum_abs / static_cast<double>(count);
    s.ref_rms = std::sqrt(sum_sq / static_cast<double>(count));
  }
  return s;
}

template <class T, class U>
ErrorStats error_stats(const T* x, const U* ref, std::int64_t count) {
  return error_stats(
      count, [x](std::int64_t i) { return x[i]; }, [ref](std::int64_t i) { return ref[i]; });
}

}  // namespace gdn::bench
