// layer_parts.h: the pieces of the fused layer op that its orchestration (src/api/layer.cc) and
// a serving step (src/api/step.cc) share, in the compute type Real (validated: float64 for
// float64 inputs, else float32): element access of any float view, the conv parameters in the
// conv kernel's layout, and the gates.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/half_bits.h"
#include "gdn/layer.h"
#include "gdn/tensor.h"

namespace gdn::detail {

// Element `offset` (in elements) of a float view of any dtype, as Real; and a value stored
// into one (rounded to nearest even for bf16 and f16).
template <class Real>
Real element(const TensorView& v, std::int64_t offset) {
  switch (v.dtype) {
    case DType::f32:
      return static_cast<Real>(static_cast<const float*>(v.data)[offset]);
    case DType::bf16:
      return static_cast<Real>(float_from_bf16(static_cast<const std::uint16_t*>(v.data)[offset]));
    case DType::f16:
      return static_cast<Real>(float_from_f16(static_cast<const std::uint16_t*>(v.data)[offset]));
    default:
      return static_cast<Real>(static_cast<const double*>(v.data)[offset]);
  }
}
template <class Real>
void store_element(const MutableTensorView& v, std::int64_t offset, Real value) {
  switch (v.dtype) {
    case DType::f32:
      static_cast<float*>(v.data)[offset] = static_cast<float>(value);
      break;
    case DType::bf16:
      static_cast<std::uint16_t*>(v.data)[offset] = bf16_from_float(static_cast<float>(value));
      break;
    case DType::f16:
      static_cast<std::uint16_t*>(v.data)[offset] = f16_from_float(static_cast<float>(value));
      break;
    default:
      static_cast<double*>(v.data)[offset] = static_cast<double>(value);
  }
}

template <class Real, int K>
void transpose_taps(const Real* src, std::int64_t d, std::int64_t cpad, Real* w) {
  for (std::int64_t c = 0; c < d; ++c) {
#pragma GCC unroll 8
    for (int i = 0; i < K; ++i) w[i * cpad + c] = src[c * K + i];
  }
}

// w [K][cpad] = conv_weight [D, K] or [D, 1, K] transposed (the conv kernel's layout; a
// contiguous weight takes a loop the compiler vectorises for each K), and b [cpad] = conv_bias
// (left as it is when absent). w and b are zero beyond D.
template <class Real>
void conv_parameters(const TensorView& weight, const TensorView& bias, std::int64_t k,
                     std::int64_t d, std::int64_t cpad, Real* w, Real* b) {
  const Real* src = static_cast<const Real*>(weight.data);
  const std::int64_t channel = weight.strides[0], tap = weight.strides[weight.rank - 1];
  if (bias.present()) {
    for (std::int64_t c = 0; c < d; ++c)
      b[c] = static_cast<const Real*>(bias.data)[c * bias.strides[0]];
  }
  if (channel == k && tap == 1) {
    switch (k) {
      case 1:
        return transpose_taps<Real, 1>(src, d, cpad, w);
      case 2:
        return transpose_taps<Real, 2>(src, d, cpad, w);
      case 3:
        return transpose_taps<Real, 3>(src, d, cpad, w);
      case 4:
        return transpose_taps<Real, 4>(src, d, cpad, w);
      default:
        break;
    }
  }
  for (std::int64_t i = 0; i < k; ++i) {
    const Real* column = src + i * tap;
    Real* to = w + i * cpad;
    for (std::int64_t c = 0; c < d; ++c) to[c] = column[c * channel];
  }
}

// The gates of `tokens` tokens [tokens][hv]: beta = sigmoid(b), g = -exp(A_log) softplus(a +
// dt_bias); softplus(z) = log1p(e^z), returned as z past 20 in float32 and past 40 in float64,
// where z + e^-z rounds to z.
template <class Real>
void layer_gates(const TensorView& a, const TensorView& b, const TensorView& A_log,
                 const TensorView& dt_bias, std::int64_t tokens, std::int64_t hv, Real* g,
                 Real* beta) {
  for (std::int64_t h = 0; h < hv; ++h) {
    const Real a_scale = std::exp(static_cast<const Real*>(A_log.data)[h * A_log.strides[0]]);
    const Real dt = static_cast<const Real*>(dt_bias.data)[h * dt_bias.strides[0]];
    for (std::int64_t t = 0; t < tokens; ++t) {
      const Real z = element<Real>(a, t * a.strides[0] + h * a.strides[1]) + dt;
      const Real softplus = z > (sizeof(Real) == 4 ? 20 : 40) ? z : std::log1p(std::exp(z));
      g[t * hv + h] = -a_scale * softplus;
      beta[t * hv + h] = 1 / (1 + std::exp(-element<Real>(b, t * b.strides[0] + h * b.strides[1])));
    }
  }
}

// gdn::fused_gdn_fwd without the check mode, whatever the options or GDN_CHECK_FINITE say: a
// serving step's prefills, whose step checks its own inputs and results (src/api/step.cc).
void fused_gdn_fwd_unchecked(const LayerInputs& inputs, const LayerOutputs& outputs,
                             const LayerOptions& options);

}  // namespace gdn::detail
