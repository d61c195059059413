// backward.cc: reverse-mode differentiation of the token recurrence, in float64 (the definition
// of the backward pass; docs/math.md section 5.1). Per token, forward:
//   S' = alpha S;  u = beta (v - S'^T k);  S_new = S' + k u^T;  o = scale S_new^T q
// and in reverse, with dS the cotangent of S_new:
//   dq += scale S_new dO;   dS += scale q dO^T
//   du = dS^T k;   dk += dS u;   dS' = dS - beta k du^T;   dk -= beta S' du
//   dbeta = du . (v - S'^T k);   dv = beta du;   dg = alpha <dS', S>;   dS = alpha dS'
// then the L2-norm backward dx = (dx_hat - x_hat (x_hat . dx_hat)) / sqrt(|x|^2 + eps).
// The states are recomputed from checkpoints every kSegment tokens (the reference keeps
// O(T / kSegment + kSegment) states per item). Tested against central finite differences of
// recurrent_fwd (tests/reference/backward_test.cc).
#include <algorithm>
#include <cmath>
#include <vector>

#include "api/validate.h"
#include "gdn/reference.h"
#include "reference/reference.h"

namespace gdn::ref {
namespace {

constexpr std::int64_t kSegment = 64;

using Vector = std::vector<double>;

// Row (sequence s, token t, head h) of a gradient output (f64), n elements.
void write_grad(const detail::TokenTensor<std::byte*>& x, const detail::Sequence& s, std::int64_t t,
                std::int64_t h, std::int64_t n, const double* values) {
  write_row(x, s, t, h, n, values);
}

// x_hat = x / sqrt(|x|^2 + 1e-6); dx from dx_hat.
void l2_norm_backward(const double* x, const double* dx_hat, std::int64_t n, double* dx) {
  double ss = 0;
  for (std::int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss + 1e-6);
  double dot = 0;
  for (std::int64_t i = 0; i < n; ++i) dot += x[i] * inv * dx_hat[i];
  for (std::int64_t i = 0; i < n; ++i) dx[i] = inv * (dx_hat[i] - x[i] * inv * dot);
}

struct Token {
  Vector q, k, v;  // q, k after the L2 norm (when on), not scaled
  double alpha = 1, beta = 0;
};

void load_token(const detail::ForwardProblem& p, const detail::Sequence& seq, std::int64_t t,
                std::int64_t h, Token* token) {
  const std::int64_t hk = h / p.group;
  token->q.resize(p.shape.dk);
  token->k.resize(p.shape.dk);
  token->v.resize(p.shape.dv);
  read_row(p.q, seq, t, hk, p.shape.dk, token->q.data());
  read_row(p.k, seq, t, hk, p.shape.dk, token->k.data());
  read_row(p.v, seq, t, h, p.shape.dv, token->v.data());
  if (p.l2norm) {
    l2_normalize(token->q.data(), p.shape.dk);
    l2_normalize(token->k.data(), p.shape.dk);
  }
  token->alpha = std::exp(read_scalar(p.g, seq, t, h));
  token->beta = read_scalar(p.beta, seq, t, h);
}

// S <- the state after token t (alpha S + k u^T); returns u in `u`.
void step(const Token& x, std::int64_t dk, std::int64_t dv, Vector& state, Vector& u) {
  for (std::int64_t j = 0; j < dv; ++j) {
    double sk = 0;
    for (std::int64_t i = 0; i < dk; ++i) sk += x.alpha * state[i * dv + j] * x.k[i];
    u[j] = x.beta * (x.v[j] - sk);
  }
  for (std::int64_t i = 0; i < dk; ++i) {
    for (std::int64_t j = 0; j < dv; ++j) {
      state[i * dv + j] = x.alpha * state[i * dv + j] + x.k[i] * u[j];
    }
  }
}

// One value head h of sequence s: dv, dg, dbeta, d_initial_state written; the gradients of
// the normalised (unscaled) q and k added to dq_hat and dk_hat ([length][Dk]).
void backward_head(const detail::BackwardProblem& bp, std::int64_t s, std::int64_t h,
                   Vector& dq_hat, Vector& dk_hat) {
  const detail::ForwardProblem& p = bp.fwd;
  const detail::Sequence& seq = p.seqs[s];
  const std::int64_t dk = p.shape.dk, dv = p.shape.dv, len = seq.length;
  const std::int64_t segments = (len + kSegment - 1) / kSegment;

  // Forward: the state entering every segment.
  std::vector<Vector> checkpoints(static_cast<std::size_t>(segments));
  Vector state(dk * dv), u(dv);
  read_matrix(p.initial_state, s, h, dk, dv, state.data());
  Token x;
  for (std::int64_t t = 0; t < len; ++t) {
    if (t % kSegment == 0) checkpoints[t / kSegment] = state;
    load_token(p, seq, t, h, &x);
    step(x, dk, dv, state, u);
  }

  Vector dS(dk * dv), dO(dv), du(dv), dS_prime(dk * dv), row(std::max(dk, dv));
  read_matrix(bp.d_final_state, s, h, dk, dv, dS.data());
  std::vector<Vector> entering(kSegment);  // the state entering each token of a segment
  for (std::int64_t segment = segments - 1; segment >= 0; --segment) {
    const std::int64_t t0 = segment * kSegment, t1 = std::min(len, t0 + kSegment);
    state = checkpoints[segment];
    for (std::int64_t t = t0; t < t1; ++t) {
      entering[t - t0] = state;
      load_token(p, seq, t, h, &x);
      step(x, dk, dv, state, u);
    }
    for (std::int64_t t = t1 - 1; t >= t0; --t) {
      const Vector& prev = entering[t - t0];
      load_token(p, seq, t, h, &x);
      // Recompute u and the state after the token.
      Vector next = prev;
      step(x, dk, dv, next, u);
      read_row(bp.d_o, seq, t, h, dv, dO.data());
      // o = scale S_new^T q.
      double* dq_t = &dq_hat[t * dk];
      for (std::int64_t i = 0; i < dk; ++i) {
        double acc = 0;
        for (std::int64_t j = 0; j < dv; ++j) acc += next[i * dv + j] * dO[j];
        dq_t[i] += p.scale * acc;
        for (std::int64_t j = 0; j < dv; ++j) dS[i * dv + j] += p.scale * x.q[i] * dO[j];
      }
      // S_new = S' + k u^T.
      double* dk_t = &dk_hat[t * dk];
      for (std::int64_t j = 0; j < dv; ++j) {
        double acc = 0;
        for (std::int64_t i = 0; i < dk; ++i) acc += dS[i * dv + j] * x.k[i];
        du[j] = acc;
      }
      for (std::int64_t i = 0; i < dk; ++i) {
        double acc = 0;
        for (std::int64_t j = 0; j < dv; ++j) acc += dS[i * dv + j] * u[j];
        dk_t[i] += acc;
      }
      // u = beta (v - S'^T k), S' = alpha S.
      double dbeta = 0;
      for (std::int64_t j = 0; j < dv; ++j) {
        double sk = 0;
        for (std::int64_t i = 0; i < dk; ++i) sk += x.alpha * prev[i * dv + j] * x.k[i];
        dbeta += du[j] * (x.v[j] - sk);
        row[j] = x.beta * du[j];  // dv
      }
      write_grad(bp.dv, seq, t, h, dv, row.data());
      write_grad(bp.dbeta, seq, t, h, 1, &dbeta);
      for (std::int64_t i = 0; i < dk; ++i) {
        double acc = 0;
        for (std::int64_t j = 0; j < dv; ++j) {
          acc += x.alpha * prev[i * dv + j] * du[j];
          dS_prime[i * dv + j] = dS[i * dv + j] - x.beta * x.k[i] * du[j];
        }
        dk_t[i] -= x.beta * acc;
      }
      double dalpha = 0;
      for (std::int64_t e = 0; e < dk * dv; ++e) dalpha += dS_prime[e] * prev[e];
      const double dg = dalpha * x.alpha;
      write_grad(bp.dg, seq, t, h, 1, &dg);
      for (std::int64_t e = 0; e < dk * dv; ++e) dS[e] = x.alpha * dS_prime[e];
    }
  }
  write_matrix(bp.d_initial_state, s, h, dk, dv, dv, dS.data(), dk, dv);
}

// Sequence s, key head hk: every value head reading it (in order), then dq and dk.
void backward_item(const detail::BackwardProblem& bp, std::int64_t s, std::int64_t hk) {
  const detail::ForwardProblem& p = bp.fwd;
  const detail::Sequence& seq = p.seqs[s];
  const std::int64_t dk = p.shape.dk, len = seq.length;
  Vector dq_hat(len * dk), dk_hat(len * dk);
  for (std::int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    backward_head(bp, s, h, dq_hat, dk_hat);
  }
  Vector raw(dk), grad(dk);
  for (std::int64_t t = 0; t < len; ++t) {
    for (auto [x, dx_hat, out] :
         {std::tuple{&p.q, &dq_hat, &bp.dq}, std::tuple{&p.k, &dk_hat, &bp.dk}}) {
      const double* d_hat = &(*dx_hat)[t * dk];
      if (p.l2norm) {
        read_row(*x, seq, t, hk, dk, raw.data());
        l2_norm_backward(raw.data(), d_hat, dk, grad.data());
      } else {
        std::copy(d_hat, d_hat + dk, grad.begin());
      }
      write_grad(*out, seq, t, hk, dk, grad.data());
    }
  }
}

}  // namespace

void recurrent_bwd(const BackwardInputs& inputs, const BackwardOutputs& outputs,
                   const ForwardOptions& options) {
  ForwardOptions opts = options;
  opts.algorithm = Algorithm::automatic;  // options.algorithm, .isa, .matmul_precision ignored
  opts.isa = CpuIsa::automatic;
  opts.matmul_precision = MatmulPrecision::compute;
  detail::ValidatedBackward validated;
  detail::validate_backward(inputs, outputs, opts, detail::OutputPrecision::float64, &validated);
  const detail::BackwardProblem& bp = validated.problem;
  const std::int64_t items = bp.fwd.shape.num_seqs * bp.fwd.shape.hk;
  parallel_for(bp.fwd.threads, items, [&bp](std::int64_t item) {
    backward_item(bp, item / bp.fwd.shape.hk, item % bp.fwd.shape.hk);
  });
}

BackwardResult recurrent_bwd(const BackwardInputs& inputs, const ForwardOptions& options) {
  ForwardOptions opts = options;
  opts.algorithm = Algorithm::automatic;
  opts.isa = CpuIsa::automatic;
  BackwardResult r =
      detail::allocate_backward_result(inputs, forward_shape(inputs.forward(), opts), DType::f64);
  recurrent_bwd(inputs, detail::outputs_of(r), options);
  return r;
}

}  // namespace gdn::ref
