// conv1d-inl.h: the causal depthwise conv1d + SiLU (or without it: ConvProblem::silu) of the
// fused layer op and the conv op, forward and backward, for one ISA variant. Must match
// gdn::ref::fused_gdn_fwd / _bwd (tests/cpu/layer_test.cc) and gdn::ref::causal_conv1d_fwd / _bwd
// (tests/cpu/conv_test.cc); benchmark: `gdn bench --op conv`.
//
// A work item is a block of up to kConvTokens tokens of one sequence, all channels (the split
// depends on the problem only, not on the threads). Whole rows are read in token order: rows
// are D elements apart, and reading a slice of each row instead, as channel-block items would,
// defeats the hardware prefetchers (measured 2.4x slower at 8k tokens x 8192 channels).
//
// Forward: sub-blocks of kConvSub tokens; for each channel vector the K weights sit in
// registers and a window of the last K inputs slides down the sub-block's tokens, so each
// input is loaded once per vector and every tap is a vector FMA. SiLU is fused: xh = y / (1 +
// e^-y). Outputs too large to stay cached are written with non-temporal stores where a vector
// is a whole cache line. A decode step
// is the same loop over a sequence of one token.
//
// Backward, per item: recompute y for the block and the K - 1 tokens after it, dy = dxh .
// sigma(y) (1 + y (1 - sigma(y))), the transposed conv dx_j = sum_i w[i] dy_(j+K-1-i) for the
// block's inputs (the first block of a sequence also its conv-state rows, j < 0, which feed
// d conv_state), plus the cotangent of the final conv state for the last K - 1 inputs; and the
// item's partial d weight and d bias, which the driver sums over items in item order
// (bit-identical for any thread count). The same column walk as the forward, with windows of
// the last K inputs and the last K dy in registers and the gradients accumulated in registers
// over each sub-block.

// Row K - 1 + j (j < 0) of block `block` of the conv states: blocks state_stride elements apart
// (a pool's slot stride), or packed.
template <class Real>
inline const Real* conv_state_row(const detail::ConvProblem& p, std::int64_t block,
                                  std::int64_t j) {
  const std::int64_t stride = p.state_stride != 0 ? p.state_stride : (p.taps - 1) * p.channels;
  return reinterpret_cast<const Real*>(p.state_in) + block * stride + (p.taps - 1 + j) * p.channels;
}

// row = input j of sequence s over all channels: x[start + j] (j >= 0) or conv state row
// K - 1 + j (zeros when absent), converted, zero padded to cpad.
template <class Real, class In>
inline void conv_input_row(const detail::ConvProblem& p, std::int64_t s, std::int64_t j,
                           Real* row) {
  const detail::Sequence& seq = p.seqs[s];
  if (j >= 0) {
    const In* src = reinterpret_cast<const In*>(p.x) + (seq.start + j) * p.x_token;
    if constexpr (!__is_same(Real, In)) {
      gather_row(row, src, p.x_channel, p.channels, p.cpad);
    } else if (p.x_channel == 1) {
      const std::int64_t whole = p.channels / kLanes<Real> * kLanes<Real>;
      for (std::int64_t c = 0; c < whole; c += kLanes<Real>) store(row + c, load(src + c));
      for (std::int64_t c = whole; c < p.cpad; ++c) row[c] = c < p.channels ? src[c] : 0;
    } else {
      gather_row(row, src, p.x_channel, p.channels, p.cpad);
    }
  } else if (p.state_in == nullptr || (p.state_block != nullptr && p.state_block[s] < 0)) {
    fill<Real>(row, p.cpad, 0);
  } else {
    const std::int64_t block = p.state_block != nullptr ? p.state_block[s] : s;
    if constexpr (__is_same(Real, float)) {
      if (p.state_bf16) {
        return gather_row(row, conv_state_row<BFloat16>(p, block, j), 1, p.channels, p.cpad);
      }
    }
    gather_row(row, conv_state_row<Real>(p, block, j), 1, p.channels, p.cpad);
  }
}

