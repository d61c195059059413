// direct.cc: the core op, the conv op and the serving step called from Python on memory the caller
// owns (gdn.torch): each tensor arrives as (address, sizes, strides in elements, dtype name), or
// None when absent, and becomes a gdn view; the public C++ op validates everything and writes the
// outputs in place, with the GIL released. No framework headers: the extension builds without
// torch.
//
// Residual outputs are sized by the caller for the most chunks a batch of this shape can have
// (what a fake kernel can know without reading cu_seqlens): the op fills the first
// total_chunks rows and the rest are zeroed, as in the XLA handlers.
#include "bindings/direct.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings/dtype_names.h"
#include "bindings/huge_pages.h"
#include "gdn/gdn.h"
#include "gdn/threads.h"

namespace nb = nanobind;

namespace gdn::bindings {
namespace {

// Where a direct call's helper threads come from: gdn.torch turns this on when torch's ATen
// runs on OpenMP, so its ops run on torch's own intra-op team (gdn/threads.h's
// openmp_executor) instead of adding the library's pool to cores that team's threads spin on.
std::atomic<bool> use_openmp_team{false};

// Team members other than the calling thread that ran a direct call's parallel stage: what
// the tests (and gdn.vllm's counters) read to see that a call used the team's threads.
std::atomic<long long> team_helpers_joined{0};

// The OpenMP team, counting the members that join from other threads.
class CountedTeam final : public TeamExecutor {
 public:
  explicit CountedTeam(TeamExecutor& team) : team_(team) {}
  int helpers() const override { return team_.helpers(); }
  void schedule(std::function<void()> task) override { team_.schedule(std::move(task)); }
  void run_team(int threads, void (*member)(void* context, int index), void* context) override {
    struct Region {
      void (*member)(void*, int);
      void* context;
      std::thread::id caller;
    } region{member, context, std::this_thread::get_id()};
    team_.run_team(
        threads,
        [](void* data, int index) {
          const Region& r = *static_cast<const Region*>(data);
          if (std::this_thread::get_id() != r.caller) {
            team_helpers_joined.fetch_add(1, std::memory_order_relaxed);
          }
          r.member(r.context, index);
        },
        &region);
  }

 private:
  TeamExecutor& team_;
};

// While alive (one library call, on the calling thread), the call runs on the OpenMP team when
// use_openmp_team is set; otherwise it keeps the library's pool.
class CallThreads {
 public:
  CallThreads() {
    if (!use_openmp_team.load(std::memory_order_relaxed)) return;
    if (auto* team = dynamic_cast<TeamExecutor*>(openmp_executor())) {
      counted_.emplace(*team);
      scope_.emplace(*counted_);
    }
  }

 private:
  std::optional<CountedTeam> counted_;
  std::optional<ScopedExecutor> scope_;  // destroyed first: uninstalls before counted_ goes
};

// Returns whether direct calls now run on an OpenMP team: false when asked to stop, or when
// this process has no OpenMP runtime (the calls then keep the library's pool).
bool set_openmp_team(bool enabled) {
  const bool on = enabled && openmp_executor() != nullptr;
  use_openmp_team.store(on, std::memory_order_relaxed);
  return on;
}

using Raw = std::optional<
    std::tuple<std::int64_t, std::vector<std::int64_t>, std::vector<std::int64_t>, std::string>>;

MutableTensorView raw_view(const Raw& raw, const char* argument) {
  if (!raw) return {};
  const auto& [address, sizes, strides, dtype] = *raw;
  if (sizes.empty() || sizes.size() > static_cast<std::size_t>(kMaxRank)) {
    throw InvalidArgument(argument, "rank 1 to 4", "rank " + std::to_string(sizes.size()));
  }
  if (strides.size() != sizes.size()) {
    throw InvalidArgument(argument, std::to_string(sizes.size()) + " strides (one per dimension)",
                          std::to_string(strides.size()));
  }
  Dims s{}, st{};
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 0) {
      throw InvalidArgument(argument, "sizes >= 0", "size " + std::to_string(sizes[i]));
    }
    s[i] = sizes[i];
    st[i] = strides[i];
  }
  return MutableTensorView(reinterpret_cast<void*>(address), dtype_named(dtype, argument),
                           static_cast<int>(sizes.size()), s, st);
}

