// args.cc: see args.h.
#include "args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace gdn::cli {

Args::Args(const std::vector<OptionSpec>& specs, int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      throw UsageError("unexpected argument '" + arg + "' (options start with --)");
    }
    std::string name = arg.substr(2), value;
    bool inline_value = false;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const OptionSpec* spec = nullptr;
    for (const OptionSpec& s : specs) {
      if (name == s.name) spec = &s;
    }
    if (spec == nullptr) {
      std::string known;
      for (const OptionSpec& s : specs)
        known += std::string(known.empty() ? "" : ", ") + "--" + s.name;
      throw UsageError("unknown option '--" + name + "' (expected one of: " + known + ")");
    }
    if (spec->value_name == nullptr) {
      if (inline_value)
        throw UsageError("option '--" + name + "' takes no value, given '" + value + "'");
      flags_.insert(name);
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argc) {
        throw UsageError("option '--" + name + "' expects a value (" + spec->value_name + ")");
      }
      value = argv[++i];
    }
    if (values_.count(name)) throw UsageError("option '--" + name + "' given twice");
    values_[name] = value;
  }
}

std::string Args::text(const std::string& name, const std::string& fallback) const {
  const auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::string Args::required_text(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end() || it->second.empty())
    throw UsageError("option '--" + name + "' is required");
  return it->second;
}

std::int64_t Args::integer(const std::string& name, std::int64_t fallback, std::int64_t min,
                           std::int64_t max) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const std::string& text = it->second;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  std::ostringstream range;
  range << "an integer in [" << min << ", " << max << "]";
  if (text.empty() || *end != '\0' || errno == ERANGE || value < min || value > max) {
    throw UsageError("option '--" + name + "': expected " + range.str() + ", given '" + text + "'");
  }
  return value;
}

std::optional<double> Args::number(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  const std::string& text = it->second;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value)) {
    throw UsageError("option '--" + name + "': expected a finite number, given '" + text + "'");
  }
  return value;
}

std::string Args::choice(const std::string& name, const std::string& fallback,
                         const std::vector<std::string>& choices) const {
  const std::string value = text(name, fallback);
  std::string list;
  for (const std::string& c : choices) {
    if (c == value) return value;
    list += (list.empty() ? "" : ", ") + c;
  }
  throw UsageError("option '--" + name + "': expected one of " + list + ", given '" + value + "'");
}

std::string describe_options(const std::vector<OptionSpec>& specs) {
  std::string out;
  for (const OptionSpec& s : specs) {
    std::string left = std::string("  --") + s.name;
    if (s.value_name) left += std::string(" ") + s.value_name;
    if (left.size() < 24)
      left.append(24 - left.size(), ' ');
    else
      left += "\n" + std::string(24, ' ');
    out += left + s.help + "\n";
  }
  return out;
}

}  // namespace gdn::cli
