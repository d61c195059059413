// half-inl.h: the 16-bit activation types of one ISA variant. bf16 and f16 tensors are read
// into and written from float32 workspaces through these (round to nearest even on the way
// out); they never take part in arithmetic. f16 uses the F16C instructions where the variant
// has them, the portable bit conversion (src/common/half_bits.h) otherwise.

struct BFloat16 {
  std::uint16_t bits;
  BFloat16() = default;
  explicit BFloat16(float x) : bits(detail::bf16_from_float(x)) {}
  explicit operator float() const { return detail::float_from_bf16(bits); }
};

struct Float16 {
  std::uint16_t bits;
  Float16() = default;
#if defined(__F16C__)
  explicit Float16(float x) : bits(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)) {}
  explicit operator float() const { return _cvtsh_ss(bits); }
#else
  explicit Float16(float x) : bits(detail::f16_from_float(x)) {}
  explicit operator float() const { return detail::float_from_f16(bits); }
#endif
};
static_assert(sizeof(BFloat16) == 2 && sizeof(Float16) == 2, "16-bit storage types");

// Contiguous rows: dst[0..n) = src widened, or src rounded to nearest even; a vector at a time
// (bf16 by integer shifts in every variant; f16 by the F16C conversions where the variant has
// them), the tail element by element. Each element converts exactly as the scalar types above.
typedef std::uint16_t HalfBits __attribute__((vector_size(GDN_VECTOR_BYTES / 2)));
typedef std::uint32_t WideBits __attribute__((vector_size(GDN_VECTOR_BYTES)));
constexpr int kHalfLanes = GDN_VECTOR_BYTES / 4;

inline Vec<float> widen_bf16(const BFloat16* src) {
  HalfBits h;
  __builtin_memcpy(&h, src, sizeof h);
  const WideBits w = __builtin_convertvector(h, WideBits) << 16;
  Vec<float> x;
  __builtin_memcpy(&x, &w, sizeof x);
  return x;
}
inline void narrow_bf16(BFloat16* dst, Vec<float> x) {
  WideBits w;
  __builtin_memcpy(&w, &x, sizeof w);
  const WideBits magnitude = w & 0x7fffffffu;
  const WideBits rounded = (w + 0x7fffu + ((w >> 16) & 1u)) >> 16;
  const WideBits nan = (w >> 16) | 0x40u;
  const HalfBits h = __builtin_convertvector(magnitude > 0x7f800000u ? nan : rounded, HalfBits);
  __builtin_memcpy(dst, &h, sizeof h);
}

// 2W bf16 values (W = kLanes<float>: one vector of their bits) as two float vectors, without
// a shuffle: `even` gets values 0, 2, 4, ... (the low halves of the 32-bit words), `odd` gets
// 1, 3, 5, ... (the high halves); exact. A block of columns in this "pair order" is how the
// decode kernel streams a bf16 state (src/cpu/decode-inl.h). narrow_bf16_pair is the inverse,
// each value rounded as BFloat16(float) rounds: to nearest even, a NaN kept a quiet NaN with
// its top payload bits; about five integer instructions per vector of floats.
inline void widen_bf16_pair(const BFloat16* src, Vec<float>* even, Vec<float>* odd) {
  WideBits w;
  __builtin_memcpy(&w, src, sizeof w);
  const WideBits low = w << 16, high = w & 0xffff0000u;
  __builtin_memcpy(even, &low, sizeof low);
  __builtin_memcpy(odd, &high, sizeof high);
}
// kMayHoldNaN false: the caller knows no lane is a NaN (a finite value or an infinity rounds
// by the sum alone), and the test is skipped.
template <bool kMayHoldNaN = true>
inline void narrow_bf16_pair(BFloat16* dst, Vec<float> even, Vec<float> odd) {
  WideBits e, o;
  __builtin_memcpy(&e, &even, sizeof e);
  __builtin_memcpy(&o, &odd, sizeof o);
  // Rounded bf16 in the high half of each word.
  WideBits re = e + 0x7fffu + ((e >> 16) & 1u), ro = o + 0x7fffu + ((o >> 16) & 1u);
  // A NaN's rounding can carry into its exponent and sign (0x7fffffff becomes -0): one test
  // for both vectors, a select per lane only when one is there.
  if constexpr (kMayHoldNaN) {
    if (__builtin_expect(any_nan(even, odd), 0)) {
      re = even != even ? e | 0x400000u : re;
      ro = odd != odd ? o | 0x400000u : ro;
    }
  }
  const WideBits w = (re >> 16) | (ro & 0xffff0000u);
  __builtin_memcpy(dst, &w, sizeof w);
}

inline void widen_row(float* dst, const BFloat16* src, std::int64_t n) {
  std::int64_t j = 0;
  for (; j + kHalfLanes <= n; j += kHalfLanes) store(dst + j, widen_bf16(src + j));
  for (; j < n; ++j) dst[j] = static_cast<float>(src[j]);
}
inline void narrow_row(BFloat16* dst, const float* src, std::int64_t n) {
  std::int64_t j = 0;
  for (; j + kHalfLanes <= n; j += kHalfLanes) narrow_bf16(dst + j, load(src + j));
  for (; j < n; ++j) dst[j] = BFloat16(src[j]);
}

inline void widen_row(float* dst, const Float16* src, std::int64_t n) {
  std::int64_t j = 0;
#if defined(__F16C__) && GDN_VECTOR_BYTES == 32
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(dst + j,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j))));
  }
#elif defined(__AVX512F__) && GDN_VECTOR_BYTES == 64
  // The zero-masked forms here and below: GCC 12 warns that the plain ones' undefined
  // pass-through operand is uninitialised.
  for (; j + 16 <= n; j += 16) {
    _mm512_storeu_ps(dst + j,
                     _mm512_maskz_cvtph_ps(
                         0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + j))));
  }
#endif
  for (; j < n; ++j) dst[j] = static_cast<float>(src[j]);
}
inline void narrow_row(Float16* dst, const float* src, std::int64_t n) {
  std::int64_t j = 0;
#if defined(__F16C__) && GDN_VECTOR_BYTES == 32
  for (; j + 8 <= n; j += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + j), _MM_FROUND_TO_NEAREST_INT));
  }
#elif defined(__AVX512F__) && GDN_VECTOR_BYTES == 64
  for (; j + 16 <= n; j += 16) {
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(dst + j),
        _mm512_maskz_cvtps_ph(0xffff, _mm512_loadu_ps(src + j), _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; j < n; ++j) dst[j] = Float16(src[j]);
}
