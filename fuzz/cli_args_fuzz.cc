// cli_args_fuzz.cc: the gdn tool's argument parser (tools/gdn/args.h: --name value,
// --name=value, flags, integers, numbers, choices) and the option readers the commands share
// (tools/gdn/inputs.h, bench_util.h: the core and layer options, --isa, --matmul, --seq with
// its k suffix) on fuzzed argument lists (arguments separated by NUL bytes). Each step
// returns or throws cli::UsageError; anything else (another exception, a crash, an ASan or
// UBSan report) is a finding. The commands themselves are not run (they read files and time
// kernels).
#include <cstdint>
#include <string>
#include <vector>

#include "args.h"
#include "bench_util.h"
#include "inputs.h"

namespace {

using gdn::cli::Args;
using gdn::cli::OptionSpec;
using gdn::cli::UsageError;

const std::vector<OptionSpec>& specs() {
  static const std::vector<OptionSpec> kSpecs = gdn::cli::with_forward_options(
      {{"in", "DIR", "inputs"},
       {"out", "DIR", "outputs"},
       {"hk", "N", "key heads"},
       {"hv", "N", "value heads"},
       {"dk", "N", "key dim"},
       {"dv", "N", "value dim"},
       {"seq", "TOKENS", "tokens, k suffix"},
       {"tokens", "N", "tokens"},
       {"policy", "P", "remat policy"}},
      {{"residuals", nullptr, "flag"},
       {"reference", nullptr, "flag"},
       {"algorithm", "A", "choice"},
       {"quiet", nullptr, "flag"},
       {"help", nullptr, "flag"}});
  return kSpecs;
}

template <class Fn>
void attempt(Fn&& fn) {
  try {
    fn();
  } catch (const UsageError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  // Byte 0: where parsing starts (argv[0], argv[1] are the program and the command) and the
  // bounds of the integer read below; the rest: the arguments, NUL-separated.
  const int first = data[0] % 3;
  const std::int64_t lo = static_cast<std::int8_t>(data[0]) / 4, hi = lo + (data[0] % 7) * 1000;
  std::vector<std::string> words(1);
  for (std::size_t i = 1; i < size; ++i) {
    if (data[i] == 0) {
      words.emplace_back();
    } else {
      words.back().push_back(static_cast<char>(data[i]));
    }
  }
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  const int argc = static_cast<int>(words.size());

  for (const std::string& w : words) attempt([&] { gdn::cli::parse_token_count("seq", w); });
  (void)gdn::cli::file_of_argument(words.front());
  try {
    const Args args(specs(), argc, argv.data(), first);
    attempt([&] { gdn::cli::forward_options_from(args); });
    attempt([&] { gdn::cli::layer_options_from(args); });
    attempt([&] { gdn::cli::parse_tokens(args, 8192); });
    attempt([&] { gdn::cli::reject_matmul_with_reference(args, args.flag("reference")); });
    attempt([&] { args.choice("algorithm", "auto", {"auto", "chunked", "recurrent"}); });
    attempt([&] { args.choice("policy", "auto", {"auto", "all", "t_inv", "none"}); });
    attempt([&] { args.required_text("in"); });
    attempt([&] { args.integer("tokens", 0, lo, hi); });
    attempt([&] { args.number("scale"); });
    (void)args.text("out", "");
    (void)args.has("hk");
  } catch (const UsageError&) {
  }
  return 0;
}
