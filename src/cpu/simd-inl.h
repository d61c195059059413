// simd-inl.h: vector types and element-wise helpers of one ISA variant.
//
// Included by target-inl.h inside namespace gdn::cpu::<variant>; GDN_VECTOR_BYTES (16, 32
// or 64) is the variant's vector width. GCC/Clang vector extensions compile to the variant's
// instructions (SSE/NEON, AVX2, AVX-512) from one source. No standard-library templates are
// used here: this code is compiled once per ISA flag set, and a library template instantiated
// under AVX-512 flags could be picked by the linker for a generic caller.

template <class Real>
struct Simd;
template <>
struct Simd<float> {
  typedef float V __attribute__((vector_size(GDN_VECTOR_BYTES)));
  typedef std::int32_t I __attribute__((vector_size(GDN_VECTOR_BYTES)));
  static constexpr int kLanes = GDN_VECTOR_BYTES / 4;
};
template <>
struct Simd<double> {
  typedef double V __attribute__((vector_size(GDN_VECTOR_BYTES)));
  typedef std::int64_t I __attribute__((vector_size(GDN_VECTOR_BYTES)));
  static constexpr int kLanes = GDN_VECTOR_BYTES / 8;
};
template <class Real>
using Vec = typename Simd<Real>::V;
template <class Real>
using IVec = typename Simd<Real>::I;
template <class Real>
inline constexpr int kLanes = Simd<Real>::kLanes;
static_assert(kPad % Simd<float>::kLanes == 0 && kPad % Simd<double>::kLanes == 0,
              "rows are padded to a whole number of vectors");

inline std::int64_t min64(std::int64_t a, std::int64_t b) { return a < b ? a : b; }

template <class Real>
inline Vec<Real> load(const Real* p) {
  Vec<Real> v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <class Real>
inline void store(Real* p, Vec<Real> v) {
  __builtin_memcpy(p, &v, sizeof v);
}
// Stores a vector to memory aligned to the vector width, bypassing the caches (a
// non-temporal store: for outputs too large to stay cached, it saves reading each line before
// writing it); a plain store where the ISA has none. stream_fence() orders these stores
// before any later store, so the writer calls it before another thread may read them.
template <class Real>
inline void stream(Real* p, Vec<Real> v) {
#if GDN_VECTOR_BYTES == 64 && defined(__AVX512F__)
  if constexpr (sizeof(Real) == 4)
    _mm512_stream_ps(p, v);
  else
    _mm512_stream_pd(p, v);
#elif GDN_VECTOR_BYTES == 32 && defined(__AVX__)
  if constexpr (sizeof(Real) == 4)
    _mm256_stream_ps(p, v);
  else
    _mm256_stream_pd(p, v);
#elif GDN_VECTOR_BYTES == 16 && defined(__SSE2__)
  if constexpr (sizeof(Real) == 4)
    _mm_stream_ps(p, v);
  else
    _mm_stream_pd(p, v);
#else
  store(p, v);
#endif
}
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}
// a b + c rounded once where the variant has FMA (a b rounded first where it has none). For
// updates that two code paths must round alike: left to -ffp-contract, a * b + c * d fuses
// either product depending on the code around it (the decode kernel's float32 and bf16 pool
// paths, src/cpu/decode-inl.h, measured to differ so).
template <class Real>
inline Vec<Real> mul_add(Vec<Real> a, Vec<Real> b, Vec<Real> c) {
#if GDN_VECTOR_BYTES == 64 && defined(__AVX512F__)
  if constexpr (sizeof(Real) == 4) {
    return _mm512_fmadd_ps(a, b, c);
  } else {
    return _mm512_fmadd_pd(a, b, c);
  }
#elif GDN_VECTOR_BYTES == 32 && defined(__FMA__)
  if constexpr (sizeof(Real) == 4) {
    return _mm256_fmadd_ps(a, b, c);
  } else {
    return _mm256_fmadd_pd(a, b, c);
  }
#else
  return a * b + c;
#endif
}