template <class Real>
inline Vec<Real> vsigmoid(Vec<Real> y) {
  return splat<Real>(1) / (splat<Real>(1) + vexp<Real>(-y));
}

// Outputs of channel vectors v .. v + NV - 1 for n tokens (out + t * ld, t < n) from input
// rows[0 .. n + K - 1) (element v on): the K weights (w + i * w_ld, tap i) and the bias of the
// vector's channels in registers, a window of the last K inputs sliding down the tokens, NV
// vectors side by side (workspace.h: kConvColumnVectors); each lane's arithmetic is the same
// whatever NV, and whatever the rows' or the weights' layout (the fused layer op's conv rows,
// conv_head_rows, are the bits of xh).
template <class Real, int K, bool kStream, bool kSilu, int NV>
inline void conv_column(const Real* w, std::int64_t w_ld, const Real* bias, const Real* const* rows,
                        std::int64_t v, std::int64_t n, Real* out, std::int64_t ld) {
  constexpr int W = kLanes<Real>;
  Vec<Real> wv[NV][K], a[NV][K], b[NV];
#pragma GCC unroll 8
  for (int u = 0; u < NV; ++u) {
#pragma GCC unroll 8
    for (int i = 0; i < K; ++i) wv[u][i] = load(w + i * w_ld + u * W);
#pragma GCC unroll 8
    for (int i = 0; i < K - 1; ++i) a[u][i] = load(rows[i] + v + u * W);
    b[u] = load(bias + u * W);
  }
  for (std::int64_t t = 0; t < n; ++t) {
    Vec<Real> y[NV];
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) {
      a[u][K - 1] = load(rows[t + K - 1] + v + u * W);
      y[u] = b[u];
#pragma GCC unroll 8
      for (int i = 0; i < K; ++i) y[u] += wv[u][i] * a[u][i];
#pragma GCC unroll 8
      for (int i = 0; i < K - 1; ++i) a[u][i] = a[u][i + 1];
    }
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) {
      // y sigmoid(y) (a template argument: out may alias p.silu for all the compiler knows, and
      // a load and test of it stayed in the loop).
      Vec<Real> o = y[u];
      if constexpr (kSilu) o = y[u] / (splat<Real>(1) + vexp<Real>(-y[u]));
      if constexpr (kStream) {
        stream(out + t * ld + u * W, o);
      } else {
        store(out + t * ld + u * W, o);
      }
    }
  }
}

// conv_column with the SiLU or without it (ConvProblem::silu), chosen outside its loop.
template <class Real, int K, bool kStream, int NV>
inline void conv_columns(bool silu, const Real* w, std::int64_t w_ld, const Real* bias,
                         const Real* const* rows, std::int64_t v, std::int64_t n, Real* out,
                         std::int64_t ld) {
  if (silu) {
    conv_column<Real, K, kStream, true, NV>(w, w_ld, bias, rows, v, n, out, ld);
  } else {
    conv_column<Real, K, kStream, false, NV>(w, w_ld, bias, rows, v, n, out, ld);
  }
}

