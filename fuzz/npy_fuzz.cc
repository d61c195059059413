// npy_fuzz.cc: the .npy reader (tools/gdn/npy.h) on fuzzed files. A file loads, or throws
// npy::NpyError; one that loads saves and loads again to the same dtype, shape and bytes.
// Anything else (another exception, a crash, an ASan or UBSan report) is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "npy.h"

namespace {

std::string temp_path(const char* what) {
  return (std::filesystem::temp_directory_path() /
          ("gdn_npy_fuzz_" + std::to_string(getpid()) + "_" + what))
      .string();
}

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string in_path = temp_path("in"), out_path = temp_path("out");
  static const struct Cleanup {  // the two files go when the process exits normally
    ~Cleanup() {
      std::remove(in_path.c_str());
      std::remove(out_path.c_str());
    }
  } cleanup;
  {
    std::ofstream out(in_path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  gdn::Tensor t;
  try {
    t = gdn::npy::load(in_path);
  } catch (const gdn::npy::NpyError&) {
    return 0;
  }
  if (t.rank() < 1 || t.rank() > gdn::kMaxRank) finding("loaded a tensor of rank outside 1..4");
  gdn::npy::save(out_path, t);
  const gdn::Tensor back = gdn::npy::load(out_path);
  if (back.dtype() != t.dtype() || back.rank() != t.rank() || back.sizes() != t.sizes() ||
      back.bytes() != t.bytes() ||
      (t.bytes() > 0 && std::memcmp(back.raw(), t.raw(), t.bytes()) != 0)) {
    finding("save then load changed the tensor");
  }
  return 0;
}
