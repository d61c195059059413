// gemm-inl.h: register-tiled matrix products for the chunk shapes of one ISA variant.
//
//   C[m x n] = A[m x k] B[k x n]                       (Accumulate = false; C not read)
//   C[m x n] = c_scale * C + A[m x k] B[k x n]         (Accumulate = true)
// A(i, p) = a[i * a_row + p * a_col] is broadcast one element at a time, so A may be read
// transposed at no cost; B's rows are contiguous (ldb apart) and n is a multiple of the lane
// count (rows are padded); C's rows are ldc apart. A tile of MR rows x NV vectors of C lives
// in registers for the whole k loop.
//
// Tile sizes (GDN_GEMM_MR x GDN_GEMM_NV vectors), measured on Zen 5 with a 64x128x128 fp32
// product, L1/L2 resident: 8 x 2 (8 x 32 floats) 229 GFLOP/s, 6 x 4 228, 12 x 2 226, 8 x 3
// 223, 4 x 4 196, against an FMA peak of 190-230 GFLOP/s measured in the same session. 8 rows
// also match the row granularity of the triangular products (C = 64 = 8 tiles).

enum GemmShape : unsigned {
  kFull = 0,
  kLowerA = 1,  // A(i, p) = 0 for p > i: the k loop of a row tile stops after its last row
  kLowerC = 2,  // only C(i, j) with j <= i is wanted: tiles wholly above the diagonal skipped
  kUpperA = 4,  // A(i, p) = 0 for p < i (a transposed lower triangle): the k loop of a row
                // tile starts at its first row
};

template <class Real, int MR, int NV, bool Accumulate>
inline void gemm_tile(std::int64_t kdim, const Real* a, std::int64_t a_row, std::int64_t a_col,
                      const Real* b, std::int64_t ldb, Real* c, std::int64_t ldc, Real c_scale) {
  constexpr int L = kLanes<Real>;
  Vec<Real> acc[MR][NV];
  if constexpr (Accumulate) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = load(c + r * ldc + v * L) * c_scale;
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = Vec<Real>{};
  }
  for (std::int64_t p = 0; p < kdim; ++p) {
    Vec<Real> bv[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) bv[v] = load(b + p * ldb + v * L);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const Real ar = a[r * a_row + p * a_col];
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] += ar * bv[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) store(c + r * ldc + v * L, acc[r][v]);
}

// Picks the tile for a remainder of mr <= MR rows and nv <= NV vectors.
template <class Real, int MR, int NV, bool Accumulate>
inline void gemm_tile_dispatch(int mr, int nv, std::int64_t kdim, const Real* a, std::int64_t a_row,
                               std::int64_t a_col, const Real* b, std::int64_t ldb, Real* c,
                               std::int64_t ldc, Real c_scale) {
  if constexpr (MR > 1) {
    if (mr < MR) {
      gemm_tile_dispatch<Real, MR - 1, NV, Accumulate>(mr, nv, kdim, a, a_row, a_col, b, ldb, c,
                                                       ldc, c_scale);
      return;
    }
  }
  if constexpr (NV > 1) {
    if (nv < NV) {
      gemm_tile_dispatch<Real, MR, NV - 1, Accumulate>(mr, nv, kdim, a, a_row, a_col, b, ldb, c,
                                                       ldc, c_scale);
      return;
    }
  }
  gemm_tile<Real, MR, NV, Accumulate>(kdim, a, a_row, a_col, b, ldb, c, ldc, c_scale);
}

// The vectors of a tile's panel (nv from vector j on) that kLowerC needs: those holding a
// column <= the tile's last row (0: the tile is wholly above the diagonal). Finer than whole
// tiles: a panel's second vector is skipped in the row tiles above its first column, which at
// C = 64 on 8 x 2 tiles is a sixth of the lower triangles' vectors.
inline int lower_c_vectors(unsigned shape, int nv, std::int64_t j, std::int64_t last_row,
                           int lanes) {
  if (!(shape & kLowerC)) return nv;
  const std::int64_t reach = last_row / lanes - j + 1;
  return reach <= 0 ? 0 : static_cast<int>(min64(nv, reach));
}

template <class Real, bool Accumulate>
void gemm_panels(std::int64_t m, std::int64_t n, std::int64_t kdim, const Real* a,
                 std::int64_t a_row, std::int64_t a_col, const Real* b, std::int64_t ldb, Real* c,
                 std::int64_t ldc, Real c_scale, unsigned shape) {
  constexpr int L = kLanes<Real>;
  constexpr int MR = GDN_GEMM_MR, NV = GDN_GEMM_NV;
  const std::int64_t nvec = n / L;
  PrefetchQueue& prefetch = prefetch_queue();
  // Column panels outside, row tiles inside: the B panel (k x NV vectors, 16 KiB for
  // k = 128 floats at NV = 2) stays in L1 while every row tile of A streams past it.
  for (std::int64_t j = 0; j < nvec; j += NV) {
    const int nv = static_cast<int>(min64(NV, nvec - j));
    for (std::int64_t i = 0; i < m; i += MR) {
      const int mr = static_cast<int>(min64(MR, m - i));
      const int nt = lower_c_vectors(shape, nv, j, i + mr - 1, L);
      if (nt == 0) continue;
      const std::int64_t k_end = (shape & kLowerA) ? min64(kdim, i + mr) : kdim;
      const std::int64_t k_begin = (shape & kUpperA) ? min64(i, k_end) : 0;
      prefetch.issue(PrefetchQueue::kLinesPerTile);
      gemm_tile_dispatch<Real, MR, NV, Accumulate>(
          mr, nt, k_end - k_begin, a + i * a_row + k_begin * a_col, a_row, a_col,
          b + k_begin * ldb + j * L, ldb, c + i * ldc + j * L, ldc, c_scale);
    }
  }
}

