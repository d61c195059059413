// gdn/error.h: the exceptions the library throws.
//
// Bad input throws gdn::InvalidArgument (a std::invalid_argument) before anything is
// written: no output, state or residual buffer is touched by a call that throws. The message
// names the argument, what was expected and what was given, e.g.
//   gdn: argument 'v': expected shape [T, Hv, Dv] with T = 100 (the tokens of q), given [99, 32,
//   128]
// Failures that are not the caller's fault (allocation, an ISA the CPU lacks when forced
// through the environment) throw gdn::RuntimeError (a std::runtime_error).
#pragma once

#include <stdexcept>
#include <string>

namespace gdn {

class InvalidArgument : public std::invalid_argument {
 public:
  InvalidArgument(std::string argument, std::string expected, std::string given);

  const std::string& argument() const { return argument_; }
  const std::string& expected() const { return expected_; }
  const std::string& given() const { return given_; }

 private:
  std::string argument_, expected_, given_;
};

class RuntimeError : public std::runtime_error {
 public:
  explicit RuntimeError(const std::string& what) : std::runtime_error("gdn: " + what) {}
};

}  // namespace gdn
