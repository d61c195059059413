// conv_parts.h: the conv stage's setup and write-back that the layer op (src/api/layer.cc)
// and the conv op (src/api/conv.cc) share, in the compute type Real: the parameters and
// states converted into the kernel's buffers, the new conv states, and the kernel's gradient
// buffers written into the caller's views.
#pragma once

#include <cstdint>
#include <vector>

#include "api/layer_parts.h"
#include "common/kernel_problem.h"
#include "gdn/tensor.h"

namespace gdn::detail {

// Element (i0 (, i1 (, i2))) of a view of any float dtype, as Real; and written from Real.
template <class View>
std::int64_t offset_of(const View& v, std::int64_t i0, std::int64_t i1, std::int64_t i2) {
  return i0 * v.strides[0] + (v.rank > 1 ? i1 * v.strides[1] : 0) +
         (v.rank > 2 ? i2 * v.strides[2] : 0);
}
template <class Real>
Real read_at(const TensorView& v, std::int64_t i0, std::int64_t i1 = 0, std::int64_t i2 = 0) {
  return element<Real>(v, offset_of(v, i0, i1, i2));
}
template <class Real>
void write_at(const MutableTensorView& v, Real value, std::int64_t i0, std::int64_t i1 = 0,
              std::int64_t i2 = 0) {
  store_element<Real>(v, offset_of(v, i0, i1, i2), value);
}

// The compute-dtype buffers of one conv stage and the problem over them.
struct ConvBuffers {
  Tensor weight, bias, state_in, xh;
  ConvProblem problem;
};

// Fills `b` for x [T, D] (the caller's view, read in place) over `seqs`: weight [K][cpad] and
// bias [cpad] in the kernel's layout, the initial states [N][K - 1][D] (when present) and,
// for a forward (want_xh), the output xh [T][D]: the caller's `xh` (a contiguous buffer of
// Real) or, when null, a buffer of `b`.
template <class Real>
void prepare_conv(const TensorView& x, const TensorView& weight, const TensorView& bias,
                  const TensorView& state, const std::vector<Sequence>& seqs, std::int64_t taps,
                  DType compute_dtype, bool want_xh, Real* xh, ConvBuffers* b) {
  const std::int64_t k = taps, d = x.sizes[1], cpad = (d + 15) / 16 * 16;
  const std::int64_t n = static_cast<std::int64_t>(seqs.size());
  b->weight = Tensor(compute_dtype, {k, cpad});
  b->bias = Tensor(compute_dtype, {cpad});
  conv_parameters(weight, bias, k, d, cpad, static_cast<Real*>(b->weight.raw()),
                  static_cast<Real*>(b->bias.raw()));
  if (state.present()) {
    b->state_in = Tensor(compute_dtype, {n, k - 1, d});
    Real* s = static_cast<Real*>(b->state_in.raw());
    for (std::int64_t q = 0; q < n; ++q) {
      for (std::int64_t r = 0; r + 1 < k; ++r) {
        for (std::int64_t c = 0; c < d; ++c)
          s[(q * (k - 1) + r) * d + c] = read_at<Real>(state, q, r, c);
      }
    }
  }
  if (xh == nullptr && want_xh) {
    b->xh = Tensor(compute_dtype, {x.sizes[0], d});
    xh = static_cast<Real*>(b->xh.raw());
  }
  ConvProblem& p = b->problem;
  p.tokens = x.sizes[0];
  p.channels = d;
  p.taps = k;
  p.cpad = cpad;
  p.num_seqs = n;
  p.seqs = seqs.data();
  p.dtype = compute_dtype;
  p.x_dtype = x.dtype;
  p.x = static_cast<const std::byte*>(x.data);
  p.x_token = x.strides[0];
  p.x_channel = x.strides[1];
  p.weight = static_cast<const std::byte*>(b->weight.raw());
  p.bias = static_cast<const std::byte*>(b->bias.raw());
  p.state_in = state.present() ? static_cast<const std::byte*>(b->state_in.raw()) : nullptr;
  p.xh = reinterpret_cast<std::byte*>(xh);
}

// The new conv states: each sequence's last K - 1 raw inputs, partly from its old conv state
// when it is shorter than K - 1. Increasing rows, so an in-place update reads before it writes.
template <class Real>
void write_final_conv_state(const TensorView& x, const TensorView& state,
                            const std::vector<Sequence>& seqs, std::int64_t taps,
                            const MutableTensorView& out) {
  if (!out.present()) return;
  const std::int64_t k = taps, d = x.sizes[1];
  for (std::size_t s = 0; s < seqs.size(); ++s) {
    const Sequence& seq = seqs[s];
    const auto q = static_cast<std::int64_t>(s);
    for (std::int64_t r = 0; r + 1 < k; ++r) {
      const std::int64_t j = seq.length - (k - 1) + r;
      for (std::int64_t c = 0; c < d; ++c) {
        const Real v = j >= 0            ? read_at<Real>(x, seq.start + j, c)
                       : state.present() ? read_at<Real>(state, q, k - 1 + j, c)
                                         : Real{0};
        write_at<Real>(out, v, q, r, c);
      }
    }
  }
}

// The conv backward's inputs besides the forward's: dxh [T][D] (contiguous, Real) and the
// final state's cotangent (a caller's view, copied), and its outputs: dx written by the
// kernel into the caller's view, d weight and d bias into buffers (`grads`), d initial state
// into a buffer when wanted.
struct ConvGradBuffers {
  Tensor d_state_out, d_state_in, dweight, dbias;
};
template <class Real>
void prepare_conv_backward(const TensorView& d_state_out, const MutableTensorView& dx,
                           bool want_d_state, const Real* dxh, ConvBuffers* b,
                           ConvGradBuffers* grads) {
  ConvProblem& p = b->problem;
  const std::int64_t n = p.num_seqs, k = p.taps, d = p.channels;
  if (d_state_out.present()) {
    grads->d_state_out = Tensor(p.dtype, {n, k - 1, d});
    Real* s = static_cast<Real*>(grads->d_state_out.raw());
    for (std::int64_t q = 0; q < n; ++q) {
      for (std::int64_t r = 0; r + 1 < k; ++r) {
        for (std::int64_t c = 0; c < d; ++c)
          s[(q * (k - 1) + r) * d + c] = read_at<Real>(d_state_out, q, r, c);
      }
    }
    p.d_state_out = static_cast<const std::byte*>(grads->d_state_out.raw());
  }
  if (want_d_state) {
    grads->d_state_in = Tensor(p.dtype, {n, k - 1, d});
    p.d_state_in = static_cast<std::byte*>(grads->d_state_in.raw());
  }
  grads->dweight = Tensor(p.dtype, {k, p.cpad});
  grads->dbias = Tensor(p.dtype, {p.cpad});
  p.dxh = reinterpret_cast<const std::byte*>(dxh);
  p.dx = static_cast<std::byte*>(dx.data);
  p.dx_token = dx.strides[0];
  p.dx_channel = dx.strides[1];
  p.dweight = static_cast<std::byte*>(grads->dweight.raw());
  p.dbias = static_cast<std::byte*>(grads->dbias.raw());
}

// d weight (the layout of the weight, [D, K] or [D, 1, K]), d bias and d initial state from
// the kernel's buffers into the caller's views (each optional but d weight).
template <class Real>
void write_conv_gradients(const ConvProblem& p, const ConvGradBuffers& grads,
                          const MutableTensorView& d_weight, const MutableTensorView& d_bias,
                          const MutableTensorView& d_state) {
  const std::int64_t d = p.channels, k = p.taps, n = p.num_seqs;
  const Real* dw = static_cast<const Real*>(grads.dweight.raw());
  const Real* db = static_cast<const Real*>(grads.dbias.raw());
  for (std::int64_t c = 0; c < d; ++c) {
    for (std::int64_t i = 0; i < k; ++i) {
      if (d_weight.rank == 2) {
        write_at<Real>(d_weight, dw[i * p.cpad + c], c, i);
      } else {
        write_at<Real>(d_weight, dw[i * p.cpad + c], c, 0, i);
      }
    }
    if (d_bias.present()) write_at<Real>(d_bias, db[c], c);
  }
  if (!d_state.present()) return;
  const Real* s = static_cast<const Real*>(grads.d_state_in.raw());
  for (std::int64_t q = 0; q < n; ++q) {
    for (std::int64_t r = 0; r + 1 < k; ++r) {
      for (std::int64_t c = 0; c < d; ++c)
        write_at<Real>(d_state, s[(q * (k - 1) + r) * d + c], q, r, c);
    }
  }
}

}  // namespace gdn::detail
