// layer.cc: the fused layer op on the CPU: validate once, then
//   conv1d + SiLU (src/cpu/conv1d-inl.h) into xh [T, D], the gates into g and beta [T, Hv],
//   the gated delta rule on views of xh (q, k L2-normalised in the kernel),
// and for the backward the same recomputation, the gated delta rule's backward into dxh, the
// gates' backward and the conv's backward. Temporaries are the compute dtype; xh and dxh cost
// T x D of it each (docs/perf.md), but in a forward without residuals, which runs window by
// window through one xh of R x D (forward_windows; docs/memory.md, docs/perf_layer.md).
#include "gdn/layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "api/check_finite.h"
#include "api/conv_parts.h"
#include "api/layer_parts.h"
#include "api/validate.h"
#include "cpu/float_env.h"
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

// The gated delta rule's inputs: views of the first t rows of xh, g and beta.
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

ForwardOptions core_options(const LayerOptions& o, Algorithm algorithm = Algorithm::automatic) {
  ForwardOptions f;
  f.algorithm = algorithm;
  f.use_qk_l2norm = true;
  f.chunk_size = o.chunk_size;
  f.threads = o.threads;
  f.isa = o.isa;
  f.matmul_precision = o.matmul_precision;
  return f;
}

// 16-bit out rows [0, t) <- the float32 rows of o (width wide), each rounded once.
template <class Real>
void narrow_rows(const Real* o, std::int64_t t, std::int64_t width, const MutableTensorView& out) {
  if (out.strides[1] == 1 && out.dtype == DType::bf16) {
    for (std::int64_t i = 0; i < t; ++i) {
      auto* row = static_cast<std::uint16_t*>(out.data) + i * out.strides[0];
      const Real* from = o + i * width;
      for (std::int64_t c = 0; c < width; ++c) {
        row[c] = detail::bf16_from_float(static_cast<float>(from[c]));
      }
    }
    return;
  }
  for (std::int64_t i = 0; i < t; ++i) {
    for (std::int64_t c = 0; c < width; ++c) write<Real>(out, o[i * width + c], i, c);
  }
}

// The buffers the windows of one forward share: xh [W, D] and, for 16-bit activations with
// out, the gated delta rule's float32 out [W, Hv Dv] (src/cpu/layer.h: kLayerWindowBytes).
struct WindowBuffers {
  Tensor xh, out32;
};

// The forward of `v`'s tokens (all of a call's, or one window's) with `buffers` of at least
// v.tokens rows; the gated delta rule with `algorithm`.
template <class Real>
void forward_part(const LayerInputs& in, const LayerOutputs& out, const LayerOptions& options,
                  const detail::ValidatedLayer& v, Algorithm algorithm, WindowBuffers& buffers) {
  cpu::StageLaps laps;
  Work w;
  run_conv<Real>(in, options, v, w, static_cast<Real*>(buffers.xh.raw()));
  laps.lap(cpu::Stage::layer_conv);
  run_gates<Real>(in, options, v, w);
  laps.lap(cpu::Stage::layer_gates);
  // 16-bit activations: the gated delta rule writes float32 (its inputs are the conv's float32
  // output), rounded into out once.
  const bool with_out = out.out.present();
  const bool narrow = with_out && v.dtype != v.compute_dtype;
  const std::int64_t width = options.hv * options.dv;
  const MutableTensorView core_out =
      narrow ? MutableTensorView(buffers.out32.raw(), v.compute_dtype, 2, Dims{v.tokens, width},
                                 Dims{width, 1})
             : out.out;
  // Without out the core writes only the states and residuals (gdn/forward.h), if any.
  if (with_out || out.recurrent_state_out.present() || out.chunk_states.present() ||
      out.t_inv.present()) {
    chunk_gated_delta_rule_fwd(
        core_inputs(in, options, buffers.xh, v.tokens, w),
        {with_out ? heads_view(core_out, options.hv, options.dv) : MutableTensorView(),
         out.recurrent_state_out, out.chunk_states, out.t_inv},
        core_options(options, algorithm));
  }
  laps.skip();  // the gated delta rule's own stages
  if (narrow) narrow_rows(static_cast<const Real*>(buffers.out32.raw()), v.tokens, width, out.out);
  laps.lap(cpu::Stage::layer_out);
  detail::write_final_conv_state<Real>(in.qkv, in.conv_state, v.sequences, v.taps,
                                       out.conv_state_out);
  laps.lap(cpu::Stage::layer_conv_state);
}

// Rows [r0, r1) along the first dimension (absent stays absent).
template <class View>
View slice(const View& v, std::int64_t r0, std::int64_t r1) {
  if (!v.present()) return v;
  View r = v;
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<decltype(v.data)>>,
                                  const char, char>;
  r.data = static_cast<Byte*>(v.data) +
           r0 * v.strides[0] * static_cast<std::int64_t>(dtype_size(v.dtype));
  r.sizes[0] = r1 - r0;
  return r;
}

// The facts of tokens [t0, t1) of `v` holding the sequences `seqs` (starts from t0).
void window_facts(const detail::ValidatedLayer& v, std::int64_t t0, std::int64_t t1,
                  std::vector<detail::Sequence> seqs, detail::ValidatedLayer* w) {
  w->tokens = t1 - t0;
  w->channels = v.channels;
  w->taps = v.taps;
  w->dtype = v.dtype;
  w->compute_dtype = v.compute_dtype;
  w->core = v.core;
  w->core.tokens = t1 - t0;
  w->core.num_seqs = static_cast<std::int64_t>(seqs.size());
  w->sequences = std::move(seqs);
}

