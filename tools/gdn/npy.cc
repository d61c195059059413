// npy.cc: the .npy format, written from its specification
// (numpy.lib.format: magic "\x93NUMPY", version, header length, a Python dict literal
// {'descr': ..., 'fortran_order': ..., 'shape': (...), } padded with spaces to a multiple of
// 64 bytes and ended by '\n', then the raw data).
#include "npy.h"

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

namespace gdn::npy {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLength = 6;
constexpr std::int64_t kMaxHeader = 1 << 20;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw NpyError(path + ": " + what);
}

// The value text of key `key` in the header dict (up to the next top-level comma or '}').
std::string dict_value(const std::string& path, const std::string& header, const std::string& key) {
  std::size_t at = std::string::npos;
  for (const char quote : {'\'', '"'}) {
    const std::string needle = std::string(1, quote) + key + std::string(1, quote);
    at = header.find(needle);
    if (at != std::string::npos) {
      at += needle.size();
      break;
    }
  }
  if (at == std::string::npos) fail(path, "malformed header: no '" + key + "' key in " + header);
  while (at < header.size() && std::isspace(static_cast<unsigned char>(header[at]))) ++at;
  if (at >= header.size() || header[at] != ':')
    fail(path, "malformed header: no ':' after '" + key + "'");
  ++at;
  while (at < header.size() && std::isspace(static_cast<unsigned char>(header[at]))) ++at;
  std::size_t end = at;
  int depth = 0;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
  }
  if (end >= header.size()) fail(path, "malformed header: unterminated value of '" + key + "'");
  std::string value = header.substr(at, end - at);
  while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back()))) value.pop_back();
  return value;
}

DType parse_descr(const std::string& path, std::string descr) {
  if (descr.size() < 2 || (descr.front() != '\'' && descr.front() != '"') ||
      descr.back() != descr.front()) {
    fail(path, "malformed header: 'descr' is not a string: " + descr);
  }
  descr = descr.substr(1, descr.size() - 2);
  if (descr.size() != 3) {
    fail(path, "unsupported dtype '" + descr + "': expected <f4, <f8, <i4 or <i8");
  }
  if (descr[0] == '>') {
    fail(path, "big-endian data ('" + descr + "') is not supported: save it with arr.astype('<" +
                   descr.substr(1) + "')");
  }
  if (descr[0] != '<' && descr[0] != '=' && descr[0] != '|') {
    fail(path, "unsupported dtype '" + descr + "': expected <f4, <f8, <i4 or <i8");
  }
  const std::string kind = descr.substr(1);
  if (kind == "f4") return DType::f32;
  if (kind == "f8") return DType::f64;
  if (kind == "i4") return DType::i32;
  if (kind == "i8") return DType::i64;
  fail(path, "unsupported dtype '" + descr +
                 "': expected <f4, <f8, <i4 or <i8 (float32, float64, int32, int64)");
}

std::vector<std::int64_t> parse_shape(const std::string& path, const std::string& text) {
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') {
    fail(path, "malformed header: 'shape' is not a tuple: " + text);
  }
  std::vector<std::int64_t> shape;
  std::size_t at = 1;
  while (at < text.size() - 1) {
    while (at < text.size() - 1 &&
           (std::isspace(static_cast<unsigned char>(text[at])) || text[at] == ','))
      ++at;
    if (at >= text.size() - 1) break;
    std::size_t end = at;
    while (end < text.size() - 1 && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    // Python 2 era files may write "3L".
    if (end == at) fail(path, "malformed header: bad dimension in shape " + text);
    const std::string digits = text.substr(at, end - at);
    if (digits.size() > 15)
      fail(path, "dimension " + digits + " in shape " + text + " is too large");
    shape.push_back(std::stoll(digits));
    at = end;
    if (at < text.size() - 1 && text[at] == 'L') ++at;
  }
  return shape;
}

}  // namespace

