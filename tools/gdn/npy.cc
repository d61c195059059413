// npy.cc: the .npy format, written from its specification
// (numpy.lib.format: magic "\x93NUMPY", version, header length, a Python dict literal
// {'descr': ..., 'fortran_order': ..., 'shape': (...), } padded with spaces to a multiple of
// 64 bytes and ended by '\n', then the raw data).
#include "npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string_view>
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

constexpr const char* kSupported =
    "expected <f4, <f8, <f2, <i4 or <i8 (float32, float64, float16, int32, int64)";

DType parse_descr(const std::string& path, std::string descr) {
  if (descr.size() < 2 || (descr.front() != '\'' && descr.front() != '"') ||
      descr.back() != descr.front()) {
    fail(path, "malformed header: 'descr' is not a string: " + descr);
  }
  descr = descr.substr(1, descr.size() - 2);
  if (descr.size() != 3) fail(path, "unsupported dtype '" + descr + "': " + kSupported);
  if (descr[0] == '>') {
    fail(path, "big-endian data ('" + descr + "') is not supported: save it with arr.astype('<" +
                   descr.substr(1) + "')");
  }
  if (descr[0] != '<' && descr[0] != '=' && descr[0] != '|') {
    fail(path, "unsupported dtype '" + descr + "': " + kSupported);
  }
  const std::string kind = descr.substr(1);
  if (kind == "f4") return DType::f32;
  if (kind == "f8") return DType::f64;
  if (kind == "f2") return DType::f16;
  if (kind == "i4") return DType::i32;
  if (kind == "i8") return DType::i64;
  fail(path, "unsupported dtype '" + descr + "': " + kSupported);
}

// The descr of a dtype the format stores, or null.
const char* descr_of(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "<f4";
    case DType::f64:
      return "<f8";
    case DType::f16:
      return "<f2";
    case DType::i32:
      return "<i4";
    case DType::i64:
      return "<i8";
    default:
      return nullptr;
  }
}

// The file, open for reading: a regular file, else NpyError at once. Opened without blocking
// (a FIFO's open would wait for a writer) and checked with fstat before anything is read.
class InputFile {
 public:
  explicit InputFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) fail(path, "cannot open (" + std::string(std::strerror(errno)) + ")");
    struct stat st {};
    if (::fstat(fd_, &st) != 0)
      fail(path, "cannot stat (" + std::string(std::strerror(errno)) + ")");
    if (!S_ISREG(st.st_mode)) {
      const char* kind = S_ISFIFO(st.st_mode)                         ? "a FIFO"
                         : S_ISDIR(st.st_mode)                        ? "a directory"
                         : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                         : S_ISSOCK(st.st_mode)                       ? "a socket"
                                                                      : "not a regular file";
      fail(path, std::string("expected a regular .npy file, given ") + kind);
    }
    size_ = st.st_size;
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile() { ::close(fd_); }

  std::int64_t size() const { return size_; }
  // Up to `count` bytes; fewer only at the end of the file.
  std::int64_t read(void* to, std::int64_t count) {
    std::int64_t done = 0;
    while (done < count) {
      const ssize_t n =
          ::read(fd_, static_cast<char*>(to) + done, static_cast<std::size_t>(count - done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(path_, "read error (" + std::string(std::strerror(errno)) + ")");
      if (n == 0) break;
      done += n;
    }
    return done;
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::int64_t size_ = 0;
};

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

std::string describe(DType dtype) {
  const char* name = dtype == DType::f32   ? "float32"
                     : dtype == DType::f64 ? "float64"
                     : dtype == DType::f16 ? "float16"
                     : dtype == DType::i32 ? "int32"
                     : dtype == DType::i64 ? "int64"
                                           : dtype_name(dtype);
  const char* descr = descr_of(dtype);
  return std::string(name) + (descr != nullptr ? std::string(" (") + descr + ")" : "");
}

Tensor load(const std::string& path) {
  InputFile in(path);
  const std::int64_t file_size = in.size();

  char preamble[12] = {};
  if (in.read(preamble, 10) < 10 || std::memcmp(preamble, kMagic, kMagicLength) != 0) {
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
    if (in.read(preamble + 10, 2) < 2) fail(path, "truncated header");
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
  if (in.read(header.data(), header_length) != header_length) fail(path, "truncated header");
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
  if (in.read(tensor.raw(), data_bytes) != data_bytes) fail(path, "read error (file shrank)");
  return tensor;
}

namespace {

// The magic, version, header length and header of a file of this array.
std::string preamble_and_header(const std::string& path, DType dtype, int rank, const Dims& sizes) {
  const char* descr = descr_of(dtype);
  if (descr == nullptr) fail(path, std::string("cannot write dtype ") + dtype_name(dtype));
  std::ostringstream dict;
  dict << "{'descr': '" << descr << "', 'fortran_order': False, 'shape': (";
  for (int i = 0; i < rank; ++i) {
    dict << sizes[i] << (rank == 1 ? "," : (i + 1 < rank ? ", " : ""));
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

  std::string bytes(kMagic, kMagicLength);
  const auto length = static_cast<std::uint32_t>(header.size());
  if (prefix == 10) {
    const char version[4] = {1, 0, static_cast<char>(length & 0xff),
                             static_cast<char>(length >> 8)};
    bytes.append(version, 4);
  } else {
    const char version[6] = {2,
                             0,
                             static_cast<char>(length & 0xff),
                             static_cast<char>((length >> 8) & 0xff),
                             static_cast<char>((length >> 16) & 0xff),
                             static_cast<char>(length >> 24)};
    bytes.append(version, 6);
  }
  return bytes + header;
}

void stage(cli::OutputFiles& files, const std::string& path, DType dtype, int rank,
           const Dims& sizes, const void* data) {
  std::int64_t count = 1;
  for (int i = 0; i < rank; ++i) count *= sizes[i];
  const std::string head = preamble_and_header(path, dtype, rank, sizes);
  files.write(path, {head, std::string_view(static_cast<const char*>(data),
                                            static_cast<std::size_t>(count) * dtype_size(dtype))});
}

}  // namespace

void save(cli::OutputFiles& files, const std::string& path, const Tensor& tensor) {
  stage(files, path, tensor.dtype(), tensor.rank(), tensor.sizes(), tensor.raw());
}

void save(const std::string& path, DType dtype, int rank, const Dims& sizes, const void* data) {
  cli::OutputFiles files;
  stage(files, path, dtype, rank, sizes, data);
  files.commit();
}

void save(const std::string& path, const Tensor& tensor) {
  save(path, tensor.dtype(), tensor.rank(), tensor.sizes(), tensor.raw());
}

}  // namespace gdn::npy
