// layer.h: the CPU backend's conv1d + SiLU drivers for the fused layer op, and the decode
// driver of a serving step.
#pragma once

#include "common/kernel_problem.h"
#include "gdn/runtime.h"

namespace gdn::cpu {

// xh = SiLU(conv(x)) for every sequence; items are blocks of tokens of one sequence, all
// channels (src/cpu/workspace.h: kConvTokens).
void conv_forward(const detail::ConvProblem& problem, CpuIsa isa, int threads);

// dx, d conv_state, d weight and d bias; the same items, each writing its partial d weight
// and d bias, summed afterwards in item order (bit-identical for any thread count).
void conv_backward(const detail::ConvProblem& problem, CpuIsa isa, int threads);

// The fused layer op's forward without residuals runs a long input in windows of tokens, each
// through conv, gates, the gated delta rule and out with one xh [W, D] (and one float32 out
// [W, Hv Dv] for 16-bit activations) reused from window to window, where one xh [T, D] per call
// paid for its first touch: the kernel zeroes every fresh page, 115 ms of the 707 ms of a bf16
// Qwen3-Next step's 8192-token prefill on one thread of a 2-vCPU AMD EPYC (AVX2) host, with
// the 128 MiB float32 out (docs/perf_layer.md). kLayerWindowBytes of xh per window: 512 tokens
// at D = 8192 floats, small enough to stay in a large L3 between the conv and the delta rule.
inline constexpr std::int64_t kLayerWindowBytes = std::int64_t{16} << 20;

// The window in tokens at `channels` channels of `element_bytes` (the compute type) with
// `threads` threads (resolved, >= 1): kLayerWindowBytes of xh, or kConvTokens per thread (the
// conv's items) if more, at least 64 tokens, rounded up to a multiple of `chunk`, so that a
// window boundary inside a sequence is a chunk boundary (the delta rule then gives the bits of
// one call: the state carried across is the float32 state of that boundary).
std::int64_t layer_window_tokens(std::int64_t channels, std::int64_t element_bytes,
                                 std::int64_t chunk, int threads);

// Tests: while installed, layer_window_tokens gives `tokens` rounded up to a multiple of the
// chunk (and at least 8, above the conv's K - 1 of at most 7) instead, so that small problems
// run in windows. One at a time, as ScopedStageProfile.
class ScopedLayerWindow {
 public:
  explicit ScopedLayerWindow(std::int64_t tokens);
  ~ScopedLayerWindow();
  ScopedLayerWindow(const ScopedLayerWindow&) = delete;
  ScopedLayerWindow& operator=(const ScopedLayerWindow&) = delete;

 private:
  std::int64_t previous_;
};

// The decodes of a serving step (src/cpu/decode-inl.h): items of (sequence, value head, block
// of value columns), problem.vblocks blocks per head.
void decode(const detail::DecodeProblem& problem, CpuIsa isa, int threads);

}  // namespace gdn::cpu
