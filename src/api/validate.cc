// validate.cc: argument checks of the forward, backward and layer ops (the serving step's:
// validate_step.cc; the shared checks: validate_checks.h). Every check names the argument,
// what was expected and what was given; nothing is written before all checks have passed.
#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

#include "api/validate_checks.h"
#include "cpu/plan.h"
#include "gdn/error.h"

namespace gdn::detail {
namespace {

constexpr std::int64_t kMaxHeadDim = 256;
constexpr int kMaxChunkSize = 256;
// More worker threads than this is a mistake, not a machine: each one gets a workspace and an
// OpenMP thread stack.
constexpr int kMaxThreads = 1024;

std::string dims_string(std::initializer_list<std::int64_t> dims) {
  Dims d{};
  int rank = 0;
  for (std::int64_t x : dims) d[rank++] = x;
  return shape_string(rank, d);
}

// void* -> std::byte*, const void* -> const std::byte*.
template <class Pointer>
using BytePointer =
    std::conditional_t<std::is_same_v<Pointer, const void*>, const std::byte*, std::byte*>;

template <class Pointer>
TokenTensor<BytePointer<Pointer>> token_tensor(const BasicTensorView<Pointer>& view, bool batched,
                                               bool has_dim) {
  TokenTensor<BytePointer<Pointer>> t;
  t.data = static_cast<BytePointer<Pointer>>(view.data);
  t.dtype = view.dtype;
  int i = 0;
  t.batch = batched ? view.strides[i++] : 0;
  t.token = view.strides[i++];
  t.head = view.strides[i++];
  t.dim = has_dim ? view.strides[i] : 0;
  return t;
}

template <class Pointer>
MatrixTensor<BytePointer<Pointer>> matrix_tensor(const BasicTensorView<Pointer>& view) {
  MatrixTensor<BytePointer<Pointer>> m;
  if (!view.present() || view.numel() == 0) return m;
  m.data = static_cast<BytePointer<Pointer>>(view.data);
  m.dtype = view.dtype;
  m.outer = view.strides[0];
  m.head = view.strides[1];
  m.row = view.strides[2];
  m.col = view.strides[3];
  return m;
}

}  // namespace

// The sequences cu_seqlens defines over `tokens` tokens, with their first chunk indices.
void packed_sequences(const TensorView& cu, std::int64_t tokens, std::int64_t chunk,
                      const char* tokens_of, std::vector<Sequence>* seqs) {
  auto chunks_of = [chunk](std::int64_t len) { return (len + chunk - 1) / chunk; };
  if (cu.rank != 1 || cu.sizes[0] < 2) {
    fail("cu_seqlens", "rank 1 [N + 1] with N >= 1 sequences", shape_of(cu));
  }
  check_extent("cu_seqlens", cu);
  expect_dtype("cu_seqlens", cu, DType::i64, "");
  const auto* values = static_cast<const std::int64_t*>(cu.data);
  const std::int64_t stride = cu.strides[0];
  const std::int64_t n = cu.sizes[0] - 1;
  check_sequence_count("cu_seqlens", n, "N");
  if (values[0] != 0) fail("cu_seqlens", "cu_seqlens[0] = 0", std::to_string(values[0]));
  std::int64_t first_chunk = 0;
  for (std::int64_t s = 0; s < n; ++s) {
    const std::int64_t lo = values[s * stride], hi = values[(s + 1) * stride];
    if (hi < lo) {
      fail("cu_seqlens", "non-decreasing values",
           "cu_seqlens[" + std::to_string(s + 1) + "] = " + std::to_string(hi) + " < cu_seqlens[" +
               std::to_string(s) + "] = " + std::to_string(lo));
    }
    if (hi > tokens) {
      fail("cu_seqlens", "values <= T = " + std::to_string(tokens) + " (" + tokens_of + ")",
           "cu_seqlens[" + std::to_string(s + 1) + "] = " + std::to_string(hi));
    }
    seqs->push_back({0, lo, hi - lo, first_chunk});
    first_chunk += chunks_of(hi - lo);
  }
  const std::int64_t last = values[n * stride];
  if (last != tokens) {
    fail("cu_seqlens", "cu_seqlens[N] = T = " + std::to_string(tokens) + " (" + tokens_of + ")",
         "cu_seqlens[" + std::to_string(n) + "] = " + std::to_string(last));
  }
}

namespace {

// options.matmul_precision: compute or bf16, and bf16 only with float32 compute.
void check_matmul_precision(MatmulPrecision precision, DType compute_dtype) {
  if (precision != MatmulPrecision::compute && precision != MatmulPrecision::bf16) {
    fail("options.matmul_precision", "compute or bf16",
         std::to_string(static_cast<int>(precision)));
  }
  if (precision == MatmulPrecision::bf16 && compute_dtype != DType::f32) {
    fail("options.matmul_precision",
         "compute for float64 inputs (bf16 operands need float32 compute)", "bf16");
  }
}

// The forward's inputs, by name, for the aliasing checks.
std::vector<NamedInput> named_inputs(const ForwardInputs& in) {
  return {{"q", &in.q},
          {"k", &in.k},
          {"v", &in.v},
          {"g", &in.g},
          {"beta", &in.beta},
          {"initial_state", &in.initial_state},
          {"cu_seqlens", &in.cu_seqlens}};
}

// The input side of a ForwardProblem (everything but its outputs), from validated inputs.
void set_forward_inputs(const ForwardInputs& in, const ForwardOptions& options,
                        const std::vector<Sequence>& sequences, ForwardProblem* p) {
  const bool batched = p->shape.batch > 0;
  p->group = p->shape.hv / p->shape.hk;
  p->scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(p->shape.dk));
  p->l2norm = options.use_qk_l2norm;
  p->chunk_size = static_cast<int>(p->shape.chunk_size);  // options.chunk_size or the plan's
  p->threads = options.threads;
  p->algorithm = options.algorithm;
  p->bf16_operands = options.matmul_precision == MatmulPrecision::bf16;
  p->seqs = sequences.data();
  p->q = token_tensor(in.q, batched, true);
  p->k = token_tensor(in.k, batched, true);
  p->v = token_tensor(in.v, batched, true);
  p->g = token_tensor(in.g, batched, false);
  p->beta = token_tensor(in.beta, batched, false);
  p->initial_state = matrix_tensor(in.initial_state);
}

}  // namespace

