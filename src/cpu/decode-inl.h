// decode-inl.h: the decode kernel of a serving step (gdn/step.h), for one ISA variant: the
// token recurrence of one (sequence, value head, block of value columns) over the state in its
// pool slot, two passes over the state per token. Must match gdn::ref::fused_gdn_step
// (tests/cpu/step_test.cc); benchmark: `gdn bench --op step`.
//
//   pass 1   ks = S^T k,  qs = S^T q                       (read S from the read slot)
//            u = beta (v - alpha ks),  o = alpha qs + (q . k) u
//   pass 2   S' = alpha S + k u^T                          (read S again, from cache; write S')
// A head's state is 64 KiB at d = 128 (float), so pass 2 reads it from L2, and the memory
// traffic is one read and one write of each state: a copy's. Value columns are independent,
// so an item may take a block of them (small batches: both cores busy for one sequence) and
// the result does not depend on the split. In place when the read and write slots are the
// same (a plain decode); a speculative window writes each position's state into the next
// slot and starts the next position from it. Pass 1 is recurrent_fwd-inl.h's block_products.
//
// A bf16 pool (State = BFloat16, Real = float): the state is streamed once per pass and
// never copied: pass 1 widens each row as it loads it (exact), pass 2 widens it again,
// computes S' with the float32 pool's expressions and rounds it once into the written slot,
// in registers. A block of whole vector pairs (2W columns, every block at Qwen3-Next's shape)
// takes decode_token_pairs: its columns in "pair order" (even columns, then odd ones, per 2W),
// in which a vector of 2W bf16 widens into two float vectors and two round back into one with
// shifts and masks alone, no shuffle; column block by column block, so that the next block's
// rows are fetched from memory while this one's are rounded. A block of single vectors
// (2W does not divide it) converts a vector at a time (load_state, store_state); a block with
// a tail of columns is widened into the workspace first, updated there by the float32 code
// and rounded (see below why). A window carries its float32 state from one position to the
// next in the workspace (Dk x Dv floats at most: 64 KiB at d = 128, in L2 like the slot's
// block): position t + 1 starts from that copy, not from the rounded slot. So the slots of a
// bf16 pool are those of a float32 pool holding the same start values, rounded once, bit for
// bit, on every path (tests/cpu/decode_test.cc pins ties, NaNs and overflow). Measured:
// docs/perf.md, "bf16 pools" (`gdn bench --op step --pools f32,bf16`).

// A vector of a state stored as State: rounded to bf16, or as it is.
template <class Real, class State>
inline void store_state(State* p, Vec<Real> x) {
  if constexpr (__is_same(State, Real)) {
    store(p, x);
  } else {
    narrow_bf16(p, x);
  }
}

// One token of one block of n value columns: ks, qs from S (src, rows ld_src apart; null:
// zeros), u, o (into qs), and S' into dst (which may be src: each element is read before it is
// written), and, for Carry, also in float32 into `carry` (which may be src too).
template <bool Carry, class Real, class Src, class Dst>
inline void decode_token(const Src* src, std::int64_t ld_src, Dst* dst, std::int64_t ld_dst,
                         Real* carry, std::int64_t ld_carry, std::int64_t n, std::int64_t dk,
                         const Real* v, Real alpha, Real beta, const Real* k, const Real* q,
                         Real* u, Real* ks, Real* qs) {
  constexpr int W = kLanes<Real>;
  const std::int64_t dkp = padded(dk);
  block_products(src, dk, ld_src, n, k, q, ks, qs);
  const Real qk = dot(q, k, dkp);
  const std::int64_t whole = n / W * W;
  for (std::int64_t j = 0; j < whole; j += W) {
    const Vec<Real> uj = (load(v + j) - load(ks + j) * alpha) * beta;
    store(u + j, uj);
    store(qs + j, mul_add<Real>(load(qs + j), splat(alpha), uj * qk));
  }
  for (std::int64_t j = whole; j < n; ++j) {
    u[j] = (v[j] - ks[j] * alpha) * beta;
    qs[j] = qs[j] * alpha + u[j] * qk;
  }
  for (std::int64_t r = 0; r < dk; ++r) {
    Dst* to = dst + r * ld_dst;
    Real* keep = Carry ? carry + r * ld_carry : nullptr;
    const Real kr = k[r];
    if (src == nullptr) {
      for (std::int64_t j = 0; j < whole; j += W) {
        const Vec<Real> x = load(u + j) * kr;
        store_state<Real>(to + j, x);
        if constexpr (Carry) store(keep + j, x);
      }
      for (std::int64_t j = whole; j < n; ++j) {
        const Real x = u[j] * kr;
        to[j] = static_cast<Dst>(x);
        if constexpr (Carry) keep[j] = x;
      }
    } else {
      const Src* from = src + r * ld_src;
      for (std::int64_t j = 0; j < whole; j += W) {
        const Vec<Real> x =
            mul_add<Real>(load_state<Real>(from + j), splat(alpha), load(u + j) * kr);
        store_state<Real>(to + j, x);
        if constexpr (Carry) store(keep + j, x);
      }
      for (std::int64_t j = whole; j < n; ++j) {
        const Real x = static_cast<Real>(from[j]) * alpha + u[j] * kr;
        to[j] = static_cast<Dst>(x);
        if constexpr (Carry) keep[j] = x;
      }
    }
  }
}

