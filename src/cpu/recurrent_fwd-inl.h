// recurrent_fwd-inl.h: the token recurrence of one (sequence, value head), two passes over
// the state per token, for one ISA variant. Used for sequences shorter than a chunk and as
// the baseline of `gdn bench`. Must match gdn::ref::recurrent_fwd (tests/cpu/forward_test.cc).
//
// The output is taken from the old state, so one read pass serves both products:
//   pass 1   ks = S^T k,  qs = S^T q                      (read S)
//            u = beta (v - alpha ks),  o = alpha qs + (q . k) u   (q already scaled)
//   pass 2   S = alpha S + k u^T                          (read and write S)
// FLOPs per token and head: 6 Dk Dv (+ O(Dk + Dv)); the state (64 KiB at d = 128, float)
// lives in L2, so this runs at L2 bandwidth, not at FMA peak.

// Register block of pass 1: NB vectors of columns, two accumulators each (ks and qs).
inline constexpr int kRecurrentBlock = GDN_GEMM_NV * 2;

// A vector of a state as Real: a row of Real, or of bf16 widened (exactly; a bf16 pool's slot
// in the serving step's decode, src/cpu/decode-inl.h).
template <class Real, class State>
inline Vec<Real> load_state(const State* p) {
  if constexpr (__is_same(State, Real)) {
    return load(p);
  } else {
    return widen_bf16(p);
  }
}

// ks, qs of columns [0, n) of a row-major block (rows ld apart) of State (Real, or bf16):
// vector blocks of kRecurrentBlock in registers, the tail column by column. src = null: zeros.
template <class Real, class State>
inline void block_products(const State* src, std::int64_t rows, std::int64_t ld, std::int64_t n,
                           const Real* k, const Real* q, Real* ks, Real* qs) {
  constexpr int W = kLanes<Real>;
  const std::int64_t whole = n / W * W;
  if (src == nullptr) {
    for (std::int64_t j = 0; j < n; ++j) ks[j] = qs[j] = 0;
    return;
  }
  for (std::int64_t j = 0; j < whole; j += kRecurrentBlock * W) {
    const int nb = static_cast<int>(min64(kRecurrentBlock, (whole - j) / W));
    Vec<Real> acc_k[kRecurrentBlock] = {}, acc_q[kRecurrentBlock] = {};
    if (nb == kRecurrentBlock) {
      for (std::int64_t r = 0; r < rows; ++r) {
        const State* row = src + r * ld + j;
        const Real kr = k[r], qr = q[r];

#pragma GCC unroll 16
        for (int v = 0; v < kRecurrentBlock; ++v) {
          const Vec<Real> sv = load_state<Real>(row + v * W);
          acc_k[v] += kr * sv;
          acc_q[v] += qr * sv;
        }
      }
    } else {
      for (std::int64_t r = 0; r < rows; ++r) {
        const State* row = src + r * ld + j;
        const Real kr = k[r], qr = q[r];
        for (int v = 0; v < nb; ++v) {
          const Vec<Real> sv = load_state<Real>(row + v * W);
          acc_k[v] += kr * sv;
          acc_q[v] += qr * sv;
        }
      }
    }
    for (int v = 0; v < nb; ++v) {
      store(ks + j + v * W, acc_k[v]);
      store(qs + j + v * W, acc_q[v]);
    }
  }
  for (std::int64_t j = whole; j < n; ++j) {
    Real a = 0, b = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      a += k[r] * static_cast<Real>(src[r * ld + j]);
      b += q[r] * static_cast<Real>(src[r * ld + j]);
    }
    ks[j] = a;
    qs[j] = b;
  }
}

// q, k, v and o are In (the activation type); g, beta and the states are Real.
template <class Real, class In>
void recurrent_head(const detail::ForwardProblem& p, std::int64_t s, std::int64_t h,
                    std::byte* workspace) {
  constexpr int W = kLanes<Real>;
  const detail::Sequence& seq = p.seqs[s];
  const std::int64_t dk = p.shape.dk, dv = p.shape.dv, c = p.chunk_size;
  const std::int64_t hk = h / p.group;
  const Real scale = static_cast<Real>(p.scale);
  const RecurrentLayout l = recurrent_layout(dk, dv);
  Real* w = reinterpret_cast<Real*>(workspace);
  Real* state = w + l.state;
  Real* q = w + l.q;
  Real* k = w + l.k;
  Real* v = w + l.v;
  Real* ks = w + l.ks;
  Real* qs = w + l.qs;

  // The fused layer op's conv (ForwardProblem::conv): its rows one token at a time.
  Real* conv_stage = p.conv != nullptr ? w + l.total : nullptr;

  load_matrix<Real, Real>(state, dk, dv, l.dvp, p.initial_state, s, h);
  for (std::int64_t t = 0; t < seq.length; ++t) {
    if (t % c == 0)
      store_matrix<Real>(p.chunk_states, seq.first_chunk + t / c, h, state, dk, dv, l.dvp);
    if (conv_stage != nullptr) {
      conv_head_rows<Real, In>(*p.conv, seq, s, hk * dk, dk, t, 1, q, l.dkp, conv_stage);
      normalize_qk_row(q, l.dkp, p.l2norm, scale);
      conv_head_rows<Real, In>(*p.conv, seq, s, (p.shape.hk + hk) * dk, dk, t, 1, k, l.dkp,
                               conv_stage);
      normalize_qk_row(k, l.dkp, p.l2norm, static_cast<Real>(1));
      conv_head_rows<Real, In>(*p.conv, seq, s, 2 * p.shape.hk * dk + h * dv, dv, t, 1, v, l.dvp,
                               conv_stage);
    } else {
      pack_qk_row(q, token_at<In>(p.q, seq, t, hk), p.q.dim, dk, l.dkp, p.l2norm, scale);
      pack_qk_row(k, token_at<In>(p.k, seq, t, hk), p.k.dim, dk, l.dkp, p.l2norm,
                  static_cast<Real>(1));
      gather_row(v, token_at<In>(p.v, seq, t, h), p.v.dim, dv, l.dvp);
    }
    const Real alpha =
        static_cast<Real>(__builtin_exp(static_cast<double>(*token_at<Real>(p.g, seq, t, h))));
    const Real beta = *token_at<Real>(p.beta, seq, t, h);

    block_products(state, dk, l.dvp, l.dvp, k, q, ks, qs);
    const Real qk = dot(q, k, l.dkp);
    for (std::int64_t j = 0; j < l.dvp; j += W) {
      const Vec<Real> u = (load(v + j) - load(ks + j) * alpha) * beta;
      store(v + j, u);
      store(qs + j, load(qs + j) * alpha + u * qk);
    }
    for (std::int64_t r = 0; r < dk; ++r) {
      Real* row = state + r * l.dvp;
      const Real kr = k[r];
      for (std::int64_t j = 0; j < l.dvp; j += W)
        store(row + j, load(row + j) * alpha + load(v + j) * kr);
    }
    if (p.o.data != nullptr) scatter_row(token_at<In>(p.o, seq, t, h), p.o.dim, qs, dv);
  }
  store_matrix<Real>(p.final_state, s, h, state, dk, dv, l.dvp);
}

// Value heads [h0, h0 + heads) of sequence s, one after the other (each head's recurrence
// shares nothing with the others but the q and k rows).
template <class Real, class In>
void recurrent_item(const detail::ForwardProblem& p, std::int64_t s, std::int64_t h0,
                    std::int64_t heads, std::byte* workspace) {
  for (std::int64_t h = h0; h < h0 + heads; ++h) recurrent_head<Real, In>(p, s, h, workspace);
}
