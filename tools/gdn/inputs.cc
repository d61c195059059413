// inputs.cc: see inputs.h.
#include "inputs.h"

#include <cctype>
#include <utility>

#include "npy.h"

namespace gdn::cli {

std::vector<OptionSpec> with_forward_options(std::vector<OptionSpec> first,
                                             const std::vector<OptionSpec>& last) {
  const std::vector<OptionSpec> shared = {
      {"chunk-size", "C", "tokens per chunk, 1 to 256, or 0: the tiling plan's (default 64)"},
      {"threads", "N", "worker threads, 0 = all cores (default 0); results do not depend on it"},
      {"l2norm", nullptr, "L2-normalise q and k inside the kernel"},
      {"scale", "S", "multiplier of q (default Dk^-1/2)"},
      {"isa", "ISA", "CPU variant: auto, generic, avx2, avx512 or avx512_bf16 (default auto)"},
      {"matmul", "P", kMatmulHelp},
  };
  first.insert(first.end(), shared.begin(), shared.end());
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

ForwardOptions forward_options_from(const Args& args) {
  ForwardOptions options;
  options.chunk_size = static_cast<int>(args.integer("chunk-size", 64, 0, 256));
  options.threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  options.use_qk_l2norm = args.flag("l2norm");
  if (auto s = args.number("scale")) options.scale = *s;
  options.isa = isa_option(args);
  options.matmul_precision = matmul_option(args);
  return options;
}

MatmulPrecision matmul_option(const Args& args) {
  return args.choice("matmul", "compute", {"compute", "bf16"}) == "bf16" ? MatmulPrecision::bf16
                                                                         : MatmulPrecision::compute;
}

void reject_matmul_with_reference(const Args& args, bool reference) {
  if (reference && args.has("matmul")) {
    throw UsageError(
        "option '--matmul' does not apply with --reference (every product of the reference is "
        "float64)");
  }
}

namespace {

std::int64_t required_integer(const Args& args, const char* name, std::int64_t max) {
  if (!args.has(name)) {
    throw UsageError(std::string("option '--") + name + "' is required (the head layout)");
  }
  return args.integer(name, 0, 1, max);
}

}  // namespace

LayerOptions layer_options_from(const Args& args) {
  LayerOptions o;
  o.hk = required_integer(args, "hk", 4096);
  o.hv = required_integer(args, "hv", 4096);
  o.dk = required_integer(args, "dk", 256);
  o.dv = required_integer(args, "dv", 256);
  o.chunk_size = static_cast<int>(args.integer("chunk-size", 64, 0, 256));
  o.threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  o.isa = isa_option(args);
  o.matmul_precision = matmul_option(args);
  return o;
}

CpuIsa isa_option(const Args& args) {
  const std::string isa =
      args.choice("isa", "auto", {"auto", "generic", "avx2", "avx512", "avx512_bf16"});
  const CpuIsa chosen = isa == "generic"       ? CpuIsa::generic
                        : isa == "avx2"        ? CpuIsa::avx2
                        : isa == "avx512"      ? CpuIsa::avx512
                        : isa == "avx512_bf16" ? CpuIsa::avx512_bf16
                                               : CpuIsa::automatic;
  // A variant this build or CPU cannot run is the option's error, not the library's.
  if (chosen != CpuIsa::automatic) {
    if (const char* why = cpu_isa_unavailable_reason(chosen)) {
      const std::string reason = why;
      std::string runnable = "auto";
      for (const CpuIsa c : {CpuIsa::generic, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512_bf16}) {
        if (cpu_isa_unavailable_reason(c) == nullptr)
          runnable += std::string(", ") + cpu_isa_name(c);
      }
      throw UsageError("option '--isa': expected a variant this build runs on this CPU (" +
                       runnable + "), given '" + isa + "' (" + reason + ")");
    }
  }
  return chosen;
}

std::string engine_name(bool reference, CpuIsa isa, MatmulPrecision matmul) {
  if (reference) return "float64 reference";
  return std::string(cpu_isa_name(resolve_cpu_isa(isa))) + " kernels" +
         (matmul == MatmulPrecision::bf16 ? " (bf16 matrix operands)" : "");
}

ForwardTensors load_forward_inputs(const std::filesystem::path& dir) {
  if (!std::filesystem::is_directory(dir)) {
    throw UsageError(
        "option '--in': expected a directory with q.npy, k.npy, v.npy, g.npy, beta.npy, given '" +
        dir.string() + "'");
  }
  ForwardTensors t;
  t.q = npy::load(dir / "q.npy");
  t.k = npy::load(dir / "k.npy");
  t.v = npy::load(dir / "v.npy");
  t.g = npy::load(dir / "g.npy");
  t.beta = npy::load(dir / "beta.npy");
  t.cu_seqlens = load_cu_seqlens(dir);
  t.h0 = load_if_present(dir / "h0.npy");
  return t;
}

Tensor load_if_present(const std::filesystem::path& file) {
  return std::filesystem::exists(file) ? npy::load(file) : Tensor{};
}

Tensor load_cu_seqlens(const std::filesystem::path& dir) {
  Tensor cu = load_if_present(dir / "cu_seqlens.npy");
  if (cu.present() && cu.dtype() == DType::i32) {  // widen int32 boundaries exactly
    Tensor wide(DType::i64, cu.rank(), cu.sizes());
    for (std::int64_t i = 0; i < cu.numel(); ++i) {
      wide.data<std::int64_t>()[i] = cu.data<std::int32_t>()[i];
    }
    return wide;
  }
  return cu;
}

std::string file_of_argument(const std::string& argument) {
  if (argument == "initial_state") return "h0.npy";
  if (argument == "d_o") return "do.npy";
  if (argument == "d_final_state") return "dht.npy";
  for (const char* name : {"q", "k", "v", "g", "beta", "cu_seqlens", "chunk_states", "t_inv"}) {
    if (argument == name) return argument + ".npy";
  }
  return "";
}

namespace {

// The library's option names and the flags that set them.
constexpr std::pair<const char*, const char*> kOptionFlags[] = {
    {"options.scale", "--scale"},
    {"options.chunk_size", "--chunk-size"},
    {"options.threads", "--threads"},
    {"options.isa", "--isa"},
    {"options.matmul_precision", "--matmul"},
    {"options.algorithm", "--algorithm"},
    {"options.use_qk_l2norm", "--l2norm"},
    {"options.num_spec", "--num-spec"},
    {"options.hk", "--hk"},
    {"options.hv", "--hv"},
    {"options.dk", "--dk"},
    {"options.dv", "--dv"},
};

// Every library option name in `text` as its flag (whole names only).
std::string in_flag_names(std::string text) {
  for (const auto& [name, flag] : kOptionFlags) {
    const std::string from = name;
    for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at)) {
      const std::size_t end = at + from.size();
      const bool whole = end == text.size() ||
                         !(std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_');
      if (!whole) {
        at = end;
        continue;
      }
      text.replace(at, from.size(), flag);
      at += std::string(flag).size();
    }
  }
  return text;
}

// A dtype name of the library ("i32") as the .npy reader's ("int32 (<i4)"); others as they are.
std::string npy_dtype_text(const std::string& name) {
  for (const DType d : {DType::f32, DType::f64, DType::f16, DType::i32, DType::i64}) {
    if (name == dtype_name(d)) return npy::describe(d);
  }
  return name;
}

}  // namespace

std::string flag_of_option(const std::string& argument) {
  for (const auto& [name, flag] : kOptionFlags) {
    if (argument == name) return flag;
  }
  return "";
}

void rethrow_in_cli_names(const InvalidArgument& e, const Args& args, const std::string& file) {
  const std::string expected = in_flag_names(e.expected());
  const std::string flag = flag_of_option(e.argument());
  if (!flag.empty()) {
    const std::string name = flag.substr(2);
    const std::string given =
        args.has(name) ? "'" + args.text(name, "") + "'" : in_flag_names(e.given());
    throw UsageError("option '" + flag + "': expected " + expected + ", given " + given);
  }
  if (file.empty()) {
    throw InvalidArgument(in_flag_names(e.argument()), expected, in_flag_names(e.given()));
  }
  // The activations' dtype list names bf16, which no .npy file holds; the reader takes f16.
  if (expected == "dtype f32, f64, bf16 or f16") {
    throw InvalidArgument(file + " (" + e.argument() + ")",
                          "dtype float32, float64 or float16 (.npy <f4, <f8 or <f2)",
                          npy_dtype_text(e.given()));
  }
  throw InvalidArgument(file + " (" + e.argument() + ")", expected, e.given());
}

}  // namespace gdn::cli
