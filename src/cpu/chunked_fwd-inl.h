// chunked_fwd-inl.h: the chunked (WY) forward of one sequence for a group of value heads (some
// or all of a key head's, or those of several key heads), float32 or float64, for one ISA
// variant. Must match gdn::ref::chunked_fwd
// and gdn::ref::recurrent_fwd (tests/cpu/forward_test.cc); benchmark: `gdn bench`.
//
// Per chunk of n <= C tokens, S = state entering the chunk (docs/math.md, section 3):
//   chunk_pack_qk  Q = scale * q (normalised), K, K^T (with vdpbf16ps    once per key head
//                  and bf16 operands: [Q;K], K^T and K as bf16 pair words)
//   chunk_gram     [Q;K] K^T (lower triangles)                         once per key head
//   chunk_pack_v   V, beta, g, G = cumsum(g), e^G                      per value head
//   chunk_kkt      P = (Q K^T . Gamma) incl. diagonal and
//                  L = strict_lower(diag(beta) (K K^T . Gamma)), Gamma_ij = exp(G_i - G_j),
//                  i >= j, and e^(G_last - G)
//   solve_tril   A = (I + L)^-1 by forward substitution
//   chunk_wy     X = [Q;K] S;  V_new = A diag(beta) (V - diag(e^G) K S)   (= U - W S)
//   chunk_output O = diag(e^G) Q S + P V_new
//   chunk_state  S = e^(G_last) S + K^T diag(e^(G_last - G)) V_new
// Only differences G_i - G_j with i >= j are exponentiated (never e^G_i * e^-G_j), and a
// short last chunk runs with its own n: nothing past the sequence is read. The differences are
// summed directly, D_ij = g_(j+1) + ... + g_i (row i = row i-1 + g_i), not subtracted from the
// running sum: with strong decay G reaches -1000 within a chunk, where a float32 G_i - G_j
// would lose 1e-4 of every weight (docs/numerics.md).
//
// FLOPs per token and head at d = Dk = Dv, chunk C: 6 d^2 (the three products with S) +
// about 4 C d (four triangular C x C x d products) + C^3 / 3 / C (the solve); see
// bench/cost_model.h.

template <class Real>
struct ChunkBuffers {
  Real* states;  // head j's state at states + j * Dk * dvp
  Real* qk;
  Real* kt;
  Real* gram;
  Real* v;
  Real* pl;
  Real* a;
  Real* x;
  Real* vnew;
  Real* g;
  Real* G;
  Real* eG;
  Real* beta;
  Real* decay_to_end;
  Real* diff;
  // The backward also wants Gamma and B = K K^T . Gamma (strict lower) from chunk_kkt; the
  // forward leaves these null.
  Real* gamma = nullptr;
  Real* bmat = nullptr;
  // Scratch for bf16 matrix operands (ForwardProblem::bf16_operands; gemm-inl.h), after the
  // layout; null: operands in the compute type.
  Real* bf16 = nullptr;
  // With vdpbf16ps, the key head's operands as bf16 pair words, packed once per chunk
  // (chunk_pack_words; workspace.h: bf16_key_words); null: each product packs its own.
  std::uint32_t* qk_words = nullptr;  // [Q;K] along its rows, padded(ceil(Dk / 2)) words a row
  std::uint32_t* kt_words = nullptr;  // K^T as chunk_gram's B
  std::uint32_t* k_words = nullptr;   // K read transposed, as chunk_state's A
  // The fused layer op's conv (ForwardProblem::conv): its staging (conv1d-inl.h:
  // conv_head_rows) and the item's sequence index; null: q, k and v are read as they are.
  Real* conv_stage = nullptr;
  std::int64_t conv_seq = 0;

  ChunkBuffers() = default;
  ChunkBuffers(std::byte* workspace, const ChunkedLayout& l) {
    Real* w = reinterpret_cast<Real*>(workspace);
    states = w + l.states;
    qk = w + l.qk;
    kt = w + l.kt;
    gram = w + l.gram;
    v = w + l.v;
    pl = w + l.pl;
    a = w + l.a;
    x = w + l.x;
    vnew = w + l.vnew;
    g = w + l.vectors;
    G = g + l.cp;
    eG = G + l.cp;
    beta = eG + l.cp;
    decay_to_end = beta + l.cp;
    diff = decay_to_end + l.cp;
  }
};

