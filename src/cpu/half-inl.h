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
