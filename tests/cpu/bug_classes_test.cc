// bug_classes_test.cc: the bug classes that shipped in other GDN kernels
// (docs/peers.md, section 4; issue 16), each as a test of its own against the
// float64 reference or an invariance that needs none, on every ISA variant this CPU runs.
//
// Tolerances as in layer_test.cc / forward_test.cc (docs/numerics.md): float32 results within
// 1e-4 of the float64 reference in the shared metric; the A_log / dt_bias gradients within 1e-5
// relative (2-norm) with a cosine >= 0.9999.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/compare.h"
#include "common/isas.h"
#include "common/layer_problem.h"
#include "common/problem.h"

namespace gdn {
namespace {

constexpr double kF32Tolerance = 1e-4;
constexpr double kParameterRelative = 1e-5;
constexpr double kMinCosine = 0.9999;

struct LayerRun {
  LayerForwardResult fwd;
  LayerBackwardResult bwd;
};

LayerRun run_layer(const test::LayerProblem& p, bool with_state_cotangents, bool reference,
                   CpuIsa isa = CpuIsa::automatic) {
  LayerOptions o = p.options();
  o.isa = isa;
  const LayerBackwardInputs in{
      p.inputs(),
      p.d_out.view(),
      with_state_cotangents ? p.d_conv_state_out.view() : TensorView{},
      with_state_cotangents ? p.d_recurrent_state_out.view() : TensorView{},
      {},
      {}};
  if (reference) return {ref::fused_gdn_fwd(p.inputs(), o), ref::fused_gdn_bwd(in, o)};
  return {fused_gdn_fwd(p.inputs(), o), fused_gdn_bwd(in, o)};
}

// Cosine and 2-norm relative error of x against ref.
std::pair<double, double> direction_and_size(const Tensor& x, const Tensor& ref) {
  double dot = 0, nx = 0, nr = 0, diff = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double a = test::value_at(x, i), b = test::value_at(ref, i);
    dot += a * b;
    nx += a * a;
    nr += b * b;
    diff += (a - b) * (a - b);
  }
  return {dot / std::sqrt(nx * nr), std::sqrt(diff / nr)};
}

void expect_layer_gradients_match(const LayerRun& cpu, const LayerRun& ref,
                                  const std::string& what) {
  const std::vector<std::pair<const char*, std::pair<const Tensor*, const Tensor*>>> pairs = {
      {"out", {&cpu.fwd.out, &ref.fwd.out}},
      {"conv_state_out", {&cpu.fwd.conv_state_out, &ref.fwd.conv_state_out}},
      {"d_qkv", {&cpu.bwd.d_qkv, &ref.bwd.d_qkv}},
      {"d_conv_weight", {&cpu.bwd.d_conv_weight, &ref.bwd.d_conv_weight}},
      {"d_conv_bias", {&cpu.bwd.d_conv_bias, &ref.bwd.d_conv_bias}},
      {"d_conv_state", {&cpu.bwd.d_conv_state, &ref.bwd.d_conv_state}},
      {"d_recurrent_state", {&cpu.bwd.d_recurrent_state, &ref.bwd.d_recurrent_state}},
      {"d_a", {&cpu.bwd.d_a, &ref.bwd.d_a}},
      {"d_b", {&cpu.bwd.d_b, &ref.bwd.d_b}}};
  for (const auto& [name, tensors] : pairs) {
    if (!tensors.second->present()) continue;
    ASSERT_TRUE(tensors.first->present()) << name << ", " << what;
    EXPECT_TRUE(test::within(*tensors.first, *tensors.second, kF32Tolerance,
                             std::string(name) + ", " + what));
  }
  for (const auto& [name, got, want] :
       {std::tuple{"d_A_log", &cpu.bwd.d_A_log, &ref.bwd.d_A_log},
        std::tuple{"d_dt_bias", &cpu.bwd.d_dt_bias, &ref.bwd.d_dt_bias}}) {
    double want_norm = 0, got_max = 0;
    for (std::int64_t i = 0; i < want->numel(); ++i) {
      want_norm += test::value_at(*want, i) * test::value_at(*want, i);
      got_max = std::max(got_max, std::abs(test::value_at(*got, i)));
    }
    if (want_norm == 0) {
      // One token from a zero state: the decay multiplies zero, its gradient is exactly 0.
      EXPECT_EQ(got_max, 0.0) << name << " (the reference's is exactly 0), " << what;
      continue;
    }
    const auto [cosine, relative] = direction_and_size(*got, *want);
    EXPECT_GE(cosine, kMinCosine) << name << ", " << what;
    EXPECT_LE(relative, kParameterRelative) << name << ", " << what;
  }
}

// A1 (fla #1140): the conv backward of a sequence shorter than K - 1 took the slot of the
// final conv state's cotangent from a clamped start and shifted every contribution; the part
// of the initial conv state that survives into the final one lost its gradient. K = 4, one
// sequence of T = 1, 2, 3 tokens, with and without an initial conv state, with and without
// cotangents of the final states: every gradient against float64.
TEST(PeerBugA1, ConvGradientsOfSequencesShorterThanTapsMinusOne) {
  for (std::int64_t tokens : {1, 2, 3}) {
    for (bool states : {false, true}) {
      for (bool cotangents : {false, true}) {
        test::LayerSpec spec;
        spec.lengths = {tokens};
        spec.taps = 4;
        spec.conv_state = states;
        spec.recurrent_state = states;
        spec.seed = 11 + static_cast<std::uint64_t>(tokens);
        const test::LayerProblem p = test::make_layer_problem(spec);
        const LayerRun ref = run_layer(p, cotangents, true);
        for (CpuIsa isa : test::runnable_isas()) {
          const LayerRun cpu = run_layer(p, cotangents, false, isa);
          expect_layer_gradients_match(
              cpu, ref,
              spec.name() + (cotangents ? ", state cotangents" : ", no state cotangents") + ", " +
                  cpu_isa_name(isa));
        }
      }
    }
  }
}

// A1's second half: a sequence fed as calls of 1, 2 and 3 tokens (the conv and recurrent
// states carried) gives the same forward as one call of 6 tokens.
TEST(PeerBugA1, ShortCallsInARowEqualOneCall) {
  test::LayerSpec spec;
  spec.lengths = {6};
  spec.taps = 4;
  spec.conv_state = true;
  spec.recurrent_state = true;
  spec.seed = 21;
  const test::LayerProblem whole = test::make_layer_problem(spec);
  const LayerForwardResult one = fused_gdn_fwd(whole.inputs(), whole.options());
  const std::int64_t d = spec.channels();
  Tensor conv_state = test::make_layer_problem(spec).conv_state;  // same seed: same values
  Tensor rec_state = test::make_layer_problem(spec).recurrent_state;
  std::int64_t start = 0;
  for (std::int64_t len : {1, 2, 3}) {
    LayerInputs in = whole.inputs();
    in.qkv = TensorView(whole.qkv.data<float>() + start * d, {len, d});
    in.a = TensorView(whole.a.data<float>() + start * spec.hv, {len, spec.hv});
    in.b = TensorView(whole.b.data<float>() + start * spec.hv, {len, spec.hv});
    in.conv_state = conv_state.view();
    in.recurrent_state = rec_state.view();
    in.cu_seqlens = {};
    LayerForwardResult part = fused_gdn_fwd(in, whole.options());
    for (std::int64_t i = 0; i < len * spec.hv * spec.dv; ++i) {
      EXPECT_NEAR(part.out.data<float>()[i], one.out.data<float>()[start * spec.hv * spec.dv + i],
                  1e-5)
          << "token " << start + i / (spec.hv * spec.dv) << " of the call of " << len;
    }
    conv_state = std::move(part.conv_state_out);
    rec_state = std::move(part.recurrent_state_out);
    start += len;
  }
  EXPECT_TRUE(test::within(conv_state,
                           ref::fused_gdn_fwd(whole.inputs(), whole.options()).conv_state_out,
                           kF32Tolerance, "final conv state after 1 + 2 + 3 tokens"));
}

// A2 (fla #955): the conv weight gradient of a packed batch of several sequences (1- and
// 2-token ones among them) equals the sum of the per-sequence gradients, and the float64
// reference.
TEST(PeerBugA2, ConvWeightGradientOfAPackedBatchIsTheSumOverItsSequences) {
  test::LayerSpec spec;
  spec.lengths = {1, 2, 37, 5, 64, 3};
  spec.taps = 4;
  spec.conv_state = true;
  spec.recurrent_state = true;
  spec.seed = 31;
  const test::LayerProblem p = test::make_layer_problem(spec);
  const LayerRun whole = run_layer(p, true, false);
  expect_layer_gradients_match(whole, run_layer(p, true, true), spec.name());

  const std::int64_t d = spec.channels(), k = spec.taps;
  std::vector<double> dw_sum(static_cast<std::size_t>(d * k), 0.0), db_sum(d, 0.0);
  std::int64_t start = 0;
  for (std::size_t s = 0; s < spec.lengths.size(); ++s) {
    const std::int64_t len = spec.lengths[s];
    const std::int64_t state_rows = k - 1;
    LayerInputs in = p.inputs();
    in.qkv = TensorView(p.qkv.data<float>() + start * d, {len, d});
    in.a = TensorView(p.a.data<float>() + start * spec.hv, {len, spec.hv});
    in.b = TensorView(p.b.data<float>() + start * spec.hv, {len, spec.hv});
    in.conv_state = TensorView(p.conv_state.data<float>() + s * state_rows * d, {1, state_rows, d});
    in.recurrent_state =
        TensorView(p.recurrent_state.data<float>() + s * spec.hv * spec.dk * spec.dv,
                   {1, spec.hv, spec.dk, spec.dv});
    in.cu_seqlens = {};
    const LayerBackwardInputs bin{
        in,
        TensorView(p.d_out.data<float>() + start * spec.hv * spec.dv, {len, spec.hv * spec.dv}),
        TensorView(p.d_conv_state_out.data<float>() + s * state_rows * d, {1, state_rows, d}),
        TensorView(p.d_recurrent_state_out.data<float>() + s * spec.hv * spec.dk * spec.dv,
                   {1, spec.hv, spec.dk, spec.dv}),
        {},
        {}};
    const LayerBackwardResult one = fused_gdn_bwd(bin, p.options());
    for (std::int64_t i = 0; i < d * k; ++i) dw_sum[i] += one.d_conv_weight.data<float>()[i];
    for (std::int64_t i = 0; i < d; ++i) db_sum[i] += one.d_conv_bias.data<float>()[i];
    start += len;
  }
  double worst = 0, scale = 0;
  for (std::int64_t i = 0; i < d * k; ++i) {
    worst = std::max(worst, std::abs(whole.bwd.d_conv_weight.data<float>()[i] - dw_sum[i]));
    scale = std::max(scale, std::abs(dw_sum[i]));
  }
  EXPECT_LE(worst, 1e-5 * scale) << "d_conv_weight: packed batch against the per-sequence sum";
  worst = 0;
  scale = 0;
  for (std::int64_t i = 0; i < d; ++i) {
    worst = std::max(worst, std::abs(whole.bwd.d_conv_bias.data<float>()[i] - db_sum[i]));
    scale = std::max(scale, std::abs(db_sum[i]));
  }
  EXPECT_LE(worst, 1e-5 * scale) << "d_conv_bias: packed batch against the per-sequence sum";
}

// A4 (FlashQLA #28, MaxText's float32 rule): gate gradients under strong decay. A_log =
// log 16, and a set so that g = -exp(A_log) softplus(a + dt_bias) alternates between about
// -60 and about -1e-6 inside one chunk: d_A_log, d_dt_bias and d_a against float64.
TEST(PeerBugA4, GateGradientsWithDecayOfMinus60NextToMinus1eMinus6) {
  test::LayerSpec spec;
  spec.lengths = {100, 29};
  spec.hv = 4;
  spec.hk = 2;
  spec.seed = 41;
  spec.recurrent_state = true;
  test::LayerProblem p = test::make_layer_problem(spec);
  float* A_log = p.A_log.data<float>();
  float* dt_bias = p.dt_bias.data<float>();
  float* a = p.a.data<float>();
  for (std::int64_t h = 0; h < spec.hv; ++h) {
    A_log[h] = static_cast<float>(std::log(16.0));
    dt_bias[h] = 0.0f;
  }
  // softplus(x) = 60 / 16 at x = 3.726; softplus(-16.6) = 6.2e-8, so g = -1e-6.
  const std::int64_t tokens = 129;
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t h = 0; h < spec.hv; ++h) {
      a[t * spec.hv + h] = ((t + h) % 3 == 0) ? 3.726f : -16.6f;
    }
  }
  const LayerRun ref = run_layer(p, true, true);
  for (CpuIsa isa : test::runnable_isas()) {
    expect_layer_gradients_match(run_layer(p, true, false, isa), ref,
                                 spec.name() + ", g in {-60, -1e-6}, " + cpu_isa_name(isa));
  }
}

