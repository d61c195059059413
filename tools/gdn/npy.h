// npy.h: reading and writing NumPy .npy files (format versions 1.0, 2.0, 3.0).
//
// Supported element types: little-endian f4, f8, i4, i8 ('<' or '='/'|' native order on a
// little-endian host), C order, 1 to 4 dimensions. Anything else, and any malformed, truncated
// or oversized file, gives NpyError with the path and what was wrong; nothing is guessed.
#pragma once

#include <stdexcept>
#include <string>

#include "gdn/tensor.h"

namespace gdn::npy {

class NpyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads the whole file into a contiguous Tensor.
Tensor load(const std::string& path);

// Writes a contiguous tensor (version 1.0 header unless it needs more than 64 KiB).
void save(const std::string& path, const Tensor& tensor);
void save(const std::string& path, DType dtype, int rank, const Dims& sizes, const void* data);

}  // namespace gdn::npy
