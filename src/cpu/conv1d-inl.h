// conv1d-inl.h: the causal depthwise conv1d + SiLU of the fused layer op, forward and
// backward, for one ISA variant. Must match gdn::ref::fused_gdn_fwd / _bwd
// (tests/cpu/layer_test.cc); benchmark: `gdn bench --op conv`.
//
// A work item is a block of up to kConvTokens tokens of one sequence, all channels (the split
// depends on the problem only, not on the threads). Whole rows are read in token order: rows
// are D elements apart, and reading a slice of each row instead, as channel-block items would,
// defeats the hardware prefetchers (measured 2.4x slower at 8k tokens x 8192 channels).
//
// Forward: sub-blocks of kConvSub tokens; for each channel vector the K weights sit in
// registers and a window of the last K inputs slides down the sub-block's tokens, so each
// input is loaded once per vector and every tap is a vector FMA. SiLU is fused: xh = y / (1 +
// e^-y). Outputs too large to stay cached are written with non-temporal stores. A decode step
// is the same loop over a sequence of one token.
//
// Backward, per item: recompute y for the block and the K - 1 tokens after it, dy = dxh .
// sigma(y) (1 + y (1 - sigma(y))), the transposed conv dx_j = sum_i w[i] dy_(j+K-1-i) for the
// block's inputs (the first block of a sequence also its conv-state rows, j < 0, which feed
// d conv_state), plus the cotangent of the final conv state for the last K - 1 inputs; and the
// item's partial d weight and d bias, which the driver sums over items in item order
// (bit-identical for any thread count). It walks whole rows through a ring of the last K
// input rows and a ring of the last K dy rows.

// The ring slot of input j (j may be negative: the conv state's rows).
inline std::int64_t ring_slot(std::int64_t j, std::int64_t taps) {
  const std::int64_t r = j % taps;
  return r < 0 ? r + taps : r;
}

// ring row = input j of sequence s over all channels: x[start + j] (j >= 0) or conv state row
// K - 1 + j (zeros when absent), converted, zero padded to cpad.
template <class Real>
inline void conv_input_row(const detail::ConvProblem& p, std::int64_t s, std::int64_t j,
                           Real* row) {
  const detail::Sequence& seq = p.seqs[s];
  if (j >= 0) {
    const Real* src = reinterpret_cast<const Real*>(p.x) + (seq.start + j) * p.x_token;
    if (p.x_channel == 1) {
      const std::int64_t whole = p.channels / kLanes<Real> * kLanes<Real>;
      for (std::int64_t c = 0; c < whole; c += kLanes<Real>) store(row + c, load(src + c));
      for (std::int64_t c = whole; c < p.cpad; ++c) row[c] = c < p.channels ? src[c] : 0;
    } else {
      gather_row(row, src, p.x_channel, p.channels, p.cpad);
    }
  } else if (p.state_in == nullptr) {
    fill<Real>(row, p.cpad, 0);
  } else {
    const Real* src = reinterpret_cast<const Real*>(p.state_in) +
                      (s * (p.taps - 1) + p.taps - 1 + j) * p.channels;
    gather_row(row, src, 1, p.channels, p.cpad);
  }
}

// The ring rows holding inputs t - K + 1 .. t (tap i reads rows[i]).
template <class Real>
inline void ring_rows(const Real* ring, std::int64_t t, std::int64_t taps, std::int64_t cpad,
                      const Real** rows) {
  for (std::int64_t i = 0; i < taps; ++i) rows[i] = ring + ring_slot(t - taps + 1 + i, taps) * cpad;
}

// y = bias + sum_i w[i] x_(t-K+1+i) at channel vector v.
template <class Real>
inline Vec<Real> conv_pre_activation(const detail::ConvProblem& p, const Real* const* rows,
                                     std::int64_t v) {
  const Real* w = reinterpret_cast<const Real*>(p.weight) + v;
  Vec<Real> y = load(reinterpret_cast<const Real*>(p.bias) + v);
  for (std::int64_t i = 0; i < p.taps; ++i) y += load(w + i * p.cpad) * load(rows[i] + v);
  return y;
}

template <class Real>
inline Vec<Real> vsigmoid(Vec<Real> y) {
  return splat<Real>(1) / (splat<Real>(1) + vexp<Real>(-y));
}

