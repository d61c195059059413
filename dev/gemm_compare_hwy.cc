// gemm_compare_hwy.cc: the register-tiled product of src/cpu/gemm-inl.h written with Highway
// (Debian's libhwy 1.0.3) instead of GCC vector extensions, compiled for every x86 target
// Highway knows and dispatched at run time (HWY_DYNAMIC_DISPATCH), for dev/gemm_compare.cc:
// it measures what the portable-SIMD library would give on the chunk shapes. Same algorithm:
// column panels of NV vectors outside, row tiles of MR rows inside, the MR x NV tile of C in
// registers for the whole k loop, A broadcast one element at a time.
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "dev/gemm_compare_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace gdn::dev::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Our tiles: 8 x 2 vectors of 64 bytes (AVX-512), 6 x 2 otherwise.
constexpr int kMR = HWY_MAX_BYTES >= 64 ? 8 : 6;
constexpr int kNV = 2;

template <int MR, int NV>
void Tile(std::int64_t kdim, const float* a, std::int64_t a_row, std::int64_t a_col, const float* b,
          std::int64_t ldb, float* c, std::int64_t ldc) {
  const hn::ScalableTag<float> d;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(d));
  hn::Vec<decltype(d)> acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = hn::Zero(d);
  for (std::int64_t p = 0; p < kdim; ++p) {
    hn::Vec<decltype(d)> bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = hn::LoadU(d, b + p * ldb + v * lanes);
    for (int r = 0; r < MR; ++r) {
      const auto ar = hn::Set(d, a[r * a_row + p * a_col]);
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(ar, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) hn::StoreU(acc[r][v], d, c + r * ldc + v * lanes);
}

template <int MR, int NV>
void TileFor(int mr, int nv, std::int64_t kdim, const float* a, std::int64_t a_row,
             std::int64_t a_col, const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  if constexpr (MR > 1) {
    if (mr < MR) return TileFor<MR - 1, NV>(mr, nv, kdim, a, a_row, a_col, b, ldb, c, ldc);
  }
  if constexpr (NV > 1) {
    if (nv < NV) return TileFor<MR, NV - 1>(mr, nv, kdim, a, a_row, a_col, b, ldb, c, ldc);
  }
  Tile<MR, NV>(kdim, a, a_row, a_col, b, ldb, c, ldc);
}

// C[m x n] = A[m x k] B[k x n], A(i, p) = a[i * a_row + p * a_col]; n a multiple of the lanes.
void HwyGemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t a_row,
             std::int64_t a_col, const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  const hn::ScalableTag<float> d;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t nvec = n / lanes;
  for (std::int64_t j = 0; j < nvec; j += kNV) {
    const int nv = static_cast<int>(nvec - j < kNV ? nvec - j : kNV);
    for (std::int64_t i = 0; i < m; i += kMR) {
      const int mr = static_cast<int>(m - i < kMR ? m - i : kMR);
      TileFor<kMR, kNV>(mr, nv, k, a + i * a_row, a_row, a_col, b + j * lanes, ldb,
                        c + i * ldc + j * lanes, ldc);
    }
  }
}

const char* HwyTarget() { return hwy::TargetName(HWY_TARGET); }
int HwyTileRows() { return kMR; }

}  // namespace gdn::dev::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gdn::dev {
HWY_EXPORT(HwyGemm);
HWY_EXPORT(HwyTarget);
HWY_EXPORT(HwyTileRows);

void hwy_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t a_row,
              std::int64_t a_col, const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  HWY_DYNAMIC_DISPATCH(HwyGemm)(m, n, k, a, a_row, a_col, b, ldb, c, ldc);
}
const char* hwy_target() { return HWY_DYNAMIC_DISPATCH(HwyTarget)(); }
int hwy_tile_rows() { return HWY_DYNAMIC_DISPATCH(HwyTileRows)(); }
}  // namespace gdn::dev
#endif
