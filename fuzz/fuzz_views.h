// fuzz_views.h: tensor views built from fuzzed bytes, for the validation fuzzers.
//
// Every view of a case points into one arena (a heap block of exactly its size, so ASan
// guards both ends). Each view starts as the shape, dtype and layout a valid call wants and
// the fuzzer may break it: drop it, change its rank, dtype (invalid enum values included),
// a size (0, -1, +-1, huge), its strides (negative, zero, padded, transposed, overlapping,
// huge), misalign or null its pointer, or place it over another view. A view whose address
// range does not fit in the arena makes the case "unsafe": the op must not run it (it would
// read memory the fuzzer never gave it), so the fuzzer calls the validation alone. Index
// tensors (cu_seqlens, slots, distribution) are read by the validation itself: they always
// fit, and their values (intended, then perturbed) are written into the arena last.
//
// The oracle (check_call): the call returns, or throws gdn::InvalidArgument with an argument
// name (or gdn::RuntimeError, e.g. a forced ISA this CPU lacks); a throwing call leaves every
// byte of the arena as it was; a returning one changes no byte outside its output views.
// Anything else (another exception, a crash, an ASan or UBSan report) is a finding.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <vector>

#include "gdn/gdn.h"

namespace gdn::fuzz {

// Saturating arithmetic: the fuzzer's own edits must not overflow (UBSan would report them).
inline std::int64_t sat_add(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? std::numeric_limits<std::int64_t>::max() : std::numeric_limits<std::int64_t>::min();
}
inline std::int64_t sat_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (!__builtin_mul_overflow(a, b, &r)) return r;
  return (a < 0) != (b < 0) ? std::numeric_limits<std::int64_t>::min()
                            : std::numeric_limits<std::int64_t>::max();
}

[[noreturn]] inline void finding(const char* what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what);
  std::abort();
}

class Case {
 public:
  static constexpr std::size_t kArenaBytes = 256 * 1024;

  explicit Case(FuzzedDataProvider& f) : f_(f), arena_(arena()) {
    // Small finite floats (an f32 pattern; other dtypes read the same bytes), shifted by a
    // fuzzed number of elements.
    static const std::vector<float> pattern = make_pattern();
    const std::uint8_t seed = f_.ConsumeIntegral<std::uint8_t>();
    std::memcpy(arena_, pattern.data() + seed, kArenaBytes);
  }

  FuzzedDataProvider& data() { return f_; }
  bool safe() const { return safe_; }

  // Any value of the type, an edge value, or `usual` (what zero bytes give).
  std::int64_t pick(std::int64_t usual, std::initializer_list<std::int64_t> others) {
    const std::uint8_t c = f_.ConsumeIntegral<std::uint8_t>();
    if (c < 200) return usual;
    const std::size_t i = c - 200;
    if (i < others.size()) return others.begin()[i];
    return f_.ConsumeIntegral<std::int64_t>();
  }

