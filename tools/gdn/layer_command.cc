// layer_command.cc: `gdn layer-forward` and `gdn layer-backward`, the fused layer op (conv1d +
// SiLU + gates + L2 norm + gated delta rule) on tensors stored as .npy files.
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

const char* const kLayerForwardHelp =
    R"HELP(usage: gdn layer-forward --in DIR --out DIR --hk HK --hv HV --dk DK --dv DV [options]

Runs the fused GDN layer op (what a Qwen3-Next / Qwen3.5 layer calls between its projections):
causal depthwise conv1d + SiLU over the projected channels, the split into q, k, v, their L2
norm, the gates beta = sigmoid(b) and g = -exp(A_log) softplus(a + dt_bias), and the gated
delta rule. D = 2 HK DK + HV DV channels, ordered [q heads | k heads | v heads].

Reads from --in (C order; float32 or float64, one dtype for all, or float16 qkv, a, b with
everything else float32):
  qkv.npy               [T, D]   the projected, pre-conv channels
  a.npy, b.npy          [T, HV]  gate logits
  conv_weight.npy       [D, K] or [D, 1, K], K from 1 to 8
  A_log.npy, dt_bias.npy [HV]
  conv_bias.npy         optional, [D]
  cu_seqlens.npy        optional, int64 (or int32) [N + 1]: sequence boundaries (packed batch)
  conv_state.npy        optional, [N, K - 1, D]: each sequence's last K - 1 inputs before it
  recurrent_state.npy   optional, [N, HV, DK, DV]
Writes to --out (created if missing), out in the dtype of qkv, the rest in that of conv_weight:
  out.npy [T, HV DV], conv_state_out.npy [N, K - 1, D], recurrent_state_out.npy [N, HV, DK, DV]
  chunk_states.npy and t_inv.npy with --residuals (for `gdn layer-backward`)
With --reference the outputs come from the float64 reference (float64 conv and gates, then the
token recurrence) and are float64.

options:
%s
examples:
  gdn layer-forward --in dump/ --out result/ --hk 16 --hv 32 --dk 128 --dv 128
  gdn layer-forward --in dump/ --out dump/ --hk 16 --hv 32 --dk 128 --dv 128 --residuals
  gdn layer-forward --in dump/ --out ref/ --hk 16 --hv 32 --dk 128 --dv 128 --reference
)HELP";

const char* const kLayerBackwardHelp =
    R"HELP(usage: gdn layer-backward --in DIR --out DIR --hk HK --hv HV --dk DK --dv DV [options]

Runs the backward pass of the fused GDN layer op (see `gdn layer-forward --help`): the gradients
of L = <d_out, out> + <d_conv_state_out, conv_state_out> + <d_recurrent_state_out,
recurrent_state_out> with respect to every input. Parameter gradients are sums over all tokens
in a fixed order: bit-identical for any --threads.

