// main.cc: the gdn command-line tool.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include "args.h"
#include "commands.h"
#include "gdn/gdn.h"
#include "npy.h"

namespace {

const char* const kHelp = R"HELP(usage: gdn <command> [options]

Gated DeltaNet (the gated delta rule of Qwen3-Next / Qwen3.5) on the CPU, exact and fast.

commands:
  forward         the gated delta rule's forward on .npy tensors (q, k, v, g, beta, ...)
  backward        the gated delta rule's backward on .npy tensors (the forward's, do, ...)
  layer-forward   the fused layer op (conv1d + SiLU + gates + gated delta rule) on .npy tensors
  layer-backward  the fused layer op's backward: every gradient a training step needs
  step            one serving step of the layer op over pools of state slots (decodes,
                  prefills, speculative windows) on .npy tensors
  plan            print the tiling plan a call makes on this machine (chunk size, work items,
                  threads, decode split) and why; --time times it against the alternatives
  bench           time the passes (default: the gated delta rule of one Qwen3-Next layer,
                  8192 tokens; --op layer: the whole layer op; --op conv: the conv1d + SiLU;
                  --op step: serving steps over state-slot pools)
  version         print the version, the CPU variants and the threads this build uses
  help            show this help, or `gdn help <command>` for a command's

Run `gdn <command> --help` for a command's options and examples.

examples:
  gdn bench
  gdn bench --threads 1 --json
  gdn forward --in dump/ --out result/ --l2norm
  gdn forward --in dump/ --out ref/ --reference --l2norm
  gdn backward --in dump/ --out grads/ --l2norm --policy t_inv
  gdn layer-forward --in dump/ --out result/ --hk 16 --hv 32 --dk 128 --dv 128
  gdn bench --op layer --json
  gdn step --in dump/ --out dump/ --hk 16 --hv 32 --dk 128 --dv 128
  gdn bench --op step --preset decode-64
  gdn plan --op backward --seq 64k --policy none
  gdn plan --threads 1 --time
)HELP";

using Command = int (*)(int argc, char** argv);
const std::pair<const char*, Command> kCommands[] = {
    {"forward", gdn::cli::forward_command},
    {"backward", gdn::cli::backward_command},
    {"layer-forward", gdn::cli::layer_forward_command},
    {"layer-backward", gdn::cli::layer_backward_command},
    {"step", gdn::cli::step_command},
    {"bench", gdn::cli::bench_command},
    {"plan", gdn::cli::plan_command},
};

int print_version() {
  std::printf("gdn %s\n", gdn::kVersion);
  std::printf("CPU variants: ");
  for (gdn::CpuIsa isa :
       {gdn::CpuIsa::generic, gdn::CpuIsa::avx2, gdn::CpuIsa::avx512, gdn::CpuIsa::avx512_bf16}) {
    const char* why = gdn::cpu_isa_unavailable_reason(isa);
    std::printf("%s%s%s%s ", gdn::cpu_isa_name(isa), why != nullptr ? " (unavailable: " : "",
                why != nullptr ? why : "", why != nullptr ? ")" : "");
  }
  std::printf("\nselected: %s\n", gdn::cpu_isa_name(gdn::resolve_cpu_isa(gdn::CpuIsa::automatic)));
  std::printf("threads: %s, default threads: %d\n",
              gdn::built_with_threads() ? "the library's pool" : "off (GDN_THREADS=OFF)",
              gdn::default_threads());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A file size limit (ulimit -f) kills a process that writes past it unless SIGXFSZ is
  // ignored; ignored, the write fails with EFBIG and the tool removes its temporary files and
  // says which output could not be written (tools/gdn/output_files.h), as on a full disk.
  std::signal(SIGXFSZ, SIG_IGN);
  const std::string command = argc > 1 ? argv[1] : "";
  try {
    if (command.empty() || command == "help" || command == "--help" || command == "-h") {
      if (argc > 2) {
        for (const auto& [name, run] : kCommands) {
          if (std::strcmp(argv[2], name) == 0) {
            char* args[] = {argv[0], argv[2], const_cast<char*>("--help")};
            return run(3, args);
          }
        }
      }
      std::fputs(kHelp, command.empty() ? stderr : stdout);
      return command.empty() ? 2 : 0;
    }
    for (const auto& [name, run] : kCommands) {
      if (command == name) return run(argc, argv);
    }
    if (command == "version" || command == "--version") return print_version();
    std::fprintf(stderr,
                 "gdn: unknown command '%s' (expected forward, backward, layer-forward, "
                 "layer-backward, step, bench, plan, version or help)\n",
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
