// gdn/error.h: the exceptions the library throws.
//
// Bad input throws gdn::InvalidArgument (a std::invalid_argument) before anything is
// written: no output, state or residual buffer is touched by a call that throws. The message
// names the argument, what was expected and what was given, e.g.
//   gdn: argument 'v': expected shape [T, Hv, Dv] with T = 100 (the tokens of q), given [99, 32,
//   128]
// Failures that are not the caller's fault (allocation, an ISA the CPU lacks when forced
// through the environment) throw gdn::RuntimeError (a std::runtime_error).
// The optional check mode (ForwardOptions::check_finite, LayerOptions::check_finite, or the
// environment variable GDN_CHECK_FINITE=1) throws gdn::NonFiniteError, a gdn::RuntimeError,
// for the first NaN or Inf among a call's inputs (before anything is written) or, after the
// call, among its outputs; a state the call updates in place (a serving step's pool slots, a
// final state that is the view of the initial state) is then put back as it was, so that a
// call that throws has changed no state. The message says what is written, e.g.
//   gdn: check_finite: input 'g' holds nan at [41, 3] (nothing was written)
//   gdn: check_finite: output 'out' holds inf at [2, 17] (out is written; every pool slot is
//   as before the call)
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

class NonFiniteError : public RuntimeError {
 public:
  NonFiniteError(std::string tensor, std::string index, double value, bool output);
  // `written`: what the call has left written, the message's last words, e.g. "nothing was
  // written".
  NonFiniteError(std::string tensor, std::string index, double value, bool output,
                 const std::string& written);

  const std::string& tensor() const { return tensor_; }  // the argument's name, e.g. "q"
  const std::string& index() const { return index_; }    // its position, e.g. "[41, 3]"

 private:
  std::string tensor_, index_;
};

}  // namespace gdn
