// compare.h: test assertions against the float64 reference (metric: bench/error_stats.h).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "bench/error_stats.h"
#include "gdn/gdn.h"

namespace gdn::test {

// Error of x (any float dtype) against ref (f64), element by element in flat order.
bench::ErrorStats compare(const Tensor& x, const Tensor& ref);

// Passes when compare(x, ref).normalized() <= tolerance; the failure message carries the
// full statistics (max, mean, worst index and values) and `what`.
::testing::AssertionResult within(const Tensor& x, const Tensor& ref, double tolerance,
                                  const std::string& what);

// Same dtype, same shape, same bytes.
::testing::AssertionResult bit_identical(const Tensor& a, const Tensor& b, const std::string& what);

// Element i of a float tensor as double.
double value_at(const Tensor& t, std::int64_t i);

}  // namespace gdn::test