// The pre-packed words of [Q;K] from row `first` on (null where nothing was pre-packed).
template <class Real>
const std::uint32_t* qk_words_from(const ChunkBuffers<Real>& b, std::int64_t first,
                                   std::int64_t dk) {
  return b.qk_words == nullptr ? nullptr : b.qk_words + first * bf16_words_per_row(dk);
}

// With vdpbf16ps and bf16 operands (chunk_pack_qk, when the buffers have qk_words), packs
// the key head's operands that several products read once per chunk ([Q;K]: chunk_gram and each
// value head's chunk_wy; K^T: chunk_gram's two products; K transposed: each value head's
// chunk_state), the same words each product would pack for itself. With with_q = false only K's
// rows of [Q;K]. K^T's word (q, j) is (K[j][2q], K[j][2q + 1]), the along-word (j, q) of K's rows:
// a transpose of those words, moved as float lanes (bits unchanged), with zeros past row n, as the
// float K^T holds.
template <class Real>
void chunk_pack_words(std::int64_t n, std::int64_t dk, const ChunkedLayout& l,
                      ChunkBuffers<Real>& b, bool with_q) {
#if defined(__AVX512BF16__)
  if constexpr (sizeof(Real) == 4) {
    const std::int64_t first = with_q ? 0 : n, stride = bf16_words_per_row(dk);
    pack_bf16_a(b.qk_words + first * stride, 2 * n - first, dk, b.qk + first * l.dkp, l.dkp, 1);
    transpose_into(reinterpret_cast<const float*>(b.qk_words + n * stride), n, stride, (dk + 1) / 2,
                   reinterpret_cast<float*>(b.kt_words), l.cp, l.cp);
    pack_bf16_a(b.k_words, dk, n, b.qk + n * l.dkp, 1, l.dkp);
  }
#else
  (void)n, (void)dk, (void)l, (void)b, (void)with_q;
#endif
}

// Gathers the q and k rows of the n tokens of the chunk starting at token t0 for key head hk
// (the fused layer op's conv computes them, ChunkBuffers::conv_stage):
// Q rows 0..n-1 (normalised and scaled), K rows n..2n-1, and K^T (in the buffers' qk_words,
// kt_words and k_words too where they are set, and then K^T only there). Padding is zero.
// With with_q = false the Q rows are left unwritten: a step without its output (the forward
// asked for no o, the backward's rebuild) never reads them. With inv_norms (the backward;
// with_q, l2norm) the rows' inverse L2 norms go to inv_norms[0..n) (q) and [n..2n) (k).
template <class Real, class In>
void chunk_pack_qk(const detail::ForwardProblem& p, const detail::Sequence& seq, std::int64_t hk,
                   std::int64_t t0, std::int64_t n, const ChunkedLayout& l, ChunkBuffers<Real>& b,
                   bool with_q = true, Real* inv_norms = nullptr) {
  const std::int64_t dk = p.shape.dk;
  const Real scale = static_cast<Real>(p.scale);
  Real* q = b.qk;
  Real* k = b.qk + n * l.dkp;
  if (b.conv_stage != nullptr) {
    // The conv's output rows of the key head's q and k channels (ForwardProblem::conv).
    const detail::ConvProblem& conv = *p.conv;
    if (with_q) {
      conv_head_rows<Real, In>(conv, seq, b.conv_seq, hk * dk, dk, t0, n, q, l.dkp, b.conv_stage);
      for (std::int64_t i = 0; i < n; ++i) {
        normalize_qk_row(q + i * l.dkp, l.dkp, p.l2norm, scale,
                         inv_norms != nullptr ? inv_norms + i : nullptr);
      }
    }
    conv_head_rows<Real, In>(conv, seq, b.conv_seq, (p.shape.hk + hk) * dk, dk, t0, n, k, l.dkp,
                             b.conv_stage);
    for (std::int64_t i = 0; i < n; ++i) {
      normalize_qk_row(k + i * l.dkp, l.dkp, p.l2norm, static_cast<Real>(1),
                       inv_norms != nullptr ? inv_norms + n + i : nullptr);
    }
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t t = t0 + i;
      if (with_q) {
        pack_qk_row(q + i * l.dkp, token_at<In>(p.q, seq, t, hk), p.q.dim, dk, l.dkp, p.l2norm,
                    scale, inv_norms != nullptr ? inv_norms + i : nullptr);
      }
      pack_qk_row(k + i * l.dkp, token_at<In>(p.k, seq, t, hk), p.k.dim, dk, l.dkp, p.l2norm,
                  static_cast<Real>(1), inv_norms != nullptr ? inv_norms + n + i : nullptr);
    }
  }
  // K^T [Dk][cp], columns past n zero, by in-register block transposes (a scalar transpose
  // took 2.4 of the 9.7 us the packing needed at C = 64, Dk = 128, float, AVX-512); the
  // products that take pre-packed words read K^T's words instead, so the floats are skipped.
  if (b.qk_words != nullptr) {
    chunk_pack_words(n, dk, l, b, with_q);
  } else {
    transpose_into(k, n, l.dkp, dk, b.kt, l.cp, l.cp);
  }
}

