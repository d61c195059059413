// workspace.h: the per-thread scratch layout of one forward work item.
//
// Shared by the driver (which sizes and allocates it) and every ISA variant (which carves it),
// so the functions have internal linkage: each translation unit gets its own copy.
// Rows are padded to kPad elements (zeros in the padding) so that every row starts on a
// vector boundary for every variant and dtype. Budget at C = 64, Dk = Dv = 128, float:
// S 64 KiB + [Q;K] 64 KiB + K^T 32 KiB + V 32 KiB + gram 32 KiB + A 16 KiB + X 64 KiB +
// V_new 32 KiB + P/L 32 KiB = 368 KiB for one value head, + 64 KiB per further head of the
// item: 432 KiB at Qwen3-Next's 2 value heads per key head, inside the 1 MiB L2 of a Zen 5
// core.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gdn::cpu {

inline constexpr std::int64_t kPad = 16;  // elements; 64 bytes of float

static constexpr std::int64_t padded(std::int64_t n) { return (n + kPad - 1) / kPad * kPad; }

// Offsets in elements of each buffer; every buffer starts on a 64-byte boundary because
// every size is a multiple of kPad elements. One item runs `heads` value heads that share a
// key head: the q/k buffers and the raw [Q;K] K^T are shared, each head has its own state, and
// the per-head temporaries are reused head after head.
struct ChunkedLayout {
  std::int64_t dkp, dvp, cp;  // padded Dk, Dv, C
  std::int64_t states;        // S of each head  [heads][Dk][dvp]
  std::int64_t qk;            // [Q;K]  [2C][dkp]: Q (scaled) in rows 0..n-1, K in n..2n-1
  std::int64_t kt;            // K^T    [Dk][cp]
  std::int64_t gram;          // [Q;K] K^T, lower triangles  [2C][cp]
  std::int64_t v;             // V, then R = diag(beta)(V - diag(e^G) K S)   [C][dvp]
  std::int64_t pl;            // P (rows 0..n-1) and L (rows n..2n-1)  [2C][cp]
  std::int64_t a;             // A = T^-1 [C][cp]
  std::int64_t x;             // [Q;K] S, then O in rows 0..n-1   [2C][dvp]
  std::int64_t vnew;          // V_new  [C][dvp]
  std::int64_t vectors;       // g, G, e^G, beta, e^(G_last - G), D: 6 x [cp]
  std::int64_t total;
};

static constexpr ChunkedLayout chunked_layout(std::int64_t dk, std::int64_t dv, std::int64_t c,
                                              std::int64_t heads) {
  ChunkedLayout l{};
  l.dkp = padded(dk);
  l.dvp = padded(dv);
  l.cp = padded(c);
  std::int64_t at = 0;
  l.states = at;
  at += heads * dk * l.dvp;
  l.qk = at;
  at += 2 * c * l.dkp;
  l.kt = at;
  at += dk * l.cp;
  l.gram = at;
  at += 2 * c * l.cp;
  l.v = at;
  at += c * l.dvp;
  l.pl = at;
  at += 2 * c * l.cp;
  l.a = at;
  at += c * l.cp;
  l.x = at;
  at += 2 * c * l.dvp;
  l.vnew = at;
  at += c * l.dvp;
  l.vectors = at;
  at += 6 * l.cp;
  l.total = padded(at);
  return l;
}

// Scratch for bf16 matrix operands (ForwardProblem::bf16_operands), after the forward's or
// the backward's layout: one product's A and B rounded to bf16 (src/cpu/gemm-inl.h). Every
// product of the chunk has m, k, n <= max(dkp, dvp, 2 cp).
static constexpr std::int64_t bf16_scratch_elements(std::int64_t dk, std::int64_t dv,
                                                    std::int64_t c) {
  const std::int64_t dkp = padded(dk), dvp = padded(dv), c2 = 2 * padded(c);
  const std::int64_t r = dkp > dvp ? (dkp > c2 ? dkp : c2) : (dvp > c2 ? dvp : c2);
  return 2 * r * r + kPad;
}

// bf16 pair words (two bf16 along k in 4 bytes) in a row of an operand packed along k: kdim
// elements, padded to whole vectors.
static constexpr std::int64_t bf16_words_per_row(std::int64_t kdim) {
  return padded((kdim + 1) / 2);
}

