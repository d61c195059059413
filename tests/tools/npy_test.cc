// npy_test.cc: the .npy reader and writer, including every malformed file it must reject.
#include "npy.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/compare.h"

namespace gdn {
namespace {

std::filesystem::path temp_dir() {
  const auto dir =
      std::filesystem::temp_directory_path() /
      ("gdn_npy_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
       ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::create_directories(dir);
  return dir;
}

void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A version 1.0 file with the given header dict and data bytes.
std::string npy_file(const std::string& dict, const std::string& data) {
  std::string header = dict;
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  return out + header + data;
}

void expect_rejected(const std::filesystem::path& path, const std::string& fragment) {
  try {
    npy::load(path.string());
    ADD_FAILURE() << "accepted " << path;
  } catch (const npy::NpyError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path.string()), std::string::npos) << what;
    EXPECT_NE(what.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << what;
  }
}

TEST(Npy, RoundTripEveryDtypeAndRank) {
  const auto dir = temp_dir();
  int n = 0;
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::i32, DType::i64}) {
    for (const Dims& sizes : {Dims{7, 0, 0, 0}, Dims{3, 5, 0, 0}, Dims{2, 3, 4, 0},
                              Dims{2, 1, 3, 2}, Dims{0, 4, 0, 0}}) {
      int rank = 0;
      while (rank < 4 && sizes[rank] != 0) ++rank;
      if (sizes[0] == 0) rank = 2;
      Tensor t(dtype, rank, sizes);
      for (std::size_t b = 0; b < t.bytes(); ++b)
        static_cast<unsigned char*>(t.raw())[b] = static_cast<unsigned char>(b * 31 + 7);
      std::string name = "t";  // (appending, not "t" + ...: GCC 12 -Wrestrict false positive)
      name += std::to_string(n++);
      name += ".npy";
      const auto path = dir / name;
      npy::save(path.string(), t);
      const std::string bytes = read_bytes(path);
      const std::size_t header_end = bytes.find('\n') + 1;
      EXPECT_EQ(header_end % 64, 0u) << "data must start on a 64-byte boundary";
      const Tensor back = npy::load(path.string());
      ASSERT_EQ(back.dtype(), dtype);
      ASSERT_EQ(back.rank(), rank);
      for (int i = 0; i < rank; ++i) EXPECT_EQ(back.size(i), sizes[i]);
      EXPECT_EQ(std::memcmp(back.raw(), t.raw(), t.bytes()), 0);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(Npy, ReadsWhatNumpyWrites) {
  const auto dir = temp_dir();
  // Exactly what numpy 1.x/2.x write for np.arange(6, dtype='<f4').reshape(2, 3).
  std::string data(24, '\0');
  for (int i = 0; i < 6; ++i) {
    const float f = static_cast<float>(i);
    std::memcpy(&data[i * 4], &f, 4);
  }
  write_bytes(dir / "a.npy",
              npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data));
  const Tensor t = npy::load((dir / "a.npy").string());
  ASSERT_EQ(t.rank(), 2);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(1), 3);
  EXPECT_EQ(t.data<float>()[5], 5.0f);
  // Version 2.0 header, double quotes, one-dimensional tuple.
  std::string v2 = npy_file("{\"descr\": \"<i8\", \"fortran_order\": False, \"shape\": (1,), }",
                            std::string(8, '\x01'));
  v2[6] = '\x02';
  const std::string len = v2.substr(8, 2);
  v2 = v2.substr(0, 8) + len + std::string(2, '\0') + v2.substr(10);
  write_bytes(dir / "b.npy", v2);
  const Tensor b = npy::load((dir / "b.npy").string());
  EXPECT_EQ(b.dtype(), DType::i64);
  EXPECT_EQ(b.data<std::int64_t>()[0], 0x0101010101010101LL);
  std::filesystem::remove_all(dir);
}

// What numpy writes for np.array([1.0, -2.5, 65504], dtype='<f2'): float16, read as it is.
TEST(Npy, ReadsFloat16) {
  const auto dir = temp_dir();
  const std::uint16_t bits[3] = {0x3c00, 0xc100, 0x7bff};
  write_bytes(dir / "h.npy", npy_file("{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }",
                                      std::string(reinterpret_cast<const char*>(bits), 6)));
  const Tensor t = npy::load((dir / "h.npy").string());
  ASSERT_EQ(t.dtype(), DType::f16);
  EXPECT_EQ(f16_value(static_cast<const std::uint16_t*>(t.raw())[0]), 1.0f);
  EXPECT_EQ(f16_value(static_cast<const std::uint16_t*>(t.raw())[1]), -2.5f);
  EXPECT_EQ(f16_value(static_cast<const std::uint16_t*>(t.raw())[2]), 65504.0f);
  std::filesystem::remove_all(dir);
}

// A FIFO, a directory or a device is refused at once, by what it is: opening a FIFO for reading
// would wait for a writer that never comes.
TEST(Npy, RefusesWhatIsNotARegularFile) {
  const auto dir = temp_dir();
  ASSERT_EQ(mkfifo((dir / "fifo.npy").c_str(), 0600), 0);
  expect_rejected(dir / "fifo.npy", "expected a regular .npy file, given a FIFO");
  std::filesystem::create_directories(dir / "dir.npy");
  expect_rejected(dir / "dir.npy", "expected a regular .npy file, given a directory");
  expect_rejected("/dev/null", "expected a regular .npy file, given a device");
  std::filesystem::remove_all(dir);
}

// save replaces a file whole: written to a temporary file beside it and renamed, which leaves
// nothing else in the directory; a path that is a directory is refused before anything is
// written.
TEST(Npy, SaveReplacesAFileWhole) {
  const auto dir = temp_dir();
  Tensor a(DType::f32, {4}), b(DType::f32, {1000});
  npy::save((dir / "x.npy").string(), a);
  npy::save((dir / "x.npy").string(), b);
  EXPECT_EQ(npy::load((dir / "x.npy").string()).numel(), 1000);
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1);
  std::filesystem::create_directories(dir / "d.npy");
  EXPECT_THROW(npy::save((dir / "d.npy").string(), a), cli::OutputError);
  std::filesystem::remove_all(dir);
}