// gram = [Q;K] K^T, lower triangles only (the rest of the tiles wholly above the diagonal is
// left unwritten and never read unmasked). With with_q = false only K K^T (rows n..2n-1).
// With pre-packed words gemm reads [Q;K] and K^T from them (b.kt is then not formed).
template <class Real>
void chunk_gram(std::int64_t n, std::int64_t dk, const ChunkedLayout& l, ChunkBuffers<Real>& b,
                bool with_q = true) {
  if (with_q) {
    gemm<Real, false>(n, l.cp, dk, b.qk, l.dkp, 1, b.kt, l.cp, b.gram, l.cp, 1, kLowerC, b.bf16,
                      {qk_words_from(b, 0, dk), b.kt_words});
  }
  gemm<Real, false>(n, l.cp, dk, b.qk + n * l.dkp, l.dkp, 1, b.kt, l.cp, b.gram + n * l.cp, l.cp, 1,
                    kLowerC, b.bf16, {qk_words_from(b, n, dk), b.kt_words});
}

// Gathers value head h's rows of the chunk: V (In, or the fused layer op's conv output), beta, g
// (Real), G and e^G. Padding is zero.
template <class Real, class In>
void chunk_pack_v(const detail::ForwardProblem& p, const detail::Sequence& seq, std::int64_t h,
                  std::int64_t t0, std::int64_t n, const ChunkedLayout& l, ChunkBuffers<Real>& b) {
  if (b.conv_stage != nullptr) {
    const std::int64_t channel = 2 * p.shape.hk * p.shape.dk + h * p.shape.dv;
    conv_head_rows<Real, In>(*p.conv, seq, b.conv_seq, channel, p.shape.dv, t0, n, b.v, l.dvp,
                             b.conv_stage);
  }
  Real running = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t t = t0 + i;
    if (b.conv_stage == nullptr)
      gather_row(b.v + i * l.dvp, token_at<In>(p.v, seq, t, h), p.v.dim, p.shape.dv, l.dvp);
    b.g[i] = *token_at<Real>(p.g, seq, t, h);
    running += b.g[i];
    b.G[i] = running;
    b.beta[i] = *token_at<Real>(p.beta, seq, t, h);
  }
  for (std::int64_t i = n; i < l.cp; ++i) b.g[i] = b.G[i] = b.beta[i] = 0;
  exp_row(b.eG, b.G, l.cp);
}

// Queues, for the products to prefetch (prefetch-inl.h), the rows chunk_pack_qk and
// chunk_pack_v gather for the c tokens from t, in the order they read them: q (with_q) and k
// of key head hk, then v, g and beta of each value head in [h_begin, h_end), each head's d_o
// rows after them where d_o is given (the backward reads them next).
template <class Real, class In>
void queue_chunk_rows(const detail::ForwardProblem& p, const detail::Sequence& seq, std::int64_t t,
                      std::int64_t c, std::int64_t hk, std::int64_t h_begin, std::int64_t h_end,
                      bool with_q, const detail::TokenTensor<const std::byte*>* d_o = nullptr) {
  if (with_q) queue_tokens<In>(p.q, seq, t, c, hk, p.shape.dk, false);
  queue_tokens<In>(p.k, seq, t, c, hk, p.shape.dk, false);
  for (std::int64_t h = h_begin; h < h_end; ++h) {
    queue_tokens<In>(p.v, seq, t, c, h, p.shape.dv, false);
    queue_tokens<Real>(p.g, seq, t, c, h, 1, false);
    queue_tokens<Real>(p.beta, seq, t, c, h, 1, false);
    if (d_o != nullptr) queue_tokens<In>(*d_o, seq, t, c, h, p.shape.dv, false);
  }
}

