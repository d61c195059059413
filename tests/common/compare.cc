// compare.cc: see compare.h.
#include "compare.h"

#include <cstring>

namespace gdn::test {

double value_at(const Tensor& t, std::int64_t i) {
  switch (t.dtype()) {
    case DType::f32:
      return t.data<float>()[i];
    case DType::f64:
      return t.data<double>()[i];
    case DType::bf16:
      return bf16_value(static_cast<const std::uint16_t*>(t.raw())[i]);
    case DType::f16:
      return f16_value(static_cast<const std::uint16_t*>(t.raw())[i]);
    case DType::i64:
      return static_cast<double>(t.data<std::int64_t>()[i]);
    default:
      return 0.0;
  }
}

bench::ErrorStats compare(const Tensor& x, const Tensor& ref) {
  return bench::error_stats(
      x.numel(), [&](std::int64_t i) { return value_at(x, i); },
      [&](std::int64_t i) { return value_at(ref, i); });
}

::testing::AssertionResult within(const Tensor& x, const Tensor& ref, double tolerance,
                                  const std::string& what) {
  if (x.numel() != ref.numel()) {
    return ::testing::AssertionFailure()
           << what << ": " << x.numel() << " values vs " << ref.numel() << " in the reference";
  }
  const bench::ErrorStats s = compare(x, ref);
  if (s.normalized() <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << s.summary() << " > tolerance " << tolerance;
}

::testing::AssertionResult bit_identical(const Tensor& a, const Tensor& b,
                                         const std::string& what) {
  if (a.dtype() != b.dtype() || a.rank() != b.rank() || a.sizes() != b.sizes()) {
    return ::testing::AssertionFailure() << what << ": different dtype or shape";
  }
  if (std::memcmp(a.raw(), b.raw(), a.bytes()) == 0) return ::testing::AssertionSuccess();
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(static_cast<const char*>(a.raw()) + i * dtype_size(a.dtype()),
                    static_cast<const char*>(b.raw()) + i * dtype_size(b.dtype()),
                    dtype_size(a.dtype())) != 0) {
      return ::testing::AssertionFailure() << what << ": first difference at flat index " << i
                                           << ": " << value_at(a, i) << " vs " << value_at(b, i);
    }
  }
  return ::testing::AssertionFailure() << what << ": differ";
}

}  // namespace gdn::test