// The forward of a long input in windows of `window` tokens (a multiple of the chunk size),
// sharing one set of buffers: runs of whole sequences that fit in a window, as one call would
// run them; a sequence longer than a window in pieces of `window` tokens, each starting from
// the conv inputs and the float32 state the piece before it ended with, through the chunked
// form (as one call runs a sequence of a window's length or more). No residuals.
template <class Real>
void forward_windows(const LayerInputs& in, const LayerOutputs& out, const LayerOptions& options,
                     const detail::ValidatedLayer& v, std::int64_t window, WindowBuffers& buffers) {
  LayerOptions o = options;
  o.chunk_size = static_cast<int>(v.core.chunk_size);  // resolved once for every window
  const auto n = static_cast<std::int64_t>(v.sequences.size());
  const std::int64_t k = v.taps, d = v.channels;
  // A split sequence between its pieces: its last K - 1 inputs and its state.
  Tensor history, state;
  for (std::int64_t s = 0; s < n;) {
    const detail::Sequence& seq = v.sequences[static_cast<std::size_t>(s)];
    if (seq.length <= window) {
      std::int64_t e = s + 1, tokens = seq.length;
      while (e < n && tokens + v.sequences[static_cast<std::size_t>(e)].length <= window) {
        tokens += v.sequences[static_cast<std::size_t>(e++)].length;
      }
      const std::int64_t t0 = seq.start, t1 = seq.start + tokens;
      std::vector<detail::Sequence> seqs;
      Tensor cu(DType::i64, {e - s + 1});
      cu.data<std::int64_t>()[0] = 0;
      for (std::int64_t i = s; i < e; ++i) {
        detail::Sequence q = v.sequences[static_cast<std::size_t>(i)];
        q.start -= t0;
        cu.data<std::int64_t>()[i - s + 1] = q.start + q.length;
        seqs.push_back(q);
      }
      detail::ValidatedLayer wv;
      window_facts(v, t0, t1, std::move(seqs), &wv);
      LayerInputs wi = in;
      wi.qkv = slice(in.qkv, t0, t1);
      wi.a = slice(in.a, t0, t1);
      wi.b = slice(in.b, t0, t1);
      wi.conv_state = slice(in.conv_state, s, e);
      wi.recurrent_state = slice(in.recurrent_state, s, e);
      wi.cu_seqlens = cu.view();
      const LayerOutputs wo{slice(out.out, t0, t1), slice(out.conv_state_out, s, e),
                            slice(out.recurrent_state_out, s, e), MutableTensorView{},
                            MutableTensorView{}};
      forward_part<Real>(wi, wo, o, wv, Algorithm::automatic, buffers);
      s = e;
      continue;
    }
    for (std::int64_t p0 = 0; p0 < seq.length; p0 += window) {
      const std::int64_t p1 = std::min(p0 + window, seq.length);
      const bool first = p0 == 0, last = p1 == seq.length;
      const std::int64_t t0 = seq.start + p0, t1 = seq.start + p1;
      detail::ValidatedLayer wv;
      window_facts(v, t0, t1, {{0, 0, p1 - p0, 0}}, &wv);
      LayerInputs wi = in;
      wi.qkv = slice(in.qkv, t0, t1);
      wi.a = slice(in.a, t0, t1);
      wi.b = slice(in.b, t0, t1);
      wi.conv_state = first ? slice(in.conv_state, s, s + 1) : history.view();
      wi.recurrent_state = first ? slice(in.recurrent_state, s, s + 1) : state.view();
      wi.cu_seqlens = TensorView{};
      if (!last && !state.present()) state = Tensor(v.compute_dtype, {1, o.hv, o.dk, o.dv});
      const LayerOutputs wo{slice(out.out, t0, t1),
                            last ? slice(out.conv_state_out, s, s + 1) : MutableTensorView{},
                            last ? slice(out.recurrent_state_out, s, s + 1) : state.mutable_view(),
                            MutableTensorView{}, MutableTensorView{}};
      forward_part<Real>(wi, wo, o, wv, Algorithm::chunked, buffers);
      if (!last && k > 1) {
        // The next piece's conv history: this piece's last K - 1 inputs (window >= 8 > K - 1).
        if (!history.present()) history = Tensor(v.compute_dtype, {1, k - 1, d});
        Real* h = static_cast<Real*>(history.raw());
        for (std::int64_t r = 0; r + 1 < k; ++r) {
          for (std::int64_t c = 0; c < d; ++c)
            h[r * d + c] = read<Real>(in.qkv, t1 - (k - 1) + r, c);
        }
      }
    }
    ++s;
  }
}

template <class Real>
void layer_forward(const LayerInputs& in, const LayerOutputs& out, const LayerOptions& options,
                   const detail::ValidatedLayer& v) {
  // Residuals are laid out by the chunks of the whole call: one window.
  const bool residuals = out.chunk_states.present() || out.t_inv.present();
  const int threads = options.threads > 0 ? options.threads : default_threads();
  const std::int64_t window =
      residuals ? v.tokens
                : cpu::layer_window_tokens(v.channels, static_cast<std::int64_t>(sizeof(Real)),
                                           v.core.chunk_size, threads);
  const std::int64_t rows = std::min(window, v.tokens);
  WindowBuffers buffers;
  buffers.xh = Tensor(v.compute_dtype, {rows, v.channels});
  if (out.out.present() && v.dtype != v.compute_dtype) {
    buffers.out32 = Tensor(v.compute_dtype, {rows, options.hv * options.dv});
  }
  if (v.tokens <= window) {
    forward_part<Real>(in, out, options, v, Algorithm::automatic, buffers);
  } else {
    forward_windows<Real>(in, out, options, v, window, buffers);
  }
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