// A bf16 pool's block of n columns, n a whole number of vector pairs (2W columns: half-inl.h,
// widen_bf16_pair), streamed once per pass in "pair order": every per-column vector of the
// block (v, ks, qs, u, the window's float32 carry) holds, per chunk of 2W columns, the even
// columns and then the odd ones, so that a state row widens and rounds with no shuffle.
// Columns are independent and each takes the float32 pool's own expressions, in the same
// order, so the result is the float32 pool's, rounded once. Measured: docs/perf.md, "bf16
// pools".
template <class Real>
inline std::int64_t pair_position(std::int64_t j) {  // of column j
  constexpr int W = kLanes<Real>;
  return j / (2 * W) * (2 * W) + (j % 2) * W + j % (2 * W) / 2;
}

// n columns (whole vector pairs) into pair order, and back: a deinterleave and an interleave
// of each 2W columns in registers (moves: the values keep their bits). The scalar loops over
// pair_position these replace took about a twentieth of a decode-16 step (perf, avx2).
template <std::size_t... I>
inline Vec<float> even_lanes(Vec<float> a, Vec<float> b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, int(2 * I)...);
}
template <std::size_t... I>
inline Vec<float> odd_lanes(Vec<float> a, Vec<float> b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, int(2 * I + 1)...);
}
// Column i of the 2W (Offset 0: the first W, W: the second) from the even (i even) or the odd
// vector's i / 2.
template <std::size_t Offset, std::size_t... I>
inline Vec<float> interleaved(Vec<float> e, Vec<float> o, std::index_sequence<I...>) {
  return __builtin_shufflevector(e, o, int((I % 2) * kLanes<float> + (Offset + I) / 2)...);
}
inline void to_pair_order(const float* x, float* y, std::int64_t n) {
  constexpr int W = kLanes<float>;
  constexpr auto lanes = std::make_index_sequence<W>{};
  for (std::int64_t j = 0; j < n; j += 2 * W) {
    const Vec<float> a = load(x + j), b = load(x + j + W);
    store(y + j, even_lanes(a, b, lanes));
    store(y + j + W, odd_lanes(a, b, lanes));
  }
}
inline void from_pair_order(const float* y, float* x, std::int64_t n) {
  constexpr int W = kLanes<float>;
  constexpr auto lanes = std::make_index_sequence<W>{};
  for (std::int64_t j = 0; j < n; j += 2 * W) {
    const Vec<float> e = load(y + j), o = load(y + j + W);
    store(x + j, interleaved<0>(e, o, lanes));
    store(x + j + W, interleaved<W>(e, o, lanes));
  }
}

