// conv1d-inl.h: the causal depthwise conv1d + SiLU of the fused layer op, forward and
// backward, for one ISA variant. Must match gdn::ref::fused_gdn_fwd / _bwd
// (tests/cpu/layer_test.cc); benchmark: `gdn bench --op conv`.
//
// Streaming and channel-vectorised: a block of channels walks the tokens of a sequence with a
// ring of the last K input rows in the workspace (the sequence's conv state fills the ring
// first), so each input row is read from memory once and every tap is a vector FMA. SiLU is
// fused: xh = y / (1 + e^-y). A decode step is the same loop over a sequence of one token.
//
// Backward, per channel block over every sequence in order (so that the weight and bias
// gradients are summed in a fixed order): recompute y, dy = dxh . sigma(y) (1 + y (1 -
// sigma(y))), accumulate d bias and d w[i] = sum_t dy_t x_(t-K+1+i), and the transposed conv
// dx_j = sum_i w[i] dy_(j+K-1-i), finalised once dy_(j+K-1) exists; inputs before the sequence
// (j < 0) feed d conv_state, and the cotangent of the final conv state adds to the last K - 1
// inputs.

// ring row = x[row, c0 .. c0 + nc) converted, zero padded to ncp.
template <class Real>
inline void conv_gather(const detail::ConvProblem& p, std::int64_t row, std::int64_t c0,
                        std::int64_t nc, std::int64_t ncp, Real* ring_row) {
  const Real* src = reinterpret_cast<const Real*>(p.x) + row * p.x_token + c0 * p.x_channel;
  gather_row(ring_row, src, p.x_channel, nc, ncp);
}

// The ring slot of input j (j may be negative: the conv state's rows).
inline std::int64_t ring_slot(std::int64_t j, std::int64_t taps) {
  const std::int64_t r = j % taps;
  return r < 0 ? r + taps : r;
}

// Fills the ring with the sequence's conv state: inputs j = -(K-1) .. -1 (zeros when absent).
template <class Real>
inline void conv_load_state(const detail::ConvProblem& p, std::int64_t s, std::int64_t c0,
                            std::int64_t nc, std::int64_t ncp, Real* ring) {
  const std::int64_t k = p.taps;
  for (std::int64_t r = 0; r + 1 < k; ++r) {
    Real* row = ring + ring_slot(r - (k - 1), k) * ncp;
    if (p.state_in == nullptr) {
      fill<Real>(row, ncp, 0);
    } else {
      const Real* src =
          reinterpret_cast<const Real*>(p.state_in) + (s * (k - 1) + r) * p.channels + c0;
      gather_row(row, src, 1, nc, ncp);
    }
  }
}

// y for token t of the channel block: bias + sum_i w[i] x_(t-K+1+i), vectors over ncp.
template <class Real>
inline Vec<Real> conv_pre_activation(const detail::ConvProblem& p, const Real* ring, std::int64_t t,
                                     std::int64_t c0, std::int64_t ncp, std::int64_t v) {
  const Real* w = reinterpret_cast<const Real*>(p.weight);
  Vec<Real> y = load(reinterpret_cast<const Real*>(p.bias) + c0 + v);
  for (std::int64_t i = 0; i < p.taps; ++i) {
    y += load(w + i * p.cpad + c0 + v) *
         load(ring + ring_slot(t - p.taps + 1 + i, p.taps) * ncp + v);
  }
  return y;
}

template <class Real>
inline Vec<Real> vsigmoid(Vec<Real> y) {
  return splat<Real>(1) / (splat<Real>(1) + vexp<Real>(-y));
}

// Sequence s, channels [c0, c1): xh = SiLU(conv(x)).
template <class Real>
void conv_forward_item(const detail::ConvProblem& p, std::int64_t s, std::int64_t c0,
                       std::int64_t c1, std::byte* workspace) {
  constexpr int W = kLanes<Real>;
  const std::int64_t nc = c1 - c0, ncp = padded(nc), k = p.taps;
  const detail::Sequence& seq = p.seqs[s];
  Real* ring = reinterpret_cast<Real*>(workspace);
  Real* out = ring + 2 * k * kConvBlock;
  conv_load_state(p, s, c0, nc, ncp, ring);
  for (std::int64_t t = 0; t < seq.length; ++t) {
    conv_gather(p, seq.start + t, c0, nc, ncp, ring + ring_slot(t, k) * ncp);
    for (std::int64_t v = 0; v < ncp; v += W) {
      const Vec<Real> y = conv_pre_activation(p, ring, t, c0, ncp, v);
      store(out + v, y * vsigmoid<Real>(y));
    }
    Real* xh = reinterpret_cast<Real*>(p.xh) + (seq.start + t) * p.channels + c0;
    for (std::int64_t c = 0; c < nc; ++c) xh[c] = out[c];
  }
}

