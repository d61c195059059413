// module.cc: the extension module gdn._gdn (nanobind). It hands the XLA FFI handlers to Python
// as capsules (python/gdn/jax registers them with jax.ffi.register_ffi_target) and runs the
// library's validation when a call is traced, from shapes and dtypes alone, so that a static
// mistake raises ValueError with the library's message before anything is compiled.
//
// A trace-time check builds views at distinct fake addresses (never dereferenced: see
// gdn/step.h check_fused_gdn_step, gdn/forward.h forward_shape) and placeholder index arrays
// that pass (cu_seqlens [0, T, ..., T]; a step's indices all zero, so every sequence is
// padding); the values of traced index arrays are checked by the handlers when they run.
// check_step also takes the values of a serving call's index arrays where the caller has them
// on the host: gdn.jax checks them before its donating call, so that a bad index raises while
// the caller still holds its pools.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/direct.h"
#include "bindings/dtype_names.h"
#include "gdn/gdn.h"
#if GDN_XLA_FFI
#include "bindings/handlers.h"
#endif

namespace nb = nanobind;

namespace gdn::bindings {
namespace {

// (shape, dtype name) of one argument, or None for an absent one.
using Spec = std::optional<std::tuple<std::vector<std::int64_t>, std::string>>;
// The values of a concrete index argument: int32 (widened here) or int64.
using Values = nb::ndarray<nb::ro, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

Dims dims_of(const std::vector<std::int64_t>& shape, const char* argument) {
  if (shape.empty() || shape.size() > static_cast<std::size_t>(kMaxRank)) {
    throw InvalidArgument(argument, "rank 1 to 4", "rank " + std::to_string(shape.size()));
  }
  Dims d{};
  for (std::size_t i = 0; i < shape.size(); ++i) d[i] = shape[i];
  return d;
}

// Views of traced arguments: each at its own fake address, far from the others, so that the
// validation's overlap rules see distinct buffers; and index placeholders with real storage.
class TraceViews {
 public:
  MutableTensorView mutable_view(const Spec& spec, const char* argument) {
    if (!spec) return {};
    const auto& [shape, dtype_name] = *spec;
    const Dims sizes = dims_of(shape, argument);
    const int rank = static_cast<int>(shape.size());
    const DType dtype = dtype_named(dtype_name, argument);
    std::int64_t bytes = static_cast<std::int64_t>(dtype_size(dtype));
    for (int i = 0; i < rank; ++i) bytes *= sizes[i] > 0 ? sizes[i] : 1;
    void* address = reinterpret_cast<void*>(next_);
    next_ += (static_cast<std::uintptr_t>(bytes) + kGap) / kGap * kGap + kGap;
    return MutableTensorView(address, dtype, rank, sizes, contiguous_strides(sizes, rank));
  }
  TensorView view(const Spec& spec, const char* argument) { return mutable_view(spec, argument); }

  // An index argument: its placeholder values from `fill` (when traced), or the caller's own.
  template <class Fill>
  TensorView index(const Spec& spec, const std::optional<Values>& values, const char* argument,
                   Fill fill) {
    if (!spec || !values) return index(spec, argument, fill);
    const std::vector<std::int64_t>& shape = std::get<0>(*spec);
    if (shape.size() != 1 || static_cast<std::int64_t>(values->shape(0)) != shape[0]) {
      throw std::invalid_argument(std::string("gdn: check_step: the values of '") + argument +
                                  "' do not have the shape of its spec");
    }
    const Dims sizes{shape[0], 0, 0, 0};
    const nb::dlpack::dtype dtype = values->dtype();
    if (dtype == nb::dtype<std::int64_t>()) {
      return TensorView(values->data(), DType::i64, 1, sizes, contiguous_strides(sizes, 1));
    }
    if (dtype != nb::dtype<std::int32_t>()) {
      throw std::invalid_argument(std::string("gdn: check_step: the values of '") + argument +
                                  "' are neither int32 nor int64");
    }
    const auto* narrow = static_cast<const std::int32_t*>(values->data());
    return index(spec, argument, [&](std::int64_t i) { return std::int64_t{narrow[i]}; });
  }

