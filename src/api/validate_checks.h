// validate_checks.h: the checks every argument validation shares (src/api/validate.cc, and
// the serving step's src/api/validate_step.cc): shapes, dtypes, extents, aliasing. Each failure
// throws gdn::InvalidArgument naming the argument, what was expected and what was given.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gdn/error.h"
#include "gdn/layer.h"
#include "gdn/tensor.h"

namespace gdn::detail {

template <class View>
std::string shape_of(const View& view) {
  if (view.rank < 0 || view.rank > kMaxRank) return "rank " + std::to_string(view.rank);
  return view.present() ? shape_string(view.rank, view.sizes) : std::string("absent");
}

[[noreturn]] inline void fail(const std::string& argument, const std::string& expected,
                              const std::string& given) {
  throw InvalidArgument(argument, expected, given);
}

// At most this many sequences in one call (cu_seqlens N, the batched layout's B, the step's
// N): validation keeps a record per sequence, and a broadcast (stride 0) index tensor or an
// empty batched input describes any number of them in no memory (found by fuzz/).
inline constexpr std::int64_t kMaxSequences = std::int64_t{1} << 20;

inline void check_sequence_count(const char* name, std::int64_t n, const std::string& what) {
  if (n > kMaxSequences) {
    fail(name, "at most 2^20 = " + std::to_string(kMaxSequences) + " sequences",
         what + " = " + std::to_string(n));
  }
}

// A rank the view types can hold (0 = absent, for optional arguments).
template <class View>
void check_rank(const char* name, const View& view) {
  if (view.rank < 0 || view.rank > kMaxRank) {
    fail(name, "a rank from 0 (absent) to 4", std::to_string(view.rank));
  }
}

// A dtype of the enum, sizes non-negative, the element count and the byte offset of the farthest
// element representable in int64, and a non-null pointer aligned to the element size.
template <class View>
void check_extent(const char* name, const View& view) {
  if (dtype_size(view.dtype) == 0) {  // a value outside the enum (found by fuzz/)
    fail(name, "a dtype of the enum (f32, f64, bf16, f16, i32 or i64)",
         "DType value " + std::to_string(static_cast<int>(view.dtype)));
  }
  std::int64_t count = 1;
  for (int i = 0; i < view.rank; ++i) {
    if (view.sizes[i] < 0) fail(name, "non-negative sizes", shape_of(view));
    if (__builtin_mul_overflow(count, view.sizes[i], &count)) {
      fail(name, "an element count that fits in int64", shape_of(view));
    }
  }
  if (count == 0) return;
  const auto elem = static_cast<std::int64_t>(dtype_size(view.dtype));
  std::int64_t reach = 0, bytes = 0, last = 0;
  for (int i = 0; i < view.rank; ++i) {
    std::int64_t step = 0;
    // |INT64_MIN| and reach + 1 overflow too (found by fuzz/); a size-1 dimension's stride
    // is never used.
    const std::int64_t stride = view.sizes[i] == 1 ? 0 : view.strides[i];
    if (stride == std::numeric_limits<std::int64_t>::min() ||
        __builtin_mul_overflow(view.sizes[i] - 1, stride < 0 ? -stride : stride, &step) ||
        __builtin_add_overflow(reach, step, &reach) || __builtin_add_overflow(reach, 1, &last) ||
        __builtin_mul_overflow(last, elem, &bytes)) {
      fail(name, "byte offsets that fit in int64",
           "sizes " + shape_of(view) + " with strides " + shape_string(view.rank, view.strides));
    }
  }
  if (view.data == nullptr) {
    fail(name, "a non-null data pointer for " + std::to_string(count) + " elements", "null");
  }
  if (reinterpret_cast<std::uintptr_t>(view.data) % static_cast<std::uintptr_t>(elem) != 0) {
    std::ostringstream given;
    given << view.data;
    fail(name,
         "a pointer aligned to " + std::to_string(elem) + " bytes (" + dtype_name(view.dtype) + ")",
         given.str());
  }
}

template <class View>
void expect_dtype(const char* name, const View& view, DType expected, const std::string& why) {
  if (view.dtype != expected) {
    fail(name, std::string("dtype ") + dtype_name(expected) + why, dtype_name(view.dtype));
  }
}

template <class View>
void expect_shape(const char* name, const View& view, int rank, const Dims& sizes,
                  const std::string& what) {
  bool same = view.rank == rank;
  for (int i = 0; same && i < rank; ++i) same = view.sizes[i] == sizes[i];
  if (!same) {
    fail(name, "shape " + what + " = " + shape_string(rank, sizes), shape_of(view));
  }
}

// Address range [lo, hi) in bytes that a view touches (empty for zero elements).
struct Span {
  std::uintptr_t lo = 0, hi = 0;
  bool empty() const { return hi <= lo; }
  bool overlaps(const Span& other) const {
    return !empty() && !other.empty() && lo < other.hi && other.lo < hi;
  }
};

template <class View>
Span span_of(const View& view) {
  if (!view.present() || view.numel() == 0) return {};
  std::int64_t lo = 0, hi = 0;
  for (int i = 0; i < view.rank; ++i) {
    std::int64_t step = (view.sizes[i] - 1) * view.strides[i];
    (step < 0 ? lo : hi) += step;
  }
  auto base = reinterpret_cast<std::uintptr_t>(view.data);
  auto elem = static_cast<std::int64_t>(dtype_size(view.dtype));
  return {base + static_cast<std::uintptr_t>(lo * elem),
          base + static_cast<std::uintptr_t>((hi + 1) * elem)};
}

// A view as a sorted list of disjoint byte intervals: its innermost contiguous run of
// elements, repeated over the other dimensions. Only for views whose strides are all
// positive and nested (each steps over what the smaller ones span), where the intervals come
// out in increasing address order; false otherwise, or when there would be more than
// `limit` intervals.
template <class View>
bool byte_intervals(const View& view, std::int64_t limit,
                    std::vector<std::pair<std::uintptr_t, std::uintptr_t>>* out) {
  struct Dim {
    std::int64_t size, stride;
  };
  Dim dims[kMaxRank];
  int n = 0;
  for (int i = 0; i < view.rank; ++i) {
    if (view.sizes[i] == 0) return true;
    if (view.sizes[i] > 1) {
      if (view.strides[i] <= 0) return false;
      dims[n++] = {view.sizes[i], view.strides[i]};
    }
  }
  for (int i = 1; i < n; ++i) {
    for (int j = i; j > 0 && dims[j].stride < dims[j - 1].stride; --j)
      std::swap(dims[j], dims[j - 1]);
  }
  // The contiguous run: dimensions that continue the one below without a gap.
  std::int64_t run = 1;  // elements
  int first_outer = 0;
  while (first_outer < n && dims[first_outer].stride == run) run *= dims[first_outer++].size;
  std::int64_t spanned = run - 1, count = 1;
  for (int i = first_outer; i < n; ++i) {
    if (dims[i].stride <= spanned) return false;  // not nested
    spanned += (dims[i].size - 1) * dims[i].stride;
    count *= dims[i].size;
    if (count > limit) return false;
  }
  const auto elem = static_cast<std::int64_t>(dtype_size(view.dtype));
  const auto base = reinterpret_cast<std::uintptr_t>(view.data);
  std::int64_t index[kMaxRank] = {};
  for (std::int64_t c = 0; c < count; ++c) {
    std::int64_t offset = 0;
    for (int i = first_outer; i < n; ++i) offset += index[i] * dims[i].stride;
    out->emplace_back(base + static_cast<std::uintptr_t>(offset * elem),
                      base + static_cast<std::uintptr_t>((offset + run) * elem));
    for (int i = first_outer; i < n; ++i) {  // the odometer, smallest stride fastest
      if (++index[i] < dims[i].size) break;
      index[i] = 0;
    }
  }
  return true;
}

// True when two views share a byte: exactly, by sweeping their interval lists, when both are
// positive and nested with a reasonable number of intervals (e.g. the q, k and v parts of one
// fused buffer, interleaved row by row); by address range otherwise (conservative).
template <class A, class B>
bool views_overlap(const A& a, const B& b) {
  if (!span_of(a).overlaps(span_of(b))) return false;
  constexpr std::int64_t kLimit = std::int64_t{1} << 22;
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ia, ib;
  if (!byte_intervals(a, kLimit, &ia) || !byte_intervals(b, kLimit, &ib)) return true;
  std::size_t i = 0, j = 0;
  while (i < ia.size() && j < ib.size()) {
    if (ia[i].first < ib[j].second && ib[j].first < ia[i].second) return true;
    if (ia[i].second <= ib[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return false;
}

// True when no two elements of the view share an address: sorted by |stride|, every stride
// must step over everything the smaller dimensions span.
template <class View>
bool elements_distinct(const View& view) {
  struct Dim {
    std::int64_t size, stride;
  };
  Dim dims[kMaxRank];
  int n = 0;
  for (int i = 0; i < view.rank; ++i) {
    if (view.sizes[i] == 0) return true;
    if (view.sizes[i] > 1) {
      dims[n++] = {view.sizes[i], view.strides[i] < 0 ? -view.strides[i] : view.strides[i]};
    }
  }
  for (int i = 1; i < n; ++i) {  // insertion sort by stride (at most 4 dimensions)
    for (int j = i; j > 0 && dims[j].stride < dims[j - 1].stride; --j) {
      const Dim t = dims[j];
      dims[j] = dims[j - 1];
      dims[j - 1] = t;
    }
  }
  std::int64_t spanned = 0;  // largest offset reachable with the smaller dimensions
  for (int i = 0; i < n; ++i) {
    if (dims[i].stride <= spanned) return false;
    spanned += (dims[i].size - 1) * dims[i].stride;
  }
  return true;
}

inline bool same_view(const TensorView& a, const MutableTensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i) {
    if (a.sizes[i] != b.sizes[i] || a.strides[i] != b.strides[i]) return false;
  }
  return true;
}

using NamedOutput = std::pair<const char*, const MutableTensorView*>;
using NamedInput = std::pair<const char*, const TensorView*>;

// Outputs are written while inputs are still being read: every present output must give
// each element its own address and must not share a byte with another output or with any
// input (views_overlap), except the (output, input) pairs of `in_place` when the output is
// exactly the input's view (an in-place update).
using InPlace = std::pair<const MutableTensorView*, const TensorView*>;

inline void check_aliasing(const std::vector<NamedOutput>& outputs,
                           const std::vector<NamedInput>& inputs,
                           const std::vector<InPlace>& in_place) {
  for (auto it = outputs.begin(); it != outputs.end(); ++it) {
    const auto& [name, view] = *it;
    if (!view->present()) continue;
    if (!elements_distinct(*view)) {
      fail(name, "strides that give every element its own address",
           "sizes " + shape_of(*view) + " with strides " + shape_string(view->rank, view->strides));
    }
    for (auto other = it + 1; other != outputs.end(); ++other) {
      if (other->second->present() && views_overlap(*view, *other->second)) {
        fail(name, std::string("memory that does not overlap '") + other->first + "'",
             "overlapping address ranges");
      }
    }
    for (const auto& [input_name, input] : inputs) {
      if (!input->present() || !views_overlap(*view, *input)) continue;
      bool allowed_pair = false;
      for (const InPlace& pair : in_place)
        allowed_pair |= view == pair.first && input == pair.second;
      if (!(allowed_pair && same_view(*input, *view))) {
        fail(name,
             std::string("memory that does not overlap the input '") + input_name + "'" +
                 (allowed_pair ? std::string(" (or exactly the view of ") + input_name +
                                     ", for an in-place update)"
                               : ""),
             "overlapping address ranges");
      }
    }
  }
}

// A pool of state slots [num_slots, ...] that an op reads and writes in place, slot by slot:
// each slot's inner dimensions dense row-major (one block of `slot` elements), the slot stride
// (dim 0) any number of elements from one slot up (vLLM's hybrid allocator pads each slot to a
// page shared with another pool's slot, with a storage offset: the base only needs the element
// alignment check_extent checks), so that no two slots share an element. With one slot its
// stride is never used: any value, 0 included.
template <class View>
void check_pool_slots(const char* name, const View& pool) {
  const int rank = pool.rank;
  const Dims dense = contiguous_strides(pool.sizes, rank);
  Dims want = pool.strides;  // dim 0 as given; the inner dims row-major
  bool inner = true;
  for (int i = 1; i < rank; ++i) {
    want[i] = dense[i];
    inner &= pool.sizes[i] <= 1 || pool.strides[i] == dense[i];
  }
  if (!inner) {
    fail(name,
         "each slot contiguous (row-major inner dimensions), strides " + shape_string(rank, want) +
             " for sizes " + shape_of(pool) + " (any slot stride of at least one slot)",
         "strides " + shape_string(rank, pool.strides));
  }
  const std::int64_t slot = dense[0];  // elements per slot
  if (pool.sizes[0] > 1 && pool.strides[0] < slot) {
    fail(name,
         "a slot stride (dim 0) of at least one slot, " + std::to_string(slot) +
             " elements, so that slots do not overlap (0 only with num_slots = 1)",
         "stride " + std::to_string(pool.strides[0]) + " with " + std::to_string(pool.sizes[0]) +
             " slots");
  }
}

inline std::vector<NamedInput> named_layer_inputs(const LayerInputs& in) {
  return {{"qkv", &in.qkv},
          {"a", &in.a},
          {"b", &in.b},
          {"conv_weight", &in.conv_weight},
          {"conv_bias", &in.conv_bias},
          {"A_log", &in.A_log},
          {"dt_bias", &in.dt_bias},
          {"conv_state", &in.conv_state},
          {"recurrent_state", &in.recurrent_state},
          {"cu_seqlens", &in.cu_seqlens}};
}

template <class View>
void expect_output(const char* name, const View& view, int rank, const Dims& sizes,
                   const std::string& what, DType dtype, const std::string& why, bool required) {
  if (!view.present()) {
    if (required) fail(name, "an output view " + shape_string(rank, sizes), "absent");
    return;
  }
  expect_shape(name, view, rank, sizes, what);
  expect_dtype(name, view, dtype, why);
  check_extent(name, view);
}

}  // namespace gdn::detail
