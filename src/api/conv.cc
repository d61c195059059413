// conv.cc: the conv op on the CPU (gdn/conv.h): validate once, then the layer op's conv
// kernels (src/cpu/conv1d-inl.h) with or without the SiLU. The kernels write and read
// contiguous rows of the compute dtype; a float32 / float64 out or d_out in that layout is
// used in place, any other layout or a 16-bit dtype goes through one T x D buffer.
#include "gdn/conv.h"

#include <algorithm>
#include <cstring>

#include "api/conv_parts.h"
#include "api/validate.h"
#include "cpu/float_env.h"
#include "cpu/layer.h"
#include "reference/reference.h"

namespace gdn {
namespace {

bool contiguous_rows(const TensorView& v, DType dtype) {
  return v.dtype == dtype && v.strides[1] == 1 && (v.sizes[0] <= 1 || v.strides[0] == v.sizes[1]);
}

// A [T, D] view to contiguous rows of Real, and back, in square tiles, so that a transposed
// layout (the causal-conv1d package's [D, T], token stride 1) is read a cache line at a time:
// a backward whose d_out has that layout took 1168 ms element by element and 455 ms tiled at
// 8k tokens x 8192 channels (contiguous d_out: 115 ms; torch's own transposed copy of d_out:
// 200-560 ms, same host, 2026-12-03).
constexpr std::int64_t kTile = 16;
template <class Tile>
void for_each_tile(std::int64_t t_count, std::int64_t d, const Tile& tile) {
  for (std::int64_t t0 = 0; t0 < t_count; t0 += kTile) {
    for (std::int64_t c0 = 0; c0 < d; c0 += kTile)
      tile(t0, std::min(t0 + kTile, t_count), c0, std::min(c0 + kTile, d));
  }
}
template <class Real>
void to_rows(const TensorView& v, Real* rows) {
  const std::int64_t d = v.sizes[1], st = v.strides[0], sc = v.strides[1];
  const bool same = v.dtype == (sizeof(Real) == 8 ? DType::f64 : DType::f32);
  for_each_tile(v.sizes[0], d,
                [&](std::int64_t t0, std::int64_t t1, std::int64_t c0, std::int64_t c1) {
                  for (std::int64_t c = c0; c < c1; ++c) {
                    if (same) {  // no per-element dtype dispatch
                      const Real* src = static_cast<const Real*>(v.data) + c * sc;
                      for (std::int64_t t = t0; t < t1; ++t) rows[t * d + c] = src[t * st];
                    } else {
                      for (std::int64_t t = t0; t < t1; ++t)
                        rows[t * d + c] = detail::read_at<Real>(v, t, c);
                    }
                  }
                });
}
template <class Real>
void from_rows(const Real* rows, const MutableTensorView& v) {
  const std::int64_t d = v.sizes[1], st = v.strides[0], sc = v.strides[1];
  const bool same = v.dtype == (sizeof(Real) == 8 ? DType::f64 : DType::f32);
  for_each_tile(v.sizes[0], d,
                [&](std::int64_t t0, std::int64_t t1, std::int64_t c0, std::int64_t c1) {
                  for (std::int64_t c = c0; c < c1; ++c) {
                    if (same) {
                      Real* dst = static_cast<Real*>(v.data) + c * sc;
                      for (std::int64_t t = t0; t < t1; ++t) dst[t * st] = rows[t * d + c];
                    } else {
                      for (std::int64_t t = t0; t < t1; ++t)
                        detail::write_at<Real>(v, rows[t * d + c], t, c);
                    }
                  }
                });
}

template <class Real>
void conv_forward(const ConvInputs& in, const ConvOutputs& out, const ConvOptions& options,
                  const detail::ValidatedConv& v) {
  const bool direct = contiguous_rows(out.out, v.compute_dtype);
  detail::ConvBuffers b;
  detail::prepare_conv<Real>(in.x, in.weight, in.bias, in.initial_state, v.sequences, v.taps,
                             v.compute_dtype, true,
                             direct ? static_cast<Real*>(out.out.data) : nullptr, &b);
  b.problem.silu = options.activation == ConvActivation::silu;
  cpu::conv_forward(b.problem, options.isa, options.threads);
  if (!direct) from_rows<Real>(static_cast<const Real*>(b.xh.raw()), out.out);
  detail::write_final_conv_state<Real>(in.x, in.initial_state, v.sequences, v.taps,
                                       out.final_state);
}

template <class Real>
void conv_backward(const ConvBackwardInputs& in, const ConvBackwardOutputs& out,
                   const ConvOptions& options, const detail::ValidatedConv& v) {
  const ConvInputs& f = in.forward;
  detail::ConvBuffers b;
  detail::prepare_conv<Real>(f.x, f.weight, f.bias, f.initial_state, v.sequences, v.taps,
                             v.compute_dtype, false, nullptr, &b);
  b.problem.silu = options.activation == ConvActivation::silu;
  Tensor dxh;
  const Real* dxh_rows = static_cast<const Real*>(in.d_out.data);
  if (!contiguous_rows(in.d_out, v.compute_dtype)) {
    dxh = Tensor(v.compute_dtype, {v.tokens, v.channels});
    to_rows<Real>(in.d_out, static_cast<Real*>(dxh.raw()));
    dxh_rows = static_cast<const Real*>(dxh.raw());
  }
  detail::ConvGradBuffers grads;
  detail::prepare_conv_backward<Real>(in.d_final_state, out.d_x, out.d_initial_state.present(),
                                      dxh_rows, &b, &grads);
  cpu::conv_backward(b.problem, options.isa, options.threads);
  detail::write_conv_gradients<Real>(b.problem, grads, out.d_weight, out.d_bias,
                                     out.d_initial_state);
}

// conv_update (gdn/conv.h): the conv from each slot's last K - 1 inputs, then the slots
// shifted in place. A channel-last pool of the compute dtype is read by the kernel where it lies
// (its slots as state blocks, slot_stride apart); any other pool's last K - 1 rows per sequence
// are widened into a small buffer first. The conv reads every history before any slot is
// written.
template <class Real>
void conv_update_cpu(const ConvUpdateInputs& in, const MutableTensorView& pool,
                     const MutableTensorView& out, const ConvOptions& options,
                     const detail::ValidatedConvUpdate& u) {
  const detail::ValidatedConv& v = u.conv;
  const std::int64_t k = v.taps, d = v.channels, rows = u.rows;
  const auto n = static_cast<std::int64_t>(v.sequences.size());
  const bool direct = contiguous_rows(out, v.compute_dtype);
  detail::ConvBuffers b;
  detail::prepare_conv<Real>(in.x, in.weight, in.bias, TensorView{}, v.sequences, k,
                             v.compute_dtype, true, direct ? static_cast<Real*>(out.data) : nullptr,
                             &b);
  b.problem.silu = options.activation == ConvActivation::silu;
  const auto elem = static_cast<std::int64_t>(dtype_size(pool.dtype));
  auto* base = static_cast<std::byte*>(pool.data);
  const bool in_place = pool.dtype == v.compute_dtype && u.channel_stride == 1;
  Tensor history;
  if (k > 1 && in_place) {
    b.problem.state_in = base + (rows - (k - 1)) * d * elem;
    b.problem.state_block = u.slots.data();
    b.problem.state_stride = u.slot_stride;
  } else if (k > 1) {
    history = Tensor(v.compute_dtype, {n, k - 1, d});
    Real* h = static_cast<Real*>(history.raw());
    for (std::int64_t s = 0; s < n; ++s) {
      for (std::int64_t r = 0; r + 1 < k; ++r) {
        const std::int64_t at = u.slots[s] * u.slot_stride + (rows - (k - 1) + r) * u.row_stride;
        for (std::int64_t c = 0; c < d; ++c)
          h[(s * (k - 1) + r) * d + c] = detail::element<Real>(pool, at + c * u.channel_stride);
      }
    }
    b.problem.state_in = static_cast<const std::byte*>(history.raw());
  }
  cpu::conv_forward(b.problem, options.isa, options.threads);
  if (!direct) from_rows<Real>(static_cast<const Real*>(b.xh.raw()), out);
  // Row r of a slot becomes input L - S + r of its sequence: a new token, or the old row r + L
  // (rows in increasing order, so each old row is read before it is written).
  const bool pool_rows = u.channel_stride == 1;
  const bool x_rows = pool_rows && in.x.strides[1] == 1 && in.x.dtype == pool.dtype;
  for (std::int64_t s = 0; s < n; ++s) {
    const detail::Sequence& seq = v.sequences[static_cast<std::size_t>(s)];
    const std::int64_t len = seq.length, slot = u.slots[s] * u.slot_stride;
    if (len == 0) continue;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t j = len - rows + r, to = slot + r * u.row_stride;
      if (j < 0) {
        const std::int64_t from = slot + (r + len) * u.row_stride;
        if (pool_rows) {
          std::memmove(base + to * elem, base + from * elem, static_cast<std::size_t>(d * elem));
        } else {
          for (std::int64_t c = 0; c < d; ++c) {
            std::memcpy(base + (to + c * u.channel_stride) * elem,
                        base + (from + c * u.channel_stride) * elem,
                        static_cast<std::size_t>(elem));
          }
        }
      } else if (x_rows) {
        std::memcpy(
            base + to * elem,
            static_cast<const std::byte*>(in.x.data) + (seq.start + j) * in.x.strides[0] * elem,
            static_cast<std::size_t>(d * elem));
      } else {
        for (std::int64_t c = 0; c < d; ++c) {
          detail::store_element<Real>(pool, to + c * u.channel_stride,
                                      detail::read_at<Real>(in.x, seq.start + j, c));
        }
      }
    }
  }
}

}  // namespace