// Whether any lane of a or of b is a NaN: one unordered compare of the two.
inline bool any_nan(Vec<float> a, Vec<float> b) {
#if GDN_VECTOR_BYTES == 64 && defined(__AVX512F__)
  return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q) != 0;
#elif GDN_VECTOR_BYTES == 32 && defined(__AVX__)
  const __m256 unordered = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
  return !_mm256_testz_ps(unordered, unordered);
#elif GDN_VECTOR_BYTES == 16 && defined(__SSE2__)
  return _mm_movemask_ps(_mm_cmpunord_ps(a, b)) != 0;
#else
  bool any = false;
  for (int i = 0; i < kLanes<float>; ++i) any = any || a[i] != a[i] || b[i] != b[i];
  return any;
#endif
}
template <class Real>
inline Vec<Real> splat(Real x) {
  return Vec<Real>{} + x;
}

// Lane indices 0, 1, 2, ... as Real.
template <class Real>
inline Vec<Real> lane_index() {
  Vec<Real> v;
  for (int i = 0; i < kLanes<Real>; ++i) v[i] = static_cast<Real>(i);
  return v;
}

// Sum of the lanes in a fixed order (results must not depend on anything but the inputs).
template <class Real>
inline Real reduce_add(Vec<Real> v) {
  Real s = 0;
  for (int i = 0; i < kLanes<Real>; ++i) s += v[i];
  return s;
}

// e^x, element-wise, to about 1 ulp: Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2,
// a Taylor polynomial (degree 7 for float: truncation 5e-9; degree 13 for double: 4e-18) and
// a scale by 2^n applied in two halves (so that 2^n stays representable near overflow).
// Results below the smallest normal number (x < -87.3 float, -708.3 double) are flushed to 0:
// subnormal decay factors change nothing above 1e-38 but make every later product slow.
// -inf gives 0, +inf gives inf, NaN gives NaN. Branch-free and deterministic.
template <class Real>
struct ExpConstants;
template <>
struct ExpConstants<float> {
  static constexpr float kLo = -104.0f, kHi = 89.0f;
  static constexpr float kFlush = -87.33654f;  // ln(FLT_MIN)
  static constexpr float kLog2e = 1.44269504088896341f;
  static constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  static constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  static constexpr int kDegree = 7;
  static constexpr int kMantissa = 23, kBias = 127;
};
template <>
struct ExpConstants<double> {
  static constexpr double kLo = -746.0, kHi = 710.0;
  static constexpr double kFlush = -708.3964185322641;  // ln(DBL_MIN)
  static constexpr double kLog2e = 1.44269504088896338700;
  static constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kShifter = 6755399441055744.0;  // 1.5 * 2^52
  static constexpr int kDegree = 13;
  static constexpr int kMantissa = 52, kBias = 1023;
};

template <class Real, int Degree>
struct TaylorCoefficients {
  Real value[Degree + 1] = {};
  constexpr TaylorCoefficients() {
    Real factorial = 1;
    value[0] = 1;
    for (int k = 1; k <= Degree; ++k) {
      factorial *= static_cast<Real>(k);
      value[k] = 1 / factorial;
    }
  }
};

template <class Real>
inline Vec<Real> vexp(Vec<Real> x) {
  using K = ExpConstants<Real>;
  using I = IVec<Real>;
  const Vec<Real> lo = splat<Real>(K::kLo), hi = splat<Real>(K::kHi);
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const Vec<Real> shifter = splat<Real>(K::kShifter);
  const Vec<Real> t = x * K::kLog2e + shifter;
  const Vec<Real> n = t - shifter;  // round(x / ln2)
  const Vec<Real> r = (x - n * K::kLn2Hi) - n * K::kLn2Lo;
  // Horner on the Taylor coefficients 1/k!.
  constexpr TaylorCoefficients<Real, K::kDegree> c;
  Vec<Real> p = splat<Real>(c.value[K::kDegree]);
  for (int k = K::kDegree - 1; k >= 0; --k) p = p * r + c.value[k];
  const I ni = (I)t - (I)shifter;
  const I n1 = ni >> 1, n2 = ni - n1;
  const Vec<Real> s1 = (Vec<Real>)((n1 + K::kBias) << K::kMantissa);
  const Vec<Real> s2 = (Vec<Real>)((n2 + K::kBias) << K::kMantissa);
  return x < splat<Real>(K::kFlush) ? Vec<Real>{} : p * s1 * s2;
}