  // An index argument with real storage: `fill(i)` for element i. An int32 argument becomes
  // int64, as the handlers widen it.
  template <class Fill>
  TensorView index(const Spec& spec, const char* argument, Fill fill) {
    if (!spec) return {};
    const auto& [shape, dtype_name] = *spec;
    const Dims sizes = dims_of(shape, argument);
    const int rank = static_cast<int>(shape.size());
    DType dtype = dtype_named(dtype_name, argument);
    if (dtype == DType::i32) dtype = DType::i64;
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= sizes[i];
    std::vector<std::int64_t>& values = storage_.emplace_back(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) values[i] = fill(i);
    return TensorView(values.data(), dtype, rank, sizes, contiguous_strides(sizes, rank));
  }

 private:
  static constexpr std::uintptr_t kGap = std::uintptr_t{1} << 20;
  std::uintptr_t next_ = std::uintptr_t{1} << 32;
  std::deque<std::vector<std::int64_t>> storage_;  // stable addresses
};

std::int64_t leading_size(const Spec& spec) {
  return spec && !std::get<0>(*spec).empty() ? std::get<0>(*spec)[0] : 0;
}

// Residual rows to allocate: the chunks of the batch when it is known from shapes alone (one
// sequence, or the batched layout), else the most N sequences over T tokens can have: each
// sequence adds at most one partial chunk to ceil(T / C), and no chunk is empty.
std::int64_t max_chunks(const ForwardShape& shape, bool packed_varlen, std::int64_t tokens) {
  if (!packed_varlen) return shape.total_chunks;
  const std::int64_t c = shape.chunk_size;
  return std::min(tokens, (tokens + c - 1) / c + shape.num_seqs - 1);
}

nb::dict shape_dict(const ForwardShape& shape, std::int64_t chunks) {
  nb::dict d;
  d["num_seqs"] = shape.num_seqs;
  d["chunk_size"] = shape.chunk_size;
  d["max_chunks"] = chunks;
  d["compute_dtype"] = std::string(shape.compute_dtype == DType::f64 ? "float64" : "float32");
  return d;
}

// forward_shape from shapes: checks q, k, v, g, beta, the initial state, cu_seqlens' shape and
// the options; returns the facts the Python layer allocates by.
nb::dict core_shape(const Spec& q, const Spec& k, const Spec& v, const Spec& g, const Spec& beta,
                    const Spec& initial_state, const Spec& cu_seqlens, std::optional<double> scale,
                    bool l2norm, int chunk_size, bool bf16_matmul, int threads) {
  TraceViews views;
  ForwardInputs in;
  in.q = views.view(q, "q");
  in.k = views.view(k, "k");
  in.v = views.view(v, "v");
  in.g = views.view(g, "g");
  in.beta = views.view(beta, "beta");
  in.initial_state = views.view(initial_state, "initial_state");
  const std::int64_t tokens = in.q.rank == 3 ? in.q.sizes[0] : 0;
  in.cu_seqlens =
      views.index(cu_seqlens, "cu_seqlens", [&](std::int64_t i) { return i == 0 ? 0 : tokens; });
  ForwardOptions options;
  options.scale = scale;
  options.use_qk_l2norm = l2norm;
  options.chunk_size = chunk_size;
  options.threads = threads;
  options.matmul_precision = bf16_matmul ? MatmulPrecision::bf16 : MatmulPrecision::compute;
  const ForwardShape shape = forward_shape(in, options);
  return shape_dict(shape, max_chunks(shape, in.cu_seqlens.present(), tokens));
}

nb::dict layer_shape(const Spec& qkv, const Spec& a, const Spec& b, const Spec& conv_weight,
                     const Spec& conv_bias, const Spec& A_log, const Spec& dt_bias,
                     const Spec& conv_state, const Spec& recurrent_state, const Spec& cu_seqlens,
                     std::int64_t hk, std::int64_t hv, std::int64_t dk, std::int64_t dv,
                     int chunk_size, bool bf16_matmul, int threads) {
  TraceViews views;
  LayerInputs in;
  in.qkv = views.view(qkv, "qkv");
  in.a = views.view(a, "a");
  in.b = views.view(b, "b");
  in.conv_weight = views.view(conv_weight, "conv_weight");
  in.conv_bias = views.view(conv_bias, "conv_bias");
  in.A_log = views.view(A_log, "A_log");
  in.dt_bias = views.view(dt_bias, "dt_bias");
  in.conv_state = views.view(conv_state, "conv_state");
  in.recurrent_state = views.view(recurrent_state, "recurrent_state");
  const std::int64_t tokens = leading_size(qkv);
  in.cu_seqlens =
      views.index(cu_seqlens, "cu_seqlens", [&](std::int64_t i) { return i == 0 ? 0 : tokens; });
  LayerOptions options;
  options.hk = hk;
  options.hv = hv;
  options.dk = dk;
  options.dv = dv;
  options.chunk_size = chunk_size;
  options.threads = threads;
  options.matmul_precision = bf16_matmul ? MatmulPrecision::bf16 : MatmulPrecision::compute;
  const ForwardShape shape = fused_gdn_shape(in, options);
  return shape_dict(shape, max_chunks(shape, in.cu_seqlens.present(), tokens));
}

void check_step(const Spec& qkv, const Spec& b, const Spec& a, const Spec& conv_pool,
                const Spec& recurrent_pool, const Spec& conv_weight, const Spec& conv_bias,
                const Spec& A_log, const Spec& dt_bias, const Spec& query_start_loc,
                const Spec& state_indices, const Spec& distribution, const Spec& seq_lens,
                const Spec& read_state_indices, const Spec& read_offsets, const Spec& out,
                std::int64_t hk, std::int64_t hv, std::int64_t dk, std::int64_t dv,
                std::int64_t num_spec, int threads,
                const std::optional<std::vector<std::optional<Values>>>& index_values) {
  constexpr std::size_t kIndexArguments = 6;
  if (index_values && index_values->size() != kIndexArguments) {
    throw std::invalid_argument(
        "gdn: check_step: expected the values of 6 index arguments, given " +
        std::to_string(index_values->size()));
  }
  const std::array<const Spec*, kIndexArguments> index_specs{&query_start_loc,    &state_indices,
                                                             &distribution,       &seq_lens,
                                                             &read_state_indices, &read_offsets};
  // All or none: placeholders beside real values could fail a batch that is right.
  for (std::size_t i = 0; index_values && i < kIndexArguments; ++i) {
    if (index_specs[i]->has_value() != (*index_values)[i].has_value()) {
      throw std::invalid_argument("gdn: check_step: index argument " + std::to_string(i) +
                                  " has a spec but no values, or values but no spec");
    }
  }
  const auto values = [&](std::size_t i) -> std::optional<Values> {
    return index_values ? (*index_values)[i] : std::nullopt;
  };
  TraceViews views;
  StepInputs in;
  in.qkv = views.view(qkv, "qkv");
  in.a = views.view(a, "a");
  in.b = views.view(b, "b");
  in.conv_weight = views.view(conv_weight, "conv_weight");
  in.conv_bias = views.view(conv_bias, "conv_bias");
  in.A_log = views.view(A_log, "A_log");
  in.dt_bias = views.view(dt_bias, "dt_bias");
  const auto zero = [](std::int64_t) { return std::int64_t{0}; };
  in.query_start_loc = views.index(query_start_loc, values(0), "query_start_loc", zero);
  in.state_indices = views.index(state_indices, values(1), "state_indices", zero);
  in.distribution = views.index(distribution, values(2), "distribution", zero);
  in.seq_lens = views.index(seq_lens, values(3), "seq_lens", zero);
  in.read_state_indices = views.index(read_state_indices, values(4), "read_state_indices", zero);
  in.read_offsets = views.index(read_offsets, values(5), "read_offsets", zero);
  const StatePools pools{views.mutable_view(conv_pool, "conv_state"),
                         views.mutable_view(recurrent_pool, "recurrent_state")};
  StepOptions options;
  options.hk = hk;
  options.hv = hv;
  options.dk = dk;
  options.dv = dv;
  options.num_spec = num_spec;
  options.threads = threads;
  check_fused_gdn_step(in, pools, views.mutable_view(out, "out"), options);
}

// The C++ op timed on its own, for the benchmark's overhead column (bench/jax_bench.py): a
// tensor of `dtype` filled with values in [lo, hi) from a fixed-seed generator.
Tensor filled(std::initializer_list<std::int64_t> shape, float lo, float hi, std::uint64_t seed) {
  Tensor t(DType::f32, shape);
  float* p = t.data<float>();
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = lo + (hi - lo) * static_cast<float>(x >> 40) * 0x1p-24f;
  }
  return t;
}

// A copy of a tensor in 4 KiB pages (an anonymous mapping advised MADV_NOHUGEPAGE), as XLA's
// input buffers are where transparent huge pages are `madvise`: the library's own Tensor gets
// huge pages, so the two columns of bench/jax_bench.py --small-pages tell the page size's cost
// from the custom call's (docs/perf_frameworks.md).
class SmallPageCopy {
 public:
  explicit SmallPageCopy(const Tensor& t) : view_(t.view()), bytes_(t.bytes()) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      throw std::runtime_error("small_pages: mmap of " + std::to_string(bytes_) +
                               " bytes failed: " + std::strerror(errno));
    }
    // It fails (EINVAL) only where the kernel has no transparent huge pages: 4 KiB pages then.
    madvise(p, bytes_, MADV_NOHUGEPAGE);
    std::memcpy(p, view_.data, bytes_);
    view_.data = p;
  }
  SmallPageCopy(const SmallPageCopy&) = delete;
  SmallPageCopy& operator=(const SmallPageCopy&) = delete;
  ~SmallPageCopy() { munmap(const_cast<void*>(view_.data), bytes_); }
  const TensorView& view() const { return view_; }

 private:
  TensorView view_;
  std::size_t bytes_;
};