// x rounded to the nearest bf16 value (ties to even), as float: the low 16 bits cleared after
// adding half an ulp of bf16. A NaN stays a NaN (made quiet, its top payload bits kept: what
// narrow_bf16 and widen_bf16 give); a value past bf16's largest rounds to infinity.
inline Vec<float> round_to_bf16(Vec<float> x) {
  WideBits w;
  __builtin_memcpy(&w, &x, sizeof w);
  const WideBits magnitude = w & 0x7fffffffu;
  const WideBits rounded = (w + 0x7fffu + ((w >> 16) & 1u)) & 0xffff0000u;
  const WideBits nan = (w & 0xffff0000u) | 0x00400000u;
  const WideBits r = magnitude > 0x7f800000u ? nan : rounded;
  Vec<float> y;
  __builtin_memcpy(&y, &r, sizeof y);
  return y;
}
inline float round_to_bf16(float x) {
  const Vec<float> v = round_to_bf16(Vec<float>{} + x);
  return v[0];
}

// dst[0..len) = src[0..len) rounded to bf16 (src elements `stride` apart).
inline void round_row_to_bf16(float* dst, const float* src, std::int64_t stride, std::int64_t len) {
  constexpr int L = kLanes<float>;
  std::int64_t e = 0;
  if (stride == 1) {
    for (; e + L <= len; e += L) store(dst + e, round_to_bf16(load(src + e)));
  }
  for (; e < len; ++e) dst[e] = round_to_bf16(src[e * stride]);
}

// Operands a caller packed once as bf16 pair words for several products (the avx512_bf16
// variant only; gemm_bf16-inl.h: gemm_bf16_dot says which words); null: gemm packs its own.
struct PackedOperands {
  const std::uint32_t* a = nullptr;
  const std::uint32_t* b = nullptr;
};

#if defined(__AVX512BF16__)
#include "cpu/gemm_bf16-inl.h"
#endif

// C = [c_scale C +] A B as above; with bf16_scratch (float only) A and B are rounded to bf16
// into it first. With AVX512_BF16 (the avx512_bf16 variant) they are packed there as bf16
// pairs and multiplied with vdpbf16ps (gemm_bf16-inl.h). Elsewhere they are rounded there as
// floats: A as [m][kdim] (or [kdim][m] when A is read transposed, so that both copies run along
// contiguous memory), then B as [kdim][n], and the float32 tile runs on the copies. The scratch
// holds at least padded(m kdim) + kdim n floats (workspace.h: bf16_scratch_elements). The whole
// m x kdim rectangle of A is rounded, the parts the shape skips too (they lie inside the
// caller's buffers and are never multiplied).
template <class Real, bool Accumulate>
void gemm(std::int64_t m, std::int64_t n, std::int64_t kdim, const Real* a, std::int64_t a_row,
          std::int64_t a_col, const Real* b, std::int64_t ldb, Real* c, std::int64_t ldc,
          Real c_scale = 1, unsigned shape = kFull, Real* bf16_scratch = nullptr,
          PackedOperands packed = {}) {
  (void)packed;  // read by the vdpbf16ps form only: the emulation rounds a and b itself
  if constexpr (sizeof(Real) == 4) {
    if (bf16_scratch != nullptr) {
#if defined(__AVX512BF16__)
      gemm_bf16_dot<Accumulate>(m, n, kdim, a, a_row, a_col, b, ldb, c, ldc, c_scale, shape,
                                bf16_scratch, packed);
      return;
#endif
      Real* ra = bf16_scratch;
      Real* rb = ra + padded(m * kdim);
      std::int64_t ra_row = kdim, ra_col = 1;
      if (a_row == 1 && a_col != 1) {  // A read transposed: its columns are contiguous
        ra_row = 1;
        ra_col = m;
        for (std::int64_t p = 0; p < kdim; ++p) round_row_to_bf16(ra + p * m, a + p * a_col, 1, m);
      } else {
        for (std::int64_t i = 0; i < m; ++i)
          round_row_to_bf16(ra + i * kdim, a + i * a_row, a_col, kdim);
      }
      for (std::int64_t p = 0; p < kdim; ++p) round_row_to_bf16(rb + p * n, b + p * ldb, 1, n);
      gemm_panels<Real, Accumulate>(m, n, kdim, ra, ra_row, ra_col, rb, n, c, ldc, c_scale, shape);
      return;
    }
  }
  gemm_panels<Real, Accumulate>(m, n, kdim, a, a_row, a_col, b, ldb, c, ldc, c_scale, shape);
}