// Why a gate, state or residual has the compute dtype, for error messages.
std::string compute_dtype_why(DType activations) {
  if (activations == DType::f64) return " (the compute dtype of float64 inputs)";
  return std::string(" (the compute dtype of ") + dtype_name(activations) +
         " inputs: parameters, gates, states and residuals are float32)";
}

void check_threads_and_isa(int threads, CpuIsa isa) {
  if (threads < 0 || threads > kMaxThreads) {
    fail("options.threads", "0 (all cores) to " + std::to_string(kMaxThreads),
         std::to_string(threads));
  }
  if (isa != CpuIsa::automatic && isa != CpuIsa::generic && isa != CpuIsa::avx2 &&
      isa != CpuIsa::avx512 && isa != CpuIsa::avx512_bf16) {
    fail("options.isa", "automatic, generic, avx2, avx512 or avx512_bf16",
         std::to_string(static_cast<int>(isa)));
  }
}

// conv weight [D, K] or [D, 1, K] and bias [D] in the compute dtype; returns K.
std::int64_t check_conv_parameters(const char* weight_name, const char* bias_name,
                                   const TensorView& w, const TensorView& bias, std::int64_t d,
                                   DType compute_dtype, const std::string& why) {
  if (!(w.rank == 2 || (w.rank == 3 && w.sizes[1] == 1)) || w.sizes[0] != d) {
    fail(weight_name, "[D, K] or [D, 1, K] with D = " + std::to_string(d), shape_of(w));
  }
  const std::int64_t taps = w.sizes[w.rank - 1];
  if (taps < 1 || taps > kMaxConvTaps) {
    fail(weight_name, "K from 1 to " + std::to_string(kMaxConvTaps), "K = " + std::to_string(taps));
  }
  check_extent(weight_name, w);
  expect_dtype(weight_name, w, compute_dtype, why);
  if (bias.present()) {
    expect_shape(bias_name, bias, 1, {d, 0, 0, 0}, "[D]");
    check_extent(bias_name, bias);
    expect_dtype(bias_name, bias, compute_dtype, why);
  }
  return taps;
}

