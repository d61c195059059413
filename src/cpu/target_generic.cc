// target_generic.cc: the generic variant of the CPU kernels (compiled with its ISA flags; see
// CMakeLists.txt). Register tile 6 rows x 2 vectors of 16 bytes.
#define GDN_TARGET generic
#define GDN_TARGET_ISA ::gdn::CpuIsa::generic
#define GDN_VECTOR_BYTES 16
#define GDN_GEMM_MR 6
#define GDN_GEMM_NV 2
#include "cpu/target-inl.h"

namespace gdn::cpu {
const KernelTable* kernels_generic() { return &generic::kTable; }
}  // namespace gdn::cpu
