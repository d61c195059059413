// gdn/forward.h: the gated delta rule forward pass (the core op), fla-compatible semantics.
//
// Per token t and value head h, with state S in R^{Dk x Dv} (float32; float64 for float64
// inputs), alpha_t = exp(g_t):
//   u_t = beta_t * (v_t - alpha_t * S_{t-1}^T k_t)
//   S_t = alpha_t * S_{t-1} + k_t u_t^T
//   o_t = scale * S_t^T q_t
// Value head h reads query/key head h / (Hv / Hk). The exact semantics, the chunked form and
// the residuals are in docs/math.md.
#pragma once

#include <cstdint>
#include <optional>

#include "gdn/runtime.h"
#include "gdn/tensor.h"

namespace gdn {

enum class Algorithm : std::uint8_t {
  automatic,  // chunked; sequences shorter than the chunk size use the token recurrence
              // unless residuals are requested or the operands are bf16
  chunked,    // the chunked (WY) form for every sequence
  recurrent,  // the token recurrence for every sequence (no t_inv residual)
};

// The operands of the chunked form's matrix products (docs/numerics.md "bf16 matrix operands").
//   compute: the compute dtype (float32, or float64 for float64 inputs).
//   bf16:    both operands of every matrix product rounded to bf16 (nearest even) before it
//            runs; products summed in float32; the state, gates, decay, the T^-1 solve and every
//            element-wise step stay float32. float32 compute only; not with
//            Algorithm::recurrent (no matrix products); under automatic every sequence runs
//            chunked (so the output does not depend on whether residuals are kept, and is what
//            the backward differentiates); not in the serving step (gdn/step.h). Speed: with
//            the avx512_bf16 variant (CpuIsa::avx512_bf16, the automatic choice on an AMD CPU
//            with AVX512_BF16) the products run on vdpbf16ps, 1.35x faster than compute for
//            the forward at Qwen3-Next's shape on one Zen 4 thread (docs/perf_matmul.md); on an
//            Intel Xeon without AMX vdpbf16ps issues at half the FMA rate, so the automatic choice
//            there is avx512's emulation (the forward 1.23x the time of compute); every other
//            variant rounds on float32 registers and multiplies in float32, which gives the
//            numerics of bf16 operands, not their speed (1.1-1.5x the time of compute).
enum class MatmulPrecision : std::uint8_t { compute, bf16 };

// "compute", "bf16" ("invalid" for any other value).
const char* matmul_precision_name(MatmulPrecision precision);

struct ForwardOptions {
  // Multiplies q (default Dk^-1/2). Must be finite.
  std::optional<double> scale;
  // Normalise q and k in the kernel: x / sqrt(sum(x^2) + 1e-6), per token and head.
  bool use_qk_l2norm = false;
  // Tokens per chunk, 1 to 256, or 0: the tiling plan chooses (gdn/plan.h; forward_shape says
  // which). Residuals are laid out per chunk of this size, so a backward given them must be
  // called with the same chunk_size.
  int chunk_size = 64;
  // Worker threads, 0 to 1024; 0 = default_threads(). Results do not depend on it (bit for bit).
  int threads = 0;
  Algorithm algorithm = Algorithm::automatic;
  CpuIsa isa = CpuIsa::automatic;
  MatmulPrecision matmul_precision = MatmulPrecision::compute;
  // Check mode: scan the inputs before the call and the outputs after it, and throw
  // gdn::NonFiniteError naming the first NaN or Inf and its position (gdn/error.h). Also on
  // for every call when the environment variable GDN_CHECK_FINITE is 1. A final_state updated
  // in place (the view of initial_state) is put back as it was when an output is non-finite;
  // the other outputs are then written. Costs a pass over every input and output, and a copy
  // of a state updated in place (off by default: then nothing of this runs).
  bool check_finite = false;
};

// Inputs. Two layouts, chosen by the rank of q:
//   packed  : q, k [T, Hk, Dk]   v [T, Hv, Dv]   g, beta [T, Hv]      + optional cu_seqlens
//   batched : q, k [B, T, Hk, Dk] v [B, T, Hv, Dv] g, beta [B, T, Hv]  (no cu_seqlens; N = B)
// Dtypes: all f32, or all f64; or 16-bit activations: q, k, v all bf16 or all f16 with g,
// beta float32 (the compute dtype; docs/numerics.md "16-bit activations"). Any strides.
// cu_seqlens: int64 [N + 1], cu_seqlens[0] = 0, non-decreasing, cu_seqlens[N] = T; absent
//   means one sequence of T tokens. Zero-length sequences are allowed: their state passes
//   through unchanged.
// initial_state: optional [N, Hv, Dk, Dv], the compute dtype (f64 for f64 inputs, else f32);
//   absent means zeros.
// Limits: Hv a multiple of Hk; 1 <= Dk, Dv <= 256; T >= 0; 1 <= N <= 2^20 (also in the layer,
// conv and step ops).
struct ForwardInputs {
  TensorView q, k, v, g, beta;
  TensorView initial_state;
  TensorView cu_seqlens;
};

// Outputs, written by the call (the caller owns the memory; nothing is allocated for them).
//   o            [T, Hv, Dv] (batched: [B, T, Hv, Dv]), the dtype of q. Optional: without it
//                the chunked forward skips the output products and writes only the states
//                and residuals asked for (what a rematerialising backward rebuilds, at the
//                cost of the backward's rebuild); at least one output must be given.
//   final_state  [N, Hv, Dk, Dv], the compute dtype. Optional. May be the very same view as
//                initial_state (same pointer, same strides): the state is updated in place.
//   chunk_states [total_chunks, Hv, Dk, Dv], the state entering every chunk. Optional.
//   t_inv        [total_chunks, Hv, C, C], T^-1 of every chunk; a chunk of n < C tokens fills
//                its top-left n x n block and zeros the rest. Optional.
// Residuals use the compute dtype: f32 for f32 inputs, f64 for f64 inputs. Chunks are
// numbered sequence by sequence: sequence s owns chunks [first_chunk(s), first_chunk(s) +
// ceil(len_s / C)). The address range of an output must not overlap that of another output
// or of any input (final_state being exactly the view of initial_state is the one exception),
// and an output's strides, sorted by magnitude, must each step over everything the smaller
// dimensions span (contiguous, transposed, sliced and padded layouts all qualify).
// Every pointer (inputs and outputs) must be aligned to its element size.
struct ForwardOutputs {
  MutableTensorView o;
  MutableTensorView final_state;
  MutableTensorView chunk_states;
  MutableTensorView t_inv;
};

// The shapes a forward call implies, for allocating its outputs. Validates the inputs and
// options (throws gdn::InvalidArgument like the op itself).
struct ForwardShape {
  std::int64_t batch = 0;     // B of the batched layout, 0 for the packed layout
  std::int64_t tokens = 0;    // T (per sequence when batched)
  std::int64_t num_seqs = 0;  // N
  std::int64_t hk = 0, hv = 0, dk = 0, dv = 0;
  std::int64_t chunk_size = 0;       // C
  std::int64_t total_chunks = 0;     // sum over sequences of ceil(len / C)
  DType dtype = DType::f32;          // of q, k, v and o (the activations)
  DType compute_dtype = DType::f32;  // of g, beta, the states, the accumulation, the residuals