// Two vectors of pair-ordered columns from a bf16 row (widened), or from a float32 row that is
// in pair order already (a window's carry); and into one.
template <class Real, class Src>
inline void load_pair(const Src* p, Vec<Real>* even, Vec<Real>* odd) {
  if constexpr (__is_same(Src, Real)) {
    *even = load(p);
    *odd = load(p + kLanes<Real>);
  } else {
    widen_bf16_pair(p, even, odd);
  }
}

// ks, qs (pair order) of the n columns of a block: as block_products, a register block of
// kRecurrentBlock vectors (kRecurrentBlock / 2 pairs) at a time, each column's sum over the
// rows in the same order.
template <class Real, class Src>
inline void pair_products(const Src* src, std::int64_t rows, std::int64_t ld, std::int64_t n,
                          const Real* k, const Real* q, Real* ks, Real* qs) {
  constexpr int W = kLanes<Real>, P = kRecurrentBlock / 2;
  static_assert(P >= 1, "a register block holds a pair");
  for (std::int64_t j = 0; j < n; j += P * 2 * W) {
    const int np = static_cast<int>(min64(P, (n - j) / (2 * W)));
    Vec<Real> acc_k[2 * P] = {}, acc_q[2 * P] = {};
    if (np == P) {
      for (std::int64_t r = 0; r < rows; ++r) {
        const Src* row = src + r * ld + j;
        const Real kr = k[r], qr = q[r];
#pragma GCC unroll 16
        for (int v = 0; v < P; ++v) {
          Vec<Real> even, odd;
          load_pair<Real>(row + v * 2 * W, &even, &odd);
          acc_k[2 * v] += kr * even;
          acc_q[2 * v] += qr * even;
          acc_k[2 * v + 1] += kr * odd;
          acc_q[2 * v + 1] += qr * odd;
        }
      }
    } else {
      for (std::int64_t r = 0; r < rows; ++r) {
        const Src* row = src + r * ld + j;
        const Real kr = k[r], qr = q[r];
        for (int v = 0; v < np; ++v) {
          Vec<Real> even, odd;
          load_pair<Real>(row + v * 2 * W, &even, &odd);
          acc_k[2 * v] += kr * even;
          acc_q[2 * v] += qr * even;
          acc_k[2 * v + 1] += kr * odd;
          acc_q[2 * v + 1] += qr * odd;
        }
      }
    }
    for (int v = 0; v < 2 * np; ++v) {
      store(ks + j + v * W, acc_k[v]);
      store(qs + j + v * W, acc_q[v]);
    }
  }
}