// From the raw gram, this head's P (rows 0..n-1) and L (rows n..2n-1) in pl, each a full
// padded row with zeros above the (strict) diagonal; then e^(G_last - G). With with_p = false
// (a step that only advances the state, whose gram has no Q rows) neither P nor the
// backward's Gamma and B are formed.
template <class Real>
void chunk_kkt(std::int64_t n, const ChunkedLayout& l, ChunkBuffers<Real>& b, bool with_p = true) {
  constexpr int W = kLanes<Real>;
  const Vec<Real> lanes = lane_index<Real>();
  const Vec<Real> zero{};
  const bool with_gamma = with_p && b.gamma != nullptr;
  // diff holds row i of D: D_ij = g_(j+1) + ... + g_i for j < i, 0 at j = i, -inf past i.
  fill<Real>(b.diff, l.cp, -__builtin_huge_val());
  for (std::int64_t i = 0; i < n; ++i) {
    const Vec<Real> row_i = splat(static_cast<Real>(i));
    // Row i from row i - 1, its 0 at j = i set in the vector: a scalar store into a vector
    // that the next row loads cannot be forwarded to that load, which then waits for it.
    for (std::int64_t j = 0; j < l.cp; j += W) {
      const Vec<Real> d = load(b.diff + j) + b.g[i];
      store(b.diff + j, lanes + static_cast<Real>(j) == row_i ? zero : d);
    }
    const Real beta_i = b.beta[i];
    const Real* qk_row = b.gram + i * l.cp;
    const Real* kk_row = b.gram + (n + i) * l.cp;
    Real* prow = b.pl + i * l.cp;
    Real* lrow = b.pl + (n + i) * l.cp;
    const std::int64_t used = (i / W + 1) * W;  // vectors touching columns 0..i
    for (std::int64_t j = 0; j < used; j += W) {
      const Vec<Real> col = lanes + static_cast<Real>(j);
      const Vec<Real> gamma = vexp<Real>(load(b.diff + j));  // 0 past the diagonal
      const Vec<Real> kk = col < row_i ? load(kk_row + j) * gamma : zero;
      if (with_p) store(prow + j, col <= row_i ? load(qk_row + j) * gamma : zero);
      store(lrow + j, kk * beta_i);
      if (with_gamma) {
        store(b.gamma + i * l.cp + j, gamma);
        store(b.bmat + i * l.cp + j, kk);
      }
    }
    for (std::int64_t j = used; j < l.cp; j += W) {
      if (with_p) store(prow + j, zero);
      store(lrow + j, zero);
      if (with_gamma) {
        store(b.gamma + i * l.cp + j, zero);
        store(b.bmat + i * l.cp + j, zero);
      }
    }
  }
  // Row n-1 of D is G_last - G_j (-inf, so 0, in the padding).
  exp_row(b.decay_to_end, b.diff, l.cp);
}

// A = (I + L)^-1, unit lower triangular, by forward substitution:
// row i of A = e_i - sum_{j < i} L_ij (row j of A). Rows are padded; zeros above the diagonal.
// Each block of kSolveBlock vectors of a row is accumulated in registers over j and stored
// once (row j of A is zero past column j, so block c0 only needs rows j >= c0), and
// kSolveRows rows are solved together: each vector of an earlier row is loaded once for all
// of them, and the group's rows give kSolveRows times the independent chains. The group's own
// rows are applied last, in order, so every element still subtracts its terms in the order
// j = c0, c0 + 1, ..., i - 1: the same sums, bit for bit, as one row at a time, for finite L
// (the terms skipped past an earlier row's diagonal are exact zeros; an infinite L_ij made
// them NaN one row at a time, so a chunk with an infinite L can differ there). Measured at
// C = 64, float, AVX-512: 5.6 us per chunk updating the row in memory (every j waits on the
// previous store), 1.5 us with register accumulation one row at a time.
inline constexpr int kSolveBlock = 4;
// kSolveRows x kSolveBlock accumulators and kSolveBlock loaded vectors must fit the register
// file: 20 of AVX-512's 32, 12 of AVX2's 16.
inline constexpr int kSolveRows = GDN_VECTOR_BYTES == 64 ? 4 : 2;