// An index array (cu_seqlens, slots, lengths) as int64: an int32 array is widened into `storage`.
TensorView index_view(const Raw& raw, std::vector<std::int64_t>& storage, const char* argument) {
  const TensorView v = raw_view(raw, argument);
  if (!v.present() || v.dtype != DType::i32 || v.rank != 1) return v;  // the op names these
  if (v.sizes[0] > 0 && v.data == nullptr) {
    throw InvalidArgument(argument, "a non-null data pointer", "null");
  }
  storage.resize(static_cast<std::size_t>(v.sizes[0]));
  const auto* p = static_cast<const std::int32_t*>(v.data);
  for (std::int64_t i = 0; i < v.sizes[0]; ++i) storage[i] = p[i * v.strides[0]];
  return TensorView(storage.data(), DType::i64, 1, v.sizes, {1, 0, 0, 0});
}

// An output the caller allocated: huge pages advised over it before the op writes it.
MutableTensorView output_view(const Raw& raw, const char* argument) {
  const MutableTensorView v = raw_view(raw, argument);
  if (v.present() && v.numel() > 0) {
    std::int64_t span = 1;  // elements from the first to one past the last (strides >= 0)
    for (int i = 0; i < v.rank; ++i)
      span += (v.sizes[i] - 1) * (v.strides[i] > 0 ? v.strides[i] : 0);
    advise_huge_pages(v.data, static_cast<std::size_t>(span) * dtype_size(v.dtype));
  }
  return v;
}

// A residual buffer must be dense row-major: its tail rows are zeroed as one block.
MutableTensorView dense_residual(const Raw& raw, const char* argument) {
  const MutableTensorView v = output_view(raw, argument);
  if (v.present() && v.strides != contiguous_strides(v.sizes, v.rank)) {
    throw InvalidArgument(argument, "a contiguous (row-major) buffer", "other strides");
  }
  return v;
}

// The first `rows` rows of a residual buffer sized for the most chunks a batch can have.
MutableTensorView leading(MutableTensorView v, std::int64_t rows, const char* argument) {
  if (!v.present()) return v;
  if (v.sizes[0] < rows) {
    throw InvalidArgument(argument,
                          "at least " + std::to_string(rows) + " rows (the batch's chunks)",
                          std::to_string(v.sizes[0]) + " rows");
  }
  v.sizes[0] = rows;
  return v;
}

// Rows [from, sizes[0]) of a residual buffer, zeroed; the torch layer allocates them
// contiguous, the only layout this is written for (row r starts r * strides[0] elements in).
void zero_rows(const MutableTensorView& v, std::int64_t from) {
  if (!v.present() || from >= v.sizes[0]) return;
  const std::int64_t row = v.strides[0] * static_cast<std::int64_t>(dtype_size(v.dtype));
  std::memset(static_cast<char*>(v.data) + from * row, 0,
              static_cast<std::size_t>((v.sizes[0] - from) * row));
}

ForwardOptions options_of(std::optional<double> scale, bool l2norm, int chunk_size, bool recurrent,
                          bool bf16_matmul, int threads) {
  ForwardOptions o;
  o.scale = scale;
  o.use_qk_l2norm = l2norm;
  o.chunk_size = chunk_size;
  o.threads = threads;
  o.algorithm = recurrent ? Algorithm::recurrent : Algorithm::automatic;
  o.matmul_precision = bf16_matmul ? MatmulPrecision::bf16 : MatmulPrecision::compute;
  return o;
}