  // A view of `dtype` and `sizes` (rank = sizes.size(), 0: absent), maybe broken.
  template <class View = TensorView>
  View view(DType dtype, const std::vector<std::int64_t>& sizes) {
    View v;
    v.dtype = dtype;
    v.rank = static_cast<int>(sizes.size());
    for (int i = 0; i < v.rank; ++i) v.sizes[i] = sizes[static_cast<std::size_t>(i)];
    v.strides = dense(v.sizes, v.rank);
    int place = 0;  // 0: fresh memory, 1: a fuzzed offset, 2: over an earlier view
    bool misalign = false, null = false;
    const std::uint8_t mutations = f_.ConsumeIntegral<std::uint8_t>();
    // Zero bytes: the intended view. Each set high bit: one mutation.
    for (int m = 0; m < 3 && (mutations & (0x80 >> m)); ++m) {
      const std::uint8_t kind = f_.ConsumeIntegral<std::uint8_t>();
      const int dim = f_.ConsumeIntegralInRange<int>(0, std::clamp(v.rank, 1, kMaxRank) - 1);
      switch (kind % 12) {
        case 0:
          v.rank = 0;
          break;
        case 1: {
          const int rank = f_.ConsumeIntegralInRange<int>(-1, kMaxRank + 1);
          for (int i = std::max(v.rank, 0); i < kMaxRank && i < rank; ++i) v.sizes[i] = 1;
          v.rank = rank;
          if (rank >= 0 && rank <= kMaxRank) v.strides = dense(v.sizes, rank);
          break;
        }
        case 2:
          v.dtype = static_cast<DType>(f_.ConsumeIntegralInRange<int>(0, 8));
          break;
        case 3:
          if (v.rank > 0 && v.rank <= kMaxRank && dim < v.rank)
            v.sizes[dim] = pick(sat_add(v.sizes[dim], 1), {sat_add(v.sizes[dim], -1), 0, -1, 1, 2, 1LL << 40,
                                                    std::numeric_limits<std::int64_t>::max()});
          break;
        case 4:  // reversed
          if (v.rank > 0 && v.rank <= kMaxRank && dim < v.rank) v.strides[dim] = sat_mul(v.strides[dim], -1);
          break;
        case 5:  // broadcast
          if (v.rank > 0 && v.rank <= kMaxRank && dim < v.rank) v.strides[dim] = 0;
          break;
        case 6:  // padded
          if (v.rank > 0 && v.rank <= kMaxRank && dim < v.rank) {
            const std::int64_t by = f_.ConsumeIntegralInRange<std::int64_t>(2, 3);
            for (int i = 0; i <= dim; ++i) v.strides[i] = sat_mul(v.strides[i], by);
          }
          break;
        case 7:  // transposed
          if (v.rank > 1 && v.rank <= kMaxRank && dim < v.rank) {
            const int other = f_.ConsumeIntegralInRange<int>(0, v.rank - 1);
            std::swap(v.strides[dim], v.strides[other]);
          }
          break;
        case 8:  // any stride
          if (v.rank > 0 && v.rank <= kMaxRank && dim < v.rank)
            v.strides[dim] = pick(f_.ConsumeIntegralInRange<std::int64_t>(-9, 9),
                                  {1LL << 40, -(1LL << 62), std::numeric_limits<std::int64_t>::max(),
                                   std::numeric_limits<std::int64_t>::min()});
          break;
        case 9:
          place = f_.ConsumeBool() ? 1 : 2;
          break;
        case 10:
          misalign = true;
          break;
        default:
          null = true;
          break;
      }
    }
    locate(&v, place, misalign, null);
    return v;
  }

  MutableTensorView out(DType dtype, const std::vector<std::int64_t>& sizes) {
    return view<MutableTensorView>(dtype, sizes);
  }

  // An int64 index tensor of `values.size()` elements holding `values`, maybe broken (values
  // too: each may be replaced). Always inside the arena (validation reads it).
  TensorView index(const std::vector<std::int64_t>& values, bool present = true) {
    if (!present) return {};
    TensorView v = view(DType::i64, {static_cast<std::int64_t>(values.size())});
    if (!fits(v)) {  // the intended layout, fresh
      v = TensorView(nullptr, DType::i64, {static_cast<std::int64_t>(values.size())});
      locate(&v, 0, false, false);
      if (!fits(v)) return {};
    }
    std::int64_t count = v.rank >= 1 && v.rank <= kMaxRank ? 1 : 0;
    for (int i = 0; count > 0 && i < v.rank; ++i) count = v.sizes[i] < 0 ? 0 : sat_mul(count, v.sizes[i]);
    std::vector<std::int64_t> given(static_cast<std::size_t>(std::min<std::int64_t>(count, 64)));
    for (std::size_t i = 0; i < given.size(); ++i) {
      const std::int64_t usual = i < values.size() ? values[i] : 0;
      given[i] = pick(usual, {sat_add(usual, 1), sat_add(usual, -1), 0, -1, 1, std::numeric_limits<std::int64_t>::max(),
                              std::numeric_limits<std::int64_t>::min()});
    }
    if (v.dtype == DType::i64 && v.rank >= 1 && v.rank <= kMaxRank && !given.empty())
      pending_.push_back({v, given});
    return v;
  }

