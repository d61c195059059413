// npy.h: reading and writing NumPy .npy files (format versions 1.0, 2.0, 3.0).
//
// Supported element types: little-endian f4, f8, f2, i4, i8 (float32, float64, float16, int32,
// int64; '<' or '='/'|' native order on a little-endian host), C order, 1 to 4 dimensions.
// Anything else, any malformed, truncated or oversized file, and anything but a regular file
// (a FIFO, a device, a directory: refused at once, not waited on) gives NpyError with the path
// and what was wrong; nothing is guessed.
#pragma once

#include <stdexcept>
#include <string>

#include "gdn/tensor.h"
#include "output_files.h"

namespace gdn::npy {

class NpyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads the whole file into a contiguous Tensor.
Tensor load(const std::string& path);

// "float32 (<f4)" for a dtype the format stores, for messages.
std::string describe(DType dtype);

// Writes a contiguous tensor (version 1.0 header unless it needs more than 64 KiB) into
// `files`, which puts it in place with the command's other outputs (output_files.h).
void save(cli::OutputFiles& files, const std::string& path, const Tensor& tensor);
// The same, one file on its own: written whole to a temporary file, then renamed over `path`.
void save(const std::string& path, const Tensor& tensor);
void save(const std::string& path, DType dtype, int rank, const Dims& sizes, const void* data);

}  // namespace gdn::npy
