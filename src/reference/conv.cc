// conv.cc: the float64 reference of the conv op (gdn/conv.h): the definition as plain float64
// loops, one output element at a time. tests/reference/conv_test.cc checks its gradients
// against central finite differences.
#include "gdn/conv.h"

#include <cmath>
#include <vector>

#include "reference/reference.h"

namespace gdn::ref {
namespace {

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

// Input j of sequence s at channel c: x (j >= 0) or the initial state (j < 0; 0 when absent).
double input(const ConvInputs& in, const detail::ValidatedConv& v, std::int64_t s, std::int64_t j,
             std::int64_t c) {
  if (j >= 0) return read(in.x, v.sequences[s].start + j, c);
  return in.initial_state.present() ? read(in.initial_state, s, v.taps - 1 + j, c) : 0.0;
}

double pre_activation(const ConvInputs& in, const detail::ValidatedConv& v, std::int64_t s,
                      std::int64_t t, std::int64_t c) {
  double y = in.bias.present() ? read(in.bias, c) : 0.0;
  for (std::int64_t i = 0; i < v.taps; ++i)
    y += weight_at(in.weight, c, i) * input(in, v, s, t - v.taps + 1 + i, c);
  return y;
}

}  // namespace

void causal_conv1d_fwd(const ConvInputs& in, const ConvOutputs& out, const ConvOptions& options) {
  detail::ValidatedConv v;
  detail::validate_conv_forward(in, out, options, detail::OutputPrecision::float64, &v);
  const bool silu = options.activation == ConvActivation::silu;
  const std::int64_t k = v.taps;
  // The final state first: it may be the initial state's view, which the outputs read.
  std::vector<double> final_state;
  for (std::int64_t s = 0; s < static_cast<std::int64_t>(v.sequences.size()); ++s) {
    const std::int64_t len = v.sequences[s].length;
    for (std::int64_t t = 0; t < len; ++t) {
      for (std::int64_t c = 0; c < v.channels; ++c) {
        const double y = pre_activation(in, v, s, t, c);
        write(out.out, silu ? y * sigmoid(y) : y, v.sequences[s].start + t, c);
      }
    }
    for (std::int64_t r = 0; r + 1 < k; ++r) {
      for (std::int64_t c = 0; c < v.channels; ++c)
        final_state.push_back(input(in, v, s, len - (k - 1) + r, c));
    }
  }
  if (!out.final_state.present()) return;
  std::size_t e = 0;
  for (std::int64_t s = 0; s < static_cast<std::int64_t>(v.sequences.size()); ++s) {
    for (std::int64_t r = 0; r + 1 < k; ++r) {
      for (std::int64_t c = 0; c < v.channels; ++c)
        write(out.final_state, final_state[e++], s, r, c);
    }
  }
}

ConvForwardResult causal_conv1d_fwd(const ConvInputs& in, const ConvOptions& options) {
  detail::ValidatedConv v;
  detail::validate_conv_inputs(in, options, &v);
  ConvForwardResult r;
  r.out = Tensor(DType::f64, {v.tokens, v.channels});
  r.final_state =
      Tensor(DType::f64, {static_cast<std::int64_t>(v.sequences.size()), v.taps - 1, v.channels});
  ref::causal_conv1d_fwd(in, {r.out.mutable_view(), r.final_state.mutable_view()}, options);
  return r;
}

void causal_conv1d_bwd(const ConvBackwardInputs& bin, const ConvBackwardOutputs& out,
                       const ConvOptions& options) {
  detail::ValidatedConv v;
  detail::validate_conv_backward(bin, out, options, detail::OutputPrecision::float64, &v);
  const ConvInputs& in = bin.forward;
  const bool silu = options.activation == ConvActivation::silu;
  const std::int64_t d = v.channels, k = v.taps;
  std::vector<double> dw(d * k, 0.0), db(d, 0.0);
  for (std::int64_t s = 0; s < static_cast<std::int64_t>(v.sequences.size()); ++s) {
    const detail::Sequence& seq = v.sequences[s];
    const std::int64_t len = seq.length;
    for (std::int64_t c = 0; c < d; ++c) {
      // dy = d_out SiLU'(y), SiLU'(y) = sigmoid(y) (1 + y (1 - sigmoid(y))).
      std::vector<double> dy(len);
      for (std::int64_t t = 0; t < len; ++t) {
        const double y = pre_activation(in, v, s, t, c), sig = sigmoid(y);
        dy[t] = read(bin.d_out, seq.start + t, c) * (silu ? sig * (1 + y * (1 - sig)) : 1.0);
        db[c] += dy[t];
        for (std::int64_t i = 0; i < k; ++i)
          dw[c * k + i] += dy[t] * input(in, v, s, t - k + 1 + i, c);
      }
      // Input j feeds y_t for t = j .. j + K - 1 through tap i = j - t + K - 1; the last K - 1
      // inputs are also the final state.
      for (std::int64_t j = -(k - 1); j < len; ++j) {
        double grad = 0;
        for (std::int64_t i = 0; i < k; ++i) {
          const std::int64_t t = j + k - 1 - i;
          if (t >= 0 && t < len) grad += weight_at(in.weight, c, i) * dy[t];
        }
        if (bin.d_final_state.present() && j >= len - (k - 1)) {
          grad += read(bin.d_final_state, s, j - (len - (k - 1)), c);
        }
        if (j >= 0) {
          write(out.d_x, grad, seq.start + j, c);
        } else if (out.d_initial_state.present()) {
          write(out.d_initial_state, grad, s, k - 1 + j, c);
        }
      }
    }
  }
  for (std::int64_t c = 0; c < d; ++c) {
    for (std::int64_t i = 0; i < k; ++i) {
      if (out.d_weight.rank == 2) {
        write(out.d_weight, dw[c * k + i], c, i);
      } else {
        write(out.d_weight, dw[c * k + i], c, 0, i);
      }
    }
    if (out.d_bias.present()) write(out.d_bias, db[c], c);
  }
}

ConvBackwardResult causal_conv1d_bwd(const ConvBackwardInputs& bin, const ConvOptions& options) {
  detail::ValidatedConv v;
  detail::validate_conv_inputs(bin.forward, options, &v);
  ConvBackwardResult r = detail::allocate_conv_grads(bin.forward, v, DType::f64);
  ref::causal_conv1d_bwd(bin,
                         {r.d_x.mutable_view(), r.d_weight.mutable_view(), r.d_bias.mutable_view(),
                          r.d_initial_state.mutable_view()},
                         options);
  return r;
}

}  // namespace gdn::ref
