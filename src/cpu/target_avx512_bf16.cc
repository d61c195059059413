// target_avx512_bf16.cc: the avx512_bf16 variant of the CPU kernels: avx512's source, flags and
// register tile plus -mavx512bf16 (CMakeLists.txt), so that the bf16-operand products
// (MatmulPrecision::bf16) run on vdpbf16ps (src/cpu/gemm_bf16-inl.h) instead of rounding and
// multiplying in float32. Every other kernel compiles to avx512's.
#define GDN_TARGET avx512_bf16
#define GDN_TARGET_ISA ::gdn::CpuIsa::avx512_bf16
#define GDN_VECTOR_BYTES 64
#define GDN_GEMM_MR 8
#define GDN_GEMM_NV 2
#include "cpu/target-inl.h"

namespace gdn::cpu {
const KernelTable* kernels_avx512_bf16() { return &avx512_bf16::kTable; }
}  // namespace gdn::cpu