void conv_update(const ConvUpdateInputs& inputs, const MutableTensorView& conv_state,
                 const MutableTensorView& out, const ConvOptions& options) {
  detail::ValidatedConvUpdate u;
  detail::validate_conv_update(inputs, conv_state, out, options, &u);
  const cpu::SubnormalsAsZero mode;
  if (u.conv.compute_dtype == DType::f64) {
    conv_update_cpu<double>(inputs, conv_state, out, options, u);
  } else {
    conv_update_cpu<float>(inputs, conv_state, out, options, u);
  }
}

void causal_conv1d_fwd(const ConvInputs& inputs, const ConvOutputs& outputs,
                       const ConvOptions& options) {
  detail::ValidatedConv v;
  detail::validate_conv_forward(inputs, outputs, options, detail::OutputPrecision::native, &v);
  const cpu::SubnormalsAsZero mode;
  if (v.compute_dtype == DType::f64) {
    conv_forward<double>(inputs, outputs, options, v);
  } else {
    conv_forward<float>(inputs, outputs, options, v);
  }
}

ConvForwardResult causal_conv1d_fwd(const ConvInputs& inputs, const ConvOptions& options) {
  detail::ValidatedConv v;
  detail::validate_conv_inputs(inputs, options, &v);
  ConvForwardResult r;
  r.out = Tensor(v.dtype, {v.tokens, v.channels});
  r.final_state = Tensor(v.compute_dtype,
                         {static_cast<std::int64_t>(v.sequences.size()), v.taps - 1, v.channels});
  causal_conv1d_fwd(inputs, {r.out.mutable_view(), r.final_state.mutable_view()}, options);
  return r;
}