TEST(Npy, RejectsMalformedFiles) {
  const auto dir = temp_dir();
  const std::string ok_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const std::string data(24, '\0');
  write_bytes(dir / "truncated.npy", npy_file(ok_dict, data.substr(0, 20)));
  expect_rejected(dir / "truncated.npy", "truncated");
  write_bytes(dir / "trailing.npy", npy_file(ok_dict, data + "xx"));
  expect_rejected(dir / "trailing.npy", "trailing bytes");
  write_bytes(dir / "magic.npy", "PK\x03\x04 this is a zip");
  expect_rejected(dir / "magic.npy", "not a .npy file");
  write_bytes(dir / "empty.npy", "");
  expect_rejected(dir / "empty.npy", "not a .npy file");
  write_bytes(dir / "fortran.npy",
              npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", data));
  expect_rejected(dir / "fortran.npy", "Fortran");
  write_bytes(
      dir / "bytes.npy",
      npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }", data.substr(0, 6)));
  expect_rejected(dir / "bytes.npy",
                  "unsupported dtype '|u1': expected <f4, <f8, <f2, <i4 or <i8 (float32, "
                  "float64, float16, int32, int64)");
  write_bytes(dir / "big.npy",
              npy_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", data));
  expect_rejected(dir / "big.npy", "big-endian");
  write_bytes(dir / "object.npy",
              npy_file("{'descr': '|O', 'fortran_order': False, 'shape': (2, 3), }", data));
  expect_rejected(dir / "object.npy", "unsupported dtype");
  write_bytes(dir / "noshape.npy", npy_file("{'descr': '<f4', 'fortran_order': False, }", data));
  expect_rejected(dir / "noshape.npy", "no 'shape' key");
  write_bytes(dir / "badshape.npy",
              npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", data));
  expect_rejected(dir / "badshape.npy", "bad dimension");
  write_bytes(
      dir / "scalar.npy",
      npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", data.substr(0, 4)));
  expect_rejected(dir / "scalar.npy", "1 to 4 dimensions");
  write_bytes(
      dir / "rank5.npy",
      npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 6), }", data));
  expect_rejected(dir / "rank5.npy", "1 to 4 dimensions");
  // A shape whose byte size wraps around int64 (2^31 x 2^30 x 1 of f8 = 2^64 bytes).
  write_bytes(
      dir / "wrap.npy",
      npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (2147483648, 1073741824, 1), }",
               ""));
  expect_rejected(dir / "wrap.npy", "too large");
  std::string huge_header = npy_file(ok_dict, data);
  huge_header[8] = '\xff';
  huge_header[9] = '\xff';
  write_bytes(dir / "header.npy", huge_header);
  expect_rejected(dir / "header.npy", "header");
  std::string version = npy_file(ok_dict, data);
  version[6] = '\x09';
  write_bytes(dir / "version.npy", version);
  expect_rejected(dir / "version.npy", "version 9");
  expect_rejected(dir / "missing.npy", "cannot open");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gdn
