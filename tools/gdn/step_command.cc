// step_command.cc: `gdn step`, one serving step of the fused layer op over pools of state
// slots (gdn/step.h) on tensors stored as .npy files: mixed decode / prefill batches,
// speculative decode windows, the pools read and written per slot.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "gdn/gdn.h"
#include "gdn/step.h"
#include "inputs.h"
#include "npy.h"

namespace gdn::cli {

const char* const kStepHelp =
    R"HELP(usage: gdn step --in DIR --out DIR --hk HK --hv HV --dk DK --dv DV [options]

Runs one serving step of the fused GDN layer op (see `gdn layer-forward --help`) over pools of
state slots, as an inference engine calls it for a GDN layer at every step: a batch of N
sequences packed into T tokens, single-token (or speculative-window) decodes first, then fresh
prefills and continued (chunked) prefills, then padding. Each live sequence reads its conv and
recurrent state from its slot of the pools (when it has history) and writes its new states
back into the pools. Slot 0 is the null slot. The semantics are those of include/gdn/step.h.

Reads from --in (C order; float32 or float64, one dtype for all floats, or float16 qkv, a, b
with everything else float32; indices int64 or int32):
  qkv.npy                  [T, D]   the projected, pre-conv channels, D = 2 HK DK + HV DV
  a.npy, b.npy             [T, HV]  gate logits
  conv_weight.npy          [D, K] or [D, 1, K], K from 1 to 8
  A_log.npy, dt_bias.npy   [HV]
  conv_bias.npy            optional, [D]
  conv_state.npy           [num_slots, K - 1, D]: the conv-state pool
  recurrent_state.npy      [num_slots, HV, DK, DV]: the recurrent-state pool
  query_start_loc.npy      [N + 1]: sequence s has tokens [query_start_loc[s], [s + 1])
  state_indices.npy        [N]: the slot of each sequence
  seq_lens.npy             [N]: each sequence's total length after this step (history when
                           more than its query length)
  distribution.npy         [3]: decode_end, prefill_end, mixed_end
  read_state_indices.npy   optional, [N]: the base of the slot a sequence reads (default
                           state_indices; prefix caching)
  read_offsets.npy         optional, [N]: a sequence reads slot read_state_indices +
                           read_offsets
Writes to --out (created if missing; it may be --in, to step again):
  out.npy [T, HV DV] in the dtype of qkv, and the updated pools conv_state.npy and
  recurrent_state.npy; all three are written whole to temporary files first and then renamed
  into place together, so a failed write leaves every file of --out as it was
A decode window of n tokens (1 to 1 + --num-spec) writes the states after its token t into
slot state_indices + t. With --reference the step runs the float64 reference (every sequence
through the float64 layer op on its own) on the inputs converted to float64, and the outputs
and pools written are float64.

options:
%s
examples:
  gdn step --in dump/ --out result/ --hk 16 --hv 32 --dk 128 --dv 128
  gdn step --in dump/ --out dump/ --hk 16 --hv 32 --dk 128 --dv 128 --quiet
  gdn step --in dump/ --out result/ --hk 16 --hv 32 --dk 128 --dv 128 --num-spec 3
  gdn step --in dump/ --out ref/ --hk 16 --hv 32 --dk 128 --dv 128 --reference
)HELP";

namespace {

const std::vector<OptionSpec> kStepOptions = {
    {"in", "DIR", "directory holding the input .npy files (required)"},
    {"out", "DIR", "directory for the output .npy files (required; may be --in)"},
    {"hk", "HK", "query/key heads (required)"},
    {"hv", "HV", "value heads, a multiple of HK (required)"},
    {"dk", "DK", "key head dim, 1 to 256 (required)"},
    {"dv", "DV", "value head dim, 1 to 256 (required)"},
    {"num-spec", "N", "speculative tokens a decode window may carry beyond the first (default 0)"},
    {"chunk-size", "C", "tokens per chunk of the gated delta rule, 1 to 256 (default 64)"},
    {"threads", "N", "worker threads, 0 = all cores (default 0); results do not depend on it"},
    {"isa", "ISA", "CPU variant: auto, generic, avx2, avx512 or avx512_bf16 (default auto)"},
    {"reference", nullptr, "run the float64 reference instead of the CPU kernels"},
    {"quiet", nullptr, "print nothing on success"},
    {"help", nullptr, "show this help"},
};

// The files of a step, in the order the help lists them.
const char* const kStepFiles[] = {"qkv",
                                  "a",
                                  "b",
                                  "conv_weight",
                                  "conv_bias",
                                  "A_log",
                                  "dt_bias",
                                  "conv_state",
                                  "recurrent_state",
                                  "query_start_loc",
                                  "state_indices",
                                  "seq_lens",
                                  "distribution",
                                  "read_offsets",
                                  "read_state_indices",
                                  "out"};

StepOptions step_options_from(const Args& args) {
  StepOptions o;
  static_cast<LayerOptions&>(o) = layer_options_from(args);
  o.num_spec = args.integer("num-spec", 0, 0, 1024);
  return o;
}

// An index file: int64, or int32 widened exactly; absent when optional and missing.
Tensor load_index(const std::filesystem::path& file, bool required) {
  Tensor t = required ? npy::load(file) : load_if_present(file);
  if (t.present() && t.dtype() == DType::i32) {
    Tensor wide(DType::i64, t.rank(), t.sizes());
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      wide.data<std::int64_t>()[i] = t.data<std::int32_t>()[i];
    }
    return wide;
  }
  return t;
}

