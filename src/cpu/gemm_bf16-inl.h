// gemm_bf16-inl.h: the bf16-operand product on vdpbf16ps (AVX512_BF16; the avx512_bf16
// variant, included by gemm-inl.h only where the compiler targets it).
//
// vdpbf16ps takes 16 words of two bf16 each per operand and adds, in float32, lo(a) lo(b) +
// hi(a) hi(b) to each lane. So both operands are packed into the scratch as pairs along k (the
// VNNI layout): B as [kq][n] words, word (q, j) = (B(2q, j), B(2q+1, j)); A as one word per
// (row, pair), broadcast to all lanes. kq = ceil(kdim / 2); an odd kdim's last pair carries a
// zero. A tile of MR rows x NV vectors of C stays in registers for the k loop, as gemm_tile's,
// and takes half of gemm_tile's k steps for the same products (two multiply-adds per lane per
// instruction instead of one).
//
// Operands are rounded as the float32 emulation rounds them (to nearest, ties to even, NaN
// kept), so both modes multiply the same bf16 values (subnormals read as zero in both: the
// calls run with DAZ and FTZ, cpu/float_env.h); the sums differ in order (pairs), which the
// bf16-operand tolerance covers (docs/numerics.md).
//
// The shapes: the parts of A that kLowerA / kUpperA declare zero are packed as zeros, whatever
// the caller's memory holds there, so a tile's k range can be widened to whole pairs: the extra
// products are exact zeros for finite B.

// Lanes l of 16 with from <= base + l <= to.
inline __mmask16 lane_range(std::int64_t base, std::int64_t from, std::int64_t to) {
  const std::int64_t a = from - base < 0 ? 0 : (from - base > 16 ? 16 : from - base);
  const std::int64_t b = to + 1 - base < 0 ? 0 : (to + 1 - base > 16 ? 16 : to + 1 - base);
  return static_cast<__mmask16>(((1u << b) - 1u) & ~((1u << a) - 1u));
}

// vcvtne2ps2bf16 rounds to nearest even and keeps a NaN a quiet NaN with its top payload bits,
// as round_to_bf16 does; it reads float32 subnormals as zero, which vdpbf16ps would do to
// their bf16 roundings anyway. Masked loads give the zeros past the ends and in the shape's
// zero triangle, and never touch memory outside the operand.

