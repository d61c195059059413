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

template <class Real>
void decode_item(const detail::DecodeProblem& p, std::int64_t item, std::byte* workspace) {
  constexpr int W = kLanes<Real>;
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
  const Real* xh = reinterpret_cast<const Real*>(p.xh);
  const Real* g = reinterpret_cast<const Real*>(p.g);
  const Real* beta_of = reinterpret_cast<const Real*>(p.beta);
  Real* pool = reinterpret_cast<Real*>(p.state);
  Real* out = reinterpret_cast<Real*>(p.out);
  const std::int64_t head = h * dk * dv + j0;  // this block's first element in a slot
  const std::int64_t first = p.token_start[s], tokens = p.token_start[s + 1] - first;
  const std::int64_t key = h / group;
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t row = first + t;
    const Real* x = xh + row * p.channels;
    pack_qk_row(q, x + key * dk, 1, dk, dkp, true, static_cast<Real>(p.scale));
    pack_qk_row(k, x + (p.hk + key) * dk, 1, dk, dkp, true, static_cast<Real>(1));
    const Real* v = x + 2 * p.hk * dk + h * dv + j0;
    const Real alpha = static_cast<Real>(__builtin_exp(static_cast<double>(g[row * p.hv + h])));
    const Real beta = beta_of[row * p.hv + h];
    const std::int64_t read = t == 0 ? p.read_slot[s] : p.write_slot[s] + t - 1;
    const Real* src = read < 0 ? nullptr : pool + read * p.slot_elements + head;
    Real* dst = pool + (p.write_slot[s] + t) * p.slot_elements + head;

    block_products(src, dk, dv, n, k, q, ks, qs);
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
      Real* to = dst + r * dv;
      const Real kr = k[r];
      if (src == nullptr) {
        for (std::int64_t j = 0; j < whole; j += W) store(to + j, load(u + j) * kr);
        for (std::int64_t j = whole; j < n; ++j) to[j] = u[j] * kr;
      } else {
        const Real* from = src + r * dv;
        for (std::int64_t j = 0; j < whole; j += W)
          store(to + j, load(from + j) * alpha + load(u + j) * kr);
        for (std::int64_t j = whole; j < n; ++j) to[j] = from[j] * alpha + u[j] * kr;
      }
    }
    Real* o = out + row * p.out_token + (h * dv + j0) * p.out_channel;
    for (std::int64_t j = 0; j < n; ++j) o[j * p.out_channel] = qs[j];
  }
}