// Skewed varlen batches (fla's and FlashInfer's varlen paths): one long sequence among many
// 1-token ones, every sequence with its own initial state; forward, final states and every
// gradient against float64, on every variant, with the chunk size that splits the long one
// unevenly.
TEST(PeerBugSkewedVarlen, OneLongAndThirtyOneTokenSequencesWithInitialStates) {
  test::ProblemSpec spec;
  spec.lengths.assign(31, 1);
  spec.lengths.insert(spec.lengths.begin() + 7, 203);
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 16;
  spec.dv = 24;
  spec.initial_state = true;
  spec.l2norm = true;
  spec.seed = 61;
  const test::Problem p = test::make_problem(spec);
  const test::Cotangents c = test::make_cotangents(p, 62);
  const ForwardOptions o = p.options();
  BackwardInputs bin;
  bin.q = p.q.view();
  bin.k = p.k.view();
  bin.v = p.v.view();
  bin.g = p.g.view();
  bin.beta = p.beta.view();
  bin.initial_state = p.h0.view();
  bin.cu_seqlens = p.cu_seqlens.view();
  bin.d_o = c.d_o.view();
  bin.d_final_state = c.d_ht.view();
  const ForwardResult ref_fwd = ref::recurrent_fwd(p.inputs(), o);
  const BackwardResult ref_bwd = ref::recurrent_bwd(bin, o);
  for (CpuIsa isa : test::runnable_isas()) {
    ForwardOptions oi = o;
    oi.isa = isa;
    oi.chunk_size = 32;
    const ForwardResult fwd = chunk_gated_delta_rule_fwd(p.inputs(), oi);
    const BackwardResult bwd = chunk_gated_delta_rule_bwd(bin, oi);
    const std::string what = spec.name() + ", " + cpu_isa_name(isa);
    EXPECT_TRUE(test::within(fwd.o, ref_fwd.o, kF32Tolerance, "o, " + what));
    EXPECT_TRUE(
        test::within(fwd.final_state, ref_fwd.final_state, kF32Tolerance, "final_state, " + what));
    for (const auto& [name, got, want] :
         {std::tuple{"dq", &bwd.dq, &ref_bwd.dq}, std::tuple{"dk", &bwd.dk, &ref_bwd.dk},
          std::tuple{"dv", &bwd.dv, &ref_bwd.dv}, std::tuple{"dg", &bwd.dg, &ref_bwd.dg},
          std::tuple{"dbeta", &bwd.dbeta, &ref_bwd.dbeta},
          std::tuple{"d_initial_state", &bwd.d_initial_state, &ref_bwd.d_initial_state}}) {
      EXPECT_TRUE(test::within(*got, *want, kF32Tolerance, std::string(name) + ", " + what));
    }
  }
}