// Pair words of X(p, j) = x[p * ldx + j], p < kdim, j < cols (k runs down the rows of memory:
// B, or A read transposed with its rows as the lanes j), into dst [kq][ldd], ldd >= cols
// rounded up to 16. The shape's zero triangle (lane j is row j of A) is packed as zeros.
inline void pack_pairs_down(std::uint32_t* dst, std::int64_t ldd, const float* x, std::int64_t ldx,
                            std::int64_t kdim, std::int64_t cols, unsigned shape) {
  // Words (lo_t, hi_t) from [lo_0 .. lo_15, hi_0 .. hi_15].
  alignas(64) static const std::uint16_t kInterleave[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  const bool triangle = (shape & (kLowerA | kUpperA)) != 0;
  for (std::int64_t p = 0; p < kdim; p += 2) {
    std::int64_t j = 0;
    if (!triangle && p + 1 < kdim) {  // whole vectors need no masks (most of the packing)
      const float* lo_row = x + p * ldx;
      const float* hi_row = lo_row + ldx;
      for (; j + 16 <= cols; j += 16) {
        const __m512i halves =
            (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(hi_row + j), _mm512_loadu_ps(lo_row + j));
        _mm512_storeu_si512(dst + (p / 2) * ldd + j, _mm512_permutexvar_epi16(interleave, halves));
      }
    }
    for (; j < cols; j += 16) {
      // The lanes (rows i = j + l) that element e keeps: kLowerA keeps e <= i, kUpperA e >= i.
      auto kept = [&](std::int64_t e) -> __mmask16 {
        if (e >= kdim) return 0;
        const std::int64_t from = (shape & kLowerA) ? e : 0;
        const std::int64_t to = (shape & kUpperA) ? min64(e, cols - 1) : cols - 1;
        return lane_range(j, from, to);
      };
      const __m512 lo = _mm512_maskz_loadu_ps(kept(p), x + p * ldx + j);
      const __m512 hi = _mm512_maskz_loadu_ps(kept(p + 1), x + (p + 1) * ldx + j);
      const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      _mm512_storeu_si512(dst + (p / 2) * ldd + j, _mm512_permutexvar_epi16(interleave, halves));
    }
  }
}

// Pair words of A(i, p) = a[i * a_row + p] (k runs along each row of memory: a pair is two
// neighbours, so rounding 32 floats in order gives 16 words) into dst [m][ldd], ldd >= kq
// rounded up to 16; the shape's zero triangle is packed as zeros.
inline void pack_pairs_along(std::uint32_t* dst, std::int64_t ldd, const float* a,
                             std::int64_t a_row, std::int64_t m, std::int64_t kdim,
                             unsigned shape) {
  for (std::int64_t i = 0; i < m; ++i) {
    const std::int64_t from = (shape & kUpperA) ? i : 0;
    const std::int64_t to = (shape & kLowerA) ? min64(i, kdim - 1) : kdim - 1;
    const float* row = a + i * a_row;
    std::int64_t p = 0;
    if (from == 0) {  // whole vectors up to the row's last kept element need no masks
      for (; p + 32 <= to + 1; p += 32) {
        _mm512_storeu_si512(
            dst + i * ldd + p / 2,
            (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + p + 16), _mm512_loadu_ps(row + p)));
      }
    }
    for (; p < kdim; p += 32) {
      const __m512 x0 = _mm512_maskz_loadu_ps(lane_range(p, from, to), row + p);
      const __m512 x1 = _mm512_maskz_loadu_ps(lane_range(p + 16, from, to), row + p + 16);
      _mm512_storeu_si512(dst + i * ldd + p / 2, (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
    }
  }
}

// Any other strides: one element at a time, into dst [m][ldd] as pack_pairs_along.
inline void pack_pairs_strided(std::uint32_t* dst, std::int64_t ldd, const float* a,
                               std::int64_t a_row, std::int64_t a_col, std::int64_t m,
                               std::int64_t kdim, unsigned shape) {
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t p = 0; p < kdim; p += 2) {
      std::uint32_t word = 0;
      for (std::int64_t e = p; e < p + 2 && e < kdim; ++e) {
        const bool zero = ((shape & kLowerA) && e > i) || ((shape & kUpperA) && e < i);
        std::uint32_t bits;
        const float r = round_to_bf16(zero ? 0.0f : a[i * a_row + e * a_col]);
        __builtin_memcpy(&bits, &r, sizeof bits);
        word |= e == p ? bits >> 16 : bits & 0xffff0000u;
      }
      dst[i * ldd + p / 2] = word;
    }
  }
}

