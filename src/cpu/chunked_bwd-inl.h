// chunked_bwd-inl.h: the chunked backward of one sequence for the value heads of one key head,
// float32 or float64, for one ISA variant. Must match gdn::ref::recurrent_bwd
// (tests/cpu/backward_test.cc); benchmark: `gdn bench` (backward-* cases).
//
// Chunks are walked in reverse with each head's dS carried in the compute precision. Per chunk
// of n tokens, S = the state entering it, A = T^-1, dS' = the cotangent of the state leaving
// it (docs/math.md section 5.2 derives every line):
//   recompute   Q~, K, K^T, [Q;K] K^T (shared by the heads); per head V, beta, G, e^G, Gamma,
//               P, L, B = K K^T . Gamma, A (t_inv or solve_tril), X = [Q;K] S,
//               U0 = V - e^G . K S,  R = beta . U0,  V_new = A R
//   bwd_values  K dS', dV_new = P^T dO + d . (K dS'),  dR = A^T dV_new,
//               [dP; -dL] = [dO; dR] V_new^T
//   bwd_gates   dbeta = rowsum(dR . U0) + rowsum(dL . B);  dv = beta . dR;
//               dG from e^G, e^(G_last - G), e^G_last and Gamma;  dg = reverse cumsum(dG)
//   bwd_qk      [dQ~; dK] += [dP.Gamma K; (dP.Gamma)^T Q~ + (dB.Gamma + (dB.Gamma)^T) K
//                            + (d . V_new) dS'^T] + [e dO; -beta e dR] S^T
//   bwd_state   dS = e^G_last dS' + [Q~; K]^T [e dO; -beta e dR]
// dq, dk of a chunk are summed over the heads (in head order), then scaled and taken through
// the L2-norm backward.

template <class Real>
struct BackwardBuffers {
  ChunkBuffers<Real> c;  // the forward's chunk buffers (c.states unused)
  Real* r;
  Real* dodr;
  Real* dvn;
  Real* vnt;
  Real* dpl;
  Real* st;
  Real* dst;
  Real* state;
  Real* dqk;
  Real* y;
  Real* hmat;
  Real* dd;  // dd_i d_i
  Real* dbeta;
  Real* de;  // de_i e_i
  Real* row;
  Real* inv_norms;
  Real* ds;
  Real* rebuilt;

  BackwardBuffers(std::byte* workspace, const BackwardLayout& l) : c(workspace, l.fwd) {
    Real* w = reinterpret_cast<Real*>(workspace);
    c.gamma = w + l.gamma;
    c.bmat = w + l.bmat;
    r = w + l.r;
    dodr = w + l.dodr;
    dvn = w + l.dvn;
    vnt = w + l.vnt;
    dpl = w + l.dpl;
    st = w + l.st;
    dst = w + l.dst;
    state = w + l.state;
    dqk = w + l.dqk;
    y = w + l.y;
    hmat = w + l.hmat;
    dd = w + l.grad_vectors;
    dbeta = dd + l.fwd.cp;
    de = dbeta + l.fwd.cp;
    row = de + l.fwd.cp;
    inv_norms = w + l.inv_norms;
    ds = w + l.ds;
    rebuilt = w + l.rebuilt;
  }
};

// A = t_inv block of (chunk, h): its n x n block, zeros elsewhere in the first n rows.
template <class Real>
void load_t_inv(const detail::MatrixTensor<const std::byte*>& t_inv, std::int64_t chunk,
                std::int64_t h, std::int64_t n, const ChunkedLayout& l, Real* a) {
  const Real* base = matrix_at<Real>(t_inv, chunk, h);
  for (std::int64_t i = 0; i < n; ++i) {
    Real* row = a + i * l.cp;
    fill<Real>(row, l.cp, 0);
    for (std::int64_t j = 0; j < n; ++j) row[j] = base[i * t_inv.row + j * t_inv.col];
  }
}