// Speculative decoding (vLLM / SGLang's MTP paths): over 1000 steps, a decode window of
// 1 + 3 tokens per sequence, of which a seeded random 1 to 4 are accepted, continued from the
// slot of the last accepted token (read_offsets), gives the outputs of the accepted tokens and
// the states after them bit for bit equal to plain one-token decodes of the accepted tokens
// alone: acceptance never degrades. Two sequences per step, each checked on its own (SGLang
// shipped a decode kernel that read sequence 0's beta for every sequence).
TEST(PeerBugSpeculative, AcceptedTokensOver1000StepsEqualPlainDecodesBitForBit) {
  constexpr std::int64_t kHk = 1, kHv = 2, kDk = 16, kDv = 16, kTaps = 4, kSpec = 3;
  constexpr std::int64_t kWindow = 1 + kSpec, kSeqs = 2, kSteps = 1000;
  constexpr std::int64_t kD = 2 * kHk * kDk + kHv * kDv;
  test::Random rng(71);
  auto filled = [&rng](std::initializer_list<std::int64_t> shape, double lo, double hi) {
    Tensor t(DType::f32, shape);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      t.data<float>()[i] = static_cast<float>(rng.uniform(lo, hi));
    }
    return t;
  };
  const Tensor conv_weight = filled({kD, kTaps}, -0.5, 0.5), conv_bias = filled({kD}, -0.1, 0.1);
  const Tensor A_log = filled({kHv}, -1.0, 1.0), dt_bias = filled({kHv}, -1.0, 1.0);
  // Speculative pools: sequence s owns slots 1 + 4 s .. 4 + 4 s. Plain pools: slot 1 + s.
  const std::int64_t spec_slots = 1 + kSeqs * kWindow, plain_slots = 1 + kSeqs;
  Tensor spec_conv = filled({spec_slots, kTaps - 1, kD}, -1.0, 1.0);
  Tensor spec_rec = filled({spec_slots, kHv, kDk, kDv}, -0.5, 0.5);
  Tensor plain_conv(DType::f32, {plain_slots, kTaps - 1, kD});
  Tensor plain_rec(DType::f32, {plain_slots, kHv, kDk, kDv});
  const std::int64_t conv_slot = (kTaps - 1) * kD, rec_slot = kHv * kDk * kDv;
  for (std::int64_t s = 0; s < kSeqs; ++s) {  // both start from the same history
    std::memcpy(plain_conv.data<float>() + (1 + s) * conv_slot,
                spec_conv.data<float>() + (1 + kWindow * s) * conv_slot, conv_slot * sizeof(float));
    std::memcpy(plain_rec.data<float>() + (1 + s) * rec_slot,
                spec_rec.data<float>() + (1 + kWindow * s) * rec_slot, rec_slot * sizeof(float));
  }
  StepOptions spec_options;
  spec_options.hk = kHk;
  spec_options.hv = kHv;
  spec_options.dk = kDk;
  spec_options.dv = kDv;
  spec_options.num_spec = kSpec;
  spec_options.threads = 1;
  StepOptions plain_options = spec_options;
  plain_options.num_spec = 0;
  std::int64_t length[kSeqs] = {10, 20}, offset[kSeqs] = {0, 0};
  for (std::int64_t step = 0; step < kSteps; ++step) {
    const Tensor qkv = filled({kSeqs * kWindow, kD}, -1.0, 1.0);
    const Tensor a = filled({kSeqs * kWindow, kHv}, -2.0, 2.0);
    const Tensor b = filled({kSeqs * kWindow, kHv}, -2.0, 2.0);
    std::int64_t qsl[kSeqs + 1] = {0, kWindow, 2 * kWindow}, slots[kSeqs] = {1, 1 + kWindow};
    std::int64_t lens[kSeqs] = {length[0] + kWindow, length[1] + kWindow};
    std::int64_t dist[3] = {kSeqs, kSeqs, kSeqs};
    StepInputs in{qkv.view(),
                  a.view(),
                  b.view(),
                  conv_weight.view(),
                  conv_bias.view(),
                  A_log.view(),
                  dt_bias.view(),
                  TensorView(qsl, {kSeqs + 1}),
                  TensorView(slots, {kSeqs}),
                  TensorView(lens, {kSeqs}),
                  TensorView(dist, {3}),
                  TensorView(offset, {kSeqs}),
                  {}};
    const Tensor spec_out =
        fused_gdn_step(in, {spec_conv.mutable_view(), spec_rec.mutable_view()}, spec_options);
    for (std::int64_t s = 0; s < kSeqs; ++s) {
      const auto accepted = static_cast<std::int64_t>(1 + rng.next() % kWindow);
      for (std::int64_t j = 0; j < accepted; ++j) {
        const std::int64_t row = s * kWindow + j;
        std::int64_t one_qsl[2] = {0, 1}, one_slot[1] = {1 + s}, one_len[1] = {length[s] + 1};
        std::int64_t one_dist[3] = {1, 1, 1}, zero[1] = {0};
        StepInputs one{TensorView(qkv.data<float>() + row * kD, {1, kD}),
                       TensorView(a.data<float>() + row * kHv, {1, kHv}),
                       TensorView(b.data<float>() + row * kHv, {1, kHv}),
                       conv_weight.view(),
                       conv_bias.view(),
                       A_log.view(),
                       dt_bias.view(),
                       TensorView(one_qsl, {2}),
                       TensorView(one_slot, {1}),
                       TensorView(one_len, {1}),
                       TensorView(one_dist, {3}),
                       TensorView(zero, {1}),
                       {}};
        const Tensor plain_out = fused_gdn_step(
            one, {plain_conv.mutable_view(), plain_rec.mutable_view()}, plain_options);
        ASSERT_EQ(0, std::memcmp(plain_out.data<float>(), spec_out.data<float>() + row * kHv * kDv,
                                 kHv * kDv * sizeof(float)))
            << "out of sequence " << s << ", window token " << j << ", step " << step;
        length[s] += 1;
      }
      const std::int64_t kept = slots[s] + accepted - 1;
      ASSERT_EQ(0, std::memcmp(plain_rec.data<float>() + (1 + s) * rec_slot,
                               spec_rec.data<float>() + kept * rec_slot, rec_slot * sizeof(float)))
          << "recurrent state of sequence " << s << " after " << accepted << " accepted, step "
          << step;
      ASSERT_EQ(0,
                std::memcmp(plain_conv.data<float>() + (1 + s) * conv_slot,
                            spec_conv.data<float>() + kept * conv_slot, conv_slot * sizeof(float)))
          << "conv state of sequence " << s << " after " << accepted << " accepted, step " << step;
      offset[s] = accepted - 1;  // the next window reads the last accepted token's slot
    }
  }
}