  // Writes the index values (after every view is placed, so that they win over overlaps).
  void finish() {
    for (const auto& [v, values] : pending_) {
      if (v.data == nullptr) continue;
      const auto addr = reinterpret_cast<std::uintptr_t>(v.data);
      if (addr % 8 != 0) continue;
      for (std::size_t i = 0; i < values.size(); ++i) {
        std::int64_t offset = 0;
        std::int64_t rest = static_cast<std::int64_t>(i);
        for (int d = v.rank - 1; d >= 0; --d) {
          offset += (rest % v.sizes[d]) * v.strides[d];
          rest /= v.sizes[d];
        }
        std::memcpy(const_cast<std::byte*>(static_cast<const std::byte*>(v.data)) + offset * 8,
                    &values[i], 8);
      }
    }
  }

  // Runs `call` under the oracle (see the top of this file). `outputs`: the views it may write.
  void check_call(const std::function<void()>& call,
                  const std::vector<const MutableTensorView*>& outputs) {
    before_.assign(arena_, arena_ + kArenaBytes);
    bool threw = false;
    try {
      call();
    } catch (const InvalidArgument& e) {
      if (e.argument().empty()) finding("InvalidArgument without an argument name");
      threw = true;
    } catch (const RuntimeError&) {
      threw = true;
    }
    if (std::memcmp(before_.data(), arena_, kArenaBytes) == 0) return;
    if (threw) finding("a call that threw wrote memory");
    writable_.assign(kArenaBytes, 0);
    for (const MutableTensorView* o : outputs)
      if (o != nullptr) mark(*o, &writable_);
    const std::size_t at = first_stray_write(before_.data(), arena_, writable_.data());
    if (at < kArenaBytes) {
      std::fprintf(stderr, "arena byte %zu changed\n", at);
      finding("a call wrote outside its outputs");
    }
  }

  // Validation alone (for unsafe cases): returns or throws gdn::InvalidArgument.
  static void check_validation(const std::function<void()>& validate) {
    try {
      validate();
    } catch (const InvalidArgument& e) {
      if (e.argument().empty()) finding("InvalidArgument without an argument name");
    } catch (const RuntimeError&) {
    }
  }

 private:
  // Row-major strides, saturating (gdn::contiguous_strides expects sizes that fit).
  static Dims dense(const Dims& sizes, int rank) {
    Dims strides{};
    std::int64_t step = 1;
    for (int i = rank - 1; i >= 0; --i) {
      strides[i] = step;
      step = sat_mul(step, sizes[i]);
    }
    return strides;
  }
  static std::vector<float> make_pattern() {
    std::vector<float> p(kArenaBytes / 4 + 256);
    for (std::size_t i = 0; i < p.size(); ++i)
      p[i] = static_cast<float>(static_cast<int>((i * 7) % 23) - 11) * 0.03125f;
    return p;
  }
  // The harness's own loops over the arena carry no coverage instrumentation (it would
  // dominate the run time and tells the fuzzer nothing about the library).
  __attribute__((no_sanitize("coverage"))) static std::size_t first_stray_write(
      const std::byte* before, const std::byte* after, const std::uint8_t* writable) {
    for (std::size_t block = 0; block < kArenaBytes; block += 256) {
      if (std::memcmp(before + block, after + block, 256) == 0) continue;
      for (std::size_t i = block; i < block + 256; ++i)
        if (before[i] != after[i] && !writable[i]) return i;
    }
    return kArenaBytes;
  }
  struct Range {
    __int128 lo = 0, hi = 0;  // element offsets from data, inclusive
  };
  static bool shape_ok(const TensorView& v) {
    if (v.rank < 1 || v.rank > kMaxRank) return false;
    for (int i = 0; i < v.rank; ++i)
      if (v.sizes[i] < 0) return false;
    return true;
  }
  static std::int64_t elem(const TensorView& v) {
    const std::size_t s = dtype_size(v.dtype);
    return s == 0 ? 1 : static_cast<std::int64_t>(s);
  }
  static Range range(const TensorView& v) {
    Range r;
    for (int i = 0; i < v.rank; ++i) {
      constexpr __int128 kCap = static_cast<__int128>(1) << 80;  // far past any arena
      const __int128 step =
          std::clamp(static_cast<__int128>(v.sizes[i] - 1) * v.strides[i], -kCap, kCap);
      (step < 0 ? r.lo : r.hi) += step;
    }
    return r;
  }
  static bool empty(const TensorView& v) {
    for (int i = 0; i < v.rank; ++i)
      if (v.sizes[i] == 0) return true;
    return false;
  }
  // Inside the arena (or nothing to read).
  bool fits(const TensorView& v) const {
    if (!shape_ok(v) || empty(v)) return true;
    const Range r = range(v);
    const __int128 base = reinterpret_cast<std::uintptr_t>(arena_);
    const __int128 at = reinterpret_cast<std::uintptr_t>(v.data);
    return v.data != nullptr && at + r.lo * elem(v) >= base &&
           at + (r.hi + 1) * elem(v) <= base + static_cast<__int128>(kArenaBytes);
  }

