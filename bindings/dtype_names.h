// dtype_names.h: a dtype as Python names it (NumPy's and torch's names) -> gdn::DType.
#pragma once

#include <string>

#include "gdn/error.h"
#include "gdn/tensor.h"

namespace gdn::bindings {

inline DType dtype_named(const std::string& name, const char* argument) {
  if (name == "float32") return DType::f32;
  if (name == "float64") return DType::f64;
  if (name == "bfloat16") return DType::bf16;
  if (name == "float16") return DType::f16;
  if (name == "int32") return DType::i32;
  if (name == "int64") return DType::i64;
  throw InvalidArgument(argument, "dtype float32, float64, bfloat16, float16, int32 or int64",
                        name);
}

}  // namespace gdn::bindings