// B2 (fla #1077, #1096): more than 65535 sequences x value heads in one call (2050 x 32 =
// 65600). The CPU has no grid limit, but the partition over (sequence, head) items must still
// be right: the batch equals its two halves run apart, bit for bit (items are independent).
TEST(PeerBugB2, MoreThan65535SequenceHeadsEqualTwoHalves) {
  test::ProblemSpec spec;
  spec.lengths.assign(2050, 0);
  for (std::size_t s = 0; s < spec.lengths.size(); ++s) spec.lengths[s] = 1 + s % 3;
  spec.hk = 8;
  spec.hv = 32;
  spec.dk = 4;
  spec.dv = 4;
  spec.initial_state = true;
  spec.seed = 51;
  const test::Problem p = test::make_problem(spec);
  ForwardOptions o = p.options();
  o.chunk_size = 16;
  const ForwardResult whole = chunk_gated_delta_rule_fwd(p.inputs(), o);

  const std::int64_t* cu = p.cu_seqlens.data<std::int64_t>();
  const std::int64_t half = 1025;
  const std::int64_t split = cu[half];
  const std::int64_t t_total = cu[spec.lengths.size()];
  for (int part = 0; part < 2; ++part) {
    const std::int64_t s0 = part == 0 ? 0 : half;
    const std::int64_t s1 = part == 0 ? half : static_cast<std::int64_t>(spec.lengths.size());
    const std::int64_t t0 = cu[s0], t1 = part == 0 ? split : t_total;
    std::vector<std::int64_t> cu_part;
    for (std::int64_t s = s0; s <= s1; ++s) cu_part.push_back(cu[s] - t0);
    ForwardInputs in = p.inputs();
    const std::int64_t len = t1 - t0;
    in.q = TensorView(p.q.data<float>() + t0 * spec.hk * spec.dk, {len, spec.hk, spec.dk});
    in.k = TensorView(p.k.data<float>() + t0 * spec.hk * spec.dk, {len, spec.hk, spec.dk});
    in.v = TensorView(p.v.data<float>() + t0 * spec.hv * spec.dv, {len, spec.hv, spec.dv});
    in.g = TensorView(p.g.data<float>() + t0 * spec.hv, {len, spec.hv});
    in.beta = TensorView(p.beta.data<float>() + t0 * spec.hv, {len, spec.hv});
    const std::int64_t state = spec.hv * spec.dk * spec.dv;
    in.initial_state =
        TensorView(p.h0.data<float>() + s0 * state, {s1 - s0, spec.hv, spec.dk, spec.dv});
    in.cu_seqlens = TensorView(cu_part.data(), {static_cast<std::int64_t>(cu_part.size())});
    const ForwardResult r = chunk_gated_delta_rule_fwd(in, o);
    const std::int64_t o_elems = len * spec.hv * spec.dv;
    EXPECT_EQ(0, std::memcmp(r.o.data<float>(), whole.o.data<float>() + t0 * spec.hv * spec.dv,
                             static_cast<std::size_t>(o_elems) * sizeof(float)))
        << "o of half " << part;
    EXPECT_EQ(0,
              std::memcmp(r.final_state.data<float>(), whole.final_state.data<float>() + s0 * state,
                          static_cast<std::size_t>((s1 - s0) * state) * sizeof(float)))
        << "final states of half " << part;
  }
}

}  // namespace
}  // namespace gdn
