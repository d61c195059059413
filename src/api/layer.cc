// layer.cc: the fused layer op on the CPU: validate once, then
//   forward: the gates into g and beta [T, Hv], and the gated delta rule on column views of
//     qkv with the conv1d + SiLU fused into its packing (ForwardProblem::conv: each chunk's
//     q, k and v rows computed from qkv as they are packed, src/cpu/conv1d-inl.h:
//     conv_head_rows; q, k L2-normalised in the kernel), out written by it in any activation
//     dtype: no [T, D] temporary (docs/memory.md, docs/perf_layer.md);
//   backward: conv1d + SiLU (src/cpu/conv1d-inl.h) into xh [T, D], the gates, the gated delta
//     rule's backward on views of xh into dxh, the gates' backward and the conv's backward.
// Temporaries are the compute dtype; xh and dxh of the backward cost T x D of it each
// (docs/perf.md).
#include "gdn/layer.h"

#include <cmath>

#include "api/check_finite.h"
#include "api/conv_parts.h"
#include "api/layer_parts.h"
#include "api/validate.h"
#include "cpu/float_env.h"
#include "cpu/forward.h"
#include "cpu/layer.h"
#include "cpu/profile.h"
#include "gdn/runtime.h"
#include "reference/reference.h"

namespace gdn {
namespace {

template <class Real>
Real read(const TensorView& v, std::int64_t i0, std::int64_t i1 = 0, std::int64_t i2 = 0) {
  return detail::read_at<Real>(v, i0, i1, i2);
}
template <class Real>
void write(const MutableTensorView& v, Real value, std::int64_t i0, std::int64_t i1 = 0) {
  detail::write_at<Real>(v, value, i0, i1);
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
// An empty one (T = 0) may carry any strides (none is checked): its head stride is 0 then, not
// an overflowing dv * stride (found by fuzz/).
template <class View>
View heads_view(const View& v, std::int64_t hv, std::int64_t dv) {
  const std::int64_t head = v.sizes[0] == 0 ? 0 : dv * v.strides[1];
  Dims sizes{v.sizes[0], hv, dv, 0}, strides{v.strides[0], head, v.strides[1], 0};
  return View(v.data, v.dtype, 3, sizes, strides);
}

// The compute-dtype temporaries of one call.
struct Work {
  Tensor g, beta;
  detail::ConvBuffers conv;
};

// The conv's buffers and xh = SiLU(conv(qkv)), into `xh` (null: a buffer of w.conv).
template <class Real>
void run_conv(const LayerInputs& in, const LayerOptions& options, const detail::ValidatedLayer& v,
              Work& w, Real* xh = nullptr) {
  detail::prepare_conv<Real>(in.qkv, in.conv_weight, in.conv_bias, in.conv_state, v.sequences,
                             v.taps, v.compute_dtype, true, xh, &w.conv);
  cpu::conv_forward(w.conv.problem, options.isa, options.threads);
}

template <class Real>
void run_gates(const LayerInputs& in, const LayerOptions& options, const detail::ValidatedLayer& v,
               Work& w) {
  w.g = Tensor(v.compute_dtype, {v.tokens, options.hv});
  w.beta = Tensor(v.compute_dtype, {v.tokens, options.hv});
  detail::layer_gates(in.a, in.b, in.A_log, in.dt_bias, v.tokens, options.hv,
                      static_cast<Real*>(w.g.raw()), static_cast<Real*>(w.beta.raw()));
}

// The backward's gated delta rule inputs: views of the first t rows of xh, g and beta.
ForwardInputs core_inputs(const LayerInputs& in, const LayerOptions& o, const Tensor& xh,
                          std::int64_t t, const Work& w) {
  const std::int64_t d = xh.size(1), qk = o.hk * o.dk;
  return {view(xh, 0, {t, o.hk, o.dk}, {d, o.dk, 1}),
          view(xh, qk, {t, o.hk, o.dk}, {d, o.dk, 1}),
          view(xh, 2 * qk, {t, o.hv, o.dv}, {d, o.dv, 1}),
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

// The gated delta rule's inputs as the fused forward reads them: q, k and v the column views
// of qkv (the kernels compute the conv's output from them as they pack each chunk,
// ForwardProblem::conv), g and beta.
ForwardInputs fused_core_inputs(const LayerInputs& in, const LayerOptions& o, const Work& w) {
  const TensorView& x = in.qkv;
  const auto elem = static_cast<std::int64_t>(dtype_size(x.dtype));
  // An empty qkv may carry any strides (none is checked): no product of them is formed then.
  const std::int64_t channel = x.sizes[0] == 0 ? 0 : x.strides[1];
  auto columns = [&](std::int64_t first, std::int64_t heads, std::int64_t dim) {
    return TensorView(static_cast<const char*>(x.data) + first * channel * elem, x.dtype, 3,
                      Dims{x.sizes[0], heads, dim, 0},
                      Dims{x.strides[0], dim * channel, channel, 0});
  };
  const std::int64_t qk = o.hk * o.dk;
  return {columns(0, o.hk, o.dk),
          columns(qk, o.hk, o.dk),
          columns(2 * qk, o.hv, o.dv),
          w.g.view(),
          w.beta.view(),
          in.recurrent_state,
          in.cu_seqlens};
}

// The forward: the conv's parameters and states in the kernel's layout, the gates, then the
// gated delta rule over views of qkv with the conv fused into its packing, so that the conv's
// output (a [T, D] xh) is neither written nor read back and out, of any activation dtype, is
// written once by the kernels (docs/perf_layer.md); the new conv states.
template <class Real>
void layer_forward(const LayerInputs& in, const LayerOutputs& out, const LayerOptions& options,
                   const detail::ValidatedLayer& v) {
  cpu::StageLaps laps;
  Work w;
  detail::prepare_conv<Real>(in.qkv, in.conv_weight, in.conv_bias, in.conv_state, v.sequences,
                             v.taps, v.compute_dtype, false, nullptr, &w.conv);
  laps.lap(cpu::Stage::layer_conv);
  run_gates<Real>(in, options, v, w);
  laps.lap(cpu::Stage::layer_gates);
  // Without out the core writes only the states and residuals (gdn/forward.h), if any.
  if (out.out.present() || out.recurrent_state_out.present() || out.chunk_states.present() ||
      out.t_inv.present()) {
    ForwardOptions core = core_options(options);
    core.chunk_size = static_cast<int>(v.core.chunk_size);  // as validated for the layer
    detail::ValidatedForward fwd;
    detail::validate_forward(
        fused_core_inputs(in, options, w),
        {out.out.present() ? heads_view(out.out, options.hv, options.dv) : MutableTensorView(),
         out.recurrent_state_out, out.chunk_states, out.t_inv},
        core, detail::OutputPrecision::native, &fwd);
    fwd.problem.conv = &w.conv.problem;
    cpu::forward(fwd.problem, core.isa);
  }
  laps.skip();  // the gated delta rule's own stages
  detail::write_final_conv_state<Real>(in.qkv, in.conv_state, v.sequences, v.taps,
                                       out.conv_state_out);
  laps.lap(cpu::Stage::layer_conv_state);
}

template <class Real>
void layer_backward(const LayerBackwardInputs& in, const LayerBackwardOutputs& out,
                    const LayerOptions& options, const detail::ValidatedLayer& v) {
  const LayerInputs& f = in.forward;
  const std::int64_t t_count = v.tokens, d = v.channels, hv = options.hv;
  const std::int64_t qk = options.hk * options.dk;
  Work w;
  run_conv<Real>(f, options, v, w);
  run_gates<Real>(f, options, v, w);

  // The gated delta rule's backward, into dxh (dq, dk, dv are views of it), dg and dbeta.
  const DType cd = v.compute_dtype;
  Tensor dxh(cd, {t_count, d}), dg(cd, {t_count, hv}), dbeta(cd, {t_count, hv});
  const ForwardInputs core = core_inputs(f, options, w.conv.xh, t_count, w);
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
  detail::ConvGradBuffers grads;
  detail::prepare_conv_backward<Real>(in.d_conv_state_out, out.d_qkv, out.d_conv_state.present(),
                                      static_cast<const Real*>(dxh.raw()), &w.conv, &grads);
  cpu::conv_backward(w.conv.problem, options.isa, options.threads);
  detail::write_conv_gradients<Real>(w.conv.problem, grads, out.d_conv_weight, out.d_conv_bias,
                                     out.d_conv_state);
}

void check_layer_inputs(const LayerInputs& in) {
  detail::check_finite({{"qkv", in.qkv},
                        {"a", in.a},
                        {"b", in.b},
                        {"conv_weight", in.conv_weight},
                        {"conv_bias", in.conv_bias},
                        {"A_log", in.A_log},
                        {"dt_bias", in.dt_bias},
                        {"conv_state", in.conv_state},
                        {"recurrent_state", in.recurrent_state}},
                       detail::Written::nothing);
}

}  // namespace

ForwardShape fused_gdn_shape(const LayerInputs& inputs, const LayerOptions& options) {
  detail::ValidatedLayer v;
  detail::validate_layer_inputs(inputs, options, &v);
  return v.core;
}

namespace {

void run_layer_forward(const LayerInputs& inputs, const LayerOutputs& outputs,
                       const LayerOptions& options, const detail::ValidatedLayer& v) {
  const cpu::SubnormalsAsZero mode;
  if (v.dtype == DType::f64) {
    layer_forward<double>(inputs, outputs, options, v);
  } else {
    layer_forward<float>(inputs, outputs, options, v);
  }
}

}  // namespace

namespace detail {

void fused_gdn_fwd_unchecked(const LayerInputs& inputs, const LayerOutputs& outputs,
                             const LayerOptions& options) {
  ValidatedLayer v;
  validate_layer_forward(inputs, outputs, options, OutputPrecision::native, &v);
  run_layer_forward(inputs, outputs, options, v);
}

}  // namespace detail

void fused_gdn_fwd(const LayerInputs& inputs, const LayerOutputs& outputs,
                   const LayerOptions& options) {
  detail::ValidatedLayer v;
  detail::validate_layer_forward(inputs, outputs, options, detail::OutputPrecision::native, &v);
  const bool check = detail::check_finite_enabled(options.check_finite);
  if (check) check_layer_inputs(inputs);
  // Check mode: the states updated in place (an output that is the view of its input) are put
  // back when an output turns out non-finite.
  detail::StateBackup backup;
  if (check) {
    if (outputs.conv_state_out.present() && outputs.conv_state_out.data == inputs.conv_state.data)
      backup.save(outputs.conv_state_out);
    if (outputs.recurrent_state_out.present() &&
        outputs.recurrent_state_out.data == inputs.recurrent_state.data)
      backup.save(outputs.recurrent_state_out);
  }
  detail::restoring_on_error(backup, [&] {
    run_layer_forward(inputs, outputs, options, v);
    if (check) {
      detail::check_finite(
          {{"out", outputs.out},
           {"conv_state_out", outputs.conv_state_out},
           {"recurrent_state_out", outputs.recurrent_state_out}},
          backup.empty() ? detail::Written::outputs : detail::Written::states_restored);
    }
  });
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
  const bool check = detail::check_finite_enabled(options.check_finite);
  if (check) {
    check_layer_inputs(inputs.forward);
    detail::check_finite({{"d_out", inputs.d_out},
                          {"d_conv_state_out", inputs.d_conv_state_out},
                          {"d_recurrent_state_out", inputs.d_recurrent_state_out}},
                         detail::Written::nothing);
  }
  {
    const cpu::SubnormalsAsZero mode;
    if (v.dtype == DType::f64) {
      layer_backward<double>(inputs, outputs, options, v);
    } else {
      layer_backward<float>(inputs, outputs, options, v);
    }
  }
  if (check) {
    detail::check_finite({{"d_qkv", outputs.d_qkv},
                          {"d_a", outputs.d_a},
                          {"d_b", outputs.d_b},
                          {"d_conv_weight", outputs.d_conv_weight},
                          {"d_conv_bias", outputs.d_conv_bias},
                          {"d_A_log", outputs.d_A_log},
                          {"d_dt_bias", outputs.d_dt_bias},
                          {"d_conv_state", outputs.d_conv_state},
                          {"d_recurrent_state", outputs.d_recurrent_state}},
                         detail::Written::outputs);
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
