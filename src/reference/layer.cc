// layer.cc: the float64 reference of the fused layer op: the conv, SiLU and gates as plain
// float64 loops, the gated delta rule by gdn::ref's token recurrence and its reverse mode.
// tests/reference/layer_test.cc checks its gradients against central finite differences.
#include "gdn/layer.h"

#include <cmath>
#include <vector>

#include "api/validate.h"
#include "gdn/error.h"
#include "gdn/reference.h"
#include "reference/reference.h"

namespace gdn::ref {
namespace {

// The options as the reference runs them: every product is float64, so
// options.matmul_precision is ignored.
LayerOptions float64_options(LayerOptions options) {
  options.matmul_precision = MatmulPrecision::compute;
  return options;
}

double read(const TensorView& v, std::int64_t i0, std::int64_t i1 = 0, std::int64_t i2 = 0) {
  const std::int64_t off = i0 * v.strides[0] + (v.rank > 1 ? i1 * v.strides[1] : 0) +
                           (v.rank > 2 ? i2 * v.strides[2] : 0);
  return read_real(static_cast<const std::byte*>(v.data), v.dtype, off);
}
void write(const MutableTensorView& v, double value, std::int64_t i0, std::int64_t i1 = 0,
           std::int64_t i2 = 0) {
  const std::int64_t off = i0 * v.strides[0] + (v.rank > 1 ? i1 * v.strides[1] : 0) +
                           (v.rank > 2 ? i2 * v.strides[2] : 0);
  static_cast<double*>(v.data)[off] = value;  // reference outputs are f64
}
double weight_at(const TensorView& w, std::int64_t c, std::int64_t i) {
  return w.rank == 2 ? read(w, c, i) : read(w, c, 0, i);
}
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
// Past 40, log1p(e^x) = x + e^-x rounds to x in float64 (e^-40 / 40 < 2^-60).
double softplus(double x) { return x > 40 ? x : std::log1p(std::exp(x)); }

// A float64 copy of an optional [.., .., ..] or [.., .., .., ..] view, contiguous.
Tensor to_f64(const TensorView& v) {
  if (!v.present()) return {};
  Tensor t(DType::f64, v.rank, v.sizes);
  double* out = t.data<double>();
  const Dims& s = v.sizes;
  std::int64_t e = 0;
  for (std::int64_t i0 = 0; i0 < s[0]; ++i0) {
    for (std::int64_t i1 = 0; i1 < (v.rank > 1 ? s[1] : 1); ++i1) {
      for (std::int64_t i2 = 0; i2 < (v.rank > 2 ? s[2] : 1); ++i2) {
        for (std::int64_t i3 = 0; i3 < (v.rank > 3 ? s[3] : 1); ++i3) {
          const std::int64_t off = i0 * v.strides[0] + (v.rank > 1 ? i1 * v.strides[1] : 0) +
                                   (v.rank > 2 ? i2 * v.strides[2] : 0) +
                                   (v.rank > 3 ? i3 * v.strides[3] : 0);
          out[e++] = read_real(static_cast<const std::byte*>(v.data), v.dtype, off);
        }
      }
    }
  }
  return t;
}

// Input j of sequence s at channel c: x_j from qkv (j >= 0) or the conv state (j < 0, or 0).
double conv_input(const LayerInputs& in, const detail::ValidatedLayer& v, std::int64_t s,
                  std::int64_t j, std::int64_t c) {
  const detail::Sequence& seq = v.sequences[s];
  if (j >= 0) return read(in.qkv, seq.start + j, c);
  if (!in.conv_state.present()) return 0.0;
  return read(in.conv_state, s, v.taps - 1 + j, c);
}

double pre_activation(const LayerInputs& in, const detail::ValidatedLayer& v, std::int64_t s,
                      std::int64_t t, std::int64_t c) {
  double y = in.conv_bias.present() ? read(in.conv_bias, c) : 0.0;
  for (std::int64_t i = 0; i < v.taps; ++i) {
    y += weight_at(in.conv_weight, c, i) * conv_input(in, v, s, t - v.taps + 1 + i, c);
  }
  return y;
}

struct Forward {
  Tensor xh, g, beta, state;
};

// xh = SiLU(conv(qkv)), the gates, and a float64 copy of the recurrent state.
Forward recompute(const LayerInputs& in, const LayerOptions& o, const detail::ValidatedLayer& v) {
  Forward f;
  const std::int64_t d = v.channels;
  f.xh = Tensor(DType::f64, {v.tokens, d});
  for (std::size_t s = 0; s < v.sequences.size(); ++s) {
    const detail::Sequence& seq = v.sequences[s];
    for (std::int64_t t = 0; t < seq.length; ++t) {
      for (std::int64_t c = 0; c < d; ++c) {
        const double y = pre_activation(in, v, static_cast<std::int64_t>(s), t, c);
        f.xh.data<double>()[(seq.start + t) * d + c] = y * sigmoid(y);
      }
    }
  }
  f.g = Tensor(DType::f64, {v.tokens, o.hv});
  f.beta = Tensor(DType::f64, {v.tokens, o.hv});
  for (std::int64_t t = 0; t < v.tokens; ++t) {
    for (std::int64_t h = 0; h < o.hv; ++h) {
      f.g.data<double>()[t * o.hv + h] =
          -std::exp(read(in.A_log, h)) * softplus(read(in.a, t, h) + read(in.dt_bias, h));
      f.beta.data<double>()[t * o.hv + h] = sigmoid(read(in.b, t, h));
    }
  }
  f.state = to_f64(in.recurrent_state);
  return f;
}

ForwardInputs core_inputs(const LayerInputs& in, const LayerOptions& o, const Forward& f) {
  const std::int64_t t = f.xh.size(0), d = f.xh.size(1), qk = o.hk * o.dk;
  const double* xh = f.xh.data<double>();
  return {TensorView(xh, {t, o.hk, o.dk}, {d, o.dk, 1}),
          TensorView(xh + qk, {t, o.hk, o.dk}, {d, o.dk, 1}),
          TensorView(xh + 2 * qk, {t, o.hv, o.dv}, {d, o.dv, 1}),
          f.g.view(),
          f.beta.view(),
          f.state.view(),
          in.cu_seqlens};
}

template <class View>
View heads_view(const View& v, std::int64_t hv, std::int64_t dv) {
  Dims sizes{v.sizes[0], hv, dv, 0}, strides{v.strides[0], dv * v.strides[1], v.strides[1], 0};
  return View(v.data, v.dtype, 3, sizes, strides);
}

ForwardOptions core_options(const LayerOptions& o) {
  ForwardOptions f;
  f.use_qk_l2norm = true;
  f.chunk_size = o.chunk_size;
  f.threads = o.threads;
  return f;
}

}  // namespace

void fused_gdn_fwd(const LayerInputs& in, const LayerOutputs& out,
                   const LayerOptions& layer_options) {
  const LayerOptions options = float64_options(layer_options);
  detail::ValidatedLayer v;
  detail::validate_layer_forward(in, out, options, detail::OutputPrecision::float64, &v);
  if (out.chunk_states.present() || out.t_inv.present()) {
    throw InvalidArgument(out.t_inv.present() ? "t_inv" : "chunk_states",
                          "absent (the layer reference keeps no residuals)", "an output view");
  }
  const Forward f = recompute(in, options, v);
  if (out.out.present() || out.recurrent_state_out.present()) {
    recurrent_fwd(
        core_inputs(in, options, f),
        {out.out.present() ? heads_view(out.out, options.hv, options.dv) : MutableTensorView(),
         out.recurrent_state_out,
         {},
         {}},
        core_options(options));
  }
  if (out.conv_state_out.present()) {
    for (std::size_t s = 0; s < v.sequences.size(); ++s) {
      for (std::int64_t r = 0; r + 1 < v.taps; ++r) {
        const std::int64_t j = v.sequences[s].length - (v.taps - 1) + r;
        for (std::int64_t c = 0; c < v.channels; ++c) {
          write(out.conv_state_out, conv_input(in, v, static_cast<std::int64_t>(s), j, c),
                static_cast<std::int64_t>(s), r, c);
        }
      }
    }
  }
}

LayerForwardResult fused_gdn_fwd(const LayerInputs& in, const LayerOptions& options) {
  detail::ValidatedLayer v;
  detail::validate_layer_inputs(in, float64_options(options), &v);
  LayerForwardResult r;
  r.out = Tensor(DType::f64, {v.tokens, options.hv * options.dv});
  r.conv_state_out = Tensor(DType::f64, {v.core.num_seqs, v.taps - 1, v.channels});
  r.recurrent_state_out = Tensor(DType::f64, 4, v.core.state_sizes());
  ref::fused_gdn_fwd(in,
                     {r.out.mutable_view(),
                      r.conv_state_out.mutable_view(),
                      r.recurrent_state_out.mutable_view(),
                      {},
                      {}},
                     options);
  return r;
}

void fused_gdn_bwd(const LayerBackwardInputs& bin, const LayerBackwardOutputs& out,
                   const LayerOptions& layer_options) {
  const LayerOptions options = float64_options(layer_options);
  detail::ValidatedLayer v;
  detail::validate_layer_backward(bin, out, options, detail::OutputPrecision::float64, &v);
  const LayerInputs& in = bin.forward;
  const Forward f = recompute(in, options, v);
  const std::int64_t t_count = v.tokens, d = v.channels, k = v.taps, hv = options.hv;
  const std::int64_t qk = options.hk * options.dk;

  // The gated delta rule's reverse mode into dxh, dg, dbeta.
  Tensor dxh(DType::f64, {t_count, d}), dg(DType::f64, {t_count, hv}),
      dbeta(DType::f64, {t_count, hv});
  const Tensor d_out = to_f64(bin.d_out), d_state_out = to_f64(bin.d_recurrent_state_out);
  BackwardInputs core = BackwardInputs::from(core_inputs(in, options, f));
  core.d_o = heads_view(d_out.view(), hv, options.dv);
  core.d_final_state = d_state_out.view();
  double* dx = dxh.data<double>();
  recurrent_bwd(core,
                {MutableTensorView(dx, {t_count, options.hk, options.dk}, {d, options.dk, 1}),
                 MutableTensorView(dx + qk, {t_count, options.hk, options.dk}, {d, options.dk, 1}),
                 MutableTensorView(dx + 2 * qk, {t_count, hv, options.dv}, {d, options.dv, 1}),
                 dg.mutable_view(), dbeta.mutable_view(), out.d_recurrent_state},
                core_options(options));

  // The gates.
  for (std::int64_t h = 0; h < hv; ++h) {
    const double a_scale = std::exp(read(in.A_log, h));
    double d_a_log = 0, d_dt_bias = 0;
    for (std::int64_t t = 0; t < t_count; ++t) {
      const double z = read(in.a, t, h) + read(in.dt_bias, h);
      const double dgv = dg.data<double>()[t * hv + h];
      const double dz = dgv * -a_scale * sigmoid(z);
      write(out.d_a, dz, t, h);
      d_dt_bias += dz;
      d_a_log += dgv * f.g.data<double>()[t * hv + h];
      const double b = f.beta.data<double>()[t * hv + h];
      write(out.d_b, dbeta.data<double>()[t * hv + h] * b * (1 - b), t, h);
    }
    write(out.d_A_log, d_a_log, h);
    write(out.d_dt_bias, d_dt_bias, h);
  }

  // The conv and SiLU.
  std::vector<double> dw(d * k, 0.0), db(d, 0.0);
  for (std::size_t si = 0; si < v.sequences.size(); ++si) {
    const auto s = static_cast<std::int64_t>(si);
    const detail::Sequence& seq = v.sequences[si];
    const std::int64_t len = seq.length;
    for (std::int64_t c = 0; c < d; ++c) {
      std::vector<double> dy(len);
      for (std::int64_t t = 0; t < len; ++t) {
        const double y = pre_activation(in, v, s, t, c), sig = sigmoid(y);
        dy[t] = dxh.data<double>()[(seq.start + t) * d + c] * sig * (1 + y * (1 - sig));
        db[c] += dy[t];
        for (std::int64_t i = 0; i < k; ++i)
          dw[c * k + i] += dy[t] * conv_input(in, v, s, t - k + 1 + i, c);
      }
      for (std::int64_t j = -(k - 1); j < len; ++j) {
        double grad = 0;
        for (std::int64_t i = 0; i < k; ++i) {
          const std::int64_t t = j + k - 1 - i;
          if (t >= 0 && t < len) grad += weight_at(in.conv_weight, c, i) * dy[t];
        }
        if (bin.d_conv_state_out.present() && j >= len - (k - 1)) {
          grad += read(bin.d_conv_state_out, s, j - (len - (k - 1)), c);
        }
        if (j >= 0) {
          write(out.d_qkv, grad, seq.start + j, c);
        } else if (out.d_conv_state.present()) {
          write(out.d_conv_state, grad, s, k - 1 + j, c);
        }
      }
    }
  }
  for (std::int64_t c = 0; c < d; ++c) {
    for (std::int64_t i = 0; i < k; ++i) {
      if (out.d_conv_weight.rank == 2) {
        write(out.d_conv_weight, dw[c * k + i], c, i);
      } else {
        write(out.d_conv_weight, dw[c * k + i], c, 0, i);
      }
    }
    if (out.d_conv_bias.present()) write(out.d_conv_bias, db[c], c);
  }
}

LayerBackwardResult fused_gdn_bwd(const LayerBackwardInputs& bin, const LayerOptions& options) {
  detail::ValidatedLayer v;
  detail::validate_layer_inputs(bin.forward, float64_options(options), &v);
  LayerBackwardResult r = detail::allocate_layer_grads(bin.forward, v, options, DType::f64);
  ref::fused_gdn_bwd(bin, detail::outputs_of(r), options);
  return r;
}

}  // namespace gdn::ref