// A of head h's chunk: from the t_inv residual when kept, else by forward substitution on L.
template <class Real>
void chunk_t_inv(const detail::BackwardProblem& bp, std::int64_t chunk, std::int64_t h,
                 std::int64_t n, const ChunkedLayout& l, ChunkBuffers<Real>& b) {
  if (bp.t_inv.data != nullptr) {
    load_t_inv(bp.t_inv, chunk, h, n, l, b.a);
  } else {
    solve_tril(n, l, b);
  }
}

// The forward step of one head over one chunk without its output: `state` (entering) becomes
// the state leaving the chunk. Needs the shared K buffers and the K rows of the chunk's raw gram
// (chunk_pack_qk and chunk_gram without Q).
// Bit-identical to the forward's step: the same stages compute K S, R, V_new and the update.
template <class Real, class In>
void rebuild_step(const detail::BackwardProblem& bp, const detail::Sequence& seq,
                  std::int64_t chunk, std::int64_t h, std::int64_t t0, std::int64_t n, Real* state,
                  const ChunkedLayout& l, ChunkBuffers<Real>& b) {
  const detail::ForwardProblem& p = bp.fwd;
  chunk_pack_v<Real, In>(p, seq, h, t0, n, l, b);
  chunk_kkt(n, l, b, /*with_p=*/false);
  chunk_t_inv(bp, chunk, h, n, l, b);
  chunk_wy(n, p.shape.dk, state, l, b, /*with_q=*/false);
  chunk_state(n, p.shape.dk, state, l, b);
}

// Recomputes what the backward of head h's chunk needs: K S (rows n..2n-1 of c.x), U0 (in
// c.v), R, V_new, and fills dO (rows 0..n-1 of dodr). Q S is not needed: the one place it
// appears, dO . (Q~ S)_i, is read off (dO S^T)_i . q~_i, a row of a product the backward forms
// anyway (measured: 12 % of the backward's arithmetic saved).
template <class Real, class In>
void bwd_recompute(const detail::BackwardProblem& bp, const detail::Sequence& seq,
                   std::int64_t chunk, std::int64_t h, std::int64_t t0, std::int64_t n,
                   const Real* state, const ChunkedLayout& l, BackwardBuffers<Real>& w,
                   StageClock& clock) {
  const detail::ForwardProblem& p = bp.fwd;
  ChunkBuffers<Real>& b = w.c;
  chunk_pack_v<Real, In>(p, seq, h, t0, n, l, b);
  clock.lap(Stage::pack_v);
  chunk_kkt(n, l, b);
  clock.lap(Stage::kkt);
  chunk_t_inv(bp, chunk, h, n, l, b);
  clock.lap(bp.t_inv.data != nullptr ? Stage::residuals : Stage::solve);
  const Real* ks = b.x + n * l.dvp;
  gemm<Real, false>(n, l.dvp, p.shape.dk, b.qk + n * l.dkp, l.dkp, 1, state, l.dvp, b.x + n * l.dvp,
                    l.dvp, 1, kFull, b.bf16);
  for (std::int64_t i = 0; i < n; ++i) {
    Real* u0 = b.v + i * l.dvp;
    Real* r = w.r + i * l.dvp;
    const Real beta_i = b.beta[i], eg_i = b.eG[i];
    for (std::int64_t j = 0; j < l.dvp; j += kLanes<Real>) {
      const Vec<Real> u = load(u0 + j) - load(ks + i * l.dvp + j) * eg_i;
      store(u0 + j, u);
      store(r + j, u * beta_i);
    }
  }
  gemm<Real, false>(n, l.dvp, n, b.a, l.cp, 1, w.r, l.dvp, b.vnew, l.dvp, 1, kLowerA, b.bf16);
  clock.lap(Stage::recompute);
  for (std::int64_t i = 0; i < n; ++i) {
    gather_row(w.dodr + i * l.dvp, token_at<In>(bp.d_o, seq, t0 + i, h), bp.d_o.dim, p.shape.dv,
               l.dvp);
  }
  clock.lap(Stage::read_do);
}