// The forward: the fast path, or (reference) the float64 token recurrence gdn::ref, whose
// outputs must be float64.
void core_forward(const Raw& q, const Raw& k, const Raw& v, const Raw& g, const Raw& beta,
                  const Raw& initial_state, const Raw& cu_seqlens, const Raw& o,
                  const Raw& final_state, const Raw& chunk_states, const Raw& t_inv,
                  std::optional<double> scale, bool l2norm, int chunk_size, bool recurrent,
                  bool bf16_matmul, int threads, bool reference) {
  std::vector<std::int64_t> cu;
  ForwardInputs in{raw_view(q, "q"),
                   raw_view(k, "k"),
                   raw_view(v, "v"),
                   raw_view(g, "g"),
                   raw_view(beta, "beta"),
                   raw_view(initial_state, "initial_state"),
                   index_view(cu_seqlens, cu, "cu_seqlens")};
  const ForwardOptions options =
      options_of(scale, l2norm, chunk_size, recurrent, bf16_matmul, threads);
  const MutableTensorView states = dense_residual(chunk_states, "chunk_states");
  const MutableTensorView tinv = dense_residual(t_inv, "t_inv");
  nb::gil_scoped_release released;
  const CallThreads call_threads;
  const ForwardShape shape = forward_shape(in, options);
  const ForwardOutputs out{output_view(o, "o"), output_view(final_state, "final_state"),
                           leading(states, shape.total_chunks, "chunk_states"),
                           leading(tinv, shape.total_chunks, "t_inv")};
  if (reference) {
    ref::recurrent_fwd(in, out, options);
  } else {
    chunk_gated_delta_rule_fwd(in, out, options);
  }
  zero_rows(states, shape.total_chunks);
  zero_rows(tinv, shape.total_chunks);
}

// The backward from whichever residuals are given (absent ones are rebuilt), or (reference)
// gdn::ref's float64 reverse mode of the token recurrence.
void core_backward(const Raw& q, const Raw& k, const Raw& v, const Raw& g, const Raw& beta,
                   const Raw& initial_state, const Raw& cu_seqlens, const Raw& d_o,
                   const Raw& d_final_state, const Raw& chunk_states, const Raw& t_inv,
                   const Raw& dq, const Raw& dk, const Raw& dv, const Raw& dg, const Raw& dbeta,
                   const Raw& d_initial_state, std::optional<double> scale, bool l2norm,
                   int chunk_size, bool bf16_matmul, int threads, bool reference) {
  std::vector<std::int64_t> cu;
  BackwardInputs in;
  in.q = raw_view(q, "q");
  in.k = raw_view(k, "k");
  in.v = raw_view(v, "v");
  in.g = raw_view(g, "g");
  in.beta = raw_view(beta, "beta");
  in.initial_state = raw_view(initial_state, "initial_state");
  in.cu_seqlens = index_view(cu_seqlens, cu, "cu_seqlens");
  in.d_o = raw_view(d_o, "d_o");
  in.d_final_state = raw_view(d_final_state, "d_final_state");
  const ForwardOptions options = options_of(scale, l2norm, chunk_size, false, bf16_matmul, threads);
  const BackwardOutputs out{
      output_view(dq, "dq"),       output_view(dk, "dk"),
      output_view(dv, "dv"),       output_view(dg, "dg"),
      output_view(dbeta, "dbeta"), output_view(d_initial_state, "d_initial_state")};
  const MutableTensorView states = raw_view(chunk_states, "chunk_states");
  const MutableTensorView tinv = raw_view(t_inv, "t_inv");
  nb::gil_scoped_release released;
  const CallThreads call_threads;
  const ForwardShape shape = forward_shape(in.forward(), options);
  in.chunk_states = leading(states, shape.total_chunks, "chunk_states");
  in.t_inv = leading(tinv, shape.total_chunks, "t_inv");
  if (reference) {
    ref::recurrent_bwd(in, out, options);
  } else {
    chunk_gated_delta_rule_bwd(in, out, options);
  }
}