// xh of channel vector v for n tokens (out + t * ld, t < n) from input rows[0 .. n + K - 1):
// the K weights in registers, a window of the last K inputs sliding down the tokens.
template <class Real, int K, bool kStream>
inline void conv_column(const detail::ConvProblem& p, const Real* const* rows, std::int64_t v,
                        std::int64_t n, Real* out, std::int64_t ld) {
  const Real* w = reinterpret_cast<const Real*>(p.weight) + v;
  Vec<Real> wv[K], a[K];
#pragma GCC unroll 8
  for (int i = 0; i < K; ++i) wv[i] = load(w + i * p.cpad);
#pragma GCC unroll 8
  for (int i = 0; i < K - 1; ++i) a[i] = load(rows[i] + v);
  const Vec<Real> b = load(reinterpret_cast<const Real*>(p.bias) + v);
  for (std::int64_t t = 0; t < n; ++t) {
    a[K - 1] = load(rows[t + K - 1] + v);
    Vec<Real> y = b;
#pragma GCC unroll 8
    for (int i = 0; i < K; ++i) y += wv[i] * a[i];
#pragma GCC unroll 8
    for (int i = 0; i < K - 1; ++i) a[i] = a[i + 1];
    const Vec<Real> o = y / (splat<Real>(1) + vexp<Real>(-y));  // y sigmoid(y)
    if constexpr (kStream) {
      stream(out + t * ld, o);
    } else {
      store(out + t * ld, o);
    }
  }
}

// Forward of tokens [t0, t1) of sequence s with K taps, in sub-blocks of kConvSub tokens: per
// channel vector the K weights stay in registers and a window of the last K inputs slides down
// the sub-block, so each input is loaded once per vector. Input rows are read in place when x
// is contiguous and a whole number of vectors wide; otherwise (a strided view, a channel tail,
// the conv state's rows) they are staged in the workspace, zero padded. Large outputs are
// written with non-temporal stores (kConvStreamBytes).
template <class Real, int K>
void conv_forward_taps(const detail::ConvProblem& p, std::int64_t s, std::int64_t t0,
                       std::int64_t t1, std::byte* workspace) {
  constexpr int W = kLanes<Real>;
  constexpr std::int64_t S = kConvSub;
  const std::int64_t cp = p.cpad, channels = p.channels;
  const detail::Sequence& seq = p.seqs[s];
  const Real* x = reinterpret_cast<const Real*>(p.x);
  Real* xh_base = reinterpret_cast<Real*>(p.xh);
  Real* stage = reinterpret_cast<Real*>(workspace);  // K - 1 + S rows of cp
  Real* tail = stage + (K - 1 + S) * cp;             // the channel tail of S tokens, a vector each
  const std::int64_t whole = channels / W * W;
  const bool in_place = p.x_channel == 1 && whole == channels;
  const bool streamed =
      whole == channels && reinterpret_cast<std::uintptr_t>(xh_base) % sizeof(Vec<Real>) == 0 &&
      p.tokens * channels * static_cast<std::int64_t>(sizeof(Real)) >= kConvStreamBytes;
  const Real* rows[K - 1 + S];
  for (std::int64_t s0 = t0; s0 < t1; s0 += S) {
    const std::int64_t n = min64(S, t1 - s0);
    for (std::int64_t r = 0; r < K - 1 + n; ++r) {
      const std::int64_t j = s0 - (K - 1) + r;
      if (j >= 0 && in_place) {
        rows[r] = x + (seq.start + j) * p.x_token;
      } else {
        conv_input_row(p, s, j, stage + r * cp);
        rows[r] = stage + r * cp;
      }
    }
    Real* xh = xh_base + (seq.start + s0) * channels;
    for (std::int64_t v = 0; v < whole; v += W) {
      if (streamed) {
        conv_column<Real, K, true>(p, rows, v, n, xh + v, channels);
      } else {
        conv_column<Real, K, false>(p, rows, v, n, xh + v, channels);
      }
    }
    // A padded store would run into the next row: the tail vector goes through `tail`.
    if (whole < channels) conv_column<Real, K, false>(p, rows, whole, n, tail, W);
    for (std::int64_t t = 0; t < n && whole < channels; ++t) {
      for (std::int64_t c = whole; c < channels; ++c)
        xh[t * channels + c] = tail[t * W + c - whole];
    }
  }
  if (streamed) stream_fence();
}

// Sequence s, tokens [t0, t1): xh = SiLU(conv(x)), for K = 1 .. kMaxConvTaps.
template <class Real>
void conv_forward_item(const detail::ConvProblem& p, std::int64_t s, std::int64_t t0,
                       std::int64_t t1, std::byte* workspace) {
  static_assert(kMaxConvTaps == 8, "one case per tap count");
  switch (p.taps) {
    case 1:
      return conv_forward_taps<Real, 1>(p, s, t0, t1, workspace);
    case 2:
      return conv_forward_taps<Real, 2>(p, s, t0, t1, workspace);
    case 3:
      return conv_forward_taps<Real, 3>(p, s, t0, t1, workspace);
    case 4:
      return conv_forward_taps<Real, 4>(p, s, t0, t1, workspace);
    case 5:
      return conv_forward_taps<Real, 5>(p, s, t0, t1, workspace);
    case 6:
      return conv_forward_taps<Real, 6>(p, s, t0, t1, workspace);
    case 7:
      return conv_forward_taps<Real, 7>(p, s, t0, t1, workspace);
    default:
      return conv_forward_taps<Real, 8>(p, s, t0, t1, workspace);
  }
}

