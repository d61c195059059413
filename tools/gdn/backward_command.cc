// backward_command.cc: `gdn backward`, the backward pass on tensors stored as .npy files.
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

const char* const kBackwardHelp = R"HELP(usage: gdn backward --in DIR --out DIR [options]

Runs the gated delta rule backward pass on tensors read from NumPy .npy files: the gradients
of L = <do, o> + <dht, final states> with respect to q, k (before the in-kernel L2 norm),
v, g, beta and the initial states.

Reads from --in (float32 or float64, C order, one dtype for all):
  q.npy k.npy v.npy g.npy beta.npy [cu_seqlens.npy] [h0.npy]   the forward's inputs (see
                   `gdn forward --help`); pass the forward's options (--l2norm, --scale,
                   --chunk-size) again
  do.npy           [T, Hv, Dv]: the cotangent of o
  dht.npy          optional, [N, Hv, Dk, Dv]: the cotangent of the final states
  chunk_states.npy, t_inv.npy
                   optional: the forward's residuals (`gdn forward --residuals`). When they
                   are there they are used (as --policy allows); when they are not, this
                   command runs the forward first and keeps what --policy keeps.
Writes to --out (created if missing), each shaped and typed like its input:
  dq.npy dk.npy dv.npy dg.npy dbeta.npy dh0.npy
With --reference the gradients come from the float64 reference (reverse mode through the
token recurrence) and are float64; residuals are not used.

options:
%s
--policy: auto (default) uses the residual files present, else keeps both; all uses
chunk_states.npy and t_inv.npy (whichever are present) or keeps both; t_inv uses or keeps only
t_inv (the backward rebuilds the chunk states); none uses and keeps nothing (the backward
rebuilds both). All give the same gradients when the residual files come from
`gdn forward --residuals` (the chunked CPU forward).

examples:
  gdn forward --in dump/ --out dump/ --l2norm --residuals
  gdn backward --in dump/ --out grads/ --l2norm
  gdn backward --in dump/ --out grads/ --l2norm --policy none --threads 2
  gdn backward --in dump/ --out ref/ --l2norm --reference
)HELP";

namespace {

const std::vector<OptionSpec> kOptions = with_forward_options(
    {{"in", "DIR", "directory holding the input .npy files (required)"},
     {"out", "DIR", "directory for the gradient .npy files (required)"},
     {"policy", "P", "auto, all, t_inv or none: which forward residuals to use or keep"}},
    {{"reference", nullptr, "run the float64 reference instead of the CPU kernels"},
     {"quiet", nullptr, "print nothing on success"},
     {"help", nullptr, "show this help"}});

}  // namespace

int backward_command(int argc, char** argv) {
  const Args args(kOptions, argc, argv, 2);
  if (args.flag("help")) {
    std::printf(kBackwardHelp, describe_options(kOptions).c_str());
    return 0;
  }
  const std::filesystem::path in_dir = args.required_text("in");
  const std::filesystem::path out_dir = args.required_text("out");
  ForwardOptions options = forward_options_from(args);
  const std::string policy = args.choice("policy", "auto", {"auto", "all", "t_inv", "none"});
  const bool reference = args.flag("reference");
  reject_matmul_with_reference(args, reference);
  if (reference && args.has("policy")) {
    throw UsageError(
        "option '--policy' does not apply with --reference (it recomputes everything)");
  }
  const ForwardTensors fwd = load_forward_inputs(in_dir);
  const Tensor d_o = npy::load(in_dir / "do.npy");
  Tensor dht, chunk_states, t_inv;
  if (std::filesystem::exists(in_dir / "dht.npy")) dht = npy::load(in_dir / "dht.npy");
  const bool use_states = !reference && (policy == "auto" || policy == "all") &&
                          std::filesystem::exists(in_dir / "chunk_states.npy");
  const bool use_t_inv =
      !reference && policy != "none" && std::filesystem::exists(in_dir / "t_inv.npy");
  if (use_states) chunk_states = npy::load(in_dir / "chunk_states.npy");
  if (use_t_inv) t_inv = npy::load(in_dir / "t_inv.npy");

  const ForwardInputs inputs = fwd.inputs();
  BackwardInputs bin{inputs.q,          inputs.k,
                     inputs.v,          inputs.g,
                     inputs.beta,       inputs.initial_state,
                     inputs.cu_seqlens, d_o.view(),
                     dht.view(),        chunk_states.view(),
                     t_inv.view()};
  std::string residual_note;
  BackwardResult grads;
  const auto start = std::chrono::steady_clock::now();
  try {
    if (reference) {
      bin.chunk_states = {};
      bin.t_inv = {};
      grads = ref::recurrent_bwd(bin, options);
      residual_note = "float64 reference (recomputes everything)";
    } else {
      ForwardResult kept;
      const bool have_files = use_states || use_t_inv;
      if (!have_files && policy != "none") {
        // No residual files: run the forward here, keeping what the policy keeps.
        const Residuals keep = policy == "t_inv" ? Residuals::t_inv : Residuals::all;
        kept = chunk_gated_delta_rule_fwd(inputs, options, keep);
        bin.chunk_states = kept.chunk_states.view();
        bin.t_inv = kept.t_inv.view();
        residual_note = policy == "t_inv" ? "t_inv kept by a forward run here"
                                          : "chunk_states and t_inv kept by a forward run here";
      } else if (have_files) {
        residual_note = std::string(use_states ? "chunk_states.npy" : "") +
                        (use_states && use_t_inv ? " and " : "") + (use_t_inv ? "t_inv.npy" : "") +
                        " from " + in_dir.string();
      } else {
        residual_note = "none kept (policy none)";
      }
      grads = chunk_gated_delta_rule_bwd(bin, options);
    }
  } catch (const InvalidArgument& e) {
    rethrow_in_cli_names(e, args, file_of_argument(e.argument()));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  make_output_directory(out_dir);
  OutputFiles files;  // all in place together, or none
  npy::save(files, out_dir / "dq.npy", grads.dq);
  npy::save(files, out_dir / "dk.npy", grads.dk);
  npy::save(files, out_dir / "dv.npy", grads.dv);
  npy::save(files, out_dir / "dg.npy", grads.dg);
  npy::save(files, out_dir / "dbeta.npy", grads.dbeta);
  npy::save(files, out_dir / "dh0.npy", grads.d_initial_state);
  files.commit();
  if (!args.flag("quiet")) {
    std::printf("gdn backward: residuals: %s\n", residual_note.c_str());
    std::printf("  %s in %.3f ms; wrote dq.npy dk.npy dv.npy dg.npy dbeta.npy dh0.npy to %s\n",
                engine_name(reference, options.isa, options.matmul_precision).c_str(),
                seconds * 1e3, out_dir.string().c_str());
  }
  return 0;
}

}  // namespace gdn::cli