// The tensors' views: their own, or those of 4 KiB-page copies kept in `copies`.
template <std::size_t N>
std::array<TensorView, N> input_views(const std::array<const Tensor*, N>& tensors, bool small_pages,
                                      std::vector<std::unique_ptr<SmallPageCopy>>& copies) {
  std::array<TensorView, N> views;
  for (std::size_t i = 0; i < N; ++i) {
    if (small_pages) {
      copies.push_back(std::make_unique<SmallPageCopy>(*tensors[i]));
      views[i] = copies.back()->view();
    } else {
      views[i] = tensors[i]->view();
    }
  }
  return views;
}

template <class Run>
std::vector<double> timed(int repeats, bool warm_up, Run run) {
  if (warm_up) run();  // page faults, the plan, the caches
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return seconds;
}

// Seconds per run of the core op on one sequence of T tokens, L2 norm on: the forward, or
// the forward keeping every residual plus the backward from them (what jax.grad runs). With
// small_pages the inputs (not the outputs) are in 4 KiB pages.
std::vector<double> time_core(std::int64_t t, std::int64_t hk, std::int64_t hv, std::int64_t dk,
                              std::int64_t dv, bool backward, int chunk_size, int threads,
                              int repeats, bool warm_up, bool small_pages) {
  const Tensor q = filled({t, hk, dk}, -1, 1, 1), k = filled({t, hk, dk}, -1, 1, 2),
               v = filled({t, hv, dv}, -1, 1, 3), g = filled({t, hv}, -1, -0.01f, 4),
               beta = filled({t, hv}, 0, 1, 5), d_o = filled({t, hv, dv}, -1, 1, 6);
  std::vector<std::unique_ptr<SmallPageCopy>> copies;
  const auto x = input_views<6>({&q, &k, &v, &g, &beta, &d_o}, small_pages, copies);
  const ForwardInputs in{x[0], x[1], x[2], x[3], x[4], {}, {}};
  ForwardOptions options;
  options.use_qk_l2norm = true;
  options.chunk_size = chunk_size;
  options.threads = threads;
  return timed(repeats, warm_up, [&] {
    ForwardResult r =
        chunk_gated_delta_rule_fwd(in, options, backward ? Residuals::all : Residuals::none);
    if (!backward) return;
    BackwardInputs b = BackwardInputs::from(in);
    b.d_o = x[5];
    b.chunk_states = r.chunk_states.view();
    b.t_inv = r.t_inv.view();
    chunk_gated_delta_rule_bwd(b, options);
  });
}

