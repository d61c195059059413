// inputs.h: what the forward and backward commands share: the forward's options from the
// command line and its input tensors from a directory of .npy files.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "args.h"
#include "gdn/gdn.h"

namespace gdn::cli {

// The options every command that runs the op takes: --chunk-size, --threads, --l2norm,
// --scale, --isa and --matmul, between the command's own `first` and `last` options.
std::vector<OptionSpec> with_forward_options(std::vector<OptionSpec> first,
                                             const std::vector<OptionSpec>& last);

// ForwardOptions from those options.
ForwardOptions forward_options_from(const Args& args);

// The layer op's options: --hk, --hv, --dk, --dv (required), --chunk-size, --threads, --isa,
// --matmul.
LayerOptions layer_options_from(const Args& args);

// The --isa option (auto, generic, avx2, avx512, avx512_bf16); auto is CpuIsa::automatic.
CpuIsa isa_option(const Args& args);

// The --matmul option (compute, bf16) and its help line.
MatmulPrecision matmul_option(const Args& args);
inline constexpr const char* kMatmulHelp =
    "operands of the matrix products: compute (default) or bf16 (rounded to bf16, summed in "
    "float32; float32 inputs only; on vdpbf16ps with the avx512_bf16 variant, else emulated on "
    "float32 registers: docs/numerics.md)";

// With --reference, --matmul is a usage error (every product of the reference is float64).
void reject_matmul_with_reference(const Args& args, bool reference);

// What ran a command, for its report: "float64 reference" or "<isa> kernels" (with "(bf16
// matrix operands)" when they were).
std::string engine_name(bool reference, CpuIsa isa,
                        MatmulPrecision matmul = MatmulPrecision::compute);

// q.npy k.npy v.npy g.npy beta.npy, and cu_seqlens.npy (int32 widened to int64) and h0.npy
// when present.
struct ForwardTensors {
  Tensor q, k, v, g, beta, h0, cu_seqlens;
  ForwardInputs inputs() const {
    return {q.view(), k.view(), v.view(), g.view(), beta.view(), h0.view(), cu_seqlens.view()};
  }
};
ForwardTensors load_forward_inputs(const std::filesystem::path& dir);

// The tensor in `file`, or an absent tensor when there is no such file.
Tensor load_if_present(const std::filesystem::path& file);

// dir/cu_seqlens.npy (int32 widened to int64), or an absent tensor.
Tensor load_cu_seqlens(const std::filesystem::path& dir);

// The .npy file behind an argument name of the core op ("" when none), for error messages.
std::string file_of_argument(const std::string& argument);

// The command-line flag behind an option name of the library ("options.scale": "--scale"), or
// "" when none.
std::string flag_of_option(const std::string& argument);

// Throws `e` again in the command line's names: an option's error as a UsageError naming its
// flag and, when the command line gave it, the text given ("option '--scale': expected a
// finite number representable in float32, given '1e39'"); a tensor's naming its .npy `file`
// (none: as it is); the library's option names inside the message written as flags, and a
// dtype list that includes what a .npy file cannot hold (bf16) as what the reader takes.
[[noreturn]] void rethrow_in_cli_names(const InvalidArgument& e, const Args& args,
                                       const std::string& file);

}  // namespace gdn::cli