// The forward's scratch goes on with the words of a key head's operands that several products
// read, packed once per chunk by the vdpbf16ps variant (chunked_fwd-inl.h: chunk_pack_words):
// [Q;K] along its rows [2 cp][bf16_words_per_row(Dk)] (chunk_gram's and chunk_wy's A), K^T
// [ceil(Dk / 2)][cp] (chunk_gram's B) and K read transposed [ceil(cp / 2)][dkp]
// (chunk_state's A). Offsets in 4-byte elements from the scratch's start; `end` is the
// forward's whole scratch.
struct Bf16KeyWords {
  std::int64_t qk, kt, k, end;
};
static constexpr Bf16KeyWords bf16_key_words(std::int64_t dk, std::int64_t dv, std::int64_t c) {
  const std::int64_t cp = padded(c);
  Bf16KeyWords w{};
  w.qk = bf16_scratch_elements(dk, dv, c);
  w.kt = w.qk + padded(2 * cp * bf16_words_per_row(dk));
  w.k = w.kt + padded((dk + 1) / 2 * cp);
  w.end = w.k + padded((cp + 1) / 2 * padded(dk));
  return w;
}

// The backward's per-thread workspace for one item (a sequence and the `heads` value heads of
// one key head). Besides the forward's chunk buffers (one head's worth, reused head after
// head) it holds the gradient temporaries, each head's carried dS, and the rebuilt chunk
// states when the caller kept no chunk_states: `rebuilt` states per head (checkpoints plus
// one segment; src/cpu/backward.cc sizes it).
struct BackwardLayout {
  ChunkedLayout fwd;   // the forward's chunk buffers with heads = 1 (its state unused)
  std::int64_t gamma;  // Gamma  [C][cp]
  std::int64_t bmat;   // B = K K^T . Gamma, strict lower  [C][cp]
  std::int64_t hmat;   // H = dP . P + dB . B, strict lower  [C][cp]
  std::int64_t r;      // R, then K dS'  [C][dvp]
  std::int64_t dodr;   // dO (rows 0..n-1) and dR (rows n..2n-1)  [2C][dvp]
  std::int64_t dvn;    // dV_new  [C][dvp]
  std::int64_t vnt;    // V_new^T  [Dv][cp]
  std::int64_t dpl;    // [dO; dR] V_new^T: dP and -dL, then masked  [2C][cp]
  std::int64_t st;     // S^T  [Dv][dkp]
  std::int64_t dst;    // dS'^T  [Dv][dkp]
  std::int64_t state;  // S of the chunk, read from chunk_states  [Dk][dvp]
  std::int64_t dqk;    // dQ~ (rows 0..n-1) and dK (rows n..2n-1), summed over heads  [2C][dkp]
  std::int64_t y;      // one head's [dQ~; dK], starting from M S^T  [2C][dkp]
  std::int64_t grad_vectors;  // dd d, dbeta, de e: 3 x [cp]; a row [max(cp, dkp, dvp)]
  std::int64_t inv_norms;     // 1 / |q row| (0..n-1), 1 / |k row| (n..2n-1)  [2 cp]
  std::int64_t ds;            // each head's dS  [heads][Dk][dvp]
  std::int64_t rebuilt;       // rebuilt states  [slots][heads][Dk][dvp]
  std::int64_t total;
};

static constexpr BackwardLayout backward_layout(std::int64_t dk, std::int64_t dv, std::int64_t c,
                                                std::int64_t heads, std::int64_t slots) {
  BackwardLayout l{};
  l.fwd = chunked_layout(dk, dv, c, 1);
  const std::int64_t dkp = l.fwd.dkp, dvp = l.fwd.dvp, cp = l.fwd.cp;
  std::int64_t at = l.fwd.total;
  l.gamma = at;
  at += c * cp;
  l.bmat = at;
  at += c * cp;
  l.hmat = at;
  at += c * cp;
  l.r = at;
  at += c * dvp;
  l.dodr = at;
  at += 2 * c * dvp;
  l.dvn = at;
  at += c * dvp;
  l.vnt = at;
  at += dv * cp;
  l.dpl = at;
  at += 2 * c * cp;
  l.st = at;
  at += dv * dkp;
  l.dst = at;
  at += dv * dkp;
  l.state = at;
  at += dk * dvp;
  l.dqk = at;
  at += 2 * c * dkp;
  l.y = at;
  at += 2 * c * dkp;
  const std::int64_t row = cp > dkp ? (cp > dvp ? cp : dvp) : (dkp > dvp ? dkp : dvp);
  l.grad_vectors = at;
  at += 3 * cp + row;
  at = padded(at);
  l.inv_norms = at;
  at += 2 * cp;
  l.ds = at;
  at += heads * dk * dvp;
  l.rebuilt = at;
  at += slots * heads * dk * dvp;
  l.total = padded(at);
  return l;
}