ForwardShape validate_inputs(const ForwardInputs& in, const ForwardOptions& options,
                             std::vector<Sequence>* sequences) {
  for (const auto& [name, view] : {std::pair<const char*, const TensorView*>{"q", &in.q},
                                   {"k", &in.k},
                                   {"v", &in.v},
                                   {"g", &in.g},
                                   {"beta", &in.beta},
                                   {"initial_state", &in.initial_state},
                                   {"cu_seqlens", &in.cu_seqlens}}) {
    check_rank(name, *view);
  }
  const TensorView& q = in.q;
  if (q.rank != 3 && q.rank != 4) {
    fail("q", "rank 3 [T, Hk, Dk] or rank 4 [B, T, Hk, Dk]",
         "rank " + std::to_string(q.rank) + " " + shape_of(q));
  }
  check_extent("q", q);
  if (q.dtype != DType::f32 && q.dtype != DType::f64 && q.dtype != DType::bf16 &&
      q.dtype != DType::f16) {
    fail("q", "dtype f32, f64, bf16 or f16", dtype_name(q.dtype));
  }
  ForwardShape shape;
  const bool batched = q.rank == 4;
  const int lead = batched ? 1 : 0;  // index of the token dimension
  shape.batch = batched ? q.sizes[0] : 0;
  shape.tokens = q.sizes[lead];
  shape.hk = q.sizes[lead + 1];
  shape.dk = q.sizes[lead + 2];
  shape.dtype = q.dtype;
  // bf16 and f16 activations compute in float32: gates, states and residuals are float32.
  shape.compute_dtype = q.dtype == DType::f64 ? DType::f64 : DType::f32;
  if (batched && shape.batch < 1) fail("q", "batch size B >= 1", shape_of(q));
  if (batched) check_sequence_count("q", shape.batch, "B");
  if (shape.hk < 1) fail("q", "Hk >= 1 key heads", shape_of(q));
  if (shape.dk < 1 || shape.dk > kMaxHeadDim) {
    fail("q", "Dk in [1, 256]", "Dk = " + std::to_string(shape.dk));
  }
  const std::string same_dtype = " (the dtype of q)";
  const std::string compute_dtype = compute_dtype_why(shape.dtype);

  const Dims q_sizes = q.sizes;
  expect_shape("k", in.k, q.rank, q_sizes, "equal to q");
  check_extent("k", in.k);
  expect_dtype("k", in.k, q.dtype, same_dtype);

  const TensorView& v = in.v;
  if (v.rank != q.rank) {
    fail("v",
         std::string("rank ") + std::to_string(q.rank) +
             " (that of q): " + (batched ? "[B, T, Hv, Dv]" : "[T, Hv, Dv]"),
         "rank " + std::to_string(v.rank) + " " + shape_of(v));
  }
  check_extent("v", v);
  expect_dtype("v", v, q.dtype, same_dtype);
  shape.hv = v.sizes[lead + 1];
  shape.dv = v.sizes[lead + 2];
  if ((batched && v.sizes[0] != shape.batch) || v.sizes[lead] != shape.tokens) {
    fail("v",
         std::string("the leading ") + (batched ? "[B, T]" : "[T]") + " of q, " +
             (batched ? dims_string({shape.batch, shape.tokens}) : dims_string({shape.tokens})),
         shape_of(v));
  }
  if (shape.hv < 1 || shape.hv % shape.hk != 0) {
    fail("v", "Hv a positive multiple of Hk = " + std::to_string(shape.hk),
         "Hv = " + std::to_string(shape.hv));
  }
  if (shape.dv < 1 || shape.dv > kMaxHeadDim) {
    fail("v", "Dv in [1, 256]", "Dv = " + std::to_string(shape.dv));
  }

  Dims gate_sizes{};
  if (batched) {
    gate_sizes = {shape.batch, shape.tokens, shape.hv, 0};
  } else {
    gate_sizes = {shape.tokens, shape.hv, 0, 0};
  }
  const std::string gate_what = batched ? "[B, T, Hv]" : "[T, Hv]";
  for (auto [name, view] : {std::pair<const char*, const TensorView*>{"g", &in.g},
                            std::pair<const char*, const TensorView*>{"beta", &in.beta}}) {
    expect_shape(name, *view, q.rank - 1, gate_sizes, gate_what);
    check_extent(name, *view);
    expect_dtype(name, *view, shape.compute_dtype, compute_dtype);
  }

  // Sequences.
  std::vector<Sequence> local;
  std::vector<Sequence>& seqs = sequences ? *sequences : local;
  seqs.clear();
  if (options.chunk_size < 0 || options.chunk_size > kMaxChunkSize) {
    fail("options.chunk_size", "0 (the tiling plan chooses) or an integer in [1, 256]",
         std::to_string(options.chunk_size));
  }
  // 0: the tiling plan's chunk size for the head dims, dtype, ISA and machine (src/cpu/plan.h).
  const std::int64_t chunk =
      options.chunk_size > 0 ? options.chunk_size : cpu::planned_chunk_size(shape, options.isa);
  auto chunks_of = [chunk](std::int64_t len) { return (len + chunk - 1) / chunk; };
  const TensorView& cu = in.cu_seqlens;
  if (batched) {
    if (cu.present()) {
      fail("cu_seqlens", "absent with batched [B, T, ...] inputs (B defines the sequences)",
           shape_of(cu));
    }
    for (std::int64_t b = 0; b < shape.batch; ++b) {
      seqs.push_back({b, 0, shape.tokens, b * chunks_of(shape.tokens)});
    }
  } else if (!cu.present()) {
    seqs.push_back({0, 0, shape.tokens, 0});
  } else {
    packed_sequences(cu, shape.tokens, chunk, "tokens of q", &seqs);
  }
  shape.num_seqs = static_cast<std::int64_t>(seqs.size());
  shape.chunk_size = chunk;
  shape.total_chunks = seqs.empty() ? 0 : seqs.back().first_chunk + chunks_of(seqs.back().length);

  if (in.initial_state.present()) {
    expect_shape("initial_state", in.initial_state, 4, shape.state_sizes(), "[N, Hv, Dk, Dv]");
    check_extent("initial_state", in.initial_state);
    expect_dtype("initial_state", in.initial_state, shape.compute_dtype, compute_dtype);
  }

  if (options.scale) {
    // float32 kernels hold the scale in float32.
    const double limit = shape.compute_dtype == DType::f32 ? std::numeric_limits<float>::max()
                                                           : std::numeric_limits<double>::max();
    if (!(std::fabs(*options.scale) <= limit)) {
      std::ostringstream given;
      given << *options.scale;
      fail("options.scale",
           std::string("a finite number") +
               (shape.compute_dtype == DType::f32 ? " representable in float32" : ""),
           given.str());
    }
  }
  check_threads_and_isa(options.threads, options.isa);
  if (options.algorithm != Algorithm::automatic && options.algorithm != Algorithm::chunked &&
      options.algorithm != Algorithm::recurrent) {
    fail("options.algorithm", "automatic, chunked or recurrent",
         std::to_string(static_cast<int>(options.algorithm)));
  }
  check_matmul_precision(options.matmul_precision, shape.compute_dtype);
  if (options.matmul_precision == MatmulPrecision::bf16) {
    if (options.algorithm == Algorithm::recurrent) {
      fail("options.matmul_precision",
           "compute with options.algorithm = recurrent (the token recurrence has no matrix "
           "products)",
           "bf16");
    }
  }
  return shape;
}