ConvOptions conv_options(bool silu, int threads) {
  ConvOptions o;
  o.activation = silu ? ConvActivation::silu : ConvActivation::none;
  o.threads = threads;
  return o;
}

// The conv op (gdn/conv.h) forward, or (reference) its float64 reference.
void conv_forward(const Raw& x, const Raw& weight, const Raw& bias, const Raw& initial_state,
                  const Raw& cu_seqlens, const Raw& out, const Raw& final_state, bool silu,
                  int threads, bool reference) {
  std::vector<std::int64_t> cu;
  const ConvInputs in{raw_view(x, "x"), raw_view(weight, "weight"), raw_view(bias, "bias"),
                      raw_view(initial_state, "initial_state"),
                      index_view(cu_seqlens, cu, "cu_seqlens")};
  const ConvOutputs outs{output_view(out, "out"), output_view(final_state, "final_state")};
  const ConvOptions options = conv_options(silu, threads);
  nb::gil_scoped_release released;
  const CallThreads call_threads;
  if (reference) {
    ref::causal_conv1d_fwd(in, outs, options);
  } else {
    causal_conv1d_fwd(in, outs, options);
  }
}

// The conv op's backward, or (reference) its float64 reference.
void conv_backward(const Raw& x, const Raw& weight, const Raw& bias, const Raw& initial_state,
                   const Raw& cu_seqlens, const Raw& d_out, const Raw& d_final_state,
                   const Raw& d_x, const Raw& d_weight, const Raw& d_bias,
                   const Raw& d_initial_state, bool silu, int threads, bool reference) {
  std::vector<std::int64_t> cu;
  const ConvBackwardInputs in{
      {raw_view(x, "x"), raw_view(weight, "weight"), raw_view(bias, "bias"),
       raw_view(initial_state, "initial_state"), index_view(cu_seqlens, cu, "cu_seqlens")},
      raw_view(d_out, "d_out"),
      raw_view(d_final_state, "d_final_state")};
  const ConvBackwardOutputs outs{output_view(d_x, "d_x"), output_view(d_weight, "d_weight"),
                                 output_view(d_bias, "d_bias"),
                                 output_view(d_initial_state, "d_initial_state")};
  const ConvOptions options = conv_options(silu, threads);
  nb::gil_scoped_release released;
  const CallThreads call_threads;
  if (reference) {
    ref::causal_conv1d_bwd(in, outs, options);
  } else {
    causal_conv1d_bwd(in, outs, options);
  }
}

// The conv op's decode step on a caller-owned pool of conv states, updated in place
// (gdn/conv.h's conv_update); int32 index arrays are widened.
void conv_update(const Raw& x, const Raw& weight, const Raw& bias, const Raw& cu_seqlens,
                 const Raw& state_indices, const Raw& conv_state, const Raw& out, bool silu,
                 int threads) {
  std::vector<std::int64_t> cu, slots;
  const ConvUpdateInputs in{raw_view(x, "x"), raw_view(weight, "weight"), raw_view(bias, "bias"),
                            index_view(cu_seqlens, cu, "cu_seqlens"),
                            index_view(state_indices, slots, "state_indices")};
  const MutableTensorView pool = raw_view(conv_state, "conv_state");
  const MutableTensorView o = output_view(out, "out");
  const ConvOptions options = conv_options(silu, threads);
  nb::gil_scoped_release released;
  const CallThreads call_threads;
  gdn::conv_update(in, pool, o, options);
}