// The conv1d items (src/cpu/conv1d-inl.h): up to kConvTokens tokens of one sequence, all
// channels (fixed by the problem, never by the thread count: the backward sums its partial
// d weights in item order). The forward walks an item in sub-blocks of kConvSub tokens and
// streams its output past the caches when it is at least kConvStreamBytes (the size of a
// large L3: smaller outputs are still cached when the core op reads them).
inline constexpr std::int64_t kConvTokens = 256;
inline constexpr std::int64_t kConvSub = 16;
// Channel vectors the forward's column walk carries side by side: two independent SiLU chains
// per token (each a division and an exponential deep). One bf16 Qwen3-Next 8192-token prefill,
// one thread, AVX2 (AMD EPYC, 2 vCPUs, shared host): the conv stage 146-153 ms with one,
// 109-124 ms with two, alternating runs; four measured no better than two (the 16 ymm
// registers hold two vectors' K weights and windows at K = 4).
inline constexpr int kConvColumnVectors = 2;
inline constexpr std::int64_t kConvStreamBytes = std::int64_t{32} << 20;

// The forward's residuals (chunk_states and t_inv) go out with non-temporal stores when they
// take at least this many bytes (the size of a large L3: smaller ones may still be cached when
// the backward reads them). src/cpu/chunked_fwd-inl.h.
inline constexpr std::int64_t kResidualStreamBytes = std::int64_t{32} << 20;

// The chunked forward's o and the backward's dq, dk, dv go out with non-temporal stores when
// the tensor takes at least this many bytes (as the residuals; smaller ones may still be
// cached when the next op reads them): their rows lie a token stride apart, and a cached store
// first reads each line it overwrites. src/cpu/io-inl.h: write_row.
inline constexpr std::int64_t kOutputStreamBytes = std::int64_t{32} << 20;

// Workspace in elements, rows cpad long: the forward's (K - 1 + kConvSub staged input rows and
// kConvSub tail vectors), the backward's (K - 1 rows of carried dy, staged rows of
// K - 1 + kConvSub inputs, kConvSub cotangents and kConvSub dx, one row of zeros).
static constexpr std::int64_t conv_workspace_elements(std::int64_t taps, std::int64_t cpad,
                                                      bool backward) {
  return backward ? (2 * taps - 1 + 3 * kConvSub) * cpad
                  : (taps - 1 + kConvSub) * cpad + kConvSub * kPad;
}

// The fused layer op's conv rows (ForwardProblem::conv; conv1d-inl.h: conv_head_rows), after a
// forward item's own scratch: K - 1 + kConvSub staged input rows of the widest head, padded,
// and the weights and bias of a head's last partial vector (K + 1 vectors).
static constexpr std::int64_t conv_rows_elements(std::int64_t taps, std::int64_t dk,
                                                 std::int64_t dv) {
  const std::int64_t row = padded(dk) > padded(dv) ? padded(dk) : padded(dv);
  return (taps - 1 + kConvSub) * row + (taps + 1) * kPad;
}

struct RecurrentLayout {
  std::int64_t dkp, dvp;
  std::int64_t state;      // S [Dk][dvp]
  std::int64_t q, k;       // [dkp] each
  std::int64_t v, ks, qs;  // [dvp] each: v, then u; S^T k; S^T q, then o
  std::int64_t total;
};

static constexpr RecurrentLayout recurrent_layout(std::int64_t dk, std::int64_t dv) {
  RecurrentLayout l{};
  l.dkp = padded(dk);
  l.dvp = padded(dv);
  std::int64_t at = 0;
  l.state = at;
  at += dk * l.dvp;
  l.q = at;
  at += l.dkp;
  l.k = at;
  at += l.dkp;
  l.v = at;
  at += l.dvp;
  l.ks = at;
  at += l.dvp;
  l.qs = at;
  at += l.dvp;
  l.total = padded(at);
  return l;
}

}  // namespace gdn::cpu
