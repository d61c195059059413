// kernels.h: the table of CPU kernels one ISA variant provides, and the dispatch to it.
//
// Each variant is the same source (src/cpu/target-inl.h) compiled with its own flags into its
// own namespace (target_generic.cc, target_avx2.cc, target_avx512.cc, target_avx512_bf16.cc).
// The driver (src/cpu/forward.cc) resolves the variant once per call and calls these function
// pointers per work item (a sequence and a group of value heads, src/cpu/plan.cc); nothing
// below the table looks at dtype, ISA or flags.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/kernel_problem.h"
#include "gdn/runtime.h"

namespace gdn::cpu {

// One work item of a forward problem: sequence `seq`, value heads [head, head + heads): some of
// one key head's group, or the whole groups of consecutive key heads. `workspace` holds at least
// forward_workspace_bytes(problem, heads) bytes, 64-byte aligned, owned by the calling thread.
using ForwardItemFn = void (*)(const detail::ForwardProblem& problem, std::int64_t seq,
                               std::int64_t head, std::int64_t heads, std::byte* workspace);

// One backward work item: sequence `seq`, all value heads [head, head + heads) of one key
// head, rebuilding chunk states in segments of `segment` chunks when none were kept; the
// workspace holds backward_workspace_bytes(problem, heads, chunks, segment) bytes with chunks
// at least the sequence's.
using BackwardItemFn = void (*)(const detail::BackwardProblem& problem, std::int64_t seq,
                                std::int64_t head, std::int64_t heads, std::int64_t segment,
                                std::byte* workspace);

// The layer op's conv1d + SiLU (src/cpu/conv1d-inl.h), per work item: tokens [t0, t1) of
// sequence `seq`, all channels. Backward writes the item's partial d weight [K][cpad] and
// d bias [cpad] into `partial` (conv_partial_elements(problem) elements of the dtype). The
// workspace holds conv_workspace_bytes(problem, backward) bytes.
using ConvForwardFn = void (*)(const detail::ConvProblem& problem, std::int64_t seq,
                               std::int64_t t0, std::int64_t t1, std::byte* workspace);
using ConvBackwardFn = void (*)(const detail::ConvProblem& problem, std::int64_t seq,
                                std::int64_t t0, std::int64_t t1, std::byte* partial,
                                std::byte* workspace);

// One decode work item of a serving step: item = (seq * hv + head) * vblocks + block. The
// workspace holds decode_workspace_bytes(problem) bytes.
using DecodeItemFn = void (*)(const detail::DecodeProblem& problem, std::int64_t item,
                              std::byte* workspace);

// The gated delta rule's kernels per activation type (q, k, v, o and their gradients), indexed
// by activations(dtype): float32 and float64 compute in their own type; bf16 and f16
// activations compute in float32 (state, gates, accumulation), converted on load and store.
inline constexpr int kActivationTypes = 4;
inline int activations(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 1;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 3;
    default:
      return 0;
  }
}

// The shapes gemm_f32 takes (src/cpu/gemm-inl.h: GemmShape, where they are explained).
inline constexpr unsigned kGemmFull = 0, kGemmLowerA = 1, kGemmLowerC = 2, kGemmUpperA = 4;

// The variant's float32 matrix product (src/cpu/gemm-inl.h: gemm<float, accumulate>, its
// arguments in order), for the tests and dev/ only: the stages call it inline.
using GemmFn = void (*)(bool accumulate, std::int64_t m, std::int64_t n, std::int64_t k,
                        const float* a, std::int64_t a_row, std::int64_t a_col, const float* b,
                        std::int64_t ldb, float* c, std::int64_t ldc, float c_scale, unsigned shape,
                        float* bf16_scratch);

struct KernelTable {
  CpuIsa isa;
  ForwardItemFn chunked[kActivationTypes];
  ForwardItemFn recurrent[kActivationTypes];
  BackwardItemFn backward[kActivationTypes];
  ConvForwardFn conv_forward[kActivationTypes];    // by activations(x_dtype)
  ConvBackwardFn conv_backward[kActivationTypes];  // by activations(x_dtype)
  DecodeItemFn decode_f32;
  DecodeItemFn decode_f64;
  DecodeItemFn decode_f32_bf16_state;  // float32 compute over a bf16 pool
  // Runs `iterations` rounds of independent fp32 FMA chains at this variant's vector width
  // and returns a value that depends on all of them. FLOPs = iterations * fma_flops_per_round.
  float (*fma_peak_loop)(std::int64_t iterations);
  std::int64_t fma_flops_per_round;
  GemmFn gemm_f32;
  // The same for bf16 dot products (vdpbf16ps) where the variant has them, else null and 0.
  float (*bf16_dot_peak_loop)(std::int64_t iterations);
  std::int64_t bf16_dot_flops_per_round;
};

const KernelTable* kernels_generic();
const KernelTable* kernels_avx2();         // null when not compiled in
const KernelTable* kernels_avx512();       // null when not compiled in
const KernelTable* kernels_avx512_bf16();  // null when not compiled in

// The table of a resolved (non-automatic) variant; throws gdn::RuntimeError if unavailable.
const KernelTable& kernel_table(CpuIsa isa);

// Per-thread workspace of one forward item of `heads` value heads, for either algorithm, in
// bytes. The same for every variant (buffers are padded to 16 elements, a multiple of every
// vector width).
std::size_t forward_workspace_bytes(const detail::ForwardProblem& problem, std::int64_t heads);

// The backward's workspace for an item of `heads` value heads of a sequence of `chunks`
// chunks rebuilt in segments of `segment` chunks (segment = 0: chunk states were kept).
std::size_t backward_workspace_bytes(const detail::BackwardProblem& problem, std::int64_t heads,
                                     std::int64_t chunks, std::int64_t segment);

// The conv items' workspace in bytes (forward or backward items), and the elements of one
// backward item's partial d weight and d bias.
std::size_t conv_workspace_bytes(const detail::ConvProblem& problem, bool backward);
std::int64_t conv_partial_elements(const detail::ConvProblem& problem);

// A decode item's workspace in bytes.
std::size_t decode_workspace_bytes(const detail::DecodeProblem& problem);

// fp32 FMA throughput of `threads` threads running the variant's peak loop, in GFLOP/s:
// the best of a few short runs (about `seconds` in total).
double measure_fma_peak_gflops(CpuIsa isa, int threads, double seconds = 0.3);

// The same for the variant's bf16 dot-product instruction (counting its multiplies and adds);
// 0 when the variant has none.
double measure_bf16_dot_peak_gflops(CpuIsa isa, int threads, double seconds = 0.3);

// Whether the automatic ISA choice takes the avx512_bf16 variant on this CPU (which has it):
// true where vdpbf16ps issues as often as an FMA (AMD Zen 4/5), false where it issues half as
// often (Intel Xeon without AMX: bf16 operands on it are slower than the emulation). The
// evidence is beside the definition (dispatch.cc).
bool bf16_dot_runs_at_full_rate();

}  // namespace gdn::cpu