void validate_forward(const ForwardInputs& in, const ForwardOutputs& out,
                      const ForwardOptions& options, OutputPrecision precision,
                      ValidatedForward* result) {
  ForwardProblem& p = result->problem;
  p = ForwardProblem{};
  p.shape = validate_inputs(in, options, &result->sequences);
  const ForwardShape& shape = p.shape;
  const bool batched = shape.batch > 0;
  const bool f64 = precision == OutputPrecision::float64;
  const DType out_dtype = f64 ? DType::f64 : shape.dtype;
  const DType residual_dtype = f64 ? DType::f64 : shape.compute_dtype;
  const std::string why_out = f64 ? " (reference outputs are float64)" : " (that of q)";
  const std::string why_res =
      f64 ? " (reference outputs are float64)" : compute_dtype_why(shape.dtype);
  for (const auto& [name, view] : {std::pair<const char*, const MutableTensorView*>{"o", &out.o},
                                   {"final_state", &out.final_state},
                                   {"chunk_states", &out.chunk_states},
                                   {"t_inv", &out.t_inv}}) {
    check_rank(name, *view);
  }

  // o may be left out (the states and residuals alone: what a rematerialising backward
  // rebuilds), but a call must write something.
  if (!out.o.present() && !out.final_state.present() && !out.chunk_states.present() &&
      !out.t_inv.present()) {
    fail("o",
         "an output view " + shape_string(shape.o_rank(), shape.o_sizes()) +
             " (or, without o, at least one of final_state, chunk_states, t_inv)",
         "no output at all");
  }
  if (out.o.present()) {
    expect_shape("o", out.o, shape.o_rank(), shape.o_sizes(),
                 batched ? "[B, T, Hv, Dv]" : "[T, Hv, Dv]");
    expect_dtype("o", out.o, out_dtype, why_out);
    check_extent("o", out.o);
  }
  if (out.final_state.present()) {
    expect_shape("final_state", out.final_state, 4, shape.state_sizes(), "[N, Hv, Dk, Dv]");
    expect_dtype("final_state", out.final_state, residual_dtype, why_res);
    check_extent("final_state", out.final_state);
  }
  if (out.chunk_states.present()) {
    expect_shape("chunk_states", out.chunk_states, 4, shape.chunk_states_sizes(),
                 "[total_chunks, Hv, Dk, Dv]");
    expect_dtype("chunk_states", out.chunk_states, residual_dtype, why_res);
    check_extent("chunk_states", out.chunk_states);
  }
  if (out.t_inv.present()) {
    if (options.algorithm == Algorithm::recurrent) {
      fail("t_inv",
           "absent with options.algorithm = recurrent (the token recurrence forms no T^-1)",
           shape_of(out.t_inv));
    }
    expect_shape("t_inv", out.t_inv, 4, shape.t_inv_sizes(), "[total_chunks, Hv, C, C]");
    expect_dtype("t_inv", out.t_inv, residual_dtype, why_res);
    check_extent("t_inv", out.t_inv);
  }

  // Aliasing: outputs are written while inputs are still being read.
  check_aliasing({{"o", &out.o},
                  {"final_state", &out.final_state},
                  {"chunk_states", &out.chunk_states},
                  {"t_inv", &out.t_inv}},
                 named_inputs(in), {{&out.final_state, &in.initial_state}});

  set_forward_inputs(in, options, result->sequences, &p);
  if (out.o.present()) p.o = token_tensor(out.o, batched, true);
  p.final_state = matrix_tensor(out.final_state);
  p.chunk_states = matrix_tensor(out.chunk_states);
  p.t_inv = matrix_tensor(out.t_inv);
}