// The same for the layer op (K = 4, no bias, no initial states).
std::vector<double> time_layer(std::int64_t t, std::int64_t hk, std::int64_t hv, std::int64_t dk,
                               std::int64_t dv, bool backward, int chunk_size, int threads,
                               int repeats, bool warm_up, bool small_pages) {
  const std::int64_t d = 2 * hk * dk + hv * dv;
  const Tensor qkv = filled({t, d}, -1, 1, 1), a = filled({t, hv}, -1, 1, 2),
               b = filled({t, hv}, -1, 1, 3), w = filled({d, 4}, -0.5f, 0.5f, 4),
               A_log = filled({hv}, 0, 2.7f, 5), dt_bias = filled({hv}, -0.1f, 0.1f, 6),
               d_out = filled({t, hv * dv}, -1, 1, 7);
  std::vector<std::unique_ptr<SmallPageCopy>> copies;
  const auto x = input_views<7>({&qkv, &a, &b, &w, &A_log, &dt_bias, &d_out}, small_pages, copies);
  LayerInputs in;
  in.qkv = x[0];
  in.a = x[1];
  in.b = x[2];
  in.conv_weight = x[3];
  in.A_log = x[4];
  in.dt_bias = x[5];
  LayerOptions options;
  options.hk = hk;
  options.hv = hv;
  options.dk = dk;
  options.dv = dv;
  options.chunk_size = chunk_size;
  options.threads = threads;
  return timed(repeats, warm_up, [&] {
    LayerForwardResult r = fused_gdn_fwd(in, options, backward ? Residuals::all : Residuals::none);
    if (!backward) return;
    LayerBackwardInputs bi;
    bi.forward = in;
    bi.d_out = x[6];
    bi.chunk_states = r.chunk_states.view();
    bi.t_inv = r.t_inv.view();
    fused_gdn_bwd(bi, options);
  });
}