Reads from --in: the forward's inputs (see `gdn layer-forward --help`), and
  d_out.npy                  [T, HV DV]: the cotangent of out
  d_conv_state_out.npy       optional, [N, K - 1, D]
  d_recurrent_state_out.npy  optional, [N, HV, DK, DV]
  chunk_states.npy, t_inv.npy
                             optional: the forward's residuals (`gdn layer-forward
                             --residuals`). When they are there they are used (as --policy
                             allows); when they are not, this command runs the forward first
                             and keeps what --policy keeps.
Writes to --out (created if missing), each shaped and typed like its input:
  d_qkv.npy d_a.npy d_b.npy d_conv_weight.npy d_A_log.npy d_dt_bias.npy d_conv_state.npy
  d_recurrent_state.npy, and d_conv_bias.npy when conv_bias.npy is given
With --reference the gradients come from the float64 reference (reverse mode through the
float64 conv, gates and token recurrence) and are float64; residuals are not used.

options:
%s
--policy: auto (default) uses the residual files present, else keeps both; all uses
chunk_states.npy and t_inv.npy (whichever are present) or keeps both; t_inv uses or keeps only
t_inv; none uses and keeps nothing (the backward rebuilds the chunk states and T^-1). All give
the same gradients.

examples:
  gdn layer-forward --in dump/ --out dump/ --hk 16 --hv 32 --dk 128 --dv 128 --residuals
  gdn layer-backward --in dump/ --out grads/ --hk 16 --hv 32 --dk 128 --dv 128
  gdn layer-backward --in dump/ --out grads/ --hk 16 --hv 32 --dk 128 --dv 128 --policy none
  gdn layer-backward --in dump/ --out ref/ --hk 16 --hv 32 --dk 128 --dv 128 --reference
)HELP";

namespace {

std::vector<OptionSpec> layer_options(const std::vector<OptionSpec>& own) {
  std::vector<OptionSpec> options = {
      {"in", "DIR", "directory holding the input .npy files (required)"},
      {"out", "DIR", "directory for the output .npy files (required)"},
      {"hk", "HK", "query/key heads (required)"},
      {"hv", "HV", "value heads, a multiple of HK (required)"},
      {"dk", "DK", "key head dim, 1 to 256 (required)"},
      {"dv", "DV", "value head dim, 1 to 256 (required)"},
      {"chunk-size", "C",
       "tokens per chunk of the gated delta rule, 1 to 256, or 0: the tiling plan's (default 64)"},
      {"threads", "N", "worker threads, 0 = all cores (default 0); results do not depend on it"},
      {"isa", "ISA", "CPU variant: auto, generic, avx2, avx512 or avx512_bf16 (default auto)"},
      {"matmul", "P", kMatmulHelp},
  };
  options.insert(options.end(), own.begin(), own.end());
  options.push_back({"reference", nullptr, "run the float64 reference instead of the CPU kernels"});
  options.push_back({"quiet", nullptr, "print nothing on success"});
  options.push_back({"help", nullptr, "show this help"});
  return options;
}

const std::vector<OptionSpec> kForwardOptions = layer_options(
    {{"residuals", nullptr, "also write chunk_states.npy and t_inv.npy (for layer-backward)"}});
const std::vector<OptionSpec> kBackwardOptions = layer_options(
    {{"policy", "P", "auto, all, t_inv or none: which forward residuals to use or keep"}});

// The forward's input files.
struct LayerTensors {
  Tensor qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_state, recurrent_state, cu_seqlens;
  LayerInputs inputs() const {
    return {
        qkv.view(),   a.view(),       b.view(),          conv_weight.view(),     conv_bias.view(),
        A_log.view(), dt_bias.view(), conv_state.view(), recurrent_state.view(), cu_seqlens.view()};
  }
};

LayerTensors load_layer_inputs(const std::filesystem::path& dir) {
  if (!std::filesystem::is_directory(dir)) {
    throw UsageError(
        "option '--in': expected a directory with qkv.npy, a.npy, b.npy, conv_weight.npy, "
        "A_log.npy, dt_bias.npy, given '" +
        dir.string() + "'");
  }
  LayerTensors t;
  t.qkv = npy::load(dir / "qkv.npy");
  t.a = npy::load(dir / "a.npy");
  t.b = npy::load(dir / "b.npy");
  t.conv_weight = npy::load(dir / "conv_weight.npy");
  t.A_log = npy::load(dir / "A_log.npy");
  t.dt_bias = npy::load(dir / "dt_bias.npy");
  t.conv_bias = load_if_present(dir / "conv_bias.npy");
  t.conv_state = load_if_present(dir / "conv_state.npy");
  t.recurrent_state = load_if_present(dir / "recurrent_state.npy");
  t.cu_seqlens = load_cu_seqlens(dir);
  return t;
}

// Runs `body`, naming the file (or the option) behind an invalid argument in its error.
template <class Body>
void naming_files(const Args& args, Body&& body) {
  try {
    body();
  } catch (const InvalidArgument& e) {
    std::string file;
    for (const char* name :
         {"qkv", "a", "b", "conv_weight", "conv_bias", "A_log", "dt_bias", "conv_state",
          "recurrent_state", "cu_seqlens", "d_out", "d_conv_state_out", "d_recurrent_state_out",
          "chunk_states", "t_inv"}) {
      if (e.argument() == name) file = e.argument() + ".npy";
    }
    rethrow_in_cli_names(e, args, file);
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int layer_forward_command(int argc, char** argv) {
  const Args args(kForwardOptions, argc, argv, 2);
  if (args.flag("help")) {
    std::printf(kLayerForwardHelp, describe_options(kForwardOptions).c_str());
    return 0;
  }
  const std::filesystem::path in_dir = args.required_text("in");
  const std::filesystem::path out_dir = args.required_text("out");
  const LayerOptions options = layer_options_from(args);
  const bool reference = args.flag("reference");
  reject_matmul_with_reference(args, reference);
  const bool residuals = args.flag("residuals");
  if (reference && residuals) {
    throw UsageError(
        "option '--residuals' does not apply with --reference (the reference keeps none)");
  }
  const LayerTensors tensors = load_layer_inputs(in_dir);
  LayerForwardResult result;
  const auto start = std::chrono::steady_clock::now();
  naming_files(args, [&] {
    result = reference ? ref::fused_gdn_fwd(tensors.inputs(), options)
                       : fused_gdn_fwd(tensors.inputs(), options,
                                       residuals ? Residuals::all : Residuals::none);
  });
  const double seconds = seconds_since(start);

  make_output_directory(out_dir);
  OutputFiles files;  // all in place together, or none
  npy::save(files, out_dir / "out.npy", result.out);
  npy::save(files, out_dir / "conv_state_out.npy", result.conv_state_out);
  npy::save(files, out_dir / "recurrent_state_out.npy", result.recurrent_state_out);
  if (residuals) {
    npy::save(files, out_dir / "chunk_states.npy", result.chunk_states);
    npy::save(files, out_dir / "t_inv.npy", result.t_inv);
  }
  files.commit();
  if (!args.flag("quiet")) {
    std::printf("gdn layer-forward: T = %lld tokens, D = %lld channels, K = %lld, %s\n",
                static_cast<long long>(tensors.qkv.size(0)),
                static_cast<long long>(tensors.qkv.size(1)),
                static_cast<long long>(tensors.conv_weight.size(tensors.conv_weight.rank() - 1)),
                dtype_name(tensors.qkv.dtype()));
    std::printf(
        "  %s in %.3f ms; wrote out.npy, conv_state_out.npy, recurrent_state_out.npy%s to %s\n",
        engine_name(reference, options.isa, options.matmul_precision).c_str(), seconds * 1e3,
        residuals ? ", chunk_states.npy, t_inv.npy" : "", out_dir.string().c_str());
  }
  return 0;
}

int layer_backward_command(int argc, char** argv) {
  const Args args(kBackwardOptions, argc, argv, 2);
  if (args.flag("help")) {
    std::printf(kLayerBackwardHelp, describe_options(kBackwardOptions).c_str());
    return 0;
  }
  const std::filesystem::path in_dir = args.required_text("in");
  const std::filesystem::path out_dir = args.required_text("out");
  const LayerOptions options = layer_options_from(args);
  const bool reference = args.flag("reference");
  reject_matmul_with_reference(args, reference);
  const std::string policy = args.choice("policy", "auto", {"auto", "all", "t_inv", "none"});
  if (reference && args.has("policy")) {
    throw UsageError(
        "option '--policy' does not apply with --reference (it recomputes everything)");
  }
  const LayerTensors tensors = load_layer_inputs(in_dir);
  const Tensor d_out = npy::load(in_dir / "d_out.npy");
  const Tensor d_conv_state_out = load_if_present(in_dir / "d_conv_state_out.npy");
  const Tensor d_recurrent_state_out = load_if_present(in_dir / "d_recurrent_state_out.npy");
  const bool use_states = !reference && (policy == "auto" || policy == "all") &&
                          std::filesystem::exists(in_dir / "chunk_states.npy");
  const bool use_t_inv =
      !reference && policy != "none" && std::filesystem::exists(in_dir / "t_inv.npy");
  const Tensor chunk_states = use_states ? npy::load(in_dir / "chunk_states.npy") : Tensor{};
  const Tensor t_inv = use_t_inv ? npy::load(in_dir / "t_inv.npy") : Tensor{};

  LayerBackwardInputs bin{tensors.inputs(),        d_out.view(),
                          d_conv_state_out.view(), d_recurrent_state_out.view(),
                          chunk_states.view(),     t_inv.view()};
  std::string residual_note;
  LayerBackwardResult grads;
  const auto start = std::chrono::steady_clock::now();
  naming_files(args, [&] {
    if (reference) {
      bin.chunk_states = {};
      bin.t_inv = {};
      grads = ref::fused_gdn_bwd(bin, options);
      residual_note = "float64 reference (recomputes everything)";
      return;
    }
    LayerForwardResult kept;
    const bool have_files = use_states || use_t_inv;
    if (!have_files && policy != "none") {
      // No residual files: run the forward here, keeping what the policy keeps.
      kept = fused_gdn_fwd(bin.forward, options,
                           policy == "t_inv" ? Residuals::t_inv : Residuals::all);
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
    grads = fused_gdn_bwd(bin, options);
  });
  const double seconds = seconds_since(start);

  make_output_directory(out_dir);
  OutputFiles files;  // all in place together, or none
  std::string written;
  auto save = [&](const char* name, const Tensor& t) {
    if (!t.present()) return;
    npy::save(files, out_dir / (std::string(name) + ".npy"), t);
    written += std::string(written.empty() ? "" : " ") + name + ".npy";
  };
  save("d_qkv", grads.d_qkv);
  save("d_a", grads.d_a);
  save("d_b", grads.d_b);
  save("d_conv_weight", grads.d_conv_weight);
  save("d_conv_bias", grads.d_conv_bias);
  save("d_A_log", grads.d_A_log);
  save("d_dt_bias", grads.d_dt_bias);
  save("d_conv_state", grads.d_conv_state);
  save("d_recurrent_state", grads.d_recurrent_state);
  files.commit();
  if (!args.flag("quiet")) {
    std::printf("gdn layer-backward: residuals: %s\n", residual_note.c_str());
    std::printf("  %s in %.3f ms; wrote %s to %s\n",
                engine_name(reference, options.isa, options.matmul_precision).c_str(),
                seconds * 1e3, written.c_str(), out_dir.string().c_str());
  }
  return 0;
}

}  // namespace gdn::cli