void validate_backward(const BackwardInputs& in, const BackwardOutputs& out,
                       const ForwardOptions& options, OutputPrecision precision,
                       ValidatedBackward* result) {
  BackwardProblem& p = result->problem;
  p = BackwardProblem{};
  const ForwardInputs fwd = in.forward();
  p.fwd.shape = validate_inputs(fwd, options, &result->sequences);
  const ForwardShape& shape = p.fwd.shape;
  const bool batched = shape.batch > 0;
  const std::string same_dtype = " (the dtype of q)";
  const std::string why_res = compute_dtype_why(shape.dtype);
  for (const auto& [name, view] : {std::pair<const char*, const TensorView*>{"d_o", &in.d_o},
                                   {"d_final_state", &in.d_final_state},
                                   {"chunk_states", &in.chunk_states},
                                   {"t_inv", &in.t_inv}}) {
    check_rank(name, *view);
  }
  for (const auto& [name, view] : {std::pair<const char*, const MutableTensorView*>{"dq", &out.dq},
                                   {"dk", &out.dk},
                                   {"dv", &out.dv},
                                   {"dg", &out.dg},
                                   {"dbeta", &out.dbeta},
                                   {"d_initial_state", &out.d_initial_state}}) {
    check_rank(name, *view);
  }

  // Cotangents and residuals (inputs).
  const std::string o_what = batched ? "[B, T, Hv, Dv] (that of o)" : "[T, Hv, Dv] (that of o)";
  if (!in.d_o.present())
    fail("d_o", "a view " + shape_string(shape.o_rank(), shape.o_sizes()), "absent");
  expect_shape("d_o", in.d_o, shape.o_rank(), shape.o_sizes(), o_what);
  expect_dtype("d_o", in.d_o, shape.dtype, same_dtype);
  check_extent("d_o", in.d_o);
  if (in.d_final_state.present()) {
    expect_shape("d_final_state", in.d_final_state, 4, shape.state_sizes(), "[N, Hv, Dk, Dv]");
    expect_dtype("d_final_state", in.d_final_state, shape.compute_dtype, why_res);
    check_extent("d_final_state", in.d_final_state);
  }
  if (in.chunk_states.present()) {
    expect_shape("chunk_states", in.chunk_states, 4, shape.chunk_states_sizes(),
                 "[total_chunks, Hv, Dk, Dv]");
    expect_dtype("chunk_states", in.chunk_states, shape.compute_dtype, why_res);
    check_extent("chunk_states", in.chunk_states);
  }
  if (in.t_inv.present()) {
    expect_shape("t_inv", in.t_inv, 4, shape.t_inv_sizes(), "[total_chunks, Hv, C, C]");
    expect_dtype("t_inv", in.t_inv, shape.compute_dtype, why_res);
    check_extent("t_inv", in.t_inv);
  }

  // Gradients (outputs): the shape and dtype of the matching input.
  const bool f64 = precision == OutputPrecision::float64;
  const std::string why_grad = precision == OutputPrecision::float64
                                   ? " (reference outputs are float64)"
                                   : " (that of the matching input)";
  const struct {
    const char* name;
    const MutableTensorView* grad;
    const TensorView* input;
    const char* what;
  } grads[] = {
      {"dq", &out.dq, &in.q, batched ? "[B, T, Hk, Dk] (that of q)" : "[T, Hk, Dk] (that of q)"},
      {"dk", &out.dk, &in.k, batched ? "[B, T, Hk, Dk] (that of k)" : "[T, Hk, Dk] (that of k)"},
      {"dv", &out.dv, &in.v, batched ? "[B, T, Hv, Dv] (that of v)" : "[T, Hv, Dv] (that of v)"},
      {"dg", &out.dg, &in.g, batched ? "[B, T, Hv] (that of g)" : "[T, Hv] (that of g)"},
      {"dbeta", &out.dbeta, &in.beta,
       batched ? "[B, T, Hv] (that of beta)" : "[T, Hv] (that of beta)"},
  };
  for (const auto& grad : grads) {
    if (!grad.grad->present()) {
      fail(grad.name, "an output view " + shape_string(grad.input->rank, grad.input->sizes),
           "absent");
    }
    expect_shape(grad.name, *grad.grad, grad.input->rank, grad.input->sizes, grad.what);
    expect_dtype(grad.name, *grad.grad, f64 ? DType::f64 : grad.input->dtype, why_grad);
    check_extent(grad.name, *grad.grad);
  }
  if (out.d_initial_state.present()) {
    expect_shape("d_initial_state", out.d_initial_state, 4, shape.state_sizes(), "[N, Hv, Dk, Dv]");
    expect_dtype("d_initial_state", out.d_initial_state, f64 ? DType::f64 : shape.compute_dtype,
                 f64 ? why_grad : why_res);
    check_extent("d_initial_state", out.d_initial_state);
  }

  std::vector<NamedInput> inputs = named_inputs(fwd);
  inputs.insert(inputs.end(), {{"d_o", &in.d_o},
                               {"d_final_state", &in.d_final_state},
                               {"chunk_states", &in.chunk_states},
                               {"t_inv", &in.t_inv}});
  check_aliasing({{"dq", &out.dq},
                  {"dk", &out.dk},
                  {"dv", &out.dv},
                  {"dg", &out.dg},
                  {"dbeta", &out.dbeta},
                  {"d_initial_state", &out.d_initial_state}},
                 inputs, {});

  set_forward_inputs(fwd, options, result->sequences, &p.fwd);
  p.fwd.algorithm = Algorithm::chunked;
  p.d_o = token_tensor(in.d_o, batched, true);
  p.d_final_state = matrix_tensor(in.d_final_state);
  p.chunk_states = matrix_tensor(in.chunk_states);
  p.t_inv = matrix_tensor(in.t_inv);
  p.dq = token_tensor(out.dq, batched, true);
  p.dk = token_tensor(out.dk, batched, true);
  p.dv = token_tensor(out.dv, batched, true);
  p.dg = token_tensor(out.dg, batched, false);
  p.dbeta = token_tensor(out.dbeta, batched, false);
  p.d_initial_state = matrix_tensor(out.d_initial_state);
}