// The serving step (gdn/step.h) over caller-owned pools, updated in place; int32 index arrays
// are widened. reference=True runs gdn::ref::fused_gdn_step (float64 everything).
void step(const Raw& qkv, const Raw& a, const Raw& b, const Raw& conv_weight, const Raw& conv_bias,
          const Raw& A_log, const Raw& dt_bias, const Raw& conv_state, const Raw& recurrent_state,
          const Raw& query_start_loc, const Raw& state_indices, const Raw& seq_lens,
          const Raw& distribution, const Raw& read_state_indices, const Raw& read_offsets,
          const Raw& spec_state_indices, const Raw& num_accepted_tokens, const Raw& out,
          std::int64_t hk, std::int64_t hv, std::int64_t dk, std::int64_t dv, std::int64_t num_spec,
          int threads, bool reference) {
  std::vector<std::int64_t> qsl, slots, lens, dist, read_slots, offsets, accepted;
  StepInputs in;
  in.qkv = raw_view(qkv, "qkv");
  in.a = raw_view(a, "a");
  in.b = raw_view(b, "b");
  in.conv_weight = raw_view(conv_weight, "conv_weight");
  in.conv_bias = raw_view(conv_bias, "conv_bias");
  in.A_log = raw_view(A_log, "A_log");
  in.dt_bias = raw_view(dt_bias, "dt_bias");
  in.query_start_loc = index_view(query_start_loc, qsl, "query_start_loc");
  in.state_indices = index_view(state_indices, slots, "state_indices");
  in.seq_lens = index_view(seq_lens, lens, "seq_lens");
  in.distribution = index_view(distribution, dist, "distribution");
  in.read_state_indices = index_view(read_state_indices, read_slots, "read_state_indices");
  in.read_offsets = index_view(read_offsets, offsets, "read_offsets");
  // vLLM's speculative layout: the block table as given (int64, any strides).
  in.spec_state_indices = raw_view(spec_state_indices, "spec_state_indices");
  in.num_accepted_tokens = index_view(num_accepted_tokens, accepted, "num_accepted_tokens");
  StepOptions options;
  options.hk = hk;
  options.hv = hv;
  options.dk = dk;
  options.dv = dv;
  options.threads = threads;
  options.num_spec = num_spec;
  const StatePools pools{raw_view(conv_state, "conv_state"),
                         raw_view(recurrent_state, "recurrent_state")};
  const MutableTensorView o = output_view(out, "out");
  nb::gil_scoped_release released;
  const CallThreads call_threads;
  if (reference) {
    ref::fused_gdn_step(in, pools, o, options);
  } else {
    fused_gdn_step(in, pools, o, options);
  }
}

}  // namespace

void define_direct_calls(nb::module_& m) {
  m.def("set_openmp_team", &set_openmp_team, nb::arg("enabled"),
        "Whether the direct calls below run their helper threads on this process's OpenMP "
        "team (torch's, with ATen's OpenMP backend) instead of the library's pool; returns "
        "whether they now do (False where no OpenMP runtime is loaded).");
  m.def(
      "team_helpers_joined", [] { return team_helpers_joined.load(std::memory_order_relaxed); },
      "How many times a thread other than the caller ran a direct call's parallel stage on the "
      "OpenMP team, since the process started.");
  m.def("core_forward", &core_forward,
        "The core forward on caller-owned memory: tensors as (address, sizes, strides, dtype) "
        "or None; reference=True runs gdn::ref's float64 token recurrence.");
  m.def("core_backward", &core_backward,
        "The core backward on caller-owned memory (absent residuals are rebuilt); "
        "reference=True runs gdn::ref's float64 reverse mode.");
  m.def("conv_forward", &conv_forward,
        "The conv op (causal depthwise conv1d, SiLU when silu=True) on caller-owned memory; "
        "reference=True runs its float64 reference.");
  m.def("conv_backward", &conv_backward,
        "The conv op's backward on caller-owned memory; reference=True runs its float64 "
        "reference.");
  m.def("conv_update", &conv_update,
        "The conv op's decode step on a caller-owned pool of conv states, updated in place "
        "(gdn/conv.h's conv_update).");
  m.def("step", &step,
        "The serving step over caller-owned state pools, updated in place (gdn/step.h); "
        "reference=True runs its float64 reference.");
}

}  // namespace gdn::bindings