// Forward of tokens [t0, t1) of sequence s with K taps, in sub-blocks of kConvSub tokens: per
// channel vector the K weights stay in registers and a window of the last K inputs slides down
// the sub-block, so each input is loaded once per vector. Input rows (x, and the conv state's)
// are read in place when contiguous and a whole number of vectors wide; otherwise (a strided
// view, a channel tail, an absent conv state) they are staged in the workspace, zero padded. Large
// outputs are written with non-temporal stores (kConvStreamBytes) when a vector is a cache line.
template <class Real, class In, int K>
void conv_forward_taps(const detail::ConvProblem& p, std::int64_t s, std::int64_t t0,
                       std::int64_t t1, std::byte* workspace) {
  constexpr int W = kLanes<Real>;
  constexpr std::int64_t S = kConvSub;
  const std::int64_t cp = p.cpad, channels = p.channels;
  const detail::Sequence& seq = p.seqs[s];
  const Real* x = reinterpret_cast<const Real*>(p.x);
  const Real* w = reinterpret_cast<const Real*>(p.weight);
  const Real* b = reinterpret_cast<const Real*>(p.bias);
  Real* xh_base = reinterpret_cast<Real*>(p.xh);
  Real* stage = reinterpret_cast<Real*>(workspace);  // K - 1 + S rows of cp
  Real* tail = stage + (K - 1 + S) * cp;             // the channel tail of S tokens, a vector each
  const std::int64_t whole = channels / W * W;
  // 16-bit inputs are always staged (widened).
  const bool in_place = __is_same(Real, In) && p.x_channel == 1 && whole == channels;
  // The column walk stores one vector per row at a time, so only a vector that is a whole
  // cache line fills the write-combining buffer of a non-temporal store: half-line streams
  // (AVX2) interleaved over the sub-block's rows go out as partial writes, measured 2.5x
  // slower than cached stores on a Zen 3 core (docs/perf.md).
  const bool streamed =
      sizeof(Vec<Real>) >= 64 && whole == channels &&
      reinterpret_cast<std::uintptr_t>(xh_base) % sizeof(Vec<Real>) == 0 &&
      p.tokens * channels * static_cast<std::int64_t>(sizeof(Real)) >= kConvStreamBytes;
  // The conv state's rows, read in place when whole vectors wide and of the compute type (-1:
  // absent, staged zeros; bf16: staged, widened).
  const std::int64_t state_block = p.state_in == nullptr      ? -1
                                   : p.state_block != nullptr ? p.state_block[s]
                                                              : s;
  const Real* rows[K - 1 + S];
  for (std::int64_t s0 = t0; s0 < t1; s0 += S) {
    const std::int64_t n = min64(S, t1 - s0);
    for (std::int64_t r = 0; r < K - 1 + n; ++r) {
      const std::int64_t j = s0 - (K - 1) + r;
      if (j >= 0 && in_place) {
        rows[r] = x + (seq.start + j) * p.x_token;
      } else if (j < 0 && whole == channels && state_block >= 0 && !p.state_bf16) {
        rows[r] = conv_state_row<Real>(p, state_block, j);
      } else {
        conv_input_row<Real, In>(p, s, j, stage + r * cp);
        rows[r] = stage + r * cp;
      }
    }
    Real* xh = xh_base + (seq.start + s0) * channels;
    constexpr int NV = kConvColumnVectors;
    std::int64_t v = 0;
    for (; v + NV * W <= whole; v += NV * W) {
      if (streamed) {
        conv_columns<Real, K, true, NV>(p.silu, w + v, cp, b + v, rows, v, n, xh + v, channels);
      } else {
        conv_columns<Real, K, false, NV>(p.silu, w + v, cp, b + v, rows, v, n, xh + v, channels);
      }
    }
    for (; v < whole; v += W) {
      if (streamed) {
        conv_columns<Real, K, true, 1>(p.silu, w + v, cp, b + v, rows, v, n, xh + v, channels);
      } else {
        conv_columns<Real, K, false, 1>(p.silu, w + v, cp, b + v, rows, v, n, xh + v, channels);
      }
    }
    // A padded store would run into the next row: the tail vector goes through `tail`.
    if (whole < channels) {
      conv_columns<Real, K, false, 1>(p.silu, w + whole, cp, b + whole, rows, whole, n, tail, W);
    }
    for (std::int64_t t = 0; t < n && whole < channels; ++t) {
      for (std::int64_t c = whole; c < channels; ++c)
        xh[t * channels + c] = tail[t * W + c - whole];
    }
  }
  if (streamed) stream_fence();
}

// Sequence s, tokens [t0, t1): xh = SiLU(conv(x)), for K = 1 .. kMaxConvTaps.
template <class Real, class In>
void conv_forward_item(const detail::ConvProblem& p, std::int64_t s, std::int64_t t0,
                       std::int64_t t1, std::byte* workspace) {
  static_assert(kMaxConvTaps == 8, "one case per tap count");
  switch (p.taps) {
    case 1:
      return conv_forward_taps<Real, In, 1>(p, s, t0, t1, workspace);
    case 2:
      return conv_forward_taps<Real, In, 2>(p, s, t0, t1, workspace);
    case 3:
      return conv_forward_taps<Real, In, 3>(p, s, t0, t1, workspace);
    case 4:
      return conv_forward_taps<Real, In, 4>(p, s, t0, t1, workspace);
    case 5:
      return conv_forward_taps<Real, In, 5>(p, s, t0, t1, workspace);
    case 6:
      return conv_forward_taps<Real, In, 6>(p, s, t0, t1, workspace);
    case 7:
      return conv_forward_taps<Real, In, 7>(p, s, t0, t1, workspace);
    default:
      return conv_forward_taps<Real, In, 8>(p, s, t0, t1, workspace);
  }
}