Tensor load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open (" + std::string(std::strerror(errno)) + ")");
  in.seekg(0, std::ios::end);
  const std::int64_t file_size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (file_size < 0 || !in) fail(path, "cannot read (not a regular file?)");

  char preamble[12] = {};
  in.read(preamble, 10);
  if (in.gcount() < 10 || std::memcmp(preamble, kMagic, kMagicLength) != 0) {
    fail(path, "not a .npy file (no \\x93NUMPY magic at the start)");
  }
  const int major = static_cast<unsigned char>(preamble[6]);
  std::int64_t header_length = 0;
  std::int64_t prefix = 0;
  if (major == 1) {
    header_length =
        static_cast<unsigned char>(preamble[8]) | (static_cast<unsigned char>(preamble[9]) << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    in.read(preamble + 10, 2);
    if (in.gcount() < 2) fail(path, "truncated header");
    for (int i = 0; i < 4; ++i) {
      header_length |= static_cast<std::int64_t>(static_cast<unsigned char>(preamble[8 + i]))
                       << (8 * i);
    }
    prefix = 12;
  } else {
    fail(path, "unsupported .npy format version " + std::to_string(major) + "." +
                   std::to_string(static_cast<unsigned char>(preamble[7])) +
                   " (expected 1.0, 2.0 or 3.0)");
  }
  if (header_length > kMaxHeader || prefix + header_length > file_size) {
    fail(path, "truncated or corrupt header (header length " + std::to_string(header_length) +
                   ", file size " + std::to_string(file_size) + " bytes)");
  }
  std::string header(static_cast<std::size_t>(header_length), '\0');
  in.read(header.data(), header_length);
  if (in.gcount() != header_length) fail(path, "truncated header");
  const std::size_t open = header.find('{'), close = header.rfind('}');
  if (open == std::string::npos || close == std::string::npos || close < open) {
    fail(path, "malformed header: no {...} dictionary");
  }

  const DType dtype = parse_descr(path, dict_value(path, header, "descr"));
  const std::string fortran = dict_value(path, header, "fortran_order");
  if (fortran == "True") {
    fail(path, "Fortran-order data is not supported: save a C-order array (np.ascontiguousarray)");
  }
  if (fortran != "False") fail(path, "malformed header: 'fortran_order' is " + fortran);
  const std::vector<std::int64_t> shape = parse_shape(path, dict_value(path, header, "shape"));
  if (shape.empty() || shape.size() > static_cast<std::size_t>(kMaxRank)) {
    fail(path, "expected 1 to 4 dimensions, given " + std::to_string(shape.size()));
  }
  Dims sizes{};
  std::int64_t count = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    sizes[i] = shape[i];
    if (__builtin_mul_overflow(count, shape[i], &count)) fail(path, "shape too large");
  }
  std::int64_t data_bytes = 0;
  if (__builtin_mul_overflow(count, static_cast<std::int64_t>(dtype_size(dtype)), &data_bytes)) {
    fail(path, "shape too large");
  }
  const std::int64_t available = file_size - prefix - header_length;
  const std::string described = "shape " + shape_string(static_cast<int>(shape.size()), sizes) +
                                " of " + dtype_name(dtype) + " needs " +
                                std::to_string(data_bytes) + " bytes of data";
  if (available < data_bytes) {
    fail(path, "truncated: " + described + ", the file has " + std::to_string(available));
  }
  if (available > data_bytes) {
    fail(path, "corrupt: " + described + ", the file has " + std::to_string(available) +
                   " (trailing bytes)");
  }
  Tensor tensor(dtype, static_cast<int>(shape.size()), sizes);
  in.read(static_cast<char*>(tensor.raw()), data_bytes);
  if (in.gcount() != data_bytes) fail(path, "read error");
  return tensor;
}

void save(const std::string& path, DType dtype, int rank, const Dims& sizes, const void* data) {
  const char* descr = nullptr;
  switch (dtype) {
    case DType::f32:
      descr = "<f4";
      break;
    case DType::f64:
      descr = "<f8";
      break;
    case DType::i32:
      descr = "<i4";
      break;
    case DType::i64:
      descr = "<i8";
      break;
    default:
      fail(path, std::string("cannot write dtype ") + dtype_name(dtype));
  }
  std::ostringstream dict;
  dict << "{'descr': '" << descr << "', 'fortran_order': False, 'shape': (";
  std::int64_t count = 1;
  for (int i = 0; i < rank; ++i) {
    dict << sizes[i] << (rank == 1 ? "," : (i + 1 < rank ? ", " : ""));
    count *= sizes[i];
  }
  dict << "), }";
  std::string header = dict.str();
  // Pad with spaces so that magic + version + length + header + '\n' is a multiple of 64.
  std::size_t prefix = 10;
  std::size_t total = prefix + header.size() + 1;
  if ((total + 63) / 64 * 64 - prefix > 65535) prefix = 12;
  total = prefix + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, "cannot create (" + std::string(std::strerror(errno)) + ")");
  out.write(kMagic, kMagicLength);
  const std::uint32_t length = static_cast<std::uint32_t>(header.size());
  if (prefix == 10) {
    const char version[4] = {1, 0, static_cast<char>(length & 0xff),
                             static_cast<char>(length >> 8)};
    out.write(version, 4);
  } else {
    const char version[6] = {2,
                             0,
                             static_cast<char>(length & 0xff),
                             static_cast<char>((length >> 8) & 0xff),
                             static_cast<char>((length >> 16) & 0xff),
                             static_cast<char>(length >> 24)};
    out.write(version, 6);
  }
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data),
            static_cast<std::streamsize>(count * dtype_size(dtype)));
  if (!out) fail(path, "write failed");
}

void save(const std::string& path, const Tensor& tensor) {
  save(path, tensor.dtype(), tensor.rank(), tensor.sizes(), tensor.raw());
}

}  // namespace gdn::npy
