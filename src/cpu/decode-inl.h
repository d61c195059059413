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
// A bf16 pool (State = BFloat16, Real = float): converted on the fly, in the same two passes:
// pass 1 widens the slot's rows as it loads them (exact), pass 2 widens them again, computes
// S' with the float32 pool's expressions and rounds it into the written slot. A window carries
// its float32 state from one position to the next in the workspace (Dk x Dv floats at most:
// 64 KiB at d = 128, in L2 like the slot's block): position t + 1 starts from that copy, not
// from the rounded slot. So the slots of a bf16 pool are those of a float32 pool holding the
// same start values, rounded once, bit for bit. The float32 path's arithmetic is as before.
// A block with a tail of columns (not a whole number of vectors) is widened into the
// workspace first, updated there by the float32 code and rounded (see below why). That route
// for every block measured 1.8x the float32 pool's time for one decode (in cache) and 1.4x
// for 64; converting on the fly, 1.6x to 2x, 1.25x, and 1.05x for 64 windows of 4
// (`gdn bench --op step --pools bf16`, one thread, Qwen3-Next's shape, docs/perf.md): in
// cache, the rounding's integer work in pass 2 is what it costs.

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
    store(qs + j, load(qs + j) * alpha + uj * qk);
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
        const Vec<Real> x = load_state<Real>(from + j) * alpha + load(u + j) * kr;
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
      if (n % W != 0) {
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
    for (std::int64_t j = 0; j < n; ++j) o[j * p.out_channel] = qs[j];
  }
}