#if GDN_XLA_FFI
nb::capsule handler(XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}
#endif

}  // namespace
}  // namespace gdn::bindings

NB_MODULE(_gdn, m) {
  using namespace gdn::bindings;
  m.doc() =
      "gdn's C++ library: XLA FFI handlers and trace-time validation (internal; use gdn.jax).";
  m.attr("__version__") = gdn::kVersion;
  // Built with GDN_JAX=OFF (no jaxlib at build time: pyproject.toml), the module has no XLA FFI
  // handlers and gdn.jax says so on import.
  m.attr("has_xla_ffi") = static_cast<bool>(GDN_XLA_FFI);
#if GDN_XLA_FFI
  m.def(
      "ffi_handlers",
      [] {
        nb::dict d;
        d["gdn_forward"] = handler(GdnForward);
        d["gdn_backward"] = handler(GdnBackward);
        d["gdn_layer_forward"] = handler(GdnLayerForward);
        d["gdn_layer_backward"] = handler(GdnLayerBackward);
        d["gdn_step"] = handler(GdnStep);
        d["gdn_conv_forward"] = handler(GdnConvForward);
        d["gdn_conv_backward"] = handler(GdnConvBackward);
        return d;
      },
      "The XLA FFI handlers (typed API), name -> capsule, for the CPU platform.");
#endif
  m.def(
      "cpu_isa",
      [] { return std::string(gdn::cpu_isa_name(gdn::resolve_cpu_isa(gdn::CpuIsa::automatic))); },
      "The CPU kernel variant calls run on this machine (avx512, avx2 or generic).");
  m.def("default_threads", &gdn::default_threads, "Threads a call with threads = 0 uses.");
  m.def(
      "set_pool_cpus", [](const std::vector<int>& cpus) { gdn::set_pool_cpus(cpus); },
      nb::arg("cpus"),
      "Where the library's pool threads run: each may run on any CPU of ``cpus`` (the "
      "system's CPU numbers), threads already started from their next task on. gdn.vllm "
      "places them on the CPUs vLLM bound its worker to (docs/vllm.md, \"Threads\"); until "
      "it is called a pool thread runs where the thread that started it could. ValueError "
      "naming ``cpus`` for an empty list or a CPU this system lacks (nothing changes then).");
  m.def("check_finite_from_environment", &gdn::check_finite_from_environment,
        "True when GDN_CHECK_FINITE=1 puts every call in check mode (read once per process).");
  m.def("core_shape", &core_shape);
  m.def("layer_shape", &layer_shape);
  m.def("check_step", &check_step);
  m.def("time_core", &time_core, nb::arg("t"), nb::arg("hk"), nb::arg("hv"), nb::arg("dk"),
        nb::arg("dv"), nb::arg("backward"), nb::arg("chunk_size"), nb::arg("threads"),
        nb::arg("repeats"), nb::arg("warm_up"), nb::arg("small_pages") = false,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("time_layer", &time_layer, nb::arg("t"), nb::arg("hk"), nb::arg("hv"), nb::arg("dk"),
        nb::arg("dv"), nb::arg("backward"), nb::arg("chunk_size"), nb::arg("threads"),
        nb::arg("repeats"), nb::arg("warm_up"), nb::arg("small_pages") = false,
        nb::call_guard<nb::gil_scoped_release>());
  define_direct_calls(m);
}