// The terms of the rows j < i0 whose diagonal lies in vector Seg of the block (j in
// [c0 + Seg W, c0 + (Seg + 1) W); for the last vector, every j from there on), then the next
// vectors'. Such a row is zero past vector Seg, so only vectors 0..Seg take its terms: the
// others would subtract exact zeros.
template <class Real, int R, int V, int Seg>
void solve_earlier_rows(std::int64_t i0, std::int64_t c0, const Real* lmat, const Real* a,
                        std::int64_t ld, Vec<Real> (&acc)[R][V]) {
  constexpr int W = kLanes<Real>;
  const std::int64_t j_end = Seg + 1 < V ? min64(i0, c0 + (Seg + 1) * W) : i0;
  for (std::int64_t j = c0 + Seg * W; j < j_end; ++j) {
    Vec<Real> aj[Seg + 1];
#pragma GCC unroll 4
    for (int v = 0; v <= Seg; ++v) aj[v] = load(a + j * ld + c0 + v * W);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const Real lij = lmat[(i0 + r) * ld + j];
#pragma GCC unroll 4
      for (int v = 0; v <= Seg; ++v) acc[r][v] -= lij * aj[v];
    }
  }
  if constexpr (Seg + 1 < V) solve_earlier_rows<Real, R, V, Seg + 1>(i0, c0, lmat, a, ld, acc);
}

// Rows i0 .. i0 + R - 1 of A, vectors c0 .. c0 + V - 1.
template <class Real, int R, int V>
void solve_rows(std::int64_t i0, std::int64_t c0, const Real* lmat, Real* a, std::int64_t ld) {
  constexpr int W = kLanes<Real>;
  Vec<Real> acc[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const Vec<Real> col = lane_index<Real>() + static_cast<Real>(c0 + v * W);
      acc[r][v] = col == splat(static_cast<Real>(i0 + r)) ? splat<Real>(1) : Vec<Real>{};
    }
  }
  solve_earlier_rows<Real, R, V, 0>(i0, c0, lmat, a, ld, acc);
#pragma GCC unroll 4
  for (int s = 0; s + 1 < R; ++s) {
    if (i0 + s < c0) continue;  // row i0 + s is zero in this block: no term, as above
#pragma GCC unroll 4
    for (int r = s + 1; r < R; ++r) {
      const Real lrs = lmat[(i0 + r) * ld + i0 + s];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] -= lrs * acc[s][v];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) store(a + (i0 + r) * ld + c0 + v * W, acc[r][v]);
  }
}

// Picks the block for a remainder of rows <= R rows and nb <= V vectors.
template <class Real, int R, int V>
void solve_rows_dispatch(int rows, int nb, std::int64_t i0, std::int64_t c0, const Real* lmat,
                         Real* a, std::int64_t ld) {
  if constexpr (R > 1) {
    if (rows < R) return solve_rows_dispatch<Real, R - 1, V>(rows, nb, i0, c0, lmat, a, ld);
  }
  if constexpr (V > 1) {
    if (nb < V) return solve_rows_dispatch<Real, R, V - 1>(rows, nb, i0, c0, lmat, a, ld);
  }
  solve_rows<Real, R, V>(i0, c0, lmat, a, ld);
}

template <class Real>
void solve_tril(std::int64_t n, const ChunkedLayout& l, ChunkBuffers<Real>& b) {
  constexpr int W = kLanes<Real>;
  const Real* lmat = b.pl + n * l.cp;
  for (std::int64_t i0 = 0; i0 < n; i0 += kSolveRows) {
    const int rows = static_cast<int>(min64(kSolveRows, n - i0));
    for (std::int64_t c0 = 0; c0 < l.cp; c0 += kSolveBlock * W) {
      const int nb = static_cast<int>(min64(kSolveBlock, (l.cp - c0) / W));
      solve_rows_dispatch<Real, kSolveRows, kSolveBlock>(rows, nb, i0, c0, lmat, b.a, l.cp);
    }
  }
}

