// target_avx2.cc: the avx2 variant of the CPU kernels (compiled with its ISA flags; see
// CMakeLists.txt). Register tile 6 rows x 2 vectors of 32 bytes.
#define GDN_TARGET avx2
#define GDN_TARGET_ISA ::gdn::CpuIsa::avx2
#define GDN_VECTOR_BYTES 32
#define GDN_GEMM_MR 6
#define GDN_GEMM_NV 2
#include "cpu/target-inl.h"

namespace gdn::cpu {
const KernelTable* kernels_avx2() { return &avx2::kTable; }
}  // namespace gdn::cpu
