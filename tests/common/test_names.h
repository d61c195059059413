// test_names.h: pieces of the names of parameterised test cases, so that a failing line in
// CTest's output says which case failed (T63_Hk1_Hv2_Dk64_Dv32_GloNeg1_H0_NoL2norm) instead of
// an index into the Combine() matrix. GoogleTest takes [A-Za-z0-9_] only and rejects a
// duplicate name at startup, so every piece is spelt in that alphabet and every parameter of a
// case appears in its name.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "common/problem.h"

namespace gdn::test {

// Sequence lengths: T63 for one sequence, T200_0_63_1_129 for a packed batch. Names are built
// with streams: GCC 12 at -O3 reports a false -Wrestrict on `const char* + std::string`.
inline std::string lengths_name(const std::vector<std::int64_t>& lengths) {
  std::ostringstream s;
  s << "T";
  for (std::size_t i = 0; i < lengths.size(); ++i) s << (i ? "_" : "") << lengths[i];
  return s.str();
}

// A number in the name alphabet: -20 as Neg20, 0.5 as 0p5, 1e-05 as 1eNeg05.
inline std::string number_name(double x) {
  std::ostringstream printed;
  printed << x;
  std::string s;
  for (const char c : printed.str()) {
    s += c == '-' ? "Neg" : c == '.' ? "p" : c == '+' ? "" : std::string(1, c);
  }
  return s;
}

// An option that is on or off: both states are named, so that no case is the unnamed default.
inline std::string flag_name(bool on, const std::string& what) {
  return on ? what : std::string("No") + what;
}

inline std::string shape_name(const Shape& s) {
  std::ostringstream n;
  n << lengths_name(s.lengths) << "_Hk" << s.hk << "_Hv" << s.hv << "_Dk" << s.dk << "_Dv" << s.dv;
  return n.str();
}

}  // namespace gdn::test
