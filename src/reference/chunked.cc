// chunked.cc: the chunked (WY) form in float64, exactly as docs/math.md section 3 writes it.
// It checks the algebra that the fast chunked kernels rely on, independently of them: its own
// T, its own forward substitution, explicit U and W.
#include <vector>

#include "gdn/reference.h"
#include "reference/reference.h"

namespace gdn::ref {
namespace {

using Matrix = std::vector<double>;  // row-major

void chunked_item(const detail::ForwardProblem& p, std::int64_t s, std::int64_t h) {
  const detail::Sequence& seq = p.seqs[s];
  const std::int64_t dk = p.shape.dk, dv = p.shape.dv, c = p.chunk_size;
  const std::int64_t hk = h / p.group;
  Matrix state(dk * dv), next(dk * dv);
  read_matrix(p.initial_state, s, h, dk, dv, state.data());

  Matrix q(c * dk), k(c * dk), v(c * dv), gamma(c * c), t(c * c), a(c * c);
  Matrix u(c * dv), w(c * dk), vnew(c * dv), o(dv);
  std::vector<double> beta(c), G(c);
  for (std::int64_t t0 = 0, chunk = seq.first_chunk; t0 < seq.length; t0 += c, ++chunk) {
    const std::int64_t n = std::min(c, seq.length - t0);
    write_matrix(p.chunk_states, chunk, h, dk, dv, dv, state.data(), dk, dv);
    double running = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      read_row(p.q, seq, t0 + i, hk, dk, &q[i * dk]);
      read_row(p.k, seq, t0 + i, hk, dk, &k[i * dk]);
      read_row(p.v, seq, t0 + i, h, dv, &v[i * dv]);
      if (p.l2norm) {
        l2_normalize(&q[i * dk], dk);
        l2_normalize(&k[i * dk], dk);
      }
      beta[i] = read_scalar(p.beta, seq, t0 + i, h);
      running += read_scalar(p.g, seq, t0 + i, h);
      G[i] = running;
    }
    // Gamma_ij = exp(G_i - G_j), i >= j only.
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j <= i; ++j) gamma[i * c + j] = std::exp(G[i] - G[j]);
    }
    // T = I + strict_lower(diag(beta) (K K^T . Gamma)).
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double value = i == j ? 1.0 : 0.0;
        if (j < i) {
          double kk = 0;
          for (std::int64_t d = 0; d < dk; ++d) kk += k[i * dk + d] * k[j * dk + d];
          value = beta[i] * kk * gamma[i * c + j];
        }
        t[i * c + j] = value;
      }
    }
    // A = T^-1 by forward substitution on T A = I, column by column.
    for (std::int64_t col = 0; col < n; ++col) {
      for (std::int64_t i = 0; i < n; ++i) {
        double value = i == col ? 1.0 : 0.0;
        for (std::int64_t j = 0; j < i; ++j) value -= t[i * c + j] * a[j * c + col];
        a[i * c + col] = value;  // T has a unit diagonal
      }
    }
    // U = A diag(beta) V;  W = A diag(beta e^G) K.
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t e = 0; e < dv; ++e) {
        double sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) sum += a[i * c + j] * beta[j] * v[j * dv + e];
        u[i * dv + e] = sum;
      }
      for (std::int64_t d = 0; d < dk; ++d) {
        double sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          sum += a[i * c + j] * beta[j] * std::exp(G[j]) * k[j * dk + d];
        }
        w[i * dk + d] = sum;
      }
    }
    // V_new = U - W S.
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t e = 0; e < dv; ++e) {
        double ws = 0;
        for (std::int64_t d = 0; d < dk; ++d) ws += w[i * dk + d] * state[d * dv + e];
        vnew[i * dv + e] = u[i * dv + e] - ws;
      }
    }
    // O = scale (diag(e^G) Q S + (Q K^T . Gamma . lower_incl) V_new).
    for (std::int64_t i = 0; i < n; ++i) {
      const double eg = std::exp(G[i]);
      for (std::int64_t e = 0; e < dv; ++e) {
        double qs = 0;
        for (std::int64_t d = 0; d < dk; ++d) qs += q[i * dk + d] * state[d * dv + e];
        o[e] = eg * qs;
      }
      for (std::int64_t j = 0; j <= i; ++j) {
        double qk = 0;
        for (std::int64_t d = 0; d < dk; ++d) qk += q[i * dk + d] * k[j * dk + d];
        const double weight = qk * gamma[i * c + j];
        for (std::int64_t e = 0; e < dv; ++e) o[e] += weight * vnew[j * dv + e];
      }
      for (std::int64_t e = 0; e < dv; ++e) o[e] *= p.scale;
      if (p.o.data != nullptr) write_row(p.o, seq, t0 + i, h, dv, o.data());
    }
    write_matrix(p.t_inv, chunk, h, n, n, c, a.data(), c, c);
    // S = e^(G_last) S + (diag(e^(G_last - G)) K)^T V_new.
    const double last = G[n - 1];
    for (std::int64_t d = 0; d < dk; ++d) {
      for (std::int64_t e = 0; e < dv; ++e) {
        double sum = std::exp(last) * state[d * dv + e];
        for (std::int64_t i = 0; i < n; ++i) {
          sum += std::exp(last - G[i]) * k[i * dk + d] * vnew[i * dv + e];
        }
        next[d * dv + e] = sum;
      }
    }
    state.swap(next);
  }
  write_matrix(p.final_state, s, h, dk, dv, dv, state.data(), dk, dv);
}

}  // namespace

void chunked_fwd(const ForwardInputs& inputs, const ForwardOutputs& outputs,
                 const ForwardOptions& options) {
  run_reference(inputs, outputs, options, Algorithm::chunked, &chunked_item);
}

ForwardResult chunked_fwd(const ForwardInputs& inputs, const ForwardOptions& options,
                          Residuals residuals) {
  return run_reference_allocating(inputs, options, residuals, true,
                                  [](const ForwardInputs& in, const ForwardOutputs& out,
                                     const ForwardOptions& o) { chunked_fwd(in, out, o); });
}

}  // namespace gdn::ref
