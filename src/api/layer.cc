// layer.cc: the fused layer op on the CPU: validate once, then
//   conv1d + SiLU (src/cpu/conv1d-inl.h) into xh [T, D], the gates into g and beta [T, Hv],
//   the gated delta rule on views of xh (q, k L2-normalised in the kernel),
// and for the backward the same recomputation, the gated delta rule's backward into dxh, the
// gates' backward and the conv's backward. Temporaries are the compute dtype; xh and dxh cost
// T x D of it each (docs/perf.md).
#include "gdn/layer.h"

#include <cmath>
#include <cstring>

#include "api/layer_parts.h"
#include "api/validate.h"
#include "cpu/float_env.h"
#include "cpu/layer.h"
#include "reference/reference.h"

namespace gdn {
namespace {

// Element i0 (, i1 (, i2)) of a view of any float dtype, as Real; and written from Real.
template <class View>
std::int64_t offset_of(const View& v, std::int64_t i0, std::int64_t i1, std::int64_t i2) {
  return i0 * v.strides[0] + (v.rank > 1 ? i1 * v.strides[1] : 0) +
         (v.rank > 2 ? i2 * v.strides[2] : 0);
}
template <class Real>
Real read(const TensorView& v, std::int64_t i0, std::int64_t i1 = 0, std::int64_t i2 = 0) {
  return detail::element<Real>(v, offset_of(v, i0, i1, i2));
}
template <class Real>
void write(const MutableTensorView& v, Real value, std::int64_t i0, std::int64_t i1 = 0,
           std::int64_t i2 = 0) {
  detail::store_element<Real>(v, offset_of(v, i0, i1, i2), value);
}

// A 16-bit [T, C] view as a float32 copy (the gated delta rule on the conv's float32 output
// takes float32 cotangents).
Tensor widened(const TensorView& v) {
  Tensor t(DType::f32, {v.sizes[0], v.sizes[1]});
  float* to = t.data<float>();
  for (std::int64_t i = 0; i < v.sizes[0]; ++i) {
    for (std::int64_t c = 0; c < v.sizes[1]; ++c) to[i * v.sizes[1] + c] = read<float>(v, i, c);
  }
  return t;
}

TensorView view(const Tensor& t, std::int64_t offset, std::initializer_list<std::int64_t> sizes,
                std::initializer_list<std::int64_t> strides) {
  Dims s{}, st{};
  int rank = 0;
  for (std::int64_t x : sizes) s[rank++] = x;
  rank = 0;
  for (std::int64_t x : strides) st[rank++] = x;
  return TensorView(static_cast<const char*>(t.raw()) + offset * dtype_size(t.dtype()), t.dtype(),
                    rank, s, st);
}
MutableTensorView mutable_view(Tensor& t, std::int64_t offset,
                               std::initializer_list<std::int64_t> sizes,
                               std::initializer_list<std::int64_t> strides) {
  const TensorView v = view(t, offset, sizes, strides);
  return MutableTensorView(const_cast<void*>(v.data), v.dtype, v.rank, v.sizes, v.strides);
}

// out [T, Hv Dv] (any strides) seen as the core op's [T, Hv, Dv].
template <class View>
View heads_view(const View& v, std::int64_t hv, std::int64_t dv) {
  Dims sizes{v.sizes[0], hv, dv, 0}, strides{v.strides[0], dv * v.strides[1], v.strides[1], 0};
  return View(v.data, v.dtype, 3, sizes, strides);
}

// The compute-dtype temporaries of one call.
struct Work {
  Tensor weight, bias, state_in, xh, g, beta;
  detail::ConvProblem conv;
};

template <class Real>
void prepare(const LayerInputs& in, const LayerOptions& options, const detail::ValidatedLayer& v,
             Work& w) {
  const std::int64_t k = v.taps, d = v.channels, cpad = (d + 15) / 16 * 16;
  const std::int64_t n = v.core.num_seqs, t_count = v.tokens, hv = options.hv;
  w.weight = Tensor(v.compute_dtype, {k, cpad});
  w.bias = Tensor(v.compute_dtype, {cpad});
  detail::conv_parameters(in.conv_weight, in.conv_bias, k, d, cpad,
                          static_cast<Real*>(w.weight.raw()), static_cast<Real*>(w.bias.raw()));
  if (in.conv_state.present()) {
    w.state_in = Tensor(v.compute_dtype, {n, k - 1, d});
    Real* s = static_cast<Real*>(w.state_in.raw());
    for (std::int64_t q = 0; q < n; ++q) {
      for (std::int64_t r = 0; r + 1 < k; ++r) {
        for (std::int64_t c = 0; c < d; ++c)
          s[(q * (k - 1) + r) * d + c] = read<Real>(in.conv_state, q, r, c);
      }
    }
  }
  w.xh = Tensor(v.compute_dtype, {t_count, d});
  w.g = Tensor(v.compute_dtype, {t_count, hv});
  w.beta = Tensor(v.compute_dtype, {t_count, hv});
  detail::ConvProblem& p = w.conv;
  p.tokens = t_count;
  p.channels = d;
  p.taps = k;
  p.cpad = cpad;
  p.num_seqs = n;
  p.seqs = v.sequences.data();
  p.dtype = v.compute_dtype;
  p.x_dtype = v.dtype;
  p.x = static_cast<const std::byte*>(in.qkv.data);
  p.x_token = in.qkv.strides[0];
  p.x_channel = in.qkv.strides[1];
  p.weight = static_cast<const std::byte*>(w.weight.raw());
  p.bias = static_cast<const std::byte*>(w.bias.raw());
  p.state_in = in.conv_state.present() ? static_cast<const std::byte*>(w.state_in.raw()) : nullptr;
  p.xh = static_cast<std::byte*>(w.xh.raw());
  detail::layer_gates(in.a, in.b, in.A_log, in.dt_bias, t_count, hv, static_cast<Real*>(w.g.raw()),
                      static_cast<Real*>(w.beta.raw()));
}

// The gated delta rule's inputs: views of xh, g and beta.
ForwardInputs core_inputs(const LayerInputs& in, const LayerOptions& o, const Work& w) {
  const std::int64_t t = w.xh.size(0), d = w.xh.size(1), qk = o.hk * o.dk;
  return {view(w.xh, 0, {t, o.hk, o.dk}, {d, o.dk, 1}),
          view(w.xh, qk, {t, o.hk, o.dk}, {d, o.dk, 1}),
          view(w.xh, 2 * qk, {t, o.hv, o.dv}, {d, o.dv, 1}),
          w.g.view(),
          w.beta.view(),
          in.recurrent_state,
          in.cu_seqlens};
}

ForwardOptions core_options(const LayerOptions& o) {
  ForwardOptions f;
  f.use_qk_l2norm = true;
  f.chunk_size = o.chunk_size;
  f.threads = o.threads;
  f.isa = o.isa;
  f.matmul_precision = o.matmul_precision;
  return f;
}

// The new conv states: each sequence's last K - 1 raw inputs, partly from its old conv state
// when it is shorter than K - 1. Increasing rows, so an in-place update reads before it writes.
template <class Real>
void write_conv_state(const LayerInputs& in, const detail::ValidatedLayer& v,
                      const MutableTensorView& out) {
  if (!out.present()) return;
  const std::int64_t k = v.taps, d = v.channels;
  for (std::size_t s = 0; s < v.sequences.size(); ++s) {
    const detail::Sequence& seq = v.sequences[s];
    for (std::int64_t r = 0; r + 1 < k; ++r) {
      const std::int64_t j = seq.length - (k - 1) + r;
      for (std::int64_t c = 0; c < d; ++c) {
        const Real x = j >= 0 ? read<Real>(in.qkv, seq.start + j, c)
                       : in.conv_state.present()
                           ? read<Real>(in.conv_state, static_cast<std::int64_t>(s), k - 1 + j, c)
                           : Real{0};
        write<Real>(out, x, static_cast<std::int64_t>(s), r, c);
      }
    }
  }
}

template <class Real>
void layer_forward(const LayerInputs& in, const LayerOutputs& out, const LayerOptions& options,
                   const detail::ValidatedLayer& v) {
  Work w;
  prepare<Real>(in, options, v, w);
  cpu::conv_forward(w.conv, options.isa, options.threads);
  // 16-bit activations: the gated delta rule writes float32 (its inputs are the conv's float32
  // output), rounded into out once.
  const bool narrow = v.dtype != v.compute_dtype;
  Tensor out32 = narrow ? Tensor(v.compute_dtype, {v.tokens, options.hv * options.dv}) : Tensor{};
  const MutableTensorView core_out = narrow ? out32.mutable_view() : out.out;
  chunk_gated_delta_rule_fwd(core_inputs(in, options, w),
                             {heads_view(core_out, options.hv, options.dv), out.recurrent_state_out,
                              out.chunk_states, out.t_inv},
                             core_options(options));
  if (narrow) {
    const Real* o = static_cast<const Real*>(out32.raw());
    const std::int64_t width = options.hv * options.dv;
    for (std::int64_t t = 0; t < v.tokens; ++t) {
      for (std::int64_t c = 0; c < width; ++c) write<Real>(out.out, o[t * width + c], t, c);
    }
  }
  write_conv_state<Real>(in, v, out.conv_state_out);
}

template <class Real>
void layer_backward(const LayerBackwardInputs& in, const LayerBackwardOutputs& out,
                    const LayerOptions& options, const detail::ValidatedLayer& v) {
  const LayerInputs& f = in.forward;
  const std::int64_t t_count = v.tokens, d = v.channels, k = v.taps, hv = options.hv;
  const std::int64_t n = v.core.num_seqs, qk = options.hk * options.dk;
  Work w;
  prepare<Real>(f, options, v, w);
  cpu::conv_forward(w.conv, options.isa, options.threads);

  // The gated delta rule's backward, into dxh (dq, dk, dv are views of it), dg and dbeta.
  const DType cd = v.compute_dtype;
  Tensor dxh(cd, {t_count, d}), dg(cd, {t_count, hv}), dbeta(cd, {t_count, hv});
  const ForwardInputs core = core_inputs(f, options, w);
  BackwardInputs bin = BackwardInputs::from(core);
  const Tensor d_out32 = v.dtype != cd ? widened(in.d_out) : Tensor{};
  bin.d_o = heads_view(v.dtype != cd ? d_out32.view() : in.d_out, hv, options.dv);
  bin.d_final_state = in.d_recurrent_state_out;
  bin.chunk_states = in.chunk_states;
  bin.t_inv = in.t_inv;
  chunk_gated_delta_rule_bwd(
      bin,
      {mutable_view(dxh, 0, {t_count, options.hk, options.dk}, {d, options.dk, 1}),
       mutable_view(dxh, qk, {t_count, options.hk, options.dk}, {d, options.dk, 1}),
       mutable_view(dxh, 2 * qk, {t_count, hv, options.dv}, {d, options.dv, 1}), dg.mutable_view(),
       dbeta.mutable_view(), out.d_recurrent_state},
      core_options(options));

  // The gates' backward; the sums over tokens in token order.
  const Real* g = static_cast<const Real*>(w.g.raw());
  const Real* beta = static_cast<const Real*>(w.beta.raw());
  const Real* dgp = static_cast<const Real*>(dg.raw());
  const Real* dbp = static_cast<const Real*>(dbeta.raw());
  for (std::int64_t h = 0; h < hv; ++h) {
    const Real a_scale = std::exp(read<Real>(f.A_log, h)), bias_h = read<Real>(f.dt_bias, h);
    Real d_a_log = 0, d_dt_bias = 0;
    for (std::int64_t t = 0; t < t_count; ++t) {
      const std::int64_t e = t * hv + h;
      const Real z = read<Real>(f.a, t, h) + bias_h;
      const Real dz = dgp[e] * -a_scale / (1 + std::exp(-z));  // d softplus = sigmoid
      write<Real>(out.d_a, dz, t, h);
      d_dt_bias += dz;
      d_a_log += dgp[e] * g[e];  // dg/dA_log = g
      write<Real>(out.d_b, dbp[e] * beta[e] * (1 - beta[e]), t, h);
    }
    write<Real>(out.d_A_log, d_a_log, h);
    write<Real>(out.d_dt_bias, d_dt_bias, h);
  }

  // The conv's backward.
  Tensor d_state_out, d_state_in, dweight(cd, {k, w.conv.cpad}), dbias(cd, {w.conv.cpad});
  detail::ConvProblem& p = w.conv;
  if (in.d_conv_state_out.present()) {
    d_state_out = Tensor(cd, {n, k - 1, d});
    Real* s = static_cast<Real*>(d_state_out.raw());
    for (std::int64_t q = 0; q < n; ++q) {
      for (std::int64_t r = 0; r + 1 < k; ++r) {
        for (std::int64_t c = 0; c < d; ++c)
          s[(q * (k - 1) + r) * d + c] = read<Real>(in.d_conv_state_out, q, r, c);
      }
    }
    p.d_state_out = static_cast<const std::byte*>(d_state_out.raw());
  }
  if (out.d_conv_state.present()) {
    d_state_in = Tensor(cd, {n, k - 1, d});
    p.d_state_in = static_cast<std::byte*>(d_state_in.raw());
  }
  p.dxh = static_cast<const std::byte*>(dxh.raw());
  p.dx = static_cast<std::byte*>(out.d_qkv.data);
  p.dx_token = out.d_qkv.strides[0];
  p.dx_channel = out.d_qkv.strides[1];
  p.dweight = static_cast<std::byte*>(dweight.raw());
  p.dbias = static_cast<std::byte*>(dbias.raw());
  cpu::conv_backward(p, options.isa, options.threads);
  const Real* dw = static_cast<const Real*>(dweight.raw());
  const Real* db = static_cast<const Real*>(dbias.raw());
  for (std::int64_t c = 0; c < d; ++c) {
    for (std::int64_t i = 0; i < k; ++i) {
      if (out.d_conv_weight.rank == 2) {
        write<Real>(out.d_conv_weight, dw[i * p.cpad + c], c, i);
      } else {
        write<Real>(out.d_conv_weight, dw[i * p.cpad + c], c, 0, i);
      }
    }
    if (out.d_conv_bias.present()) write<Real>(out.d_conv_bias, db[c], c);
  }
  if (out.d_conv_state.present()) {
    const Real* s = static_cast<const Real*>(d_state_in.raw());
    for (std::int64_t q = 0; q < n; ++q) {
      for (std::int64_t r = 0; r + 1 < k; ++r) {
        for (std::int64_t c = 0; c < d; ++c)
          write<Real>(out.d_conv_state, s[(q * (k - 1) + r) * d + c], q, r, c);
      }
    }
  }
}

}  // namespace

ForwardShape fused_gdn_shape(const LayerInputs& inputs, const LayerOptions& options) {
  detail::ValidatedLayer v;
  detail::validate_layer_inputs(inputs, options, &v);
  return v.core;
}

void fused_gdn_fwd(const LayerInputs& inputs, const LayerOutputs& outputs,
                   const LayerOptions& options) {
  detail::ValidatedLayer v;
  detail::validate_layer_forward(inputs, outputs, options, detail::OutputPrecision::native, &v);
  const cpu::SubnormalsAsZero mode;
  if (v.dtype == DType::f64) {
    layer_forward<double>(inputs, outputs, options, v);
  } else {
    layer_forward<float>(inputs, outputs, options, v);
  }
}

LayerForwardResult fused_gdn_fwd(const LayerInputs& inputs, const LayerOptions& options,
                                 Residuals residuals) {
  detail::ValidatedLayer v;
  detail::validate_layer_inputs(inputs, options, &v);
  LayerForwardResult r;
  const DType c = v.compute_dtype;
  r.out = Tensor(v.dtype, {v.tokens, options.hv * options.dv});
  r.conv_state_out = Tensor(c, {v.core.num_seqs, v.taps - 1, v.channels});
  r.recurrent_state_out = Tensor(c, 4, v.core.state_sizes());
  if (residuals == Residuals::all) r.chunk_states = Tensor(c, 4, v.core.chunk_states_sizes());
  if (residuals != Residuals::none) r.t_inv = Tensor(c, 4, v.core.t_inv_sizes());
  fused_gdn_fwd(
      inputs,
      {r.out.mutable_view(), r.conv_state_out.mutable_view(), r.recurrent_state_out.mutable_view(),
       r.chunk_states.mutable_view(), r.t_inv.mutable_view()},
      options);
  return r;
}

void fused_gdn_bwd(const LayerBackwardInputs& inputs, const LayerBackwardOutputs& outputs,
                   const LayerOptions& options) {
  detail::ValidatedLayer v;
  detail::validate_layer_backward(inputs, outputs, options, detail::OutputPrecision::native, &v);
  const cpu::SubnormalsAsZero mode;
  if (v.dtype == DType::f64) {
    layer_backward<double>(inputs, outputs, options, v);
  } else {
    layer_backward<float>(inputs, outputs, options, v);
  }
}

namespace detail {

LayerBackwardResult allocate_layer_grads(const LayerInputs& in, const ValidatedLayer& v,
                                         const LayerOptions& options, DType dtype) {
  // Activation gradients in `dtype`, the rest in its compute dtype (float64 stays float64).
  const DType c = dtype == DType::f64 ? dtype : v.compute_dtype;
  LayerBackwardResult r;
  r.d_qkv = Tensor(dtype, 2, in.qkv.sizes);
  r.d_a = Tensor(dtype, 2, in.a.sizes);
  r.d_b = Tensor(dtype, 2, in.b.sizes);
  r.d_conv_weight = Tensor(c, in.conv_weight.rank, in.conv_weight.sizes);
  if (in.conv_bias.present()) r.d_conv_bias = Tensor(c, {v.channels});
  r.d_A_log = Tensor(c, {options.hv});
  r.d_dt_bias = Tensor(c, {options.hv});
  r.d_conv_state = Tensor(c, {v.core.num_seqs, v.taps - 1, v.channels});
  r.d_recurrent_state = Tensor(c, 4, v.core.state_sizes());
  return r;
}

LayerBackwardOutputs outputs_of(LayerBackwardResult& r) {
  return {r.d_qkv.mutable_view(),
          r.d_a.mutable_view(),
          r.d_b.mutable_view(),
          r.d_conv_weight.mutable_view(),
          r.d_conv_bias.mutable_view(),
          r.d_A_log.mutable_view(),
          r.d_dt_bias.mutable_view(),
          r.d_conv_state.mutable_view(),
          r.d_recurrent_state.mutable_view()};
}

}  // namespace detail

LayerBackwardResult fused_gdn_bwd(const LayerBackwardInputs& inputs, const LayerOptions& options) {
  detail::ValidatedLayer v;
  detail::validate_layer_inputs(inputs.forward, options, &v);
  LayerBackwardResult r = detail::allocate_layer_grads(inputs.forward, v, options, v.dtype);
  fused_gdn_bwd(inputs, detail::outputs_of(r), options);
  return r;
}

}  // namespace gdn