  template <class View>
  void locate(View* v, int place, bool misalign, bool null) {
    auto* base = arena_;
    const std::int64_t e = elem(*v);
    std::int64_t start = 0;  // byte offset of the lowest element
    if (place == 2 && !placed_.empty()) {
      start = placed_[f_.ConsumeIntegralInRange<std::size_t>(0, placed_.size() - 1)];
    } else if (place == 1) {
      start = f_.ConsumeIntegralInRange<std::int64_t>(0, kArenaBytes / 8) * 8;
    } else {
      start = next_;
    }
    __int128 span = 0;
    bool measurable = shape_ok(*v) && !empty(*v);
    Range r;
    if (measurable) {
      r = range(*v);
      span = (r.hi - r.lo + 1) * e;
    }
    const __int128 data = start - (measurable ? r.lo * e : 0);
    if (measurable && start + span <= static_cast<__int128>(kArenaBytes)) {
      v->data = base + static_cast<std::int64_t>(data);
      if (place == 0) next_ = (start + static_cast<std::int64_t>(span) + 63) / 64 * 64;
    } else {
      v->data = base + start;  // validation must not dereference it
      if (measurable) safe_ = false;
    }
    placed_.push_back(start);
    if (misalign) v->data = static_cast<std::byte*>(const_cast<void*>(static_cast<const void*>(v->data))) + 1;
    if (null) v->data = nullptr;
    if (!fits(*v)) safe_ = false;
  }

  __attribute__((no_sanitize("coverage"))) void mark(const MutableTensorView& v,
                                                     std::vector<std::uint8_t>* writable) const {
    if (!shape_ok(v) || empty(v) || !fits(v)) return;
    const auto* base = arena_;
    const std::int64_t e = elem(v);
    const std::int64_t n = v.numel();
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t offset = 0, rest = i;
      for (int d = v.rank - 1; d >= 0; --d) {
        offset += (rest % v.sizes[d]) * v.strides[d];
        rest /= v.sizes[d];
      }
      const std::int64_t at = static_cast<const std::byte*>(v.data) - base + offset * e;
      for (std::int64_t b = 0; b < e; ++b) (*writable)[static_cast<std::size_t>(at + b)] = 1;
    }
  }

  FuzzedDataProvider& f_;
  // One heap block for every case (allocated once: ASan's redzones guard both its ends).
  static std::byte* arena() {
    static const std::unique_ptr<std::byte[]> block(new std::byte[kArenaBytes]);
    return block.get();
  }
  std::byte* arena_;
  static inline std::vector<std::byte> before_;
  static inline std::vector<std::uint8_t> writable_;
  std::int64_t next_ = 0;
  std::vector<std::int64_t> placed_;
  std::vector<std::pair<TensorView, std::vector<std::int64_t>>> pending_;
  bool safe_ = true;
};

}  // namespace gdn::fuzz