// The backward of head h over one chunk, given its recomputed buffers: writes dv, dbeta, dg of
// the chunk's tokens, adds the head's dQ~ and dK into w.dqk, and turns ds (dS') into the
// cotangent of the state entering the chunk.
template <class Real, class In>
void bwd_chunk_head(const detail::BackwardProblem& bp, const detail::Sequence& seq, std::int64_t h,
                    std::int64_t t0, std::int64_t n, const Real* state, Real* ds,
                    const ChunkedLayout& l, BackwardBuffers<Real>& w, StageClock& clock) {
  constexpr int W = kLanes<Real>;
  const detail::ForwardProblem& p = bp.fwd;
  ChunkBuffers<Real>& b = w.c;
  const std::int64_t dk = p.shape.dk, dv = p.shape.dv;
  Real* d_o = w.dodr;
  Real* dr = w.dodr + n * l.dvp;
  Real* kds = w.r;  // R is no longer needed once V_new exists
  const Real* q = b.qk;
  const Real* k = b.qk + n * l.dkp;

  // bwd_values.
  Real* const bf16 = b.bf16;
  gemm<Real, false>(n, l.dvp, dk, k, l.dkp, 1, ds, l.dvp, kds, l.dvp, 1, kFull, bf16);  // K dS'
  gemm<Real, false>(n, l.dvp, n, b.pl, 1, l.cp, d_o, l.dvp, w.dvn, l.dvp, 1, kUpperA,
                    bf16);  // P^T dO
  for (std::int64_t i = 0; i < n; ++i) {
    w.dd[i] = dot(kds + i * l.dvp, b.vnew + i * l.dvp, l.dvp);
    const Real d_i = b.decay_to_end[i];
    Real* dvn = w.dvn + i * l.dvp;
    for (std::int64_t j = 0; j < l.dvp; j += W)
      store(dvn + j, load(dvn + j) + load(kds + i * l.dvp + j) * d_i);
  }
  gemm<Real, false>(n, l.dvp, n, b.a, 1, l.cp, w.dvn, l.dvp, dr, l.dvp, 1, kUpperA,
                    bf16);  // A^T dV_new
  transpose_into(b.vnew, n, l.dvp, dv, w.vnt, l.cp, l.cp);
  gemm<Real, false>(n, l.cp, dv, d_o, l.dvp, 1, w.vnt, l.cp, w.dpl, l.cp, 1, kLowerC,
                    bf16);  // dP
  gemm<Real, false>(n, l.cp, dv, dr, l.dvp, 1, w.vnt, l.cp, w.dpl + n * l.cp, l.cp, 1, kLowerC,
                    bf16);
  clock.lap(Stage::values);

  // M = [e dO; -beta e dR] (over X: K S is no longer needed) and Y = M S^T, the start of this
  // head's [dQ~; dK].
  Real* m = b.x;
  for (std::int64_t i = 0; i < n; ++i) {
    const Real e = b.eG[i], nbe = -b.beta[i] * b.eG[i];
    for (std::int64_t j = 0; j < l.dvp; j += W) {
      store(m + i * l.dvp + j, load(d_o + i * l.dvp + j) * e);
      store(m + (n + i) * l.dvp + j, load(dr + i * l.dvp + j) * nbe);
    }
  }
  transpose_into(state, dk, l.dvp, dv, w.st, l.dkp, l.dkp);
  gemm<Real, false>(2 * n, l.dkp, dv, m, l.dvp, 1, w.st, l.dkp, w.y, l.dkp, 1, kFull,
                    bf16);  // M S^T
  clock.lap(Stage::mst);

  // bwd_gates. H = dP . P + dB . B (strict lower: the diagonal's d/dG_i and d/dG_j cancel);
  // dP <- dP . Gamma, dB <- dB . Gamma (dB = beta dL, dL = -dR V_new^T).
  const Vec<Real> lanes = lane_index<Real>();
  const bool stream_dv = stream_rows<In, Real>(p.shape, p.shape.hv, dv);
  for (std::int64_t i = 0; i < n; ++i) {
    const Vec<Real> row_i = splat(static_cast<Real>(i));
    const Real beta_i = b.beta[i];
    Real* dp = w.dpl + i * l.cp;
    Real* db = w.dpl + (n + i) * l.cp;
    Real* hrow = w.hmat + i * l.cp;
    const Real* prow = b.pl + i * l.cp;
    const Real* brow = b.bmat + i * l.cp;
    const Real* grow = b.gamma + i * l.cp;
    Vec<Real> dbeta_b{};
    const std::int64_t used = (i / W + 1) * W;
    for (std::int64_t j = 0; j < used; j += W) {
      const Vec<Real> col = lanes + static_cast<Real>(j);
      const Vec<Real> dpv = col <= row_i ? load(dp + j) : Vec<Real>{};
      const Vec<Real> dl = col < row_i ? -load(db + j) : Vec<Real>{};
      const Vec<Real> bv = load(brow + j), gv = load(grow + j);
      const Vec<Real> dbv = dl * beta_i;
      dbeta_b += dl * bv;
      store(hrow + j, col < row_i ? dpv * load(prow + j) + dbv * bv : Vec<Real>{});
      store(dp + j, dpv * gv);
      store(db + j, dbv * gv);
    }
    for (std::int64_t j = used; j < l.cp; j += W) {
      store(dp + j, Vec<Real>{});
      store(db + j, Vec<Real>{});
      store(hrow + j, Vec<Real>{});
    }
    w.dbeta[i] = dot(dr + i * l.dvp, b.v + i * l.dvp, l.dvp) + reduce_add<Real>(dbeta_b);
    w.dd[i] *= b.decay_to_end[i];
    // de_i e_i = e_i (dO_i . (Q~ S)_i - beta_i dR_i . (K S)_i) = Y_i . q~_i + Y_(n+i) . k_i.
    w.de[i] = dot(w.y + i * l.dkp, q + i * l.dkp, l.dkp) +
              dot(w.y + (n + i) * l.dkp, k + i * l.dkp, l.dkp);
    for (std::int64_t j = 0; j < l.dvp; j += W)
      store(w.dvn + i * l.dvp + j, load(dr + i * l.dvp + j) * beta_i);
    write_row(token_at<In>(bp.dv, seq, t0 + i, h), bp.dv.dim, w.dvn + i * l.dvp, dv, stream_dv);
    *token_at<Real>(bp.dbeta, seq, t0 + i, h) = w.dbeta[i];
  }
  // dg_l = sum_{i >= l} de_i e_i  (e_i = e^G_i)
  //      + dgamma gamma            (gamma = e^G_last, dgamma = <S, dS'>)
  //      + sum_{j < l} dd_j d_j    (d_j = e^(G_last - G_j) depends on g_(j+1) .. g_last)
  //      + sum_{i >= l, j < l} H_ij  (Gamma_ij depends on g_(j+1) .. g_i)
  // each term summed directly: no block is added and subtracted again.
  Real dgamma = 0;
  for (std::int64_t r = 0; r < dk; ++r) dgamma += dot(state + r * l.dvp, ds + r * l.dvp, l.dvp);
  const Real gamma_last = b.eG[n - 1];
  Real* prefix_dd = w.row;  // prefix_dd[l] = sum_{j < l} dd_j d_j
  Real running = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    prefix_dd[i] = running;
    running += w.dd[i];
  }
  Real* column_suffix = w.dd;  // dd is consumed: reuse it for sum_{i >= l} H_ij
  fill<Real>(column_suffix, l.cp, 0);
  Real suffix_e = 0;
  for (std::int64_t i = n - 1; i >= 0; --i) {
    const std::int64_t used = (i / W + 1) * W;
    Vec<Real> rect{};
    for (std::int64_t j = 0; j < used; j += W) {
      const Vec<Real> col = lanes + static_cast<Real>(j);
      const Vec<Real> sum = load(column_suffix + j) + load(w.hmat + i * l.cp + j);
      store(column_suffix + j, sum);
      rect += col < splat(static_cast<Real>(i)) ? sum : Vec<Real>{};
    }
    suffix_e += w.de[i];
    const Real dg = suffix_e + dgamma * gamma_last + prefix_dd[i] + reduce_add<Real>(rect);
    *token_at<Real>(bp.dg, seq, t0 + i, h) = dg;
  }

  clock.lap(Stage::gates);

  // bwd_qk: the rest of this head's [dQ~; dK] into Y, then added to the item's sum.
  Real* dq = w.y;
  Real* dkk = w.y + n * l.dkp;
  const Real* dpg = w.dpl;
  const Real* dbg = w.dpl + n * l.cp;
  gemm<Real, true>(n, l.dkp, n, dpg, l.cp, 1, k, l.dkp, dq, l.dkp, 1, kLowerA, bf16);  // dP.G K
  gemm<Real, true>(n, l.dkp, n, dpg, 1, l.cp, q, l.dkp, dkk, l.dkp, 1, kUpperA,
                   bf16);  // (dP.G)^T Q~
  gemm<Real, true>(n, l.dkp, n, dbg, l.cp, 1, k, l.dkp, dkk, l.dkp, 1, kLowerA,
                   bf16);  // dB.G K
  gemm<Real, true>(n, l.dkp, n, dbg, 1, l.cp, k, l.dkp, dkk, l.dkp, 1, kUpperA,
                   bf16);  // (dB.G)^T K
  transpose_into(ds, dk, l.dvp, dv, w.dst, l.dkp, l.dkp);
  for (std::int64_t i = 0; i < n; ++i) scale_row(b.vnew + i * l.dvp, l.dvp, b.decay_to_end[i]);
  gemm<Real, true>(n, l.dkp, dv, b.vnew, l.dvp, 1, w.dst, l.dkp, dkk, l.dkp, 1, kFull,
                   bf16);  // (d V_new) dS'^T
  for (std::int64_t e = 0; e < 2 * n * l.dkp; e += W)
    store(w.dqk + e, load(w.dqk + e) + load(w.y + e));
  clock.lap(Stage::dqk);

  // bwd_state: dS = e^G_last dS' + [Q~; K]^T M.
  gemm<Real, true>(dk, l.dvp, 2 * n, b.qk, 1, l.dkp, m, l.dvp, ds, l.dvp, gamma_last, kFull, bf16);
  clock.lap(Stage::dstate);
}