// X = [Q;K] S (rows 0..n-1: Q S, rows n..2n-1: K S); V <- R = diag(beta)(V - diag(e^G) K S);
// V_new = A R.
// With with_q = false only K S is formed (rows n..2n-1 of X; each row of a product is computed
// the same way whatever rows share its tile, so K S is bit-identical either way).
template <class Real>
void chunk_wy(std::int64_t n, std::int64_t dk, const Real* state, const ChunkedLayout& l,
              ChunkBuffers<Real>& b, bool with_q = true) {
  if (with_q) {
    gemm<Real, false>(2 * n, l.dvp, dk, b.qk, l.dkp, 1, state, l.dvp, b.x, l.dvp, 1, kFull, b.bf16,
                      {qk_words_from(b, 0, dk), nullptr});
  } else {
    gemm<Real, false>(n, l.dvp, dk, b.qk + n * l.dkp, l.dkp, 1, state, l.dvp, b.x + n * l.dvp,
                      l.dvp, 1, kFull, b.bf16, {qk_words_from(b, n, dk), nullptr});
  }
  const Real* ks = b.x + n * l.dvp;
  for (std::int64_t i = 0; i < n; ++i) {
    Real* r = b.v + i * l.dvp;
    const Real* ksi = ks + i * l.dvp;
    const Real beta_i = b.beta[i], eg_i = b.eG[i];
    for (std::int64_t j = 0; j < l.dvp; j += kLanes<Real>) {
      store(r + j, (load(r + j) - load(ksi + j) * eg_i) * beta_i);
    }
  }
  gemm<Real, false>(n, l.dvp, n, b.a, l.cp, 1, b.v, l.dvp, b.vnew, l.dvp, 1, kLowerA, b.bf16);
}

// O (in rows 0..n-1 of X) = diag(e^G) Q S + P V_new.
template <class Real>
void chunk_output(std::int64_t n, const ChunkedLayout& l, ChunkBuffers<Real>& b) {
  for (std::int64_t i = 0; i < n; ++i) scale_row(b.x + i * l.dvp, l.dvp, b.eG[i]);
  gemm<Real, true>(n, l.dvp, n, b.pl, l.cp, 1, b.vnew, l.dvp, b.x, l.dvp, 1, kLowerA, b.bf16);
}

// S = e^(G_last) S + K^T diag(e^(G_last - G)) V_new  (V_new is scaled in place).
template <class Real>
void chunk_state(std::int64_t n, std::int64_t dk, Real* state, const ChunkedLayout& l,
                 ChunkBuffers<Real>& b) {
  for (std::int64_t i = 0; i < n; ++i) scale_row(b.vnew + i * l.dvp, l.dvp, b.decay_to_end[i]);
  const Real* k = b.qk + n * l.dkp;
  // A(i, p) = K[p][i]: a_row = 1, a_col = dkp.
  gemm<Real, true>(dk, l.dvp, n, k, 1, l.dkp, b.vnew, l.dvp, state, l.dvp, b.eG[n - 1], kFull,
                   b.bf16, {b.k_words, nullptr});
}