// The fused layer op's conv (ForwardProblem::conv), as the forward kernels pack their rows:
// out rows i < n (ld apart) = SiLU(conv(x)) (or conv(x)) of inputs j0 + i of sequence s (`seq`,
// its index `s` for the conv state), over channels [c0, c0 + width), zeros in [width,
// padded(width)). Sub-blocks of kConvSub tokens through conv_column, so every lane is computed
// as conv_forward_taps computes it: the bits of the xh it writes. The inputs are read in place
// when they are Real, contiguous and the head is whole vectors wide; otherwise staged (widened,
// zero padded) in `stage` (workspace.h: conv_rows_elements), where a head's last partial
// vector also takes its weights and bias, zeros past the head (y = 0 there, and SiLU(0) = 0).
template <class Real, class In, int K>
void conv_head_rows_taps(const detail::ConvProblem& p, const detail::Sequence& seq, std::int64_t s,
                         std::int64_t c0, std::int64_t width, std::int64_t j0, std::int64_t n,
                         Real* out, std::int64_t ld, Real* stage) {
  constexpr int W = kLanes<Real>;
  constexpr int NV = kConvColumnVectors;
  constexpr std::int64_t S = kConvSub;
  const std::int64_t row = padded(width), whole = width / W * W;
  const std::int64_t vectors = (width + W - 1) / W * W;
  const Real* w = reinterpret_cast<const Real*>(p.weight) + c0;
  const Real* b = reinterpret_cast<const Real*>(p.bias) + c0;
  Real* tail = stage + (K - 1 + S) * row;  // the last partial vector's K weights, then its bias
  if (whole < width) {
    for (int i = 0; i <= K; ++i) {
      const Real* from = i < K ? w + i * p.cpad : b;
      for (std::int64_t u = 0; u < W; ++u)
        tail[i * W + u] = whole + u < width ? from[whole + u] : 0;
    }
  }
  const bool in_place = __is_same(Real, In) && p.x_channel == 1 && whole == width;
  const std::int64_t state_block = p.state_in == nullptr      ? -1
                                   : p.state_block != nullptr ? p.state_block[s]
                                                              : s;
  const In* x = reinterpret_cast<const In*>(p.x);
  const Real* rows[K - 1 + S];
  for (std::int64_t i0 = 0; i0 < n; i0 += S) {
    const std::int64_t m = min64(S, n - i0);
    for (std::int64_t r = 0; r < K - 1 + m; ++r) {
      const std::int64_t j = j0 + i0 - (K - 1) + r;
      Real* staged = stage + r * row;
      rows[r] = staged;
      if (j >= 0) {
        const In* src = x + (seq.start + j) * p.x_token + c0 * p.x_channel;
        if (in_place) {
          rows[r] = reinterpret_cast<const Real*>(src);
        } else {
          gather_row(staged, src, p.x_channel, width, row);
        }
      } else if (state_block >= 0) {
        const Real* src = conv_state_row<Real>(p, state_block, j) + c0;
        if (whole == width) {
          rows[r] = src;
        } else {
          gather_row(staged, src, 1, width, row);
        }
      } else {
        fill<Real>(staged, row, 0);
      }
    }
    Real* o = out + i0 * ld;
    std::int64_t v = 0;
    for (; v + NV * W <= whole; v += NV * W)
      conv_columns<Real, K, false, NV>(p.silu, w + v, p.cpad, b + v, rows, v, m, o + v, ld);
    for (; v < whole; v += W)
      conv_columns<Real, K, false, 1>(p.silu, w + v, p.cpad, b + v, rows, v, m, o + v, ld);
    if (whole < width)
      conv_columns<Real, K, false, 1>(p.silu, tail, W, tail + K * W, rows, whole, m, o + whole, ld);
    for (std::int64_t i = 0; i < m && vectors < row; ++i)
      fill<Real>(o + i * ld + vectors, row - vectors, 0);
  }
}

