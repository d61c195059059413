// problem.cc: see problem.h.
#include "problem.h"

#include <cmath>
#include <sstream>
#include <tuple>
#include <utility>

namespace gdn::test {

std::uint64_t Random::next() {
  state_ += 0x9e3779b97f4a7c15ULL;
  std::uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double Random::uniform(double lo, double hi) {
  return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53;
}

double Random::normal() {
  // Box-Muller; u1 in (0, 1].
  const double u1 = 1.0 - uniform(), u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

std::string ProblemSpec::name() const {
  std::ostringstream s;
  s << "lengths [";
  for (std::size_t i = 0; i < lengths.size(); ++i) s << (i ? ", " : "") << lengths[i];
  s << "] Hk=" << hk << " Hv=" << hv << " Dk=" << dk << " Dv=" << dv << " " << dtype_name(dtype)
    << (initial_state ? " h0" : "") << (l2norm ? " l2norm" : "") << " g in [" << g_lo << ", "
    << g_hi << "] beta in [" << beta_lo << ", " << beta_hi << "]" << (batched ? " batched" : "")
    << " seed " << seed;
  return s.str();
}

ProblemSpec spec_for(const Shape& shape, DType dtype) {
  ProblemSpec spec;
  spec.lengths = shape.lengths;
  spec.hk = shape.hk;
  spec.hv = shape.hv;
  spec.dk = shape.dk;
  spec.dv = shape.dv;
  spec.dtype = dtype;
  return spec;
}

namespace {

void set(Tensor& t, std::int64_t i, double value) {
  if (t.dtype() == DType::f32) {
    t.data<float>()[i] = static_cast<float>(value);
  } else {
    t.data<double>()[i] = value;
  }
}

}  // namespace

Problem make_problem(const ProblemSpec& spec) {
  Problem p;
  p.spec = spec;
  Random rng(spec.seed);
  std::int64_t total = 0;
  for (std::int64_t len : spec.lengths) total += len;
  const std::int64_t n = static_cast<std::int64_t>(spec.lengths.size());
  const DType dt = spec.dtype;
  if (spec.batched) {
    const std::int64_t t = spec.lengths.front();
    p.q = Tensor(dt, {n, t, spec.hk, spec.dk});
    p.k = Tensor(dt, {n, t, spec.hk, spec.dk});
    p.v = Tensor(dt, {n, t, spec.hv, spec.dv});
    p.g = Tensor(dt, {n, t, spec.hv});
    p.beta = Tensor(dt, {n, t, spec.hv});
  } else {
    p.q = Tensor(dt, {total, spec.hk, spec.dk});
    p.k = Tensor(dt, {total, spec.hk, spec.dk});
    p.v = Tensor(dt, {total, spec.hv, spec.dv});
    p.g = Tensor(dt, {total, spec.hv});
    p.beta = Tensor(dt, {total, spec.hv});
    p.cu_seqlens = Tensor(DType::i64, {n + 1});
    std::int64_t at = 0;
    for (std::int64_t s = 0; s < n; ++s) {
      p.cu_seqlens.data<std::int64_t>()[s] = at;
      at += spec.lengths[s];
    }
    p.cu_seqlens.data<std::int64_t>()[n] = at;
  }
  // q and k: normal; unit norm per (token, head) unless the kernel normalises them.
  for (Tensor* x : {&p.q, &p.k}) {
    std::vector<double> row(spec.dk);
    for (std::int64_t r = 0; r < x->numel() / spec.dk; ++r) {
      double ss = 0;
      for (double& e : row) {
        e = rng.normal();
        ss += e * e;
      }
      const double inv = spec.l2norm ? 1.0 : 1.0 / std::sqrt(ss);
      for (std::int64_t d = 0; d < spec.dk; ++d) set(*x, r * spec.dk + d, row[d] * inv);
    }
  }
  for (std::int64_t i = 0; i < p.v.numel(); ++i) set(p.v, i, rng.normal());
  for (std::int64_t i = 0; i < p.g.numel(); ++i) set(p.g, i, rng.uniform(spec.g_lo, spec.g_hi));
  for (std::int64_t i = 0; i < p.beta.numel(); ++i)
    set(p.beta, i, rng.uniform(spec.beta_lo, spec.beta_hi));
  if (spec.initial_state) {
    p.h0 = Tensor(dt, {n, spec.hv, spec.dk, spec.dv});
    for (std::int64_t i = 0; i < p.h0.numel(); ++i) set(p.h0, i, 0.5 * rng.normal());
  }
  return p;
}

ForwardInputs Problem::inputs() const {
  return {q.view(), k.view(), v.view(), g.view(), beta.view(), h0.view(), cu_seqlens.view()};
}

ForwardOptions Problem::options() const {
  ForwardOptions o;
  o.use_qk_l2norm = spec.l2norm;
  return o;
}

namespace {

template <class In>
void baseline_run(const Problem& p, const ForwardOptions& options, ForwardResult& r) {
  const ProblemSpec& s = p.spec;
  const std::int64_t dk = s.dk, dv = s.dv, group = s.hv / s.hk;
  const float scale = options.scale ? static_cast<float>(*options.scale)
                                    : static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
  const In* q = p.q.data<In>();
  const In* k = p.k.data<In>();
  const In* v = p.v.data<In>();
  const In* g = p.g.data<In>();
  const In* beta = p.beta.data<In>();
  float* o = r.o.data<float>();
  float* ht = r.final_state.data<float>();
  std::vector<float> state(dk * dv), qt(dk), kt(dk), u(dv);
  std::int64_t start = 0;
  for (std::size_t seq = 0; seq < s.lengths.size(); ++seq) {
    const std::int64_t len = s.lengths[seq];
    for (std::int64_t h = 0; h < s.hv; ++h) {
      for (std::int64_t i = 0; i < dk * dv; ++i) {
        state[i] = p.h0.present()
                       ? static_cast<float>(p.h0.data<In>()[(seq * s.hv + h) * dk * dv + i])
                       : 0.0f;
      }
      for (std::int64_t t = start; t < start + len; ++t) {
        const std::int64_t hk = h / group;
        for (std::int64_t d = 0; d < dk; ++d) {
          qt[d] = static_cast<float>(q[(t * s.hk + hk) * dk + d]);
          kt[d] = static_cast<float>(k[(t * s.hk + hk) * dk + d]);
        }
        if (options.use_qk_l2norm) {
          for (std::vector<float>* x : {&qt, &kt}) {
            float ss = 0;
            for (float e : *x) ss += e * e;
            const float inv = 1.0f / std::sqrt(ss + 1e-6f);
            for (float& e : *x) e *= inv;
          }
        }
        const float alpha = std::exp(static_cast<float>(g[t * s.hv + h]));
        const float b = static_cast<float>(beta[t * s.hv + h]);
        for (std::int64_t j = 0; j < dv; ++j) {
          float sk = 0;
          for (std::int64_t d = 0; d < dk; ++d) sk += state[d * dv + j] * kt[d];
          u[j] = b * (static_cast<float>(v[(t * s.hv + h) * dv + j]) - alpha * sk);
        }
        for (std::int64_t d = 0; d < dk; ++d) {
          for (std::int64_t j = 0; j < dv; ++j)
            state[d * dv + j] = alpha * state[d * dv + j] + kt[d] * u[j];
        }
        for (std::int64_t j = 0; j < dv; ++j) {
          float sq = 0;
          for (std::int64_t d = 0; d < dk; ++d) sq += state[d * dv + j] * qt[d];
          o[(t * s.hv + h) * dv + j] = scale * sq;
        }
      }
      for (std::int64_t i = 0; i < dk * dv; ++i) ht[(seq * s.hv + h) * dk * dv + i] = state[i];
    }
    start += len;
  }
}

}  // namespace

ForwardResult baseline_f32(const Problem& p, const ForwardOptions& options) {
  ForwardResult r;
  const ForwardShape shape = forward_shape(p.inputs(), options);
  r.o = Tensor(DType::f32, shape.o_rank(), shape.o_sizes());
  r.final_state = Tensor(DType::f32, 4, shape.state_sizes());
  if (p.spec.dtype == DType::f32) {
    baseline_run<float>(p, options, r);
  } else {
    baseline_run<double>(p, options, r);
  }
  return r;
}

}  // namespace gdn::test

namespace gdn::test {
namespace {

template <class In>
float at(const Tensor& t, std::int64_t i) {
  return static_cast<float>(t.data<In>()[i]);
}

template <class In>
void baseline_bwd_run(const Problem& p, const Tensor& d_o, const Tensor& d_ht,
                      const ForwardOptions& options, BackwardResult& r) {
  const ProblemSpec& s = p.spec;
  const std::int64_t dk = s.dk, dv = s.dv, group = s.hv / s.hk, state = dk * dv;
  const float scale = options.scale ? static_cast<float>(*options.scale)
                                    : static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
  std::int64_t total = 0;
  for (std::int64_t len : s.lengths) total += len;
  // Normalised q, k per (token, key head), float.
  std::vector<float> qn(total * s.hk * dk), kn(total * s.hk * dk), dqn(qn.size()), dkn(kn.size());
  for (std::int64_t row = 0; row < total * s.hk; ++row) {
    for (auto [x, out] : {std::pair{&p.q, &qn}, std::pair{&p.k, &kn}}) {
      float ss = 0;
      for (std::int64_t d = 0; d < dk; ++d)
        ss += at<In>(*x, row * dk + d) * at<In>(*x, row * dk + d);
      const float inv = options.use_qk_l2norm ? 1.0f / std::sqrt(ss + 1e-6f) : 1.0f;
      for (std::int64_t d = 0; d < dk; ++d) (*out)[row * dk + d] = at<In>(*x, row * dk + d) * inv;
    }
  }
  std::int64_t start = 0;
  for (std::size_t seq = 0; seq < s.lengths.size(); ++seq) {
    const std::int64_t len = s.lengths[seq];
    for (std::int64_t h = 0; h < s.hv; ++h) {
      const std::int64_t hk = h / group;
      std::vector<float> states((len + 1) * state), u(len * dv);
      for (std::int64_t e = 0; e < state; ++e) {
        states[e] = p.h0.present() ? at<In>(p.h0, (seq * s.hv + h) * state + e) : 0.0f;
      }
      for (std::int64_t i = 0; i < len; ++i) {
        const std::int64_t t = start + i;
        const float* k = &kn[(t * s.hk + hk) * dk];
        const float alpha = std::exp(at<In>(p.g, t * s.hv + h)),
                    beta = at<In>(p.beta, t * s.hv + h);
        const float* prev = &states[i * state];
        float* next = &states[(i + 1) * state];
        for (std::int64_t j = 0; j < dv; ++j) {
          float sk = 0;
          for (std::int64_t d = 0; d < dk; ++d) sk += alpha * prev[d * dv + j] * k[d];
          u[i * dv + j] = beta * (at<In>(p.v, (t * s.hv + h) * dv + j) - sk);
        }
        for (std::int64_t d = 0; d < dk; ++d) {
          for (std::int64_t j = 0; j < dv; ++j)
            next[d * dv + j] = alpha * prev[d * dv + j] + k[d] * u[i * dv + j];
        }
      }
      std::vector<float> dS(state), dS1(state), du(dv);
      for (std::int64_t e = 0; e < state; ++e) {
        dS[e] = d_ht.present() ? at<In>(d_ht, (seq * s.hv + h) * state + e) : 0.0f;
      }
      for (std::int64_t i = len - 1; i >= 0; --i) {
        const std::int64_t t = start + i;
        const float* q = &qn[(t * s.hk + hk) * dk];
        const float* k = &kn[(t * s.hk + hk) * dk];
        float* dq = &dqn[(t * s.hk + hk) * dk];
        float* dkk = &dkn[(t * s.hk + hk) * dk];
        const float alpha = std::exp(at<In>(p.g, t * s.hv + h)),
                    beta = at<In>(p.beta, t * s.hv + h);
        const float* prev = &states[i * state];
        const float* next = &states[(i + 1) * state];
        for (std::int64_t d = 0; d < dk; ++d) {
          float acc = 0;
          for (std::int64_t j = 0; j < dv; ++j)
            acc += next[d * dv + j] * at<In>(d_o, (t * s.hv + h) * dv + j);
          dq[d] += scale * acc;
          for (std::int64_t j = 0; j < dv; ++j)
            dS[d * dv + j] += scale * q[d] * at<In>(d_o, (t * s.hv + h) * dv + j);
        }
        for (std::int64_t j = 0; j < dv; ++j) {
          float acc = 0;
          for (std::int64_t d = 0; d < dk; ++d) acc += dS[d * dv + j] * k[d];
          du[j] = acc;
        }
        float dbeta = 0;
        for (std::int64_t j = 0; j < dv; ++j) {
          float sk = 0;
          for (std::int64_t d = 0; d < dk; ++d) sk += alpha * prev[d * dv + j] * k[d];
          dbeta += du[j] * (at<In>(p.v, (t * s.hv + h) * dv + j) - sk);
          r.dv.data<float>()[(t * s.hv + h) * dv + j] = beta * du[j];
        }
        r.dbeta.data<float>()[t * s.hv + h] = dbeta;
        float dalpha = 0;
        for (std::int64_t d = 0; d < dk; ++d) {
          float acc = 0, acc_u = 0;
          for (std::int64_t j = 0; j < dv; ++j) {
            acc_u += dS[d * dv + j] * u[i * dv + j];
            acc += alpha * prev[d * dv + j] * du[j];
            dS1[d * dv + j] = dS[d * dv + j] - beta * k[d] * du[j];
            dalpha += dS1[d * dv + j] * prev[d * dv + j];
          }
          dkk[d] += acc_u - beta * acc;
        }
        r.dg.data<float>()[t * s.hv + h] = dalpha * alpha;
        for (std::int64_t e = 0; e < state; ++e) dS[e] = alpha * dS1[e];
      }
      for (std::int64_t e = 0; e < state; ++e)
        r.d_initial_state.data<float>()[(seq * s.hv + h) * state + e] = dS[e];
    }
    start += len;
  }
  for (std::int64_t row = 0; row < total * s.hk; ++row) {
    for (auto [x, d_hat, out] : {std::tuple{&p.q, &dqn, &r.dq}, std::tuple{&p.k, &dkn, &r.dk}}) {
      if (!options.use_qk_l2norm) {
        for (std::int64_t d = 0; d < dk; ++d)
          out->template data<float>()[row * dk + d] = (*d_hat)[row * dk + d];
        continue;
      }
      float ss = 0, proj = 0;
      for (std::int64_t d = 0; d < dk; ++d)
        ss += at<In>(*x, row * dk + d) * at<In>(*x, row * dk + d);
      const float inv = 1.0f / std::sqrt(ss + 1e-6f);
      for (std::int64_t d = 0; d < dk; ++d)
        proj += at<In>(*x, row * dk + d) * inv * (*d_hat)[row * dk + d];
      for (std::int64_t d = 0; d < dk; ++d) {
        out->template data<float>()[row * dk + d] =
            inv * ((*d_hat)[row * dk + d] - at<In>(*x, row * dk + d) * inv * proj);
      }
    }
  }
}

void fill_normal(Tensor& t, Random& rng) {
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if (t.dtype() == DType::f32) {
      t.data<float>()[i] = static_cast<float>(rng.normal());
    } else {
      t.data<double>()[i] = rng.normal();
    }
  }
}

}  // namespace

BackwardResult baseline_f32_bwd(const Problem& p, const Tensor& d_o, const Tensor& d_ht,
                                const ForwardOptions& options) {
  BackwardResult r;
  r.dq = Tensor(DType::f32, p.q.rank(), p.q.sizes());
  r.dk = Tensor(DType::f32, p.k.rank(), p.k.sizes());
  r.dv = Tensor(DType::f32, p.v.rank(), p.v.sizes());
  r.dg = Tensor(DType::f32, p.g.rank(), p.g.sizes());
  r.dbeta = Tensor(DType::f32, p.beta.rank(), p.beta.sizes());
  r.d_initial_state = Tensor(DType::f32, {static_cast<std::int64_t>(p.spec.lengths.size()),
                                          p.spec.hv, p.spec.dk, p.spec.dv});
  if (p.spec.dtype == DType::f32) {
    baseline_bwd_run<float>(p, d_o, d_ht, options, r);
  } else {
    baseline_bwd_run<double>(p, d_o, d_ht, options, r);
  }
  return r;
}

Cotangents make_cotangents(const Problem& p, std::uint64_t seed) {
  const ForwardShape shape = forward_shape(p.inputs(), p.options());
  Cotangents c;
  c.d_o = Tensor(p.spec.dtype, shape.o_rank(), shape.o_sizes());
  c.d_ht = Tensor(p.spec.dtype, 4, shape.state_sizes());
  Random rng(seed);
  fill_normal(c.d_o, rng);
  fill_normal(c.d_ht, rng);
  return c;
}

}  // namespace gdn::test