// decode_token over a bf16 pool in pair order: S from src (the read slot, bf16; or, within a
// window, the float32 carry, already in pair order; null: zeros), S' rounded into dst and, for
// Carry, kept in float32 (pair order) in `carry` (which may be src). v, u, ks, qs: pair order.
// Column block by column block (pair_products' register block: 32 columns on avx2, 64 on
// avx512): its pass 1, its u, its pass 2, during which the next block's rows of a bf16 slot
// are prefetched (a line per row on avx2), so that their reads from memory overlap the
// rounding's arithmetic instead of following it; during the last block's, the first block of
// `next` (rows ld_next apart, next_columns columns; null: none), the slot block that the next
// item is likely to read.
template <bool Carry, class Real, class Src>
inline void decode_token_pairs(const Src* src, std::int64_t ld_src, BFloat16* dst,
                               std::int64_t ld_dst, Real* carry, std::int64_t ld_carry,
                               std::int64_t n, std::int64_t dk, const Real* v, Real alpha,
                               Real beta, const Real* k, const Real* q, Real* u, Real* ks, Real* qs,
                               const BFloat16* next, std::int64_t ld_next,
                               std::int64_t next_columns) {
  constexpr int W = kLanes<Real>;
  // Pass 2 runs over 128 columns (a Qwen3-Next head's whole row) per state row, pass 1's
  // register blocks one after the other before it: per row the loop's own work (pointers,
  // the prefetch, the broadcast of k) is spread over 8 vector pairs on avx2 instead of 2
  // (measured: docs/perf.md, "bf16 pools"). The block's bf16 rows (32 KiB) stay in L1/L2
  // between the passes.
  constexpr std::int64_t kBlock =
      kRecurrentBlock * W * (kRecurrentBlock * W >= 128 ? 1 : 128 / (kRecurrentBlock * W));
  const Real qk = dot(q, k, padded(dk));
  // k finite and |alpha| <= 1 (always so for the step's alpha = exp(g), g <= 0): see below.
  Real k_zero = 0;
  for (std::int64_t r = 0; r < dk; ++r) k_zero += k[r] * 0;
  const bool bounded = k_zero == 0 && alpha >= -1 && alpha <= 1;
  for (std::int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const std::int64_t nb = min64(kBlock, n - j0), j1 = j0 + nb;
    // The rows to prefetch (a float32 carry is in cache already): the next block's, or the
    // next item's.
    const char* ahead = nullptr;
    std::int64_t ld_ahead = 0, ahead_bytes = 0;
    if (j1 < n && src != nullptr && !__is_same(Src, Real)) {
      ahead = reinterpret_cast<const char*>(src + j1);
      ld_ahead = ld_src * static_cast<std::int64_t>(sizeof(Src));
      ahead_bytes = min64(kBlock, n - j1) * static_cast<std::int64_t>(sizeof(Src));
    } else if (j1 == n && next != nullptr) {
      ahead = reinterpret_cast<const char*>(next);
      ld_ahead = ld_next * static_cast<std::int64_t>(sizeof(BFloat16));
      ahead_bytes = min64(kBlock, next_columns) * static_cast<std::int64_t>(sizeof(BFloat16));
    }
    if (src == nullptr) {
      for (std::int64_t j = j0; j < j1; ++j) ks[j] = qs[j] = 0;
    } else {
      pair_products(src + j0, dk, ld_src, nb, k, q, ks + j0, qs + j0);
    }
    Vec<Real> zero{};  // stays 0 while every ks and u is finite (x * 0 is NaN for inf, NaN)
    for (std::int64_t j = j0; j < j1; j += W) {
      const Vec<Real> ksj = load(ks + j);
      const Vec<Real> uj = (load(v + j) - ksj * alpha) * beta;
      zero += ksj * 0 + uj * 0;
      store(u + j, uj);
      store(qs + j, mul_add<Real>(load(qs + j), splat(alpha), uj * qk));
    }
    // No lane of S' = alpha S + k u can be a NaN when S, k and u are finite and |alpha| <= 1:
    // alpha S is then finite, and a finite value plus k u (finite, or an infinity where it
    // overflows) is no NaN. S is finite where ks is: a non-finite S_rj makes k_r S_rj, and so
    // column j's sum, non-finite. Then narrow_bf16_pair skips its NaN test (3 instructions of
    // about 20 a pair).
    const bool no_nan = bounded && !any_nan(zero, zero);
    // S' = alpha S + k u, row by row; alpha broadcast once and the branch on a read slot taken
    // once (GCC hoisted neither out of the unrolled pairs: 4 more instructions a pair).
    const Vec<Real> va = splat(alpha);
    auto rows = [&](auto has_src, auto may_hold_nan) {
      for (std::int64_t r = 0; r < dk; ++r) {
        BFloat16* to = dst + r * ld_dst;
        Real* keep = Carry ? carry + r * ld_carry : nullptr;
        const Real kr = k[r];
        const Src* from = has_src ? src + r * ld_src : nullptr;
        auto update = [&](std::int64_t j) {  // the pair at column j
          Vec<Real> even, odd;
          if constexpr (decltype(has_src)::value) {
            load_pair<Real>(from + j, &even, &odd);
            even = mul_add<Real>(even, va, load(u + j) * kr);
            odd = mul_add<Real>(odd, va, load(u + j + W) * kr);
          } else {
            even = load(u + j) * kr;
            odd = load(u + j + W) * kr;
          }
          narrow_bf16_pair<decltype(may_hold_nan)::value>(to + j, even, odd);
          if constexpr (Carry) {
            store(keep + j, even);
            store(keep + j + W, odd);
          }
        };
        for (std::int64_t b = 0; b < ahead_bytes; b += 64)
          prefetch_line(ahead + r * ld_ahead + b, false);
        if (nb == kBlock) {  // the common case, unrolled
#pragma GCC unroll 16
          for (int i = 0; i < kBlock / (2 * W); ++i) update(j0 + i * 2 * W);
        } else {
          for (std::int64_t j = j0; j < j1; j += 2 * W) update(j);
        }
      }
    };
    if (src != nullptr) {
      no_nan ? rows(std::true_type{}, std::false_type{}) : rows(std::true_type{}, std::true_type{});
    } else {
      no_nan ? rows(std::false_type{}, std::false_type{})
             : rows(std::false_type{}, std::true_type{});
    }
  }
}

