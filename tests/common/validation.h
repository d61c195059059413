// validation.h: the checks shared by the one-test-per-rule validation tests (tests/api/
// validate_*_test.cc, docs/validation.md): a rejected call throws gdn::InvalidArgument naming
// the argument, with "expected", "given" and the rule's own words in its message, and writes
// nothing (outputs filled with a sentinel before the call still hold it after).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "gdn/gdn.h"

namespace gdn::test {

inline constexpr unsigned char kSentinel = 0xA5;

// One rule of an entry point: its test's name, the argument its message names, the words its
// message holds besides "expected" and "given", and how it breaks a valid call.
template <class Call>
struct Rule {
  const char* name;
  const char* argument;
  std::vector<const char*> words;
  std::function<void(Call&)> breaks;
};

template <class Call>
void PrintTo(const Rule<Call>& rule, std::ostream* os) {
  *os << rule.name;
}

// INSTANTIATE_TEST_SUITE_P's name generator: each test is named after its rule.
struct RuleName {
  template <class Param>
  std::string operator()(const ::testing::TestParamInfo<Param>& info) const {
    return info.param.name;
  }
};

// Fills every tensor with the sentinel byte.
inline void fill_sentinel(const std::vector<Tensor*>& tensors) {
  for (Tensor* x : tensors) std::memset(x->raw(), kSentinel, x->bytes());
}

// Whether every byte of every tensor still holds the sentinel.
inline bool hold_sentinel(const std::vector<Tensor*>& tensors) {
  for (const Tensor* x : tensors) {
    const auto* b = static_cast<const unsigned char*>(x->raw());
    for (std::size_t i = 0; i < x->bytes(); ++i) {
      if (b[i] != kSentinel) return false;
    }
  }
  return true;
}

// Runs `call`, which must be rejected by the rule `rule`: a gdn::InvalidArgument whose
// argument() is `argument` and whose message holds "argument '<argument>'", "expected",
// "given" and each of `words`. `which` prefixes the failure messages (the entry point); the
// message is printed when `print` is set, so that a run's log shows every rule's message.
inline void expect_rejected(const std::function<void()>& call, const std::string& rule,
                            const std::string& argument, const std::vector<const char*>& words,
                            const std::string& which = "", bool print = true) {
  try {
    call();
    ADD_FAILURE() << which << "no error for rule " << rule;
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.argument(), argument) << which << what;
    const std::string named = "argument '" + argument + "'";
    for (const char* w : {named.c_str(), "expected", "given"}) {
      EXPECT_NE(what.find(w), std::string::npos) << which << "'" << w << "' not in: " << what;
    }
    for (const char* w : words) {
      EXPECT_NE(what.find(w), std::string::npos) << which << "'" << w << "' not in: " << what;
    }
    if (print) std::printf("[ MESSAGE  ] %s: %s\n", rule.c_str(), what.c_str());
  } catch (const std::exception& e) {
    ADD_FAILURE() << which << "rule " << rule << ": not a gdn::InvalidArgument: " << e.what();
  }
}

}  // namespace gdn::test
