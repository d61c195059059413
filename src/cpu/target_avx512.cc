// target_avx512.cc: the avx512 variant of the CPU kernels (compiled with its ISA flags; see
// CMakeLists.txt). Register tile 8 rows x 2 vectors of 64 bytes.
#define GDN_TARGET avx512
#define GDN_TARGET_ISA ::gdn::CpuIsa::avx512
#define GDN_VECTOR_BYTES 64
#define GDN_GEMM_MR 8
#define GDN_GEMM_NV 2
#include "cpu/target-inl.h"

namespace gdn::cpu {
const KernelTable* kernels_avx512() { return &avx512::kTable; }
}  // namespace gdn::cpu