// Channels [c0, c1) over every sequence: dx, d conv_state, d weight, d bias.
template <class Real>
void conv_backward_item(const detail::ConvProblem& p, std::int64_t c0, std::int64_t c1,
                        std::byte* workspace) {
  constexpr int W = kLanes<Real>;
  const std::int64_t nc = c1 - c0, ncp = padded(nc), k = p.taps;
  Real* ring = reinterpret_cast<Real*>(workspace);
  Real* ring_dy = ring + k * kConvBlock;
  Real* row = ring_dy + k * kConvBlock;
  Real* dw = reinterpret_cast<Real*>(p.dweight);
  Real* db = reinterpret_cast<Real*>(p.dbias);
  const Real* w = reinterpret_cast<const Real*>(p.weight);
  for (std::int64_t i = 0; i < k; ++i) fill<Real>(dw + i * p.cpad + c0, ncp, 0);
  fill<Real>(db + c0, ncp, 0);

  for (std::int64_t s = 0; s < p.num_seqs; ++s) {
    const detail::Sequence& seq = p.seqs[s];
    const std::int64_t len = seq.length;
    conv_load_state(p, s, c0, nc, ncp, ring);
    for (std::int64_t i = 0; i < k; ++i) fill<Real>(ring_dy + i * ncp, ncp, 0);
    // dx_j (or d conv_state row j + K - 1 when j < 0), with dy_t' for t' in [0, len).
    auto finalize = [&](std::int64_t j) {
      for (std::int64_t v = 0; v < ncp; v += W) {
        Vec<Real> acc{};
        for (std::int64_t i = 0; i < k; ++i) {
          const std::int64_t t = j + k - 1 - i;
          if (t < 0 || t >= len) continue;
          acc += load(w + i * p.cpad + c0 + v) * load(ring_dy + ring_slot(t, k) * ncp + v);
        }
        store(row + v, acc);
      }
      const std::int64_t first_kept = len - (k - 1);  // the final conv state's first input
      if (p.d_state_out != nullptr && j >= first_kept) {
        const Real* d = reinterpret_cast<const Real*>(p.d_state_out) +
                        (s * (k - 1) + (j - first_kept)) * p.channels + c0;
        for (std::int64_t c = 0; c < nc; ++c) row[c] += d[c];
      }
      if (j >= 0) {
        Real* dx = reinterpret_cast<Real*>(p.dx) + (seq.start + j) * p.dx_token + c0 * p.dx_channel;
        scatter_row(dx, p.dx_channel, row, nc);
      } else if (p.d_state_in != nullptr) {
        Real* d =
            reinterpret_cast<Real*>(p.d_state_in) + (s * (k - 1) + j + k - 1) * p.channels + c0;
        for (std::int64_t c = 0; c < nc; ++c) d[c] = row[c];
      }
    };
    for (std::int64_t t = 0; t < len; ++t) {
      conv_gather(p, seq.start + t, c0, nc, ncp, ring + ring_slot(t, k) * ncp);
      const Real* dxh = reinterpret_cast<const Real*>(p.dxh) + (seq.start + t) * p.channels + c0;
      gather_row(row, dxh, 1, nc, ncp);
      Real* dy = ring_dy + ring_slot(t, k) * ncp;
      for (std::int64_t v = 0; v < ncp; v += W) {
        const Vec<Real> y = conv_pre_activation(p, ring, t, c0, ncp, v);
        const Vec<Real> sig = vsigmoid<Real>(y);
        const Vec<Real> d = load(row + v) * sig * (splat<Real>(1) + y * (splat<Real>(1) - sig));
        store(dy + v, d);
        store(db + c0 + v, load(db + c0 + v) + d);
        for (std::int64_t i = 0; i < k; ++i) {
          Real* dwi = dw + i * p.cpad + c0 + v;
          store(dwi, load(dwi) + d * load(ring + ring_slot(t - k + 1 + i, k) * ncp + v));
        }
      }
      finalize(t - k + 1);
    }
    const std::int64_t first = len - k + 1 > -(k - 1) ? len - k + 1 : -(k - 1);
    for (std::int64_t j = first; j < len; ++j) finalize(j);
  }
}