// A float tensor in float64 (float32 and float16 widened exactly), a copy (the reference's
// pools are its own). Absent stays absent; a tensor of another dtype is copied as it is
// (indices; anything else the library reports).
Tensor to_f64(const Tensor& t) {
  if (!t.present()) return Tensor{};
  const bool f32 = t.dtype() == DType::f32, f16 = t.dtype() == DType::f16;
  Tensor copy(f32 || f16 ? DType::f64 : t.dtype(), t.rank(), t.sizes());
  double* to = f32 || f16 ? copy.data<double>() : nullptr;
  if (f32) {
    const float* from = t.data<float>();
    for (std::int64_t i = 0; i < t.numel(); ++i) to[i] = from[i];
  } else if (f16) {
    const auto* from = static_cast<const std::uint16_t*>(t.raw());
    for (std::int64_t i = 0; i < t.numel(); ++i) to[i] = f16_value(from[i]);
  } else {
    std::memcpy(copy.raw(), t.raw(), t.bytes());
  }
  return copy;
}

struct StepTensors {
  Tensor qkv, a, b, conv_weight, conv_bias, A_log, dt_bias;
  Tensor conv_state, recurrent_state;
  Tensor query_start_loc, state_indices, seq_lens, distribution, read_offsets, read_state_indices;
  StepInputs inputs() const {
    return {qkv.view(),
            a.view(),
            b.view(),
            conv_weight.view(),
            conv_bias.view(),
            A_log.view(),
            dt_bias.view(),
            query_start_loc.view(),
            state_indices.view(),
            seq_lens.view(),
            distribution.view(),
            read_offsets.view(),
            read_state_indices.view()};
  }
  StatePools pools() { return {conv_state.mutable_view(), recurrent_state.mutable_view()}; }
};

StepTensors load_step_inputs(const std::filesystem::path& dir) {
  if (!std::filesystem::is_directory(dir)) {
    throw UsageError(
        "option '--in': expected a directory with qkv.npy, a.npy, b.npy, conv_weight.npy, "
        "A_log.npy, dt_bias.npy, conv_state.npy, recurrent_state.npy, query_start_loc.npy, "
        "state_indices.npy, seq_lens.npy, distribution.npy, given '" +
        dir.string() + "'");
  }
  StepTensors t;
  t.qkv = npy::load(dir / "qkv.npy");
  t.a = npy::load(dir / "a.npy");
  t.b = npy::load(dir / "b.npy");
  t.conv_weight = npy::load(dir / "conv_weight.npy");
  t.A_log = npy::load(dir / "A_log.npy");
  t.dt_bias = npy::load(dir / "dt_bias.npy");
  t.conv_bias = load_if_present(dir / "conv_bias.npy");
  t.conv_state = npy::load(dir / "conv_state.npy");
  t.recurrent_state = npy::load(dir / "recurrent_state.npy");
  t.query_start_loc = load_index(dir / "query_start_loc.npy", true);
  t.state_indices = load_index(dir / "state_indices.npy", true);
  t.seq_lens = load_index(dir / "seq_lens.npy", true);
  t.distribution = load_index(dir / "distribution.npy", true);
  t.read_offsets = load_index(dir / "read_offsets.npy", false);
  t.read_state_indices = load_index(dir / "read_state_indices.npy", false);
  return t;
}