template <class Real, class State = Real>
void decode_item(const detail::DecodeProblem& p, std::int64_t item, std::byte* workspace) {
  constexpr int W = kLanes<Real>;
  constexpr bool widened = !__is_same(State, Real);
  const std::int64_t vb = item % p.vblocks, sh = item / p.vblocks;
  const std::int64_t h = sh % p.hv, s = sh / p.hv;
  const std::int64_t dk = p.dk, dv = p.dv, group = p.hv / p.hk;
  // Blocks of whole vectors; the last one takes the rest.
  const std::int64_t width = (dv + p.vblocks - 1) / p.vblocks;
  const std::int64_t step = (width + W - 1) / W * W;
  const std::int64_t j0 = vb * step, n = min64(dv, j0 + step) - j0;
  if (n <= 0) return;
  const std::int64_t dkp = padded(dk), dvp = padded(dv);
  Real* q = reinterpret_cast<Real*>(workspace);
  Real* k = q + dkp;
  Real* u = k + dkp;
  Real* ks = u + dvp;
  Real* qs = ks + dvp;
  Real* wide = qs + dvp;  // widened: a window's float32 state, [dk][step]
  Real* v_pairs = widened ? wide + dk * dvp : nullptr;  // v in pair order
  // A bf16 pool's block of whole vector pairs streams in pair order (decode_token_pairs).
  static_assert(!widened || __is_same(Real, float), "a 16-bit pool is widened to float32");
  const bool pairs = widened && n % (2 * W) == 0;
  const Real* xh = reinterpret_cast<const Real*>(p.xh);
  const Real* g = reinterpret_cast<const Real*>(p.g);
  const Real* beta_of = reinterpret_cast<const Real*>(p.beta);
  State* pool = reinterpret_cast<State*>(p.state);
  Real* out = reinterpret_cast<Real*>(p.out);
  const std::int64_t head = h * dk * dv + j0;  // this block's first element in a slot
  const std::int64_t first = p.token_start[s], tokens = p.token_start[s + 1] - first;
  const std::int64_t key = h / group;
  // The slot of the state after window token t.
  auto slot_after = [&](std::int64_t t) {
    return p.token_slot != nullptr ? p.token_slot[first + t] : p.write_slot[s] + t;
  };
  // The next item's first block in its read slot, for the last token's pass 2 to prefetch
  // (decode_token_pairs): within a run (DecodeProblem::run), the block this thread reads next.
  const BFloat16* next_block = nullptr;
  std::int64_t next_columns = 0;
  if constexpr (widened) {
    const std::int64_t after = item + 1;
    if (pairs && after % p.run != 0 && after < p.num_seqs * p.hv * p.vblocks) {
      const std::int64_t next_vb = after % p.vblocks, next_sh = after / p.vblocks;
      const std::int64_t next_s = next_sh / p.hv, next_read = p.read_slot[next_s];
      const std::int64_t next_j0 = next_vb * step;
      next_columns = min64(dv, next_j0 + step) - next_j0;
      if (next_read >= 0 && next_columns > 0) {
        next_block = pool + next_read * p.slot_stride + next_sh % p.hv * dk * dv + next_j0;
      }
    }
  }
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t row = first + t;
    const Real* x = xh + row * p.channels;
    pack_qk_row(q, x + key * dk, 1, dk, dkp, true, static_cast<Real>(p.scale));
    pack_qk_row(k, x + (p.hk + key) * dk, 1, dk, dkp, true, static_cast<Real>(1));
    const Real* v = x + 2 * p.hk * dk + h * dv + j0;
    const Real alpha = static_cast<Real>(__builtin_exp(static_cast<double>(g[row * p.hv + h])));
    const Real beta = beta_of[row * p.hv + h];
    const std::int64_t read = t == 0 ? p.read_slot[s] : slot_after(t - 1);
    State* dst = pool + slot_after(t) * p.slot_stride + head;
    const State* src = read < 0 ? nullptr : pool + read * p.slot_stride + head;
    if constexpr (widened) {
      const bool carry = t + 1 < tokens;
      if (pairs) {
        to_pair_order(v, v_pairs, n);
        const BFloat16* next = t + 1 == tokens ? next_block : nullptr;
        const Real* from = wide;  // positions after the first: the carry
        if (t == 0 && carry) {
          decode_token_pairs<true>(src, dv, dst, dv, wide, step, n, dk, v_pairs, alpha, beta, k, q,
                                   u, ks, qs, next, dv, next_columns);
        } else if (t == 0) {
          decode_token_pairs<false>(src, dv, dst, dv, wide, step, n, dk, v_pairs, alpha, beta, k, q,
                                    u, ks, qs, next, dv, next_columns);
        } else if (carry) {
          decode_token_pairs<true>(from, step, dst, dv, wide, step, n, dk, v_pairs, alpha, beta, k,
                                   q, u, ks, qs, next, dv, next_columns);
        } else {
          decode_token_pairs<false>(from, step, dst, dv, wide, step, n, dk, v_pairs, alpha, beta, k,
                                    q, u, ks, qs, next, dv, next_columns);
        }
      } else if (n % W != 0) {
        // A block with a tail of columns: widened into the workspace first and updated there
        // by the float32 path's own code, then rounded. (Converting on the fly, GCC compiles
        // the float32 and bf16 tail loops differently, one with FMAs and one without, and
        // the results differ in the last bit.)
        if (t == 0 && src != nullptr) {
          for (std::int64_t r = 0; r < dk; ++r) widen_row(wide + r * step, src + r * dv, n);
        }
        const bool have = t > 0 || src != nullptr;
        decode_token<false>(have ? static_cast<const Real*>(wide) : nullptr, step, wide, step,
                            static_cast<Real*>(nullptr), 0, n, dk, v, alpha, beta, k, q, u, ks, qs);
        for (std::int64_t r = 0; r < dk; ++r) narrow_row(dst + r * dv, wide + r * step, n);
      } else if (t == 0 && carry) {
        decode_token<true>(src, dv, dst, dv, wide, step, n, dk, v, alpha, beta, k, q, u, ks, qs);
      } else if (t == 0) {
        decode_token<false>(src, dv, dst, dv, wide, step, n, dk, v, alpha, beta, k, q, u, ks, qs);
      } else if (carry) {
        decode_token<true>(static_cast<const Real*>(wide), step, dst, dv, wide, step, n, dk, v,
                           alpha, beta, k, q, u, ks, qs);
      } else {
        decode_token<false>(static_cast<const Real*>(wide), step, dst, dv, wide, step, n, dk, v,
                            alpha, beta, k, q, u, ks, qs);
      }
    } else {
      decode_token<false>(src, dv, dst, dv, static_cast<Real*>(nullptr), 0, n, dk, v, alpha, beta,
                          k, q, u, ks, qs);
    }
    Real* o = out + row * p.out_token + (h * dv + j0) * p.out_channel;
    if (!pairs) {
      for (std::int64_t j = 0; j < n; ++j) o[j * p.out_channel] = qs[j];
    } else if constexpr (__is_same(Real, float)) {
      if (p.out_channel == 1) {
        from_pair_order(qs, o, n);
      } else {
        for (std::int64_t j = 0; j < n; ++j) o[j * p.out_channel] = qs[pair_position<Real>(j)];
      }
    }
  }
}