// In-register transpose of a kLanes x kLanes block held as kLanes row vectors: one step per
// bit of the lane index, each swapping the off-diagonal B x B sub-blocks of row pairs
// (i, i + B) with two two-source shuffles; kLanes log2(kLanes) shuffles in all.
template <class Real, int B, std::size_t... I>
inline Vec<Real> keep_low_blocks(Vec<Real> a, Vec<Real> b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, ((I / B) % 2 == 0 ? int(I) : int(kLanes<Real> + I - B))...);
}
template <class Real, int B, std::size_t... I>
inline Vec<Real> keep_high_blocks(Vec<Real> a, Vec<Real> b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, ((I / B) % 2 == 0 ? int(I + B) : int(kLanes<Real> + I))...);
}
template <class Real, int B = kLanes<Real> / 2>
inline void transpose_block(Vec<Real>* rows) {
  if constexpr (B >= 1) {
    constexpr auto lanes = std::make_index_sequence<kLanes<Real>>{};
#pragma GCC unroll 16
    for (int i = 0; i < kLanes<Real>; ++i) {
      if ((i / B) % 2 != 0) continue;
      const Vec<Real> lo = keep_low_blocks<Real, B>(rows[i], rows[i + B], lanes);
      const Vec<Real> hi = keep_high_blocks<Real, B>(rows[i], rows[i + B], lanes);
      rows[i] = lo;
      rows[i + B] = hi;
    }
    transpose_block<Real, B / 2>(rows);
  }
}

// dst[c][r] = src[r][c] for r < rows, c < cols; dst[c][r] = 0 for rows <= r < dst_cols. src
// rows are src_ld apart with at least cols rounded up to the lane count readable; dst rows are
// dst_ld apart; dst_cols is a multiple of the lane count. Block transposes in registers.
template <class Real>
inline void transpose_into(const Real* src, std::int64_t rows, std::int64_t src_ld,
                           std::int64_t cols, Real* dst, std::int64_t dst_ld,
                           std::int64_t dst_cols) {
  constexpr int W = kLanes<Real>;
  for (std::int64_t r0 = 0; r0 < dst_cols; r0 += W) {
    for (std::int64_t c0 = 0; c0 < cols; c0 += W) {
      Vec<Real> block[W];
      for (int r = 0; r < W; ++r)
        block[r] = r0 + r < rows ? load(src + (r0 + r) * src_ld + c0) : Vec<Real>{};
      transpose_block<Real>(block);
      for (int c = 0; c < W && c0 + c < cols; ++c) store(dst + (c0 + c) * dst_ld + r0, block[c]);
    }
  }
}

// Row helpers over n elements, n a multiple of the lane count (padded rows).
template <class Real>
inline void fill(Real* y, std::int64_t n, Real value) {
  for (std::int64_t j = 0; j < n; j += kLanes<Real>) store(y + j, splat(value));
}
template <class Real>
inline void scale_row(Real* y, std::int64_t n, Real a) {
  for (std::int64_t j = 0; j < n; j += kLanes<Real>) store(y + j, load(y + j) * a);
}
// y -= a * x
template <class Real>
inline void sub_scaled(Real* y, const Real* x, std::int64_t n, Real a) {
  for (std::int64_t j = 0; j < n; j += kLanes<Real>) store(y + j, load(y + j) - a * load(x + j));
}
template <class Real>
inline Real dot(const Real* x, const Real* y, std::int64_t n) {
  Vec<Real> acc{};
  for (std::int64_t j = 0; j < n; j += kLanes<Real>) acc += load(x + j) * load(y + j);
  return reduce_add<Real>(acc);
}
// y[j] = exp(x[j]) for n elements.
template <class Real>
inline void exp_row(Real* y, const Real* x, std::int64_t n) {
  for (std::int64_t j = 0; j < n; j += kLanes<Real>) store(y + j, vexp<Real>(load(x + j)));
}