void causal_conv1d_bwd(const ConvBackwardInputs& inputs, const ConvBackwardOutputs& outputs,
                       const ConvOptions& options) {
  detail::ValidatedConv v;
  detail::validate_conv_backward(inputs, outputs, options, detail::OutputPrecision::native, &v);
  const cpu::SubnormalsAsZero mode;
  if (v.compute_dtype == DType::f64) {
    conv_backward<double>(inputs, outputs, options, v);
  } else {
    conv_backward<float>(inputs, outputs, options, v);
  }
}

namespace detail {

ConvBackwardResult allocate_conv_grads(const ConvInputs& in, const ValidatedConv& v, DType dtype) {
  // d_x in `dtype`, the rest in its compute dtype (float64 stays float64).
  const DType c = dtype == DType::f64 ? dtype : v.compute_dtype;
  ConvBackwardResult r;
  r.d_x = Tensor(dtype, {v.tokens, v.channels});
  r.d_weight = Tensor(c, in.weight.rank, in.weight.sizes);
  if (in.bias.present()) r.d_bias = Tensor(c, {v.channels});
  r.d_initial_state =
      Tensor(c, {static_cast<std::int64_t>(v.sequences.size()), v.taps - 1, v.channels});
  return r;
}

}  // namespace detail

ConvBackwardResult causal_conv1d_bwd(const ConvBackwardInputs& inputs, const ConvOptions& options) {
  detail::ValidatedConv v;
  detail::validate_conv_inputs(inputs.forward, options, &v);
  ConvBackwardResult r = detail::allocate_conv_grads(inputs.forward, v, v.dtype);
  causal_conv1d_bwd(inputs,
                    {r.d_x.mutable_view(), r.d_weight.mutable_view(), r.d_bias.mutable_view(),
                     r.d_initial_state.mutable_view()},
                    options);
  return r;
}

}  // namespace gdn
