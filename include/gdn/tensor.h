// gdn/tensor.h: element types, non-owning strided tensor views, and an owning Tensor.
//
// Every op of the library takes its inputs as TensorView and writes its outputs into
// MutableTensorView: a pointer, a dtype, a rank (1 to 4), the sizes and the strides, with
// strides counted in elements (not bytes) and allowed to be any int64, so that a transposed
// or sliced framework tensor can be passed without a copy. A view with rank 0 is "absent":
// that is how optional arguments are left out.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>

namespace gdn {

enum class DType : std::uint8_t { f32, f64, bf16, f16, i32, i64 };

// "f32", "f64", "bf16", "f16", "i32", "i64".
const char* dtype_name(DType dtype);
// Bytes per element.
std::size_t dtype_size(DType dtype);

template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct DTypeOf<std::int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct DTypeOf<std::int64_t> {
  static constexpr DType value = DType::i64;
};

inline constexpr int kMaxRank = 4;
using Dims = std::array<std::int64_t, kMaxRank>;

// bf16 and f16 element bits: the nearest value to x (ties to even; NaN stays NaN; beyond the
// range, infinity), and the exact float of a bit pattern. For filling and reading bf16 and f16
// tensors (the library's 16-bit activation types, see gdn/forward.h).
std::uint16_t bf16_bits(float x);
float bf16_value(std::uint16_t bits);
std::uint16_t f16_bits(float x);
float f16_value(std::uint16_t bits);

// Row-major (C order) strides of `sizes`, in elements.
Dims contiguous_strides(const Dims& sizes, int rank);

// A non-owning view. Pointer is `const void*` for inputs (TensorView) and `void*` for
// outputs (MutableTensorView); a MutableTensorView converts to a TensorView.
template <class Pointer>
struct BasicTensorView {
  Pointer data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;    // 0: absent
  Dims sizes{};    // sizes[0..rank)
  Dims strides{};  // in elements; any value, negative and zero included (inputs)

  BasicTensorView() = default;

  // A contiguous row-major view: strides follow from sizes.
  template <class T>
  BasicTensorView(T* ptr, std::initializer_list<std::int64_t> shape)
      : BasicTensorView(ptr, DTypeOf<std::remove_const_t<T>>::value, shape) {}

  // A strided view; `shape` and `element_strides` must have the same length.
  template <class T>
  BasicTensorView(T* ptr, std::initializer_list<std::int64_t> shape,
                  std::initializer_list<std::int64_t> element_strides)
      : data(ptr), dtype(DTypeOf<std::remove_const_t<T>>::value) {
    assign(shape, element_strides);
  }

  // The same, for a pointer whose element type is given as a DType.
  BasicTensorView(Pointer ptr, DType type, std::initializer_list<std::int64_t> shape)
      : data(ptr), dtype(type) {
    assign(shape, {});
    strides = contiguous_strides(sizes, rank);
  }
  BasicTensorView(Pointer ptr, DType type, int view_rank, const Dims& view_sizes,
                  const Dims& view_strides)
      : data(ptr), dtype(type), rank(view_rank), sizes(view_sizes), strides(view_strides) {}

  template <class Other, class = std::enable_if_t<std::is_same_v<Pointer, const void*> &&
                                                  std::is_same_v<Other, void*>>>
  BasicTensorView(const BasicTensorView<Other>& other)  // NOLINT: intended conversion
      : data(other.data),
        dtype(other.dtype),
        rank(other.rank),
        sizes(other.sizes),
        strides(other.strides) {}

  bool present() const { return rank > 0; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= sizes[i];
    return rank > 0 ? n : 0;
  }
  std::int64_t size(int dim) const { return sizes[dim]; }
  std::int64_t stride(int dim) const { return strides[dim]; }

 private:
  void assign(std::initializer_list<std::int64_t> shape,
              std::initializer_list<std::int64_t> element_strides);
};

using TensorView = BasicTensorView<const void*>;
using MutableTensorView = BasicTensorView<void*>;

// "[8192, 16, 128]" for a view's sizes.
std::string shape_string(int rank, const Dims& sizes);

// An owning, contiguous, 64-byte-aligned tensor, zero-initialised. Used by the allocating
// convenience overloads, the CLI and the tests; the core ops never allocate outputs. On Linux
// tensors of 2 MiB and more are mapped 2 MiB aligned with transparent huge pages advised.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::initializer_list<std::int64_t> shape);
  Tensor(DType dtype, int rank, const Dims& sizes);

  bool present() const { return rank_ > 0; }
  DType dtype() const { return dtype_; }
  int rank() const { return rank_; }
  const Dims& sizes() const { return sizes_; }
  std::int64_t size(int dim) const { return sizes_[dim]; }
  std::int64_t numel() const;
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }

  void* raw() { return storage_.get(); }
  const void* raw() const { return storage_.get(); }
  template <class T>
  T* data() {
    check_type(DTypeOf<T>::value);
    return static_cast<T*>(raw());
  }
  template <class T>
  const T* data() const {
    check_type(DTypeOf<T>::value);
    return static_cast<const T*>(raw());
  }

  TensorView view() const;
  MutableTensorView mutable_view();

 private:
  struct Free {
    constexpr Free() noexcept : mapped(0) {}
    constexpr explicit Free(std::size_t bytes) noexcept : mapped(bytes) {}
    void operator()(std::byte* p) const;
    std::size_t mapped;  // bytes of a direct mapping (large tensors); 0: from the heap
  };
  void check_type(DType requested) const;

  DType dtype_ = DType::f32;
  int rank_ = 0;
  Dims sizes_{};
  std::unique_ptr<std::byte[], Free> storage_;
};

}  // namespace gdn