// dq and dk of the chunk's tokens for key head hk, from the summed dQ~ and dK in w.dqk:
// dq_hat = scale dQ~, then the L2-norm backward when the norm is on. That backward,
// dx = inv (dx_hat - x_hat (x_hat . dx_hat)) with inv = 1 / sqrt(|x|^2 + 1e-6), reads x_hat
// off the packed rows (Q~ = scale x_hat, K = x_hat) and inv off w.inv_norms (chunk_pack_qk)
// instead of reading the raw rows again, each in its own page: this stage took 39 ms before,
// 11 after, of a ~790 ms backward (8k tokens, one Intel Xeon thread; docs/perf_cpu.md).
template <class Real, class In>
void bwd_write_qk(const detail::BackwardProblem& bp, const detail::Sequence& seq, std::int64_t hk,
                  std::int64_t t0, std::int64_t n, const ChunkedLayout& l,
                  BackwardBuffers<Real>& w) {
  const detail::ForwardProblem& p = bp.fwd;
  const std::int64_t dk = p.shape.dk;
  const bool stream_dqk = stream_rows<In, Real>(p.shape, p.shape.hk, dk);
  for (int part = 0; part < 2; ++part) {
    const detail::TokenTensor<std::byte*>& out = part == 0 ? bp.dq : bp.dk;
    const Real scale = part == 0 ? static_cast<Real>(p.scale) : static_cast<Real>(1);
    // x_hat = packed / scale; a zero scale packed zeros, whose gradient is zero.
    const Real inv_scale = scale != 0 ? 1 / scale : 0;
    for (std::int64_t i = 0; i < n; ++i) {
      Real* d_hat = w.dqk + (part * n + i) * l.dkp;
      if (p.l2norm) {
        const Real* packed = w.c.qk + (part * n + i) * l.dkp;
        const Real inv = w.inv_norms[part * n + i];
        // x_hat . dx_hat = (scale x_hat) . d_hat = packed . d_hat
        const Real along = dot(packed, d_hat, l.dkp) * inv_scale;
        for (std::int64_t j = 0; j < l.dkp; j += kLanes<Real>) {
          store(d_hat + j, (load(d_hat + j) * scale - load(packed + j) * along) * inv);
        }
      } else {
        scale_row(d_hat, l.dkp, scale);
      }
      write_row(token_at<In>(out, seq, t0 + i, hk), out.dim, d_hat, dk, stream_dqk);
    }
  }
}