// ---------------------------------------------------------------------------------------------
// The fused layer op.
// ---------------------------------------------------------------------------------------------

void validate_layer_inputs(const LayerInputs& in, const LayerOptions& options,
                           ValidatedLayer* result) {
  ValidatedLayer& r = *result;
  r.sequences.clear();
  for (const auto& [name, value] : {std::pair<const char*, std::int64_t>{"options.hk", options.hk},
                                    {"options.hv", options.hv},
                                    {"options.dk", options.dk},
                                    {"options.dv", options.dv}}) {
    if (value < 1) fail(name, ">= 1 (the head layout is required)", std::to_string(value));
  }
  if (options.hv % options.hk != 0) {
    fail("options.hv", "a multiple of options.hk = " + std::to_string(options.hk),
         std::to_string(options.hv));
  }
  if (options.dk > kMaxHeadDim) fail("options.dk", "<= 256", std::to_string(options.dk));
  if (options.dv > kMaxHeadDim) fail("options.dv", "<= 256", std::to_string(options.dv));
  if (options.chunk_size < 0 || options.chunk_size > kMaxChunkSize) {
    fail("options.chunk_size", "0 (the tiling plan chooses) or an integer in [1, 256]",
         std::to_string(options.chunk_size));
  }
  check_threads_and_isa(options.threads, options.isa);
  for (const auto& [name, view] : {std::pair<const char*, const TensorView*>{"qkv", &in.qkv},
                                   {"a", &in.a},
                                   {"b", &in.b},
                                   {"conv_weight", &in.conv_weight},
                                   {"conv_bias", &in.conv_bias},
                                   {"A_log", &in.A_log},
                                   {"dt_bias", &in.dt_bias},
                                   {"conv_state", &in.conv_state},
                                   {"recurrent_state", &in.recurrent_state},
                                   {"cu_seqlens", &in.cu_seqlens}}) {
    check_rank(name, *view);
  }
  const std::int64_t hk = options.hk, hv = options.hv, dk = options.dk, dv = options.dv;
  const std::string layout = "Hk = " + std::to_string(hk) + ", Hv = " + std::to_string(hv) +
                             ", Dk = " + std::to_string(dk) + ", Dv = " + std::to_string(dv);
  // Huge head counts overflowed the width (found by fuzz/).
  std::int64_t qk_width = 0, v_width = 0, d = 0;
  const bool qk_overflow = __builtin_mul_overflow(hk, 2 * dk, &qk_width);
  if (qk_overflow || __builtin_mul_overflow(hv, dv, &v_width) ||
      __builtin_add_overflow(qk_width, v_width, &d)) {
    fail(qk_overflow ? "options.hk" : "options.hv",
         "a head layout whose width D = 2 Hk Dk + Hv Dv fits in int64", layout);
  }
  const TensorView& qkv = in.qkv;
  if (qkv.rank != 2)
    fail("qkv", "rank 2 [T, D]", "rank " + std::to_string(qkv.rank) + " " + shape_of(qkv));
  check_extent("qkv", qkv);
  if (qkv.dtype != DType::f32 && qkv.dtype != DType::f64 && qkv.dtype != DType::bf16 &&
      qkv.dtype != DType::f16) {
    fail("qkv", "dtype f32, f64, bf16 or f16", dtype_name(qkv.dtype));
  }
  if (qkv.sizes[1] != d) {
    fail("qkv", "[T, D] with D = 2 Hk Dk + Hv Dv = " + std::to_string(d) + " (" + layout + ")",
         shape_of(qkv));
  }
  r.tokens = qkv.sizes[0];
  r.channels = d;
  r.dtype = qkv.dtype;
  r.compute_dtype = qkv.dtype == DType::f64 ? DType::f64 : DType::f32;
  check_matmul_precision(options.matmul_precision, r.compute_dtype);
  const std::string same_dtype = " (the dtype of qkv)";
  const std::string compute = compute_dtype_why(r.dtype);
  for (const auto& [name, view] :
       {std::pair<const char*, const TensorView*>{"a", &in.a}, {"b", &in.b}}) {
    expect_shape(name, *view, 2, {r.tokens, hv, 0, 0}, "[T, Hv]");
    check_extent(name, *view);
    expect_dtype(name, *view, r.dtype, same_dtype);
  }
  r.taps = check_conv_parameters("conv_weight", "conv_bias", in.conv_weight, in.conv_bias, d,
                                 r.compute_dtype, compute);
  for (const auto& [name, view] :
       {std::pair<const char*, const TensorView*>{"A_log", &in.A_log}, {"dt_bias", &in.dt_bias}}) {
    expect_shape(name, *view, 1, {hv, 0, 0, 0}, "[Hv]");
    check_extent(name, *view);
    expect_dtype(name, *view, r.compute_dtype, compute);
  }
  ForwardShape& core = r.core;
  core = ForwardShape{};
  core.hk = hk;
  core.hv = hv;
  core.dk = dk;
  core.dv = dv;
  // The gated delta rule runs on the conv's output, which has the compute dtype.
  core.dtype = r.compute_dtype;
  core.compute_dtype = r.compute_dtype;
  // 0: the tiling plan's chunk size, as the gated delta rule inside resolves it.
  const std::int64_t chunk =
      options.chunk_size > 0 ? options.chunk_size : cpu::planned_chunk_size(core, options.isa);
  if (in.cu_seqlens.present()) {
    packed_sequences(in.cu_seqlens, r.tokens, chunk, "tokens of qkv", &r.sequences);
  } else {
    r.sequences.push_back({0, 0, r.tokens, 0});
  }
  const std::int64_t n = static_cast<std::int64_t>(r.sequences.size());
  core.tokens = r.tokens;
  core.num_seqs = n;
  core.chunk_size = chunk;
  core.total_chunks =
      r.sequences.back().first_chunk + (r.sequences.back().length + chunk - 1) / chunk;
  if (in.conv_state.present()) {
    expect_shape("conv_state", in.conv_state, 3, {n, r.taps - 1, d, 0}, "[N, K - 1, D]");
    check_extent("conv_state", in.conv_state);
    expect_dtype("conv_state", in.conv_state, r.compute_dtype, compute);
  }
  if (in.recurrent_state.present()) {
    expect_shape("recurrent_state", in.recurrent_state, 4, core.state_sizes(), "[N, Hv, Dk, Dv]");
    check_extent("recurrent_state", in.recurrent_state);
    expect_dtype("recurrent_state", in.recurrent_state, r.compute_dtype, compute);
  }
}