template <class Real, class In>
void conv_head_rows(const detail::ConvProblem& p, const detail::Sequence& seq, std::int64_t s,
                    std::int64_t c0, std::int64_t width, std::int64_t j0, std::int64_t n, Real* out,
                    std::int64_t ld, Real* stage) {
  switch (p.taps) {
    case 1:
      return conv_head_rows_taps<Real, In, 1>(p, seq, s, c0, width, j0, n, out, ld, stage);
    case 2:
      return conv_head_rows_taps<Real, In, 2>(p, seq, s, c0, width, j0, n, out, ld, stage);
    case 3:
      return conv_head_rows_taps<Real, In, 3>(p, seq, s, c0, width, j0, n, out, ld, stage);
    case 4:
      return conv_head_rows_taps<Real, In, 4>(p, seq, s, c0, width, j0, n, out, ld, stage);
    case 5:
      return conv_head_rows_taps<Real, In, 5>(p, seq, s, c0, width, j0, n, out, ld, stage);
    case 6:
      return conv_head_rows_taps<Real, In, 6>(p, seq, s, c0, width, j0, n, out, ld, stage);
    case 7:
      return conv_head_rows_taps<Real, In, 7>(p, seq, s, c0, width, j0, n, out, ld, stage);
    default:
      return conv_head_rows_taps<Real, In, 8>(p, seq, s, c0, width, j0, n, out, ld, stage);
  }
}

// One channel vector v of a backward sub-block: steps t = u0 .. u0 + n - 1 of the item's walk
// (rows are indexed from the sub-block: x rows[r] holds input u0 - K + 1 + r, dxh drows[r]
// token u0 + r, dx outs[r] input u0 - K + 1 + r). At each step: dy_t (0 past the sequence),
// the item's d weight and d bias (steps before t1 only), and dx of input t - K + 1 (when at
// least lo) from the window of the last K dy. The dy window and the gradient accumulators
// carry over between sub-blocks through `carry` (K - 1 rows of dy) and `partial`.
template <class Real, int K>
inline void conv_backward_column(const detail::ConvProblem& p, const Real* const* rows,
                                 const Real* const* drows, Real* const* outs, std::int64_t v,
                                 std::int64_t u0, std::int64_t n, std::int64_t len, std::int64_t t1,
                                 std::int64_t lo, Real* carry, Real* partial) {
  const std::int64_t cp = p.cpad;
  const Real* w = reinterpret_cast<const Real*>(p.weight) + v;
  Vec<Real> wv[K], a[K], dyw[K], dw[K];
#pragma GCC unroll 8
  for (int i = 0; i < K; ++i) {
    wv[i] = load(w + i * cp);
    dw[i] = load(partial + i * cp + v);
  }
  Vec<Real> db = load(partial + K * cp + v);
  const Vec<Real> b = load(reinterpret_cast<const Real*>(p.bias) + v);
#pragma GCC unroll 8
  for (int i = 0; i < K - 1; ++i) {
    a[i] = load(rows[i] + v);
    dyw[i] = load(carry + i * cp + v);
  }
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t t = u0 + r;
    Vec<Real> dy{};
    if (t < len) {
      a[K - 1] = load(rows[r + K - 1] + v);
      Vec<Real> y = b;
#pragma GCC unroll 8
      for (int i = 0; i < K; ++i) y += wv[i] * a[i];
      dy = load(drows[r] + v);
      if (p.silu) {
        const Vec<Real> sig = vsigmoid<Real>(y);
        dy = dy * sig * (splat<Real>(1) + y * (splat<Real>(1) - sig));
      }
      if (t < t1) {
#pragma GCC unroll 8
        for (int i = 0; i < K; ++i) dw[i] += dy * a[i];
        db += dy;
      }
#pragma GCC unroll 8
      for (int i = 0; i < K - 1; ++i) a[i] = a[i + 1];
    }
    dyw[K - 1] = dy;
    if (t - (K - 1) >= lo) {
      Vec<Real> dx{};
#pragma GCC unroll 8
      for (int i = 0; i < K; ++i) dx += wv[i] * dyw[K - 1 - i];
      store(outs[r] + v, dx);
    }
#pragma GCC unroll 8
    for (int i = 0; i < K - 1; ++i) dyw[i] = dyw[i + 1];
  }
