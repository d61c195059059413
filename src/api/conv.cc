// conv.cc: the conv op on the CPU (gdn/conv.h): validate once, then the layer op's conv
// kernels (src/cpu/conv1d-inl.h) with or without the SiLU. The kernels write and read
// contiguous rows of the compute dtype; a float32 / float64 out or d_out in that layout is
// used in place, any other layout or a 16-bit dtype goes through one T x D buffer.
#include "gdn/conv.h"

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
  if (!direct) {
    const Real* xh = static_cast<const Real*>(b.xh.raw());
    for (std::int64_t t = 0; t < v.tokens; ++t) {
      for (std::int64_t c = 0; c < v.channels; ++c)
        detail::write_at<Real>(out.out, xh[t * v.channels + c], t, c);
    }
  }
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
    Real* to = static_cast<Real*>(dxh.raw());
    for (std::int64_t t = 0; t < v.tokens; ++t) {
      for (std::int64_t c = 0; c < v.channels; ++c)
        to[t * v.channels + c] = detail::read_at<Real>(in.d_out, t, c);
    }
    dxh_rows = to;
  }
  detail::ConvGradBuffers grads;
  detail::prepare_conv_backward<Real>(in.d_final_state, out.d_x, out.d_initial_state.present(),
                                      dxh_rows, &b, &grads);
  cpu::conv_backward(b.problem, options.isa, options.threads);
  detail::write_conv_gradients<Real>(b.problem, grads, out.d_weight, out.d_bias,
                                     out.d_initial_state);
}

}  // namespace

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
