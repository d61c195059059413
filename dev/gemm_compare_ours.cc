// gemm_compare_ours.cc: our register-tiled product (src/cpu/gemm-inl.h) of one ISA variant,
// callable on its own for dev/gemm_compare.cc. Compiled once per variant, with that variant's
// flags and with GDN_TARGET, GDN_TARGET_ISA, GDN_VECTOR_BYTES, GDN_GEMM_MR and GDN_GEMM_NV
// taken from src/cpu/target_<isa>.cc (dev/CMakeLists.txt reads them from there).
#include <cstdint>

#include "cpu/target-inl.h"

#define GDN_DEV_CAT2(a, b) a##b
#define GDN_DEV_CAT(a, b) GDN_DEV_CAT2(a, b)
#define GDN_DEV_STR2(x) #x
#define GDN_DEV_STR(x) GDN_DEV_STR2(x)

namespace gdn::dev {

// C[m x n] = A[m x k] B[k x n] with A(i, p) = a[i * a_row + p * a_col], B's rows ldb apart
// (n a multiple of the lane count), C's rows ldc apart: gemm<float, false> as the chunk
// stages call it, full shape (no triangle skipped). Named ours_gemm_<variant>.
void GDN_DEV_CAT(ours_gemm_, GDN_TARGET)(std::int64_t m, std::int64_t n, std::int64_t k,
                                         const float* a, std::int64_t a_row, std::int64_t a_col,
                                         const float* b, std::int64_t ldb, float* c,
                                         std::int64_t ldc) {
  cpu::GDN_TARGET::gemm<float, false>(m, n, k, a, a_row, a_col, b, ldb, c, ldc);
}

// The variant's register tile, for the report. Named ours_tile_<variant>.
const char* GDN_DEV_CAT(ours_tile_, GDN_TARGET)() {
  return GDN_DEV_STR(GDN_GEMM_MR) " x " GDN_DEV_STR(GDN_GEMM_NV) " vectors of " GDN_DEV_STR(
      GDN_VECTOR_BYTES) " B";
}

}  // namespace gdn::dev