  int o_rank() const { return batch > 0 ? 4 : 3; }
  Dims o_sizes() const;             // [T, Hv, Dv] or [B, T, Hv, Dv]
  Dims state_sizes() const;         // [N, Hv, Dk, Dv]
  Dims chunk_states_sizes() const;  // [total_chunks, Hv, Dk, Dv]
  Dims t_inv_sizes() const;         // [total_chunks, Hv, C, C]
};
ForwardShape forward_shape(const ForwardInputs& inputs, const ForwardOptions& options = {});

// Which residuals a forward keeps for the backward pass (the remat policy; gdn/backward.h).
enum class Residuals : std::uint8_t {
  none,   // nothing: the backward rebuilds the chunk states and T^-1
  t_inv,  // T^-1 of every chunk: the backward rebuilds the chunk states, reusing it
  all,    // chunk_states and t_inv: the backward repeats no forward recurrence
};

// Bytes of the residuals kept under `residuals` for this problem.
std::int64_t residual_bytes(const ForwardShape& shape, Residuals residuals);

// The forward pass on the CPU. Validates every argument first (gdn::InvalidArgument, nothing
// written), then writes o and whichever of final_state, chunk_states and t_inv are present.
void chunk_gated_delta_rule_fwd(const ForwardInputs& inputs, const ForwardOutputs& outputs,
                                const ForwardOptions& options = {});

// The same, allocating its outputs (contiguous). final_state is always returned; t_inv with
// Residuals::t_inv; chunk_states and t_inv with Residuals::all (t_inv not with
// Algorithm::recurrent, which forms no T^-1).
struct ForwardResult {
  Tensor o, final_state, chunk_states, t_inv;
};
ForwardResult chunk_gated_delta_rule_fwd(const ForwardInputs& inputs,
                                         const ForwardOptions& options = {},
                                         Residuals residuals = Residuals::none);

}  // namespace gdn
