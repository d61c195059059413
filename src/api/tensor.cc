// tensor.cc: dtype names, view helpers and the owning Tensor.
#include "gdn/tensor.h"

#ifdef __linux__
#include <sys/mman.h>
#include <unistd.h>
#endif

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "common/half_bits.h"
#include "gdn/error.h"

namespace gdn {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
  }
  return 0;
}

std::uint16_t bf16_bits(float x) { return detail::bf16_from_float(x); }
float bf16_value(std::uint16_t bits) { return detail::float_from_bf16(bits); }
std::uint16_t f16_bits(float x) { return detail::f16_from_float(x); }
float f16_value(std::uint16_t bits) { return detail::float_from_f16(bits); }

Dims contiguous_strides(const Dims& sizes, int rank) {
  Dims strides{};
  std::int64_t step = 1;
  for (int i = rank - 1; i >= 0; --i) {
    strides[i] = step;
    step *= sizes[i];
  }
  return strides;
}

std::string shape_string(int rank, const Dims& sizes) {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(sizes[i]);
  }
  return s + "]";
}

template <class Pointer>
void BasicTensorView<Pointer>::assign(std::initializer_list<std::int64_t> shape,
                                      std::initializer_list<std::int64_t> element_strides) {
  if (shape.size() < 1 || shape.size() > static_cast<std::size_t>(kMaxRank)) {
    throw InvalidArgument("shape", "1 to 4 dimensions",
                          std::to_string(shape.size()) + " dimensions");
  }
  if (element_strides.size() != 0 && element_strides.size() != shape.size()) {
    throw InvalidArgument("strides", std::to_string(shape.size()) + " strides (one per dimension)",
                          std::to_string(element_strides.size()));
  }
  rank = static_cast<int>(shape.size());
  int i = 0;
  for (std::int64_t s : shape) sizes[i++] = s;
  if (element_strides.size() == 0) {
    strides = contiguous_strides(sizes, rank);
  } else {
    i = 0;
    for (std::int64_t s : element_strides) strides[i++] = s;
  }
}

template struct BasicTensorView<const void*>;
template struct BasicTensorView<void*>;

InvalidArgument::InvalidArgument(std::string argument, std::string expected, std::string given)
    : std::invalid_argument("gdn: argument '" + argument + "': expected " + expected + ", given " +
                            given),
      argument_(std::move(argument)),
      expected_(std::move(expected)),
      given_(std::move(given)) {}

namespace {

#ifdef __linux__
// Tensors of at least this many bytes are mapped directly, 2 MiB aligned, and marked for
// transparent huge pages: the first touch of a large fresh buffer then costs 1/512 of the
// page faults (measured on a 2-core VM: 256 MiB first touched in ~20 ms instead of ~130 ms).
// Fresh mappings are zero, so they need no memset either. From 2 MiB (one huge page): a serving
// step's 2 MiB temporaries cost ~1.2 ms of memset and page faults from the heap, ~0.4 ms
// mapped (measured on a Zen 3 VM, decode-64 preset of `gdn bench --op step`).
constexpr std::size_t kHugeAlign = std::size_t{2} << 20;
constexpr std::size_t kMapAtLeast = std::size_t{2} << 20;

// A zeroed mapping of `bytes` (a multiple of the page size) at a 2 MiB boundary, or null.
void* map_aligned(std::size_t bytes) {
  const std::size_t span = bytes + kHugeAlign;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (base + kHugeAlign - 1) & ~(kHugeAlign - 1);
  if (aligned > base) munmap(raw, aligned - base);
  const std::uintptr_t end = base + span, used_end = aligned + bytes;
  if (end > used_end) munmap(reinterpret_cast<void*>(used_end), end - used_end);
  void* p = reinterpret_cast<void*>(aligned);
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without THP it is a normal mapping
  return p;
}
#endif

}  // namespace

void Tensor::Free::operator()(std::byte* p) const {
#ifdef __linux__
  if (mapped > 0) {
    munmap(p, mapped);
    return;
  }
#endif
  std::free(p);
}

Tensor::Tensor(DType dtype, std::initializer_list<std::int64_t> shape) : dtype_(dtype) {
  if (shape.size() < 1 || shape.size() > static_cast<std::size_t>(kMaxRank)) {
    throw InvalidArgument("shape", "1 to 4 dimensions", std::to_string(shape.size()));
  }
  Dims sizes{};
  int rank = 0;
  for (std::int64_t s : shape) sizes[rank++] = s;
  *this = Tensor(dtype, rank, sizes);
}

Tensor::Tensor(DType dtype, int rank, const Dims& sizes)
    : dtype_(dtype), rank_(rank), sizes_(sizes) {
  if (rank < 1 || rank > kMaxRank) {
    throw InvalidArgument("rank", "1 to 4", std::to_string(rank));
  }
  std::int64_t count = 1, bytes = 0;
  for (int i = 0; i < rank; ++i) {
    if (sizes[i] < 0) {
      throw InvalidArgument("shape", "non-negative sizes", shape_string(rank, sizes));
    }
    if (__builtin_mul_overflow(count, sizes[i], &count)) {
      throw InvalidArgument("shape", "an element count that fits in int64",
                            shape_string(rank, sizes));
    }
  }
  // Round up to a whole cache line; at least one line so that data() is never null.
  if (__builtin_mul_overflow(count, static_cast<std::int64_t>(dtype_size(dtype)), &bytes) ||
      bytes > std::numeric_limits<std::int64_t>::max() - 128) {
    throw InvalidArgument("shape", "a size in bytes that fits in int64",
                          shape_string(rank, sizes) + " of " + dtype_name(dtype));
  }
  const auto alloc = static_cast<std::size_t>((bytes + 63) / 64 + 1) * 64;
#ifdef __linux__
  if (alloc >= kMapAtLeast) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t mapped = (alloc + page - 1) / page * page;
    if (void* p = map_aligned(mapped)) {
      storage_ = std::unique_ptr<std::byte[], Free>(static_cast<std::byte*>(p), Free{mapped});
      return;
    }
    throw RuntimeError("out of memory mapping " + std::to_string(mapped) + " bytes for a tensor " +
                       shape_string(rank, sizes));
  }
#endif
  void* p = std::aligned_alloc(64, alloc);
  if (p == nullptr) {
    throw RuntimeError("out of memory allocating " + std::to_string(alloc) +
                       " bytes for a tensor " + shape_string(rank, sizes));
  }
  std::memset(p, 0, alloc);
  storage_.reset(static_cast<std::byte*>(p));
}

std::int64_t Tensor::numel() const {
  if (rank_ == 0) return 0;
  std::int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= sizes_[i];
  return n;
}

void Tensor::check_type(DType requested) const {
  if (requested != dtype_) {
    throw InvalidArgument("Tensor::data<T>",
                          std::string("T matching the tensor dtype ") + dtype_name(dtype_),
                          dtype_name(requested));
  }
}

TensorView Tensor::view() const {
  if (!present()) return {};
  return TensorView(raw(), dtype_, rank_, sizes_, contiguous_strides(sizes_, rank_));
}

MutableTensorView Tensor::mutable_view() {
  if (!present()) return {};
  return MutableTensorView(raw(), dtype_, rank_, sizes_, contiguous_strides(sizes_, rank_));
}

}  // namespace gdn