void validate_layer_forward(const LayerInputs& in, const LayerOutputs& out,
                            const LayerOptions& options, OutputPrecision precision,
                            ValidatedLayer* result) {
  validate_layer_inputs(in, options, result);
  const ValidatedLayer& r = *result;
  for (const auto& [name, view] :
       {std::pair<const char*, const MutableTensorView*>{"out", &out.out},
        {"conv_state_out", &out.conv_state_out},
        {"recurrent_state_out", &out.recurrent_state_out},
        {"chunk_states", &out.chunk_states},
        {"t_inv", &out.t_inv}}) {
    check_rank(name, *view);
  }
  const bool f64 = precision == OutputPrecision::float64;
  const DType out_dtype = f64 ? DType::f64 : r.dtype, state = f64 ? DType::f64 : r.compute_dtype;
  const std::string why = f64 ? " (reference outputs are float64)" : " (the dtype of qkv)";
  const std::string why_state =
      f64 ? " (reference outputs are float64)" : compute_dtype_why(r.dtype);
  const std::int64_t n = r.core.num_seqs;
  // out may be left out (the states and residuals alone), but a call must write something.
  if (!out.out.present() && !out.conv_state_out.present() && !out.recurrent_state_out.present() &&
      !out.chunk_states.present() && !out.t_inv.present()) {
    fail("out",
         "an output view " + shape_string(2, {r.tokens, options.hv * options.dv, 0, 0}) +
             " (or, without out, at least one of conv_state_out, recurrent_state_out, "
             "chunk_states, t_inv)",
         "no output at all");
  }
  expect_output("out", out.out, 2, {r.tokens, options.hv * options.dv, 0, 0}, "[T, Hv Dv]",
                out_dtype, why, false);
  expect_output("conv_state_out", out.conv_state_out, 3, {n, r.taps - 1, r.channels, 0},
                "[N, K - 1, D]", state, why_state, false);
  expect_output("recurrent_state_out", out.recurrent_state_out, 4, r.core.state_sizes(),
                "[N, Hv, Dk, Dv]", state, why_state, false);
  expect_output("chunk_states", out.chunk_states, 4, r.core.chunk_states_sizes(),
                "[total_chunks, Hv, Dk, Dv]", state, why_state, false);
  expect_output("t_inv", out.t_inv, 4, r.core.t_inv_sizes(), "[total_chunks, Hv, C, C]", state,
                why_state, false);
  check_aliasing(
      {{"out", &out.out},
       {"conv_state_out", &out.conv_state_out},
       {"recurrent_state_out", &out.recurrent_state_out},
       {"chunk_states", &out.chunk_states},
       {"t_inv", &out.t_inv}},
      named_layer_inputs(in),
      {{&out.recurrent_state_out, &in.recurrent_state}, {&out.conv_state_out, &in.conv_state}});
}

