// args.h: the command-line parser of the gdn tool. Options are declared, not discovered:
// anything undeclared, a missing value or a value of the wrong kind is a usage error that
// names the option, what was expected and what was given.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace gdn::cli {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct OptionSpec {
  const char* name;        // without the leading "--"
  const char* value_name;  // null for a flag
  const char* help;
};

class Args {
 public:
  // Parses argv[first..argc). Accepts --name value, --name=value and --flag.
  Args(const std::vector<OptionSpec>& specs, int argc, char** argv, int first);

  bool flag(const std::string& name) const { return flags_.count(name) > 0; }
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string text(const std::string& name, const std::string& fallback) const;
  std::string required_text(const std::string& name) const;
  std::int64_t integer(const std::string& name, std::int64_t fallback, std::int64_t min,
                       std::int64_t max) const;
  std::optional<double> number(const std::string& name) const;
  // One of `choices`, else a usage error listing them.
  std::string choice(const std::string& name, const std::string& fallback,
                     const std::vector<std::string>& choices) const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;
};

// "  --name VALUE   help" lines for a command's --help.
std::string describe_options(const std::vector<OptionSpec>& specs);

}  // namespace gdn::cli
