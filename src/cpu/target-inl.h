// target-inl.h: one ISA variant of the CPU kernels. Each target_<isa>.cc defines
//   GDN_TARGET        the variant's namespace (generic, avx2, avx512, avx512_bf16)
//   GDN_TARGET_ISA    its gdn::CpuIsa
//   GDN_VECTOR_BYTES  its vector width
//   GDN_GEMM_MR/NV    its register tile (rows x vectors)
// and includes this file once; the build compiles it with the variant's ISA flags.
#include <cstddef>
#include <cstdint>
#include <utility>  // std::index_sequence (types only, no code)

#if defined(__SSE2__)
#include <immintrin.h>  // non-temporal stores (simd-inl.h: stream); static inline functions
#endif

#include "common/half_bits.h"
#include "common/kernel_problem.h"
#include "cpu/kernels.h"
#include "cpu/profile.h"
#include "cpu/workspace.h"
#include "gdn/layer.h"

#if !defined(GDN_TARGET) || !defined(GDN_TARGET_ISA) || !defined(GDN_VECTOR_BYTES) || \
    !defined(GDN_GEMM_MR) || !defined(GDN_GEMM_NV)
#error "define GDN_TARGET, GDN_TARGET_ISA, GDN_VECTOR_BYTES, GDN_GEMM_MR and GDN_GEMM_NV first"
#endif

namespace gdn::cpu::GDN_TARGET {
namespace {

// In dependency order (each uses the ones above it).
// clang-format off
#include "cpu/simd-inl.h"
#include "cpu/profile-inl.h"
#include "cpu/half-inl.h"
#include "cpu/prefetch-inl.h"
#include "cpu/gemm-inl.h"
#include "cpu/io-inl.h"
#include "cpu/conv1d-inl.h"
#include "cpu/chunked_fwd-inl.h"
#include "cpu/chunked_bwd-inl.h"
#include "cpu/recurrent_fwd-inl.h"
#include "cpu/decode-inl.h"
// clang-format on

// kChains independent FMA chains: enough to cover the FMA latency (4 cycles) times the FMA
// ports (2) of current x86 cores with room to spare.
constexpr int kChains = 12;

float fma_peak_loop(std::int64_t iterations) {
  Vec<float> acc[kChains];
  const Vec<float> x = splat(1.0000001f), y = splat(1e-7f);
  for (int c = 0; c < kChains; ++c) acc[c] = splat(static_cast<float>(c));
  for (std::int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * x + y;
  }
  Vec<float> sum{};
  for (int c = 0; c < kChains; ++c) sum += acc[c];
  return reduce_add<float>(sum);
}

#if defined(__AVX512BF16__)
// The same chains on vdpbf16ps: 16 lanes x 2 bf16 products, each a multiply and an add. The
// operands are exact bf16 values (1 and 2^-20), so the sums only grow slowly.
float bf16_dot_peak_loop(std::int64_t iterations) {
  __m512 acc[kChains];
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // (1, 1)
  const __m512bh y = (__m512bh)_mm512_set1_epi32(0x35803580);  // (2^-20, 2^-20)
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  for (std::int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], x, y);
  }
  Vec<float> sum{};
  for (int c = 0; c < kChains; ++c) sum += Vec<float>(acc[c]);
  return reduce_add<float>(sum);
}
constexpr auto kBf16DotPeakLoop = &bf16_dot_peak_loop;
constexpr std::int64_t kBf16DotFlopsPerRound = 4 * kChains * 16;
#else
constexpr float (*kBf16DotPeakLoop)(std::int64_t) = nullptr;
constexpr std::int64_t kBf16DotFlopsPerRound = 0;
#endif

static_assert(kGemmFull == kFull && kGemmLowerA == kLowerA && kGemmLowerC == kLowerC &&
                  kGemmUpperA == kUpperA,
              "kernels.h spells the gemm shapes as gemm-inl.h does");

void gemm_f32(bool accumulate, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
              std::int64_t a_row, std::int64_t a_col, const float* b, std::int64_t ldb, float* c,
              std::int64_t ldc, float c_scale, unsigned shape, float* bf16_scratch) {
  if (accumulate) {
    gemm<float, true>(m, n, k, a, a_row, a_col, b, ldb, c, ldc, c_scale, shape, bf16_scratch);
  } else {
    gemm<float, false>(m, n, k, a, a_row, a_col, b, ldb, c, ldc, c_scale, shape, bf16_scratch);
  }
}

// clang-format off
constexpr KernelTable kTable = {
    GDN_TARGET_ISA,
    {&chunked_item<float, float>, &chunked_item<double, double>,
     &chunked_item<float, BFloat16>, &chunked_item<float, Float16>},
    {&recurrent_item<float, float>, &recurrent_item<double, double>,
     &recurrent_item<float, BFloat16>, &recurrent_item<float, Float16>},
    {&backward_item<float, float>, &backward_item<double, double>,
     &backward_item<float, BFloat16>, &backward_item<float, Float16>},
    {&conv_forward_item<float, float>, &conv_forward_item<double, double>,
     &conv_forward_item<float, BFloat16>, &conv_forward_item<float, Float16>},
    {&conv_backward_item<float, float>, &conv_backward_item<double, double>,
     &conv_backward_item<float, BFloat16>, &conv_backward_item<float, Float16>},
    &decode_item<float>,
    &decode_item<double>,
    &decode_item<float, BFloat16>,
    &fma_peak_loop,
    2 * kChains * kLanes<float>,
    &gemm_f32,
    kBf16DotPeakLoop,
    kBf16DotFlopsPerRound,
};
// clang-format on

}  // namespace
}  // namespace gdn::cpu::GDN_TARGET