template <int MR, int NV, bool Accumulate>
inline void dot_tile(std::int64_t kq, const std::uint32_t* pa, std::int64_t pa_row,
                     std::int64_t pa_q, const std::uint32_t* pb, std::int64_t ldpb, float* c,
                     std::int64_t ldc, float c_scale) {
  __m512 acc[MR][NV];
  if constexpr (Accumulate) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = load(c + r * ldc + v * 16) * c_scale;
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (std::int64_t q = 0; q < kq; ++q) {
    __m512bh bv[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(pb + q * ldpb + v * 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512bh ar = (__m512bh)_mm512_set1_epi32(static_cast<int>(pa[r * pa_row + q * pa_q]));
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, bv[v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) store(c + r * ldc + v * 16, Vec<float>(acc[r][v]));
}

// Picks the tile for a remainder of mr <= MR rows and nv <= NV vectors.
template <int MR, int NV, bool Accumulate>
inline void dot_tile_dispatch(int mr, int nv, std::int64_t kq, const std::uint32_t* pa,
                              std::int64_t pa_row, std::int64_t pa_q, const std::uint32_t* pb,
                              std::int64_t ldpb, float* c, std::int64_t ldc, float c_scale) {
  if constexpr (MR > 1) {
    if (mr < MR) {
      dot_tile_dispatch<MR - 1, NV, Accumulate>(mr, nv, kq, pa, pa_row, pa_q, pb, ldpb, c, ldc,
                                                c_scale);
      return;
    }
  }
  if constexpr (NV > 1) {
    if (nv < NV) {
      dot_tile_dispatch<MR, NV - 1, Accumulate>(mr, nv, kq, pa, pa_row, pa_q, pb, ldpb, c, ldc,
                                                c_scale);
      return;
    }
  }
  dot_tile<MR, NV, Accumulate>(kq, pa, pa_row, pa_q, pb, ldpb, c, ldc, c_scale);
}

// A's words as gemm_bf16_dot reads them, the shape's zero triangle packed as zeros: read
// transposed (a_row = 1, a_col != 1) into dst [kq][padded(m)], else into dst
// [m][bf16_words_per_row(kdim)]. Returns the words written. gemm_bf16_dot packs its A with it,
// and a caller that multiplies the same A more than once (the forward's [Q;K] and K, once per
// key head and chunk) packs it with it once and passes the words in PackedOperands.
inline std::int64_t pack_bf16_a(std::uint32_t* dst, std::int64_t m, std::int64_t kdim,
                                const float* a, std::int64_t a_row, std::int64_t a_col,
                                unsigned shape = kFull) {
  if (a_row == 1 && a_col != 1) {
    pack_pairs_down(dst, padded(m), a, a_col, kdim, m, shape);
    return (kdim + 1) / 2 * padded(m);
  }
  const std::int64_t row = bf16_words_per_row(kdim);
  if (a_col == 1) {
    pack_pairs_along(dst, row, a, a_row, m, kdim, shape);
  } else {
    pack_pairs_strided(dst, row, a, a_row, a_col, m, kdim, shape);
  }
  return m * row;
}

// gemm()'s bf16-operand form (same contract) on vdpbf16ps. The scratch holds A's words
// (m x padded(kq), or kq x padded(m)) then B's (kq x n): within bf16_scratch_elements, which
// has room for two float copies. An operand in `packed` is taken as it is (A only where the
// shape declares no zero triangle in it): it must hold the words this function would pack of
// the same a or b (pack_bf16_a; for B, pack_pairs_down's layout), so the products are
// bit-identical.
template <bool Accumulate>
void gemm_bf16_dot(std::int64_t m, std::int64_t n, std::int64_t kdim, const float* a,
                   std::int64_t a_row, std::int64_t a_col, const float* b, std::int64_t ldb,
                   float* c, std::int64_t ldc, float c_scale, unsigned shape, float* scratch,
                   PackedOperands packed) {
  constexpr int L = 16;
  // The register tile, rows x vectors of C: 4 x 4 beat the float32 tile's 8 x 2, and 6 x 4,
  // 8 x 3, 12 x 2, by 2-3 % in the forward and 2-5 % in the backward on Zen 4
  // (docs/perf_matmul.md).
  constexpr int MR = 4, NV = 4;
  static_assert(kLanes<float> == L, "the avx512_bf16 variant has 16 float lanes");
  auto* words = reinterpret_cast<std::uint32_t*>(scratch);
  // Pre-packed words of A hold no zero triangle, so a triangular A is packed here regardless.
  const bool a_given = packed.a != nullptr && (shape & (kLowerA | kUpperA)) == 0;
  const bool a_down = a_row == 1 && a_col != 1;  // A read transposed: its columns contiguous
  const std::int64_t pa_row = a_down ? 1 : bf16_words_per_row(kdim);
  const std::int64_t pa_q = a_down ? padded(m) : 1;
  const std::int64_t a_words = a_given ? 0 : pack_bf16_a(words, m, kdim, a, a_row, a_col, shape);
  const std::uint32_t* pa = a_given ? packed.a : words;
  const std::uint32_t* pb = packed.b;
  if (pb == nullptr) {
    std::uint32_t* own = words + padded(a_words);
    pack_pairs_down(own, n, b, ldb, kdim, n, kFull);
    pb = own;
  }

  const std::int64_t nvec = n / L;
  PrefetchQueue& prefetch = prefetch_queue();
  // Column panels outside, row tiles inside, as gemm_panels: the B panel (kq x NV vectors of
  // words, 16 KiB for k = 128 at NV = 4) stays in L1 while A's row tiles stream past it.
  for (std::int64_t j = 0; j < nvec; j += NV) {
    const int nv = static_cast<int>(min64(NV, nvec - j));
    for (std::int64_t i = 0; i < m; i += MR) {
      const int mr = static_cast<int>(min64(MR, m - i));
      const int nt = lower_c_vectors(shape, nv, j, i + mr - 1, L);
      if (nt == 0) continue;
      const std::int64_t k_end = (shape & kLowerA) ? min64(kdim, i + mr) : kdim;
      const std::int64_t k_begin = (shape & kUpperA) ? min64(i, k_end) : 0;
      const std::int64_t q_begin = k_begin / 2, q_end = (k_end + 1) / 2;
      prefetch.issue(PrefetchQueue::kLinesPerTile);
      dot_tile_dispatch<MR, NV, Accumulate>(
          mr, nt, q_end - q_begin, pa + i * pa_row + q_begin * pa_q, pa_row, pa_q,
          pb + q_begin * n + j * L, n, c + i * ldc + j * L, ldc, c_scale);
    }
  }
}