// Sequence s, tokens [t0, t1): dx of the block's inputs (and d conv_state for the first
// block), and the block's partial d weight [K][cpad] and d bias [cpad] into `partial`.
template <class Real>
void conv_backward_item(const detail::ConvProblem& p, std::int64_t s, std::int64_t t0,
                        std::int64_t t1, std::byte* partial_bytes, std::byte* workspace) {
  constexpr int W = kLanes<Real>;
  const std::int64_t k = p.taps, cp = p.cpad;
  const detail::Sequence& seq = p.seqs[s];
  const std::int64_t len = seq.length;
  Real* ring = reinterpret_cast<Real*>(workspace);
  Real* ring_dy = ring + k * cp;
  Real* row = ring_dy + k * cp;
  Real* partial = reinterpret_cast<Real*>(partial_bytes);
  Real* dw = partial;
  Real* db = partial + k * cp;
  const Real* w = reinterpret_cast<const Real*>(p.weight);
  fill<Real>(partial, (k + 1) * cp, 0);
  for (std::int64_t i = 0; i < k; ++i) fill<Real>(ring_dy + i * cp, cp, 0);
  for (std::int64_t j = t0 - (k - 1); j < t0; ++j)
    conv_input_row(p, s, j, ring + ring_slot(j, k) * cp);

  // dx_j (or d conv_state row j + K - 1 when j < 0), with dy_t for t in [0, len).
  const std::int64_t first_kept = len - (k - 1);  // the final conv state's first input
  auto finalize = [&](std::int64_t j) {
    for (std::int64_t v = 0; v < cp; v += W) {
      Vec<Real> acc{};
      for (std::int64_t i = 0; i < k; ++i) {
        const std::int64_t t = j + k - 1 - i;
        if (t < 0 || t >= len) continue;
        acc += load(w + i * cp + v) * load(ring_dy + ring_slot(t, k) * cp + v);
      }
      store(row + v, acc);
    }
    if (p.d_state_out != nullptr && j >= first_kept) {
      const Real* d = reinterpret_cast<const Real*>(p.d_state_out) +
                      (s * (k - 1) + (j - first_kept)) * p.channels;
      for (std::int64_t c = 0; c < p.channels; ++c) row[c] += d[c];
    }
    if (j >= 0) {
      Real* dx = reinterpret_cast<Real*>(p.dx) + (seq.start + j) * p.dx_token;
      scatter_row(dx, p.dx_channel, row, p.channels);
    } else if (p.d_state_in != nullptr) {
      Real* d = reinterpret_cast<Real*>(p.d_state_in) + (s * (k - 1) + j + k - 1) * p.channels;
      for (std::int64_t c = 0; c < p.channels; ++c) d[c] = row[c];
    }
  };
  // This item finalises inputs [lo, t1): the first block also the conv-state rows.
  const std::int64_t lo = t0 == 0 ? -(k - 1) : t0;
  // dy for the block and the K - 1 tokens after it (their dy reaches the block's last inputs).
  const std::int64_t t_end = t1 + k - 1 < len ? t1 + k - 1 : len;
  const Real* rows[8];
  for (std::int64_t t = t0; t < t_end; ++t) {
    conv_input_row(p, s, t, ring + ring_slot(t, k) * cp);
    ring_rows(ring, t, k, cp, rows);
    const Real* dxh = reinterpret_cast<const Real*>(p.dxh) + (seq.start + t) * p.channels;
    gather_row(row, dxh, 1, p.channels, cp);
    Real* dy = ring_dy + ring_slot(t, k) * cp;
    const bool own = t < t1;  // tokens past the block only lend their dy
    for (std::int64_t v = 0; v < cp; v += W) {
      const Vec<Real> y = conv_pre_activation(p, rows, v);
      const Vec<Real> sig = vsigmoid<Real>(y);
      const Vec<Real> d = load(row + v) * sig * (splat<Real>(1) + y * (splat<Real>(1) - sig));
      store(dy + v, d);
      if (own) {
        store(db + v, load(db + v) + d);
        for (std::int64_t i = 0; i < k; ++i) {
          Real* dwi = dw + i * cp + v;
          store(dwi, load(dwi) + d * load(rows[i] + v));
        }
      }
    }
    const std::int64_t j = t - k + 1;
    if (j >= lo && j < t1) finalize(j);
  }
  for (std::int64_t j = t_end - k + 1 > lo ? t_end - k + 1 : lo; j < t1; ++j) finalize(j);
}
