// main.cc: the gdn command-line tool.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "args.h"
#include "commands.h"
#include "gdn/gdn.h"
#include "npy.h"

namespace {

const char* const kHelp = R"HELP(usage: gdn <command> [options]

Gated DeltaNet (the gated delta rule of Qwen3-Next / Qwen3.5) on the CPU, exact and fast.

commands:
  forward   run the forward pass on .npy tensors (q, k, v, g, beta [, cu_seqlens, h0])
  backward  run the backward pass on .npy tensors (the forward's, do [, dht, residuals])
  bench     time the forward and backward passes (default: one Qwen3-Next layer, 8192 tokens)
  version   print the version, the CPU variants and the threads this build uses
  help      show this help, or `gdn help <command>` for a command's

Run `gdn <command> --help` for a command's options and examples.

examples:
  gdn bench
  gdn bench --threads 1 --json
  gdn forward --in dump/ --out result/ --l2norm
  gdn forward --in dump/ --out ref/ --reference --l2norm
  gdn backward --in dump/ --out grads/ --l2norm --policy t_inv
)HELP";

int print_version() {
  std::printf("gdn %s\n", gdn::kVersion);
  std::printf("CPU variants: ");
  for (gdn::CpuIsa isa : {gdn::CpuIsa::generic, gdn::CpuIsa::avx2, gdn::CpuIsa::avx512}) {
    std::printf("%s%s ", gdn::cpu_isa_name(isa),
                gdn::cpu_isa_available(isa) ? "" : " (unavailable)");
  }
  std::printf("\nselected: %s\n", gdn::cpu_isa_name(gdn::resolve_cpu_isa(gdn::CpuIsa::automatic)));
  std::printf("OpenMP: %s, default threads: %d\n", gdn::built_with_openmp() ? "yes" : "no",
              gdn::default_threads());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  try {
    if (command.empty() || command == "help" || command == "--help" || command == "-h") {
      if (argc > 2 && std::strcmp(argv[2], "forward") == 0) {
        char* args[] = {argv[0], argv[2], const_cast<char*>("--help")};
        return gdn::cli::forward_command(3, args);
      }
      if (argc > 2 && std::strcmp(argv[2], "backward") == 0) {
        char* args[] = {argv[0], argv[2], const_cast<char*>("--help")};
        return gdn::cli::backward_command(3, args);
      }
      if (argc > 2 && std::strcmp(argv[2], "bench") == 0) {
        char* args[] = {argv[0], argv[2], const_cast<char*>("--help")};
        return gdn::cli::bench_command(3, args);
      }
      std::fputs(kHelp, command.empty() ? stderr : stdout);
      return command.empty() ? 2 : 0;
    }
    if (command == "forward") return gdn::cli::forward_command(argc, argv);
    if (command == "backward") return gdn::cli::backward_command(argc, argv);
    if (command == "bench") return gdn::cli::bench_command(argc, argv);
    if (command == "version" || command == "--version") return print_version();
    std::fprintf(stderr,
                 "gdn: unknown command '%s' (expected forward, backward, bench, version or help)\n",
                 command.c_str());
    return 2;
  } catch (const gdn::cli::UsageError& e) {
    std::fprintf(stderr, "gdn %s: error: %s\nRun 'gdn %s --help' for usage.\n", command.c_str(),
                 e.what(), command.c_str());
    return 2;
  } catch (const gdn::npy::NpyError& e) {
    std::fprintf(stderr, "gdn %s: error: %s\n", command.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gdn %s: error: %s\n", command.c_str(), e.what());
    return 1;
  }
}
