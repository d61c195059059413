// forward_command.cc: `gdn forward`, the forward pass on tensors stored as .npy files.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "gdn/gdn.h"
#include "inputs.h"
#include "npy.h"

namespace gdn::cli {

const char* const kForwardHelp = R"HELP(usage: gdn forward --in DIR --out DIR [options]

Runs the gated delta rule forward pass on tensors read from NumPy .npy files.

Reads from --in (C order; float32 or float64, one dtype for all, or float16 q, k, v with
float32 g, beta, h0):
  q.npy, k.npy     [T, Hk, Dk]  (or [B, T, Hk, Dk] for a dense batch)
  v.npy            [T, Hv, Dv]  (or [B, T, Hv, Dv])
  g.npy, beta.npy  [T, Hv]      (or [B, T, Hv]); g is the log-decay
  cu_seqlens.npy   optional, int64 (or int32) [N + 1]: sequence boundaries of a packed batch
  h0.npy           optional, [N, Hv, Dk, Dv]: initial states (zeros when absent)
Writes to --out (created if missing):
  o.npy            [T, Hv, Dv]
  ht.npy           [N, Hv, Dk, Dv] final states
  chunk_states.npy [total_chunks, Hv, Dk, Dv] and t_inv.npy [total_chunks, Hv, C, C]
                   with --residuals
o has the dtype of q, ht and the residuals that of g (float32 for float16 q); with
--reference all are float64 (the float64 reference: o and ht from the token recurrence,
residuals from the chunked float64 form).

options:
%s
examples:
  gdn forward --in dump/ --out result/
  gdn forward --in dump/ --out result/ --l2norm --threads 2 --residuals
  gdn forward --in dump/ --out ref/ --reference --l2norm
  python -c "import numpy as np; print(abs(np.load('result/o.npy') - np.load('ref/o.npy')).max())"
)HELP";

namespace {

const std::vector<OptionSpec> kOptions = with_forward_options(
    {{"in", "DIR", "directory holding the input .npy files (required)"},
     {"out", "DIR", "directory for the output .npy files (required)"}},
    {{"residuals", nullptr, "also write chunk_states.npy and t_inv.npy (for the backward pass)"},
     {"reference", nullptr, "run the float64 reference instead of the CPU kernels"},
     {"algorithm", "A", "auto, chunked or recurrent (default auto; not with --reference)"},
     {"quiet", nullptr, "print nothing on success"},
     {"help", nullptr, "show this help"}});

}  // namespace

int forward_command(int argc, char** argv) {
  const Args args(kOptions, argc, argv, 2);
  if (args.flag("help")) {
    std::printf(kForwardHelp, describe_options(kOptions).c_str());
    return 0;
  }
  const std::filesystem::path in_dir = args.required_text("in");
  const std::filesystem::path out_dir = args.required_text("out");
  ForwardOptions options = forward_options_from(args);
  const std::string algorithm = args.choice("algorithm", "auto", {"auto", "chunked", "recurrent"});
  options.algorithm = algorithm == "chunked"     ? Algorithm::chunked
                      : algorithm == "recurrent" ? Algorithm::recurrent
                                                 : Algorithm::automatic;
  const bool reference = args.flag("reference");
  reject_matmul_with_reference(args, reference);
  const bool residuals = args.flag("residuals");
  if (reference && args.has("algorithm")) {
    throw UsageError("option '--algorithm' does not apply with --reference");
  }
  const ForwardTensors tensors = load_forward_inputs(in_dir);
  const ForwardInputs inputs = tensors.inputs();
  const Residuals keep = residuals ? Residuals::all : Residuals::none;
  ForwardResult result;
  const auto start = std::chrono::steady_clock::now();
  try {
    if (reference) {
      result = ref::recurrent_fwd(inputs, options, Residuals::none);
      if (residuals) {
        ForwardResult chunked = ref::chunked_fwd(inputs, options, Residuals::all);
        result.chunk_states = std::move(chunked.chunk_states);
        result.t_inv = std::move(chunked.t_inv);
      }
    } else {
      result = chunk_gated_delta_rule_fwd(inputs, options, keep);
    }
  } catch (const InvalidArgument& e) {
    rethrow_in_cli_names(e, args, file_of_argument(e.argument()));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  make_output_directory(out_dir);
  OutputFiles files;  // all in place together, or none
  npy::save(files, out_dir / "o.npy", result.o);
  npy::save(files, out_dir / "ht.npy", result.final_state);
  if (residuals) {
    npy::save(files, out_dir / "chunk_states.npy", result.chunk_states);
    if (result.t_inv.present()) npy::save(files, out_dir / "t_inv.npy", result.t_inv);
  }
  files.commit();
  if (!args.flag("quiet")) {
    const ForwardShape shape = forward_shape(inputs, options);
    std::printf(
        "gdn forward: T = %lld tokens in %lld sequences, Hk = %lld, Hv = %lld, Dk = %lld, Dv = "
        "%lld, %s\n",
        static_cast<long long>(shape.batch > 0 ? shape.batch * shape.tokens : shape.tokens),
        static_cast<long long>(shape.num_seqs), static_cast<long long>(shape.hk),
        static_cast<long long>(shape.hv), static_cast<long long>(shape.dk),
        static_cast<long long>(shape.dv), dtype_name(shape.dtype));
    std::printf(
        "  %s in %.3f ms; wrote o.npy, ht.npy%s to %s\n",
        engine_name(reference, options.isa, options.matmul_precision).c_str(), seconds * 1e3,
        residuals
            ? (result.t_inv.present() ? ", chunk_states.npy, t_inv.npy" : ", chunk_states.npy")
            : "",
        out_dir.string().c_str());
  }
  return 0;
}

}  // namespace gdn::cli