// Value heads [h0, h0 + heads) of sequence s: within one key head's group, or the whole groups
// of consecutive key heads. Each chunk runs its key heads in turn, each once for all its value
// heads of the item; a head's arithmetic is the same whatever the grouping. An item of several
// key heads reads every token row's page once for all of them (the rows of one token are
// adjacent in q, k, v and o), where one item per key head walks each page again: with inputs
// in 4 KiB pages that is a TLB miss per token row (docs/perf_frameworks.md). q, k, v and o are
// In (the activation type); g, beta, the states and the residuals are Real.
template <class Real, class In>
void chunked_item(const detail::ForwardProblem& p, std::int64_t s, std::int64_t h0,
                  std::int64_t heads, std::byte* workspace) {
  const detail::Sequence& seq = p.seqs[s];
  const std::int64_t dk = p.shape.dk, dv = p.shape.dv, c = p.chunk_size;
  const ChunkedLayout l = chunked_layout(dk, dv, c, heads);
  ChunkBuffers<Real> b(workspace, l);
  if (p.bf16_operands) {
    b.bf16 = reinterpret_cast<Real*>(workspace) + l.total;
#if defined(__AVX512BF16__)
    if constexpr (sizeof(Real) == 4) {  // bf16 operands multiply on vdpbf16ps: float32 only
      const Bf16KeyWords w = bf16_key_words(dk, dv, c);
      auto* words = reinterpret_cast<std::uint32_t*>(b.bf16);
      b.qk_words = words + w.qk;
      b.kt_words = words + w.kt;
      b.k_words = words + w.k;
    }
#endif
  }
  if (p.conv != nullptr) {
    b.conv_stage = reinterpret_cast<Real*>(workspace) + l.total +
                   (p.bf16_operands ? bf16_key_words(dk, dv, c).end : 0);
    b.conv_seq = s;
  }
  const std::int64_t state_size = dk * l.dvp;
  StageClock clock;
  // Residuals larger than a cache go out with non-temporal stores: no read of each line before
  // it is written, and the chunk's working set stays in the caches (docs/perf.md).
  const std::int64_t residual_bytes =
      p.shape.total_chunks * p.shape.hv *
      ((p.chunk_states.data != nullptr ? dk * dv : 0) + (p.t_inv.data != nullptr ? c * c : 0)) *
      static_cast<std::int64_t>(sizeof(Real));
  const bool streamed = residual_bytes >= kResidualStreamBytes;
  // Without o (the states and residuals alone, as a rematerialising backward wants them) the
  // chunk skips everything Q feeds (its packing, Q K^T, P, Q S, the output product): the
  // backward's rebuild_step, plus the residuals.
  const bool with_o = p.o.data != nullptr;
  const bool stream_o = with_o && stream_rows<In, Real>(p.shape, p.shape.hv, dv);

  for (std::int64_t j = 0; j < heads; ++j) {
    load_matrix<Real, Real>(b.states + j * state_size, dk, dv, l.dvp, p.initial_state, s, h0 + j);
  }
  clock.lap(Stage::states);
  for (std::int64_t t0 = 0, chunk = seq.first_chunk; t0 < seq.length; t0 += c, ++chunk) {
    const std::int64_t n = min64(c, seq.length - t0);
    for (std::int64_t kh = h0 / p.group; kh * p.group < h0 + heads; ++kh) {
      // This key head's value heads in the item: [h_begin, h_end).
      const std::int64_t h_begin = h0 > kh * p.group ? h0 : kh * p.group;
      const std::int64_t h_end = min64(h0 + heads, (kh + 1) * p.group);
      chunk_pack_qk<Real, In>(p, seq, kh, t0, n, l, b, with_o);
      // What this key head's part of the chunk writes, then what its part of the next one
      // reads, in the order they are needed.
      prefetch_queue().clear();
      if (!stream_o) {
        for (std::int64_t h = h_begin; h < h_end; ++h) {
          queue_tokens<In>(p.o, seq, t0, n, h, dv, true);
        }
      }
      queue_chunk_rows<Real, In>(p, seq, t0 + c, c, kh, h_begin, h_end, with_o);
      clock.lap(Stage::pack_qk);
      chunk_gram(n, dk, l, b, with_o);
      clock.lap(Stage::gram);
      for (std::int64_t h = h_begin; h < h_end; ++h) {
        Real* state = b.states + (h - h0) * state_size;
        if (streamed) {
          stream_matrix<Real>(p.chunk_states, chunk, h, state, dk, dv, l.dvp);
        } else {
          store_matrix<Real>(p.chunk_states, chunk, h, state, dk, dv, l.dvp);
        }
        clock.lap(Stage::residuals);
        chunk_pack_v<Real, In>(p, seq, h, t0, n, l, b);
        clock.lap(Stage::pack_v);
        chunk_kkt(n, l, b, with_o);
        clock.lap(Stage::kkt);
        solve_tril(n, l, b);
        clock.lap(Stage::solve);
        store_t_inv<Real>(p.t_inv, chunk, h, b.a, n, c, l.cp, streamed);
        clock.lap(Stage::residuals);
        chunk_wy(n, dk, state, l, b, with_o);
        clock.lap(Stage::wy);
        if (with_o) {
          chunk_output(n, l, b);
          clock.lap(Stage::output);
          for (std::int64_t i = 0; i < n; ++i) {
            write_row(token_at<In>(p.o, seq, t0 + i, h), p.o.dim, b.x + i * l.dvp, dv, stream_o);
          }
          clock.lap(Stage::write_o);
        }
        chunk_state(n, dk, state, l, b);
        clock.lap(Stage::state);
      }
    }
  }
  for (std::int64_t j = 0; j < heads; ++j) {
    store_matrix<Real>(p.final_state, s, h0 + j, b.states + j * state_size, dk, dv, l.dvp);
  }
  if (streamed || stream_o) stream_fence();
  prefetch_queue().clear();
  clock.lap(Stage::states);
}