#pragma GCC unroll 8
  for (int i = 0; i < K; ++i) store(partial + i * cp + v, dw[i]);
  store(partial + K * cp + v, db);
#pragma GCC unroll 8
  for (int i = 0; i < K - 1; ++i) store(carry + i * cp + v, dyw[i]);
}

// Sequence s, tokens [t0, t1), K taps: dx of the item's inputs [lo, t1) (lo = t0, or -(K - 1)
// for a sequence's first item: its conv-state rows, d conv_state), and the item's partial
// d weight [K][cpad] and d bias [cpad] into `partial_bytes`. The walk runs over steps
// [t0, t1 + K - 1): the K - 1 steps past the item recompute the dy its last inputs need.
// Rows are read and written in place when contiguous and a whole number of vectors wide,
// else staged; the cotangent of the final conv state is added to its inputs afterwards.
template <class Real, class In, int K>
void conv_backward_taps(const detail::ConvProblem& p, std::int64_t s, std::int64_t t0,
                        std::int64_t t1, std::byte* partial_bytes, std::byte* workspace) {
  constexpr int W = kLanes<Real>;
  constexpr std::int64_t S = kConvSub;
  const std::int64_t cp = p.cpad, channels = p.channels;
  const detail::Sequence& seq = p.seqs[s];
  const std::int64_t len = seq.length, lo = t0 == 0 ? -(K - 1) : t0;
  const std::int64_t vecs = (channels + W - 1) / W * W;
  const bool whole = channels % W == 0;
  // 16-bit x and dx are always staged (widened, rounded).
  constexpr bool same = __is_same(Real, In);
  const bool x_in_place = same && p.x_channel == 1 && whole;
  const bool dx_in_place = same && p.dx_channel == 1 && whole;
  const Real* x = reinterpret_cast<const Real*>(p.x);
  const Real* dxh = reinterpret_cast<const Real*>(p.dxh);
  In* dx = reinterpret_cast<In*>(p.dx);
  Real* partial = reinterpret_cast<Real*>(partial_bytes);
  Real* carry = reinterpret_cast<Real*>(workspace);  // K - 1 rows of dy
  Real* x_stage = carry + (K - 1) * cp;              // K - 1 + S rows
  Real* dxh_stage = x_stage + (K - 1 + S) * cp;      // S rows
  Real* dx_stage = dxh_stage + S * cp;               // S rows
  Real* zeros = dx_stage + S * cp;                   // 1 row: inputs past the sequence
  fill<Real>(partial, (K + 1) * cp, 0);
  fill<Real>(carry, (K - 1) * cp, 0);
  fill<Real>(zeros, cp, 0);
  const Real* rows[K - 1 + S];
  const Real* drows[S];
  Real* outs[S];
  for (std::int64_t u0 = t0; u0 < t1 + K - 1; u0 += S) {
    const std::int64_t n = min64(S, t1 + K - 1 - u0);
    for (std::int64_t r = 0; r < K - 1 + n; ++r) {
      const std::int64_t j = u0 - (K - 1) + r;
      if (j >= len) {
        rows[r] = zeros;  // past the sequence: never part of a y
      } else if (j >= 0 && x_in_place) {
        rows[r] = x + (seq.start + j) * p.x_token;
      } else {
        conv_input_row<Real, In>(p, s, j, x_stage + r * cp);
        rows[r] = x_stage + r * cp;
      }
    }
    for (std::int64_t r = 0; r < n && u0 + r < len; ++r) {
      const Real* src = dxh + (seq.start + u0 + r) * channels;
      if (whole) {
        drows[r] = src;
      } else {
        gather_row(dxh_stage + r * cp, src, 1, channels, cp);
        drows[r] = dxh_stage + r * cp;
      }
    }
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t j = u0 - (K - 1) + r;
      outs[r] = j >= 0 && dx_in_place ? reinterpret_cast<Real*>(dx) + (seq.start + j) * p.dx_token
                                      : dx_stage + r * cp;
    }
    for (std::int64_t v = 0; v < vecs; v += W) {
      conv_backward_column<Real, K>(p, rows, drows, outs, v, u0, n, len, t1, lo, carry, partial);
    }
    // Staged dx rows to dx (a strided view or a channel tail) or to d conv_state (j < 0).
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t j = u0 - (K - 1) + r;
      if (j < lo || (j >= 0 && dx_in_place)) continue;
      if (j >= 0) {
        if (!same && p.d_state_out != nullptr && j >= len - (K - 1)) {
          // The final conv state's cotangent (below for the compute type), added before the
          // one rounding to the 16-bit type.
          const Real* d = reinterpret_cast<const Real*>(p.d_state_out) +
                          (s * (K - 1) + j - (len - (K - 1))) * channels;
          for (std::int64_t c = 0; c < channels; ++c) dx_stage[r * cp + c] += d[c];
        }
        scatter_row(dx + (seq.start + j) * p.dx_token, p.dx_channel, dx_stage + r * cp, channels);
      } else if (p.d_state_in != nullptr) {
        Real* d = reinterpret_cast<Real*>(p.d_state_in) + (s * (K - 1) + j + K - 1) * channels;
        for (std::int64_t c = 0; c < channels; ++c) d[c] = dx_stage[r * cp + c];
      }
    }
  }
  // The final conv state holds inputs len - K + 1 .. len - 1: their cotangent adds to theirs.
  if (p.d_state_out == nullptr) return;
  const Real* d_out = reinterpret_cast<const Real*>(p.d_state_out) + s * (K - 1) * channels;
  for (std::int64_t j = len - (K - 1) > lo ? len - (K - 1) : lo; j < t1; ++j) {
    const Real* d = d_out + (j - (len - (K - 1))) * channels;
    if (j >= 0) {
      if constexpr (same) {
        Real* row = dx + (seq.start + j) * p.dx_token;
        for (std::int64_t c = 0; c < channels; ++c) row[c * p.dx_channel] += d[c];
      }
    } else if (p.d_state_in != nullptr) {
      Real* row = reinterpret_cast<Real*>(p.d_state_in) + (s * (K - 1) + j + K - 1) * channels;
      for (std::int64_t c = 0; c < channels; ++c) row[c] += d[c];
    }
  }
}

