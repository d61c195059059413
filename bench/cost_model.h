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

// The whole chunked forward: full chunks of c tokens plus the last partial chunk of each
// sequence, times Hv.
inline double chunked_forward_flops(std::int64_t tokens_per_seq, std::int64_t seqs, std::int64_t hv,
                                    std::int64_t dk, std::int64_t dv, std::int64_t c) {
  const std::int64_t full = tokens_per_seq / c, rest = tokens_per_seq % c;
  double per_seq = static_cast<double>(full) * chunked_forward_flops_per_chunk(c, dk, dv);
  if (rest > 0) per_seq += chunked_forward_flops_per_chunk(static_cast<double>(rest), dk, dv);
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