void validate_layer_backward(const LayerBackwardInputs& in, const LayerBackwardOutputs& out,
                             const LayerOptions& options, OutputPrecision precision,
                             ValidatedLayer* result) {
  validate_layer_inputs(in.forward, options, result);
  const ValidatedLayer& r = *result;
  for (const auto& [name, view] : {std::pair<const char*, const TensorView*>{"d_out", &in.d_out},
                                   {"d_conv_state_out", &in.d_conv_state_out},
                                   {"d_recurrent_state_out", &in.d_recurrent_state_out},
                                   {"chunk_states", &in.chunk_states},
                                   {"t_inv", &in.t_inv}}) {
    check_rank(name, *view);
  }
  for (const auto& [name, view] :
       {std::pair<const char*, const MutableTensorView*>{"d_qkv", &out.d_qkv},
        {"d_a", &out.d_a},
        {"d_b", &out.d_b},
        {"d_conv_weight", &out.d_conv_weight},
        {"d_conv_bias", &out.d_conv_bias},
        {"d_A_log", &out.d_A_log},
        {"d_dt_bias", &out.d_dt_bias},
        {"d_conv_state", &out.d_conv_state},
        {"d_recurrent_state", &out.d_recurrent_state}}) {
    check_rank(name, *view);
  }
  const std::int64_t n = r.core.num_seqs, hv = options.hv;
  const std::string same = " (the dtype of qkv)";
  expect_output("d_out", in.d_out, 2, {r.tokens, hv * options.dv, 0, 0}, "[T, Hv Dv]", r.dtype,
                same, true);
  const std::string why_res = compute_dtype_why(r.dtype);
  const DType c = r.compute_dtype;
  expect_output("d_conv_state_out", in.d_conv_state_out, 3, {n, r.taps - 1, r.channels, 0},
                "[N, K - 1, D]", c, why_res, false);
  expect_output("d_recurrent_state_out", in.d_recurrent_state_out, 4, r.core.state_sizes(),
                "[N, Hv, Dk, Dv]", c, why_res, false);
  expect_output("chunk_states", in.chunk_states, 4, r.core.chunk_states_sizes(),
                "[total_chunks, Hv, Dk, Dv]", c, why_res, false);
  expect_output("t_inv", in.t_inv, 4, r.core.t_inv_sizes(), "[total_chunks, Hv, C, C]", c, why_res,
                false);

  // Gradients have the dtype of their input: activations for d_qkv, d_a and d_b, the compute
  // dtype for the rest; the reference's are float64.
  const bool f64 = precision == OutputPrecision::float64;
  const DType g = f64 ? DType::f64 : r.dtype, gc = f64 ? DType::f64 : c;
  const std::string why = f64 ? " (reference outputs are float64)" : " (the dtype of qkv)";
  const std::string whyc = f64 ? why : why_res;
  const LayerInputs& f = in.forward;
  expect_output("d_qkv", out.d_qkv, 2, f.qkv.sizes, "[T, D] (that of qkv)", g, why, true);
  expect_output("d_a", out.d_a, 2, f.a.sizes, "[T, Hv]", g, why, true);
  expect_output("d_b", out.d_b, 2, f.b.sizes, "[T, Hv]", g, why, true);
  expect_output("d_conv_weight", out.d_conv_weight, f.conv_weight.rank, f.conv_weight.sizes,
                "that of conv_weight", gc, whyc, true);
  expect_output("d_conv_bias", out.d_conv_bias, 1, {r.channels, 0, 0, 0}, "[D]", gc, whyc, false);
  expect_output("d_A_log", out.d_A_log, 1, {hv, 0, 0, 0}, "[Hv]", gc, whyc, true);
  expect_output("d_dt_bias", out.d_dt_bias, 1, {hv, 0, 0, 0}, "[Hv]", gc, whyc, true);
  expect_output("d_conv_state", out.d_conv_state, 3, {n, r.taps - 1, r.channels, 0},
                "[N, K - 1, D]", gc, whyc, false);
  expect_output("d_recurrent_state", out.d_recurrent_state, 4, r.core.state_sizes(),
                "[N, Hv, Dk, Dv]", gc, whyc, false);
  std::vector<NamedInput> inputs = named_layer_inputs(f);
  inputs.insert(inputs.end(), {{"d_out", &in.d_out},
                               {"d_conv_state_out", &in.d_conv_state_out},
                               {"d_recurrent_state_out", &in.d_recurrent_state_out},
                               {"chunk_states", &in.chunk_states},
                               {"t_inv", &in.t_inv}});
  check_aliasing({{"d_qkv", &out.d_qkv},
                  {"d_a", &out.d_a},
                  {"d_b", &out.d_b},
                  {"d_conv_weight", &out.d_conv_weight},
                  {"d_conv_bias", &out.d_conv_bias},
                  {"d_A_log", &out.d_A_log},
                  {"d_dt_bias", &out.d_dt_bias},
                  {"d_conv_state", &out.d_conv_state},
                  {"d_recurrent_state", &out.d_recurrent_state}},
                 inputs, {});
}

}  // namespace gdn::detail