// Sequence s, tokens [t0, t1): dx of the block's inputs (and d conv_state for the first
// block), and the block's partial d weight [K][cpad] and d bias [cpad] into `partial`.
template <class Real, class In>
void conv_backward_item(const detail::ConvProblem& p, std::int64_t s, std::int64_t t0,
                        std::int64_t t1, std::byte* partial, std::byte* workspace) {
  switch (p.taps) {
    case 1:
      return conv_backward_taps<Real, In, 1>(p, s, t0, t1, partial, workspace);
    case 2:
      return conv_backward_taps<Real, In, 2>(p, s, t0, t1, partial, workspace);
    case 3:
      return conv_backward_taps<Real, In, 3>(p, s, t0, t1, partial, workspace);
    case 4:
      return conv_backward_taps<Real, In, 4>(p, s, t0, t1, partial, workspace);
    case 5:
      return conv_backward_taps<Real, In, 5>(p, s, t0, t1, partial, workspace);
    case 6:
      return conv_backward_taps<Real, In, 6>(p, s, t0, t1, partial, workspace);
    case 7:
      return conv_backward_taps<Real, In, 7>(p, s, t0, t1, partial, workspace);
    default:
      return conv_backward_taps<Real, In, 8>(p, s, t0, t1, partial, workspace);
  }
}
