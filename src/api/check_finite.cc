// check_finite.cc: the non-finite check mode's scan (check_finite.h).
#include "api/check_finite.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "common/half_bits.h"
#include "gdn/error.h"
#include "gdn/runtime.h"

namespace gdn {

namespace {

std::string describe(double value) {
  if (std::isnan(value)) return "nan";
  return value > 0 ? "inf" : "-inf";
}

}  // namespace

NonFiniteError::NonFiniteError(std::string tensor, std::string index, double value, bool output)
    : NonFiniteError(std::move(tensor), std::move(index), value, output,
                     output ? "the call's outputs are written" : "nothing was written") {}

NonFiniteError::NonFiniteError(std::string tensor, std::string index, double value, bool output,
                               const std::string& written)
    : RuntimeError("check_finite: " + std::string(output ? "output" : "input") + " '" + tensor +
                   "' holds " + describe(value) + " at " + index + " (" + written + ")"),
      tensor_(std::move(tensor)),
      index_(std::move(index)) {}

bool check_finite_from_environment() { return detail::check_finite_enabled(false); }

namespace detail {

bool check_finite_enabled(bool option) {
  static const bool from_environment = [] {
    const char* value = std::getenv("GDN_CHECK_FINITE");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }();
  return option || from_environment;
}

namespace {

// The element at flat offset `at` (in elements) of a view, widened to double.
double element(const TensorView& t, std::int64_t at) {
  const auto* base = static_cast<const std::byte*>(t.data);
  switch (t.dtype) {
    case DType::f32: {
      float x;
      std::memcpy(&x, base + at * 4, 4);
      return x;
    }
    case DType::f64: {
      double x;
      std::memcpy(&x, base + at * 8, 8);
      return x;
    }
    case DType::bf16: {
      std::uint16_t h;
      std::memcpy(&h, base + at * 2, 2);
      return float_from_bf16(h);
    }
    case DType::f16: {
      std::uint16_t h;
      std::memcpy(&h, base + at * 2, 2);
      return float_from_f16(h);
    }
    default:
      return 0.0;  // integer tensors are never non-finite
  }
}

std::string index_text(const std::int64_t* index, int rank) {
  std::string s = "[";
  for (int d = 0; d < rank; ++d) s += (d ? ", " : "") + std::to_string(index[d]);
  return s + "]";
}

const char* written_text(Written written) {
  switch (written) {
    case Written::nothing:
      return "nothing was written";
    case Written::outputs:
      return "the call's outputs are written";
    case Written::states_restored:
      return "the call's outputs are written; the states it updates in place are as before it";
    case Written::pools_restored:
      return "out is written; every pool slot is as before the call";
  }
  return "";
}

void scan(const NamedTensor& named, Written written) {
  const TensorView& t = named.view;
  if (!t.present() || t.numel() == 0) return;
  if (t.dtype != DType::f32 && t.dtype != DType::f64 && t.dtype != DType::bf16 &&
      t.dtype != DType::f16) {
    return;
  }
  Dims extent = t.sizes;
  if (named.rows >= 0 && named.rows < extent[0]) extent[0] = named.rows;
  for (int d = 0; d < t.rank; ++d) {
    if (extent[d] == 0) return;
  }
  std::int64_t index[kMaxRank] = {};
  while (true) {
    std::int64_t at = 0;
    for (int d = 0; d < t.rank; ++d) at += index[d] * t.strides[d];
    const double x = element(t, at);
    if (!std::isfinite(x)) {
      std::int64_t shown[kMaxRank];
      std::copy(index, index + kMaxRank, shown);
      shown[0] += named.first_row;
      throw NonFiniteError(named.name, index_text(shown, t.rank), x, written != Written::nothing,
                           written_text(written));
    }
    int d = t.rank - 1;
    while (d >= 0 && ++index[d] == extent[d]) index[d--] = 0;
    if (d < 0) return;
  }
}

}  // namespace

void check_finite(std::initializer_list<NamedTensor> tensors, Written written) {
  for (const NamedTensor& t : tensors) scan(t, written);
}

namespace {

// Calls visit(byte offset) for every element of a view, in row-major order.
template <class Visit>
void for_each_element(const MutableTensorView& t, Visit&& visit) {
  if (t.numel() == 0) return;
  const auto size = static_cast<std::int64_t>(dtype_size(t.dtype));
  std::int64_t index[kMaxRank] = {};
  while (true) {
    std::int64_t at = 0;
    for (int d = 0; d < t.rank; ++d) at += index[d] * t.strides[d];
    visit(at * size);
    int d = t.rank - 1;
    while (d >= 0 && ++index[d] == t.sizes[d]) index[d--] = 0;
    if (d < 0) return;
  }
}

bool contiguous(const MutableTensorView& t) {
  const Dims dense = contiguous_strides(t.sizes, t.rank);
  for (int d = 0; d < t.rank; ++d) {
    if (t.sizes[d] > 1 && t.strides[d] != dense[d]) return false;
  }
  return true;
}

}  // namespace

void StateBackup::save(const MutableTensorView& view) {
  if (!view.present() || view.numel() == 0) return;
  const std::size_t size = dtype_size(view.dtype);
  Saved s{view, std::vector<std::byte>(static_cast<std::size_t>(view.numel()) * size)};
  auto* base = static_cast<const std::byte*>(view.data);
  if (contiguous(view)) {
    std::memcpy(s.bytes.data(), base, s.bytes.size());
  } else {
    std::byte* to = s.bytes.data();
    for_each_element(view, [&](std::int64_t at) {
      std::memcpy(to, base + at, size);
      to += size;
    });
  }
  saved_.push_back(std::move(s));
}

void StateBackup::restore() const {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    const Saved& s = *it;
    auto* base = static_cast<std::byte*>(s.view.data);
    if (contiguous(s.view)) {
      std::memcpy(base, s.bytes.data(), s.bytes.size());
    } else {
      const std::size_t size = dtype_size(s.view.dtype);
      const std::byte* from = s.bytes.data();
      for_each_element(s.view, [&](std::int64_t at) {
        std::memcpy(base + at, from, size);
        from += size;
      });
    }
  }
}

void warn_expanding_keys(const TensorView& k, const TensorView& beta) {
  const int kr = k.rank, br = beta.rank;
  const std::int64_t batch = kr == 4 ? k.sizes[0] : 1, tokens = k.sizes[kr - 3];
  const std::int64_t hk = k.sizes[kr - 2], dk = k.sizes[kr - 1], hv = beta.sizes[br - 1];
  std::int64_t count = 0, first[3] = {0, 0, 0};
  double worst_first = 0;
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t h = 0; h < hv; ++h) {
        const std::int64_t key = (kr == 4 ? b * k.strides[0] : 0) + t * k.strides[kr - 3] +
                                 h / (hv / hk) * k.strides[kr - 2];
        double norm2 = 0;
        for (std::int64_t i = 0; i < dk; ++i) {
          const double x = element(k, key + i * k.strides[kr - 1]);
          norm2 += x * x;
        }
        const std::int64_t at = (br == 3 ? b * beta.strides[0] : 0) + t * beta.strides[br - 2] +
                                h * beta.strides[br - 1];
        const double growth = element(beta, at) * norm2;
        if (growth > 2) {
          if (count++ == 0) {
            first[0] = b;
            first[1] = t;
            first[2] = h;
            worst_first = growth;
          }
        }
      }
    }
  }
  if (count == 0) return;
  const std::string where = kr == 4 ? index_text(first, 3) : index_text(first + 1, 2);
  std::fprintf(stderr,
               "gdn: check_finite: warning: beta ||k||^2 = %.3g > 2 at %s %s "
               "(%lld such in the call; no L2 norm in the kernel): I - beta k k^T expands the "
               "state along k, and keys that keep their direction make it grow without bound "
               "(docs/numerics.md, \"Under stress\")\n",
               worst_first, kr == 4 ? "[sequence, token, value head]" : "[token, value head]",
               where.c_str(), static_cast<long long>(count));
}

}  // namespace detail
}  // namespace gdn
