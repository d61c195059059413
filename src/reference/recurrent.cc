// recurrent.cc: the token recurrence in float64, the definition of the op (docs/math.md, 2).
//   alpha = exp(g_t);  u = beta (v - alpha S^T k);  S = alpha S + k u^T;  o = scale S^T q
// Plain loops, no reassociation tricks: this is what every fast path answers to.
#include <vector>

#include "api/validate.h"
#include "gdn/reference.h"
#include "reference/reference.h"

namespace gdn::ref {
namespace {

void recurrent_item(const detail::ForwardProblem& p, std::int64_t s, std::int64_t h) {
  const detail::Sequence& seq = p.seqs[s];
  const std::int64_t dk = p.shape.dk, dv = p.shape.dv, c = p.chunk_size;
  const std::int64_t hk = h / p.group();
  std::vector<double> state(static_cast<std::size_t>(dk * dv));
  std::vector<double> q(dk), k(dk), v(dv), u(dv), o(dv);
  read_matrix(p.initial_state, s, h, dk, dv, state.data());
  for (std::int64_t t = 0; t < seq.length; ++t) {
    if (t % c == 0) {
      write_matrix(p.chunk_states, seq.first_chunk + t / c, h, dk, dv, dv, state.data(), dk, dv);
    }
    read_row(p.q, seq, t, hk, dk, q.data());
    read_row(p.k, seq, t, hk, dk, k.data());
    read_row(p.v, seq, t, h, dv, v.data());
    if (p.l2norm) {
      l2_normalize(q.data(), dk);
      l2_normalize(k.data(), dk);
    }
    const double alpha = std::exp(read_scalar(p.g, seq, t, h));
    const double beta = read_scalar(p.beta, seq, t, h);
    for (std::int64_t j = 0; j < dv; ++j) {
      double sk = 0;
      for (std::int64_t i = 0; i < dk; ++i) sk += state[i * dv + j] * k[i];
      u[j] = beta * (v[j] - alpha * sk);
    }
    for (std::int64_t i = 0; i < dk; ++i) {
      for (std::int64_t j = 0; j < dv; ++j) {
        state[i * dv + j] = alpha * state[i * dv + j] + k[i] * u[j];
      }
    }
    for (std::int64_t j = 0; j < dv; ++j) {
      double sq = 0;
      for (std::int64_t i = 0; i < dk; ++i) sq += state[i * dv + j] * q[i];
      o[j] = p.scale * sq;
    }
    write_row(p.o, seq, t, h, dv, o.data());
  }
  write_matrix(p.final_state, s, h, dk, dv, dv, state.data(), dk, dv);
}

}  // namespace

void recurrent_fwd(const ForwardInputs& inputs, const ForwardOutputs& outputs,
                   const ForwardOptions& options) {
  ForwardOptions opts = options;
  opts.algorithm = Algorithm::recurrent;  // rejects a t_inv output with a clear message
  detail::ValidatedForward validated;
  detail::validate_forward(inputs, outputs, opts, detail::OutputPrecision::float64, &validated);
  const detail::ForwardProblem& p = validated.problem;
  for_each_item(p, [&p](std::int64_t s, std::int64_t h) { recurrent_item(p, s, h); });
}

ForwardResult recurrent_fwd(const ForwardInputs& inputs, const ForwardOptions& options,
                            Residuals residuals) {
  const ForwardShape shape = forward_shape(inputs, options);
  ForwardResult r =
      detail::allocate_forward_result(shape, DType::f64, DType::f64, residuals, false);
  recurrent_fwd(inputs, detail::outputs_of(r), options);
  return r;
}

}  // namespace gdn::ref