StepTensors to_f64(const StepTensors& t) {
  StepTensors w;
  w.qkv = to_f64(t.qkv);
  w.a = to_f64(t.a);
  w.b = to_f64(t.b);
  w.conv_weight = to_f64(t.conv_weight);
  w.conv_bias = to_f64(t.conv_bias);
  w.A_log = to_f64(t.A_log);
  w.dt_bias = to_f64(t.dt_bias);
  w.conv_state = to_f64(t.conv_state);
  w.recurrent_state = to_f64(t.recurrent_state);
  w.query_start_loc = to_f64(t.query_start_loc);  // the indices: copied as they are
  w.state_indices = to_f64(t.state_indices);
  w.seq_lens = to_f64(t.seq_lens);
  w.distribution = to_f64(t.distribution);
  w.read_offsets = to_f64(t.read_offsets);
  w.read_state_indices = to_f64(t.read_state_indices);
  return w;
}

// Runs `body`, naming the file (or the option) behind an invalid argument in its error.
template <class Body>
void naming_files(const Args& args, Body&& body) {
  try {
    body();
  } catch (const InvalidArgument& e) {
    std::string argument = e.argument();
    for (const char* prefix : {"inputs.", "pools.", "outputs."}) {
      const std::string p = prefix;
      if (argument.rfind(p, 0) == 0) argument = argument.substr(p.size());
    }
    // "state_indices[3]" or "seq_lens of sequence 2" are in state_indices.npy, seq_lens.npy.
    const std::string base = argument.substr(0, argument.find_first_of("[ "));
    std::string file;
    for (const char* name : kStepFiles) {
      if (base == name) file = base + ".npy";
    }
    rethrow_in_cli_names(e, args, file);
  }
}

}  // namespace

int step_command(int argc, char** argv) {
  const Args args(kStepOptions, argc, argv, 2);
  if (args.flag("help")) {
    std::printf(kStepHelp, describe_options(kStepOptions).c_str());
    return 0;
  }
  const std::filesystem::path in_dir = args.required_text("in");
  const std::filesystem::path out_dir = args.required_text("out");
  const StepOptions options = step_options_from(args);
  const bool reference = args.flag("reference");
  StepTensors tensors = load_step_inputs(in_dir);
  if (reference) {
    // The CPU op's checks first, on the files as they are: widening hides a dtype mismatch.
    naming_files(args, [&] {
      const std::int64_t tokens = tensors.qkv.rank() > 0 ? tensors.qkv.size(0) : 0;
      Tensor out(tensors.qkv.dtype(), {tokens, options.hv * options.dv});
      check_fused_gdn_step(tensors.inputs(), tensors.pools(), out.mutable_view(), options);
    });
    tensors = to_f64(tensors);
  }

  Tensor out;
  const auto start = std::chrono::steady_clock::now();
  naming_files(args, [&] {
    out = reference ? ref::fused_gdn_step(tensors.inputs(), tensors.pools(), options)
                    : fused_gdn_step(tensors.inputs(), tensors.pools(), options);
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  make_output_directory(out_dir);
  // All three in place together or none: with --out = --in a failed write must leave the
  // pools of the previous step, both of them, whole.
  OutputFiles files;
  npy::save(files, out_dir / "out.npy", out);
  npy::save(files, out_dir / "conv_state.npy", tensors.conv_state);
  npy::save(files, out_dir / "recurrent_state.npy", tensors.recurrent_state);
  files.commit();
  if (!args.flag("quiet")) {
    const std::int64_t* dist = tensors.distribution.data<std::int64_t>();
    const std::int64_t* qsl = tensors.query_start_loc.data<std::int64_t>();
    std::printf(
        "gdn step: %lld sequences (%lld decodes, %lld prefills, %lld padding), %lld of T = %lld "
        "tokens live, %lld slots, D = %lld, K = %lld, %s\n",
        static_cast<long long>(tensors.state_indices.numel()), static_cast<long long>(dist[0]),
        static_cast<long long>(dist[2] - dist[0]),
        static_cast<long long>(tensors.state_indices.numel() - dist[2]),
        static_cast<long long>(qsl[dist[2]]), static_cast<long long>(tensors.qkv.size(0)),
        static_cast<long long>(tensors.recurrent_state.size(0)),
        static_cast<long long>(tensors.qkv.size(1)),
        static_cast<long long>(tensors.conv_weight.size(tensors.conv_weight.rank() - 1)),
        dtype_name(tensors.qkv.dtype()));
    std::printf("  %s in %.3f ms; wrote out.npy, conv_state.npy, recurrent_state.npy to %s\n",
                engine_name(reference, options.isa).c_str(), seconds * 1e3,
                out_dir.string().c_str());
  }
  return 0;
}

}  // namespace gdn::cli
