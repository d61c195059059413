// buffers.h: XLA FFI buffers as gdn tensor views, and the index arrays the handlers widen.
//
// XLA hands a custom call dense row-major buffers, so every view is contiguous. Optional
// arguments arrive as zero-element placeholders (an FFI call has a fixed arity) with a
// boolean attribute saying whether they are present; `optional_view` turns them into absent
// views. Index arrays may be int32 (Tokamax, vLLM) or int64; the library takes int64, so an
// int32 array is widened into a small host vector first (N + 1 values per call).
#pragma once

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "bindings/huge_pages.h"
#include "gdn/error.h"
#include "gdn/tensor.h"
#include "xla/ffi/api/ffi.h"

namespace gdn::bindings {

namespace ffi = xla::ffi;

inline DType gdn_dtype(ffi::DataType type, const char* name) {
  switch (type) {
    case ffi::DataType::F32:
      return DType::f32;
    case ffi::DataType::F64:
      return DType::f64;
    case ffi::DataType::BF16:
      return DType::bf16;
    case ffi::DataType::F16:
      return DType::f16;
    case ffi::DataType::S32:
      return DType::i32;
    case ffi::DataType::S64:
      return DType::i64;
    default:
      throw InvalidArgument(name, "dtype float32, float64, bfloat16, float16, int32 or int64",
                            "XLA dtype " + std::to_string(static_cast<int>(type)));
  }
}

template <class View, class Pointer>
View dense_view(Pointer data, DType dtype, ffi::Span<const std::int64_t> dims, const char* name) {
  if (dims.size() < 1 || dims.size() > static_cast<std::size_t>(kMaxRank)) {
    throw InvalidArgument(name, "rank 1 to 4", "rank " + std::to_string(dims.size()));
  }
  Dims sizes{};
  const int rank = static_cast<int>(dims.size());
  for (int i = 0; i < rank; ++i) sizes[i] = dims[i];
  return View(data, dtype, rank, sizes, contiguous_strides(sizes, rank));
}

inline TensorView view(const ffi::AnyBuffer& b, const char* name) {
  return dense_view<TensorView>(static_cast<const void*>(b.untyped_data()),
                                gdn_dtype(b.element_type(), name), b.dimensions(), name);
}

inline TensorView optional_view(const ffi::AnyBuffer& b, bool present, const char* name) {
  return present ? view(b, name) : TensorView();
}

inline MutableTensorView mutable_view(ffi::Result<ffi::AnyBuffer>& b, const char* name) {
  advise_huge_pages(b->untyped_data(), b->size_bytes());
  return dense_view<MutableTensorView>(b->untyped_data(), gdn_dtype(b->element_type(), name),
                                       b->dimensions(), name);
}

// A result aliased to an input (a donated pool): written in place, its pages already there.
inline MutableTensorView in_place_view(ffi::Result<ffi::AnyBuffer>& b, const char* name) {
  return dense_view<MutableTensorView>(b->untyped_data(), gdn_dtype(b->element_type(), name),
                                       b->dimensions(), name);
}

inline MutableTensorView optional_mutable_view(ffi::Result<ffi::AnyBuffer>& b, bool present,
                                               const char* name) {
  return present ? mutable_view(b, name) : MutableTensorView();
}

// The first `rows` rows of a view (residual buffers are sized for the most chunks a batch of
// this shape can have; the op fills the rows its cu_seqlens give).
template <class View>
View leading_rows(View v, std::int64_t rows) {
  v.sizes[0] = rows;
  return v;
}

// Zero bytes of rows [from, sizes[0]) of a dense output: the residual rows past the batch's
// chunks, so that a buffer sized for the most chunks holds no uninitialised memory.
inline void zero_rows_from(const MutableTensorView& v, std::int64_t from) {
  if (!v.present() || from >= v.sizes[0]) return;
  const std::int64_t row = v.strides[0] * static_cast<std::int64_t>(dtype_size(v.dtype));
  std::memset(static_cast<char*>(v.data) + from * row, 0,
              static_cast<std::size_t>((v.sizes[0] - from) * row));
}

// Runs a handler body: gdn::InvalidArgument becomes INVALID_ARGUMENT with the library's
// message (which names the argument, the expected and the given value), anything else
// INTERNAL. No exception crosses the FFI boundary.
template <class Body>
ffi::Error guarded(Body&& body) {
  try {
    body();
    return ffi::Error::Success();
  } catch (const InvalidArgument& e) {
    return ffi::Error::InvalidArgument(e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(e.what());
  }
}

// An index array widened to int64 (or viewed as it is when it already is int64). Holds the
// widened copy, so it is neither copied nor moved.
class IndexArray {
 public:
  IndexArray(const IndexArray&) = delete;
  IndexArray& operator=(const IndexArray&) = delete;
  IndexArray(const ffi::AnyBuffer& b, const char* name) {
    const TensorView v = bindings::view(b, name);
    if (v.dtype == DType::i32) {
      const auto* p = static_cast<const std::int32_t*>(v.data);
      widened_.assign(p, p + v.numel());
      view_ = TensorView(widened_.data(), DType::i64, v.rank, v.sizes, v.strides);
    } else {
      view_ = v;  // int64, or a wrong dtype the op's validation names
    }
  }
  const TensorView& view() const { return view_; }

 private:
  std::vector<std::int64_t> widened_;
  TensorView view_;
};

}  // namespace gdn::bindings
