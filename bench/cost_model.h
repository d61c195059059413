// cost_model.h: the one FLOP model of the benchmarks and docs/perf.md.
//
// Counts the useful floating-point operations of each algorithm (a multiply-add is 2), per
// (value head, chunk or token): the math, not what a kernel happens to execute (padding and
// the skipped halves of triangular tiles are not counted). "% of peak" divides these by the
// FMA peak measured in the same run.
#pragma once

#include <cstdint>

namespace gdn::bench {

// The chunked forward over one chunk of n tokens (docs/math.md, section 3):
//   [Q;K] K^T, lower triangles   2 n(n+1)/2 dk + 2 n(n-1)/2 dk  = 2 n^2 dk
//   A = (I + L)^-1                n^3 / 3
//   [Q;K] S                       4 n dk dv
//   R = beta (V - e^G K S)        3 n dv
//   V_new = A R                   n(n+1) dv
//   O = e^G Q S + P V_new         n dv + n(n+1) dv
//   S = e^G_last S + K^T D V_new  2 n dk dv + dk dv + n dv
inline double chunked_forward_flops_per_chunk(double n, double dk, double dv) {
  return 2 * n * n * dk + n * n * n / 3 + 6 * n * dk * dv + 5 * n * dv + 2 * n * (n + 1) * dv +
         dk * dv;
}

// The chunked backward over one chunk of n tokens, given the chunk's state and T^-1
// (docs/math.md section 5.2), per value head:
//   recompute  [Q;K] K^T 2 n^2 dk, K S 2 n dk dv, V_new = A R n(n+1) dv
//   values     K dS' 2 n dk dv, P^T dO and A^T dV_new 2 n(n+1) dv, [dO; dR] V_new^T 2 n^2 dv
//   q, k       four triangular products with K or Q 4 n^2 dk, [e dO; -b e dR] S^T 4 n dk dv,
//              (d V_new) dS'^T 2 n dk dv
//   state      [Q;K]^T [e dO; -b e dR] 4 n dk dv
// = 14 n dk dv + 6 n^2 dk + ~5 n^2 dv (+ O(n d) element-wise work, not counted).
inline double chunked_backward_flops_per_chunk(double n, double dk, double dv) {
  return 14 * n * dk * dv + 6 * n * n * dk + 5 * n * n * dv;
}

// The same FLOPs split by the stages of src/cpu/profile.h (the breakdown of `gdn bench
// --breakdown`), per chunk of n tokens: the gram per key head, the rest per value head.
// Forward: gram + solve + wy + output + state = chunked_forward_flops_per_chunk when every
// value head has its own key head. Backward (from kept residuals): gram + recompute + values +
// mst + dqk + dstate = chunked_backward_flops_per_chunk likewise (tests/cpu/profile_test.cc).
struct StageFlops {
  double gram = 0, solve = 0, wy = 0, output = 0, state = 0;       // forward
  double recompute = 0, values = 0, mst = 0, dqk = 0, dstate = 0;  // backward
};
inline StageFlops forward_stage_flops(double n, double dk, double dv) {
  StageFlops f;
  f.gram = 2 * n * n * dk;
  f.solve = n * n * n / 3;
  f.wy = 4 * n * dk * dv + n * (n + 1) * dv + 3 * n * dv;
  f.output = n * (n + 1) * dv + n * dv;
  f.state = 2 * n * dk * dv + dk * dv + n * dv;
  return f;
}
inline StageFlops backward_stage_flops(double n, double dk, double dv) {
  StageFlops f;
  f.gram = 2 * n * n * dk;
  f.solve = n * n * n / 3;  // when T^-1 is not kept
  f.recompute = 2 * n * dk * dv + n * n * dv;
  f.values = 2 * n * dk * dv + 4 * n * n * dv;
  f.mst = 4 * n * dk * dv;
  f.dqk = 4 * n * n * dk + 2 * n * dk * dv;
  f.dstate = 4 * n * dk * dv;
  return f;
}

// Rebuilding one chunk's state without residuals (the t_inv and none policies; also the
// forward asked for no output): K K^T, strict lower triangle n(n-1) dk (Q is not read), K S
// 2 n dk dv, V_new = A R n^2 dv, the state update 2 n dk dv, and with no t_inv kept the solve
// n^3 / 3. Counted once per chunk (a single rebuild pass); sequences long enough to be
// checkpointed rebuild twice (src/cpu/backward.cc).
inline double rebuild_flops_per_chunk(double n, double dk, double dv, bool solve) {
  return n * (n - 1) * dk + 4 * n * dk * dv + n * n * dv + (solve ? n * n * n / 3 : 0.0);
}

// Sums a per-chunk cost over the chunks of `seqs` sequences of tokens_per_seq tokens, x Hv.
template <class PerChunk>
double over_chunks(std::int64_t tokens_per_seq, std::int64_t seqs, std::int64_t hv, std::int64_t c,
                   PerChunk&& per_chunk) {
  const std::int64_t full = tokens_per_seq / c, rest = tokens_per_seq % c;
  double per_seq = static_cast<double>(full) * per_chunk(static_cast<double>(c));
  if (rest > 0) per_seq += per_chunk(static_cast<double>(rest));
  return per_seq * static_cast<double>(seqs * hv);
}

// The token recurrence with two passes over the state: S^T k and S^T q (4 dk dv), the
// update alpha S + k u^T (3 dk dv counting the scale), plus O(dk + dv) vector work.
inline double recurrent_forward_flops(std::int64_t tokens, std::int64_t hv, std::int64_t dk,
                                      std::int64_t dv) {
  const double per_token = 7.0 * dk * dv + 4.0 * dk + 6.0 * dv;
  return per_token * static_cast<double>(tokens * hv);
}

}  // namespace gdn::bench
