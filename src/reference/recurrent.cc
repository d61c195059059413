// recurrent.cc: the token recurrence in float64, the definition of the op (docs/math.md, 2).
//   alpha = exp(g_t);  u = beta (v - alpha S^T k);  S = alpha S + k u^T;  o = scale S^T q
// Plain loops, no reassociation tricks: this is what every fast path answers to.
#include <vector>

#include "gdn/reference.h"
#include "reference/reference.h"

namespace gdn::ref {
namespace {

void recurrent_item(const detail::ForwardProblem& p, std::int64_t s, std::int64_t h) {
  const detail::Sequence& seq = p.seqs[s];
  const std::int64_t dk = p.shape.dk, dv = p.shape.dv, c = p.chunk_size;
  const std::int64_t hk = h / p.group;
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
    if (p.o.data != nullptr) write_row(p.o, seq, t, h, dv, o.data());
  }
  write_matrix(p.final_state, s, h, dk, dv, dv, state.data(), dk, dv);
}

}  // namespace

void recurrent_fwd(const ForwardInputs& inputs, const ForwardOutputs& outputs,
                   const ForwardOptions& options) {
  // the recurrent form forms no T^-1: a t_inv output is rejected with a clear message
  run_reference(inputs, outputs, options, Algorithm::recurrent, &recurrent_item);
}

ForwardResult recurrent_fwd(const ForwardInputs& inputs, const ForwardOptions& options,
                            Residuals residuals) {
  return run_reference_allocating(inputs, options, residuals, false,
                                  [](const ForwardInputs& in, const ForwardOutputs& out,
                                     const ForwardOptions& o) { recurrent_fwd(in, out, o); });
}

}  // namespace gdn::ref