// Value heads [h0, h0 + heads) of sequence s (one key head), `segment` chunks per rebuilt
// segment (the caller sizes the workspace for it; unused when chunk_states were kept). q, k,
// v, d_o and their gradients are In (the activation type); g, beta, their gradients, the
// states, their cotangents and the residuals are Real.
template <class Real, class In>
void backward_item(const detail::BackwardProblem& bp, std::int64_t s, std::int64_t h0,
                   std::int64_t heads, std::int64_t segment, std::byte* workspace) {
  const detail::ForwardProblem& p = bp.fwd;
  const detail::Sequence& seq = p.seqs[s];
  const std::int64_t dk = p.shape.dk, dv = p.shape.dv, c = p.chunk_size;
  const std::int64_t hk = h0 / p.group;
  const std::int64_t chunks = (seq.length + c - 1) / c;
  const bool kept_states = bp.chunk_states.data != nullptr;
  const std::int64_t checkpoints = kept_states ? 0 : (chunks + segment - 1) / segment;
  const BackwardLayout lb =
      backward_layout(dk, dv, c, heads, kept_states ? 0 : checkpoints + segment);
  const ChunkedLayout& l = lb.fwd;
  BackwardBuffers<Real> w(workspace, lb);
  ChunkBuffers<Real>& b = w.c;
  if (p.bf16_operands) b.bf16 = reinterpret_cast<Real*>(workspace) + lb.total;
  const std::int64_t state_size = dk * l.dvp;
  StageClock clock;
  // Rebuilt states: checkpoint i (entering chunk i * segment) of head j at slot i, the states
  // entering the chunks of the current segment at slots checkpoints + 0 .. segment - 1.
  auto slot = [&](std::int64_t index, std::int64_t j) {
    return w.rebuilt + (index * heads + j) * state_size;
  };
  auto copy_state = [&](const Real* from, Real* to) {
    for (std::int64_t e = 0; e < state_size; e += kLanes<Real>) store(to + e, load(from + e));
  };
  // Advances the states in `from` (one per head) over chunk `index` into `to`.
  auto advance = [&](std::int64_t index, auto&& from, auto&& to) {
    const std::int64_t t0 = index * c, n = min64(c, seq.length - t0);
    chunk_pack_qk<Real, In>(p, seq, hk, t0, n, l, b, /*with_q=*/false);
    chunk_gram(n, dk, l, b, /*with_q=*/false);
    for (std::int64_t j = 0; j < heads; ++j) {
      if (from(j) != to(j)) copy_state(from(j), to(j));
      rebuild_step<Real, In>(bp, seq, seq.first_chunk + index, h0 + j, t0, n, to(j), l, b);
    }
    clock.lap(Stage::rebuild);
  };

  for (std::int64_t j = 0; j < heads; ++j) {
    load_matrix<Real, Real>(w.ds + j * state_size, dk, dv, l.dvp, bp.d_final_state, s, h0 + j);
  }
  clock.lap(Stage::states);
  if (!kept_states && chunks > 0) {
    // The checkpoints: the initial states, then every `segment` chunks.
    for (std::int64_t j = 0; j < heads; ++j) {
      load_matrix<Real, Real>(slot(0, j), dk, dv, l.dvp, p.initial_state, s, h0 + j);
    }
    clock.lap(Stage::states);
    for (std::int64_t i = 1; i < checkpoints; ++i) {
      for (std::int64_t index = (i - 1) * segment; index < i * segment; ++index) {
        auto from = [&](std::int64_t j) {
          return index == (i - 1) * segment ? slot(i - 1, j) : slot(i, j);
        };
        advance(index, from, [&](std::int64_t j) { return slot(i, j); });
      }
    }
  }

  for (std::int64_t index = chunks - 1; index >= 0; --index) {
    const std::int64_t t0 = index * c, n = min64(c, seq.length - t0);
    const std::int64_t chunk = seq.first_chunk + index;
    if (!kept_states && (index == chunks - 1 || index % segment == segment - 1)) {
      // Rebuild the states entering the chunks of this segment from its checkpoint.
      const std::int64_t first = index / segment * segment;
      for (std::int64_t j = 0; j < heads; ++j)
        copy_state(slot(first / segment, j), slot(checkpoints, j));
      clock.lap(Stage::rebuild);
      for (std::int64_t at = first; at < index; ++at) {
        advance(
            at, [&](std::int64_t j) { return slot(checkpoints + at - first, j); },
            [&](std::int64_t j) { return slot(checkpoints + at - first + 1, j); });
      }
    }
    chunk_pack_qk<Real, In>(p, seq, hk, t0, n, l, b, /*with_q=*/true, w.inv_norms);
    // The rows the chunk before this one gathers (the chunks run back to front), asked for
    // between this chunk's register tiles, in the order they are read.
    prefetch_queue().clear();
    if (index > 0) queue_chunk_rows<Real, In>(p, seq, t0 - c, c, hk, h0, h0 + heads, true, &bp.d_o);
    clock.lap(Stage::pack_qk);
    chunk_gram(n, dk, l, b);
    fill<Real>(w.dqk, 2 * n * l.dkp, 0);
    clock.lap(Stage::gram);
    for (std::int64_t j = 0; j < heads; ++j) {
      const std::int64_t h = h0 + j;
      const Real* state;
      if (kept_states) {
        load_matrix<Real, Real>(w.state, dk, dv, l.dvp, bp.chunk_states, chunk, h);
        state = w.state;
        clock.lap(Stage::residuals);
      } else {
        state = slot(checkpoints + index % segment, j);
      }
      bwd_recompute<Real, In>(bp, seq, chunk, h, t0, n, state, l, w, clock);
      bwd_chunk_head<Real, In>(bp, seq, h, t0, n, state, w.ds + j * state_size, l, w, clock);
    }
    bwd_write_qk<Real, In>(bp, seq, hk, t0, n, l, w);
    clock.lap(Stage::write_dqk);
  }
  for (std::int64_t j = 0; j < heads; ++j) {
    store_matrix<Real>(bp.d_initial_state, s, h0 + j, w.ds + j * state_size, dk, dv, l.dvp);
  }
  // dv, dq and dk may have gone out streamed (io-inl.h: write_row).
  if (stream_rows<In, Real>(p.shape, p.shape.hv, dv) ||
      stream_rows<In, Real>(p.shape, p.shape.hk, dk))
    stream_fence();
  prefetch_queue().clear();
  clock.lap(Stage::states);
}
