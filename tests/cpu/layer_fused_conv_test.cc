// layer_fused_conv_test.cc: the fused layer op's forward computes its conv1d + SiLU inside the
// gated delta rule's packing (ForwardProblem::conv, src/cpu/conv1d-inl.h: conv_head_rows)
// instead of writing a [T, D] xh and reading it back. Its results must be the bits of the two
// ops run one after the other: the conv op (gdn/conv.h) into a compute-dtype xh, the gates, the
// core op on column views of xh with a compute-dtype out, that out rounded once to the
// activation dtype. Packed sequences of every kind (empty, shorter than K - 1, shorter than a
// chunk: the token recurrence, several chunks with a short last one), f32, bf16, f16 and f64
// activations, K = 1 to 8, heads a whole number of vectors wide and not (Dk = 20, Dv = 12: a
// partial last vector on every variant), contiguous, row-padded and channel-strided qkv,
// with and without initial states and out, every ISA variant, 1 to 3 threads; and the float64
// reference as the judge.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>

#include "api/layer_parts.h"
#include "common/compare.h"
#include "common/isas.h"
#include "common/layer_problem.h"

namespace gdn {
namespace {

// t (f32) with every value rounded to `to` (the problem's values as 16-bit inputs).
Tensor rounded(const Tensor& t, DType to) {
  Tensor r(to, t.rank(), t.sizes());
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float x = t.data<float>()[i];
    static_cast<std::uint16_t*>(r.raw())[i] = to == DType::bf16 ? bf16_bits(x) : f16_bits(x);
  }
  return r;
}

Tensor copy_of(const Tensor& t) {
  Tensor r(t.dtype(), t.rank(), t.sizes());
  std::memcpy(r.raw(), t.raw(), t.bytes());
  return r;
}

// A tensor of any float dtype widened to the compute dtype (exact).
Tensor widened(const Tensor& t, DType compute) {
  if (t.dtype() == compute) return copy_of(t);
  Tensor r(compute, t.rank(), t.sizes());
  for (std::int64_t i = 0; i < t.numel(); ++i)
    r.data<float>()[i] = detail::element<float>(t.view(), i);
  return r;
}

// How qkv lies in memory: rows padded past D, or every other element of wider rows.
enum class Layout { padded_rows, strided_channels };

// Owns qkv's storage in a layout other than dense and gives its [T, D] view.
struct Qkv {
  Tensor storage;
  TensorView view;
};
Qkv laid_out(const Tensor& qkv, Layout layout) {
  const std::int64_t t = qkv.size(0), d = qkv.size(1);
  const auto size = static_cast<std::int64_t>(dtype_size(qkv.dtype()));
  const std::int64_t row = layout == Layout::padded_rows ? d + 24 : 2 * d;
  const std::int64_t step = layout == Layout::padded_rows ? 1 : 2;
  Qkv q{Tensor(qkv.dtype(), {t, row}), TensorView{}};
  auto* to = static_cast<char*>(q.storage.raw());
  const auto* from = static_cast<const char*>(qkv.raw());
  for (std::int64_t i = 0; i < t; ++i) {
    for (std::int64_t c = 0; c < d; ++c) {
      std::memcpy(to + (i * row + c * step) * size, from + (i * d + c) * size,
                  static_cast<std::size_t>(size));
    }
  }
  q.view = TensorView(q.storage.raw(), qkv.dtype(), 2, Dims{t, d, 0, 0}, Dims{row, step, 0, 0});
  return q;
}

test::LayerProblem problem(const test::LayerSpec& base, DType activations) {
  test::LayerSpec spec = base;
  spec.dtype = activations == DType::f64 ? DType::f64 : DType::f32;
  test::LayerProblem p = test::make_layer_problem(spec);
  if (activations == DType::bf16 || activations == DType::f16) {
    p.spec.dtype = activations;
    p.qkv = rounded(p.qkv, activations);
    p.a = rounded(p.a, activations);
    p.b = rounded(p.b, activations);
  }
  return p;
}

// The conv op, the gates and the core op one after the other, out rounded once: what the layer
// forward computed before its conv was fused (and what it must still give, bit for bit).
LayerForwardResult two_ops(const test::LayerProblem& p, const LayerOptions& o) {
  const DType c = p.spec.dtype == DType::f64 ? DType::f64 : DType::f32;
  const std::int64_t t = p.qkv.size(0), d = p.qkv.size(1), hv = o.hv, qk = o.hk * o.dk;
  const LayerInputs in = p.inputs();
  // The conv in the compute dtype: 16-bit qkv widened exactly, as the kernels widen it.
  const Tensor x = widened(p.qkv, c);
  ConvOptions co;
  co.isa = o.isa;
  co.threads = 1;
  ConvForwardResult conv =
      causal_conv1d_fwd({x.view(), in.conv_weight, in.conv_bias, in.conv_state, in.cu_seqlens}, co);
  Tensor g(c, {t, hv}), beta(c, {t, hv});
  if (c == DType::f64) {
    detail::layer_gates(in.a, in.b, in.A_log, in.dt_bias, t, hv, g.data<double>(),
                        beta.data<double>());
  } else {
    detail::layer_gates(in.a, in.b, in.A_log, in.dt_bias, t, hv, g.data<float>(),
                        beta.data<float>());
  }
  const auto size = static_cast<std::int64_t>(dtype_size(c));
  auto columns = [&](std::int64_t first, std::int64_t heads, std::int64_t dim) {
    return TensorView(static_cast<const char*>(conv.out.raw()) + first * size, c, 3,
                      Dims{t, heads, dim, 0}, Dims{d, dim, 1, 0});
  };
  ForwardOptions fo;
  fo.use_qk_l2norm = true;
  fo.chunk_size = o.chunk_size;
  fo.isa = o.isa;
  fo.threads = 1;
  const ForwardResult core = chunk_gated_delta_rule_fwd(
      {columns(0, o.hk, o.dk), columns(qk, o.hk, o.dk), columns(2 * qk, hv, o.dv), g.view(),
       beta.view(), in.recurrent_state, in.cu_seqlens},
      fo);
  LayerForwardResult r;
  r.out = Tensor(p.spec.dtype, {t, hv * o.dv});
  for (std::int64_t i = 0; i < r.out.numel(); ++i) {
    if (c == DType::f64) {
      r.out.data<double>()[i] = core.o.data<double>()[i];
    } else if (p.spec.dtype == DType::f32) {
      r.out.data<float>()[i] = core.o.data<float>()[i];
    } else {
      const float v = core.o.data<float>()[i];
      static_cast<std::uint16_t*>(r.out.raw())[i] =
          p.spec.dtype == DType::bf16 ? bf16_bits(v) : f16_bits(v);
    }
  }
  r.conv_state_out = std::move(conv.final_state);
  r.recurrent_state_out = copy_of(core.final_state);
  return r;
}

// Every kind of sequence: chunked with a short last chunk (300, 129 at chunk 16 and 32), empty,
// shorter than K - 1 (1, 2), shorter than a chunk (5, 9: the token recurrence), exactly a chunk.
test::LayerSpec spec(std::int64_t taps, std::int64_t dk, std::int64_t dv, bool states) {
  test::LayerSpec s;
  s.lengths = {300, 0, 5, 129, 1, 2, 32, 9};
  s.hk = 2;
  s.hv = 4;
  s.dk = dk;
  s.dv = dv;
  s.taps = taps;
  s.conv_state = states;
  s.recurrent_state = states;
  s.seed = 41 + static_cast<std::uint64_t>(taps);
  return s;
}

std::string describe(DType activations, const test::LayerSpec& s, CpuIsa isa, int chunk,
                     int threads) {
  return std::string(dtype_name(activations)) + ", K " + std::to_string(s.taps) + ", Dk " +
         std::to_string(s.dk) + " Dv " + std::to_string(s.dv) +
         (s.conv_state ? ", states" : ", no states") + ", " + cpu_isa_name(isa) + ", chunk " +
         std::to_string(chunk) + ", " + std::to_string(threads) + " threads";
}

void expect_bits_of_two_ops(const test::LayerProblem& p, const LayerOptions& o,
                            const TensorView& qkv, const std::string& what) {
  LayerInputs in = p.inputs();
  if (qkv.present()) in.qkv = qkv;
  const LayerForwardResult fused = fused_gdn_fwd(in, o);
  const LayerForwardResult expected = two_ops(p, o);
  EXPECT_TRUE(test::bit_identical(fused.out, expected.out, "out, " + what));
  EXPECT_TRUE(test::bit_identical(fused.conv_state_out, expected.conv_state_out,
                                  "conv_state_out, " + what));
  EXPECT_TRUE(test::bit_identical(fused.recurrent_state_out, expected.recurrent_state_out,
                                  "recurrent_state_out, " + what));
}

TEST(CpuLayerFusedConv, BitsOfTheConvOpThenTheCoreOpForEveryActivationDtype) {
  for (DType activations : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (const bool states : {true, false}) {
      const test::LayerSpec s = spec(4, 16, 8, states);
      const test::LayerProblem p = problem(s, activations);
      for (CpuIsa isa : test::runnable_isas()) {
        for (int chunk : {16, 32}) {
          for (int threads : {1, 3}) {
            LayerOptions o = p.options();
            o.isa = isa;
            o.chunk_size = chunk;
            o.threads = threads;
            expect_bits_of_two_ops(p, o, TensorView{},
                                   describe(activations, s, isa, chunk, threads));
          }
        }
      }
    }
  }
}

// Every tap count, and heads that are not a whole number of vectors (a last partial vector
// through staged weights) next to heads that are.
TEST(CpuLayerFusedConv, BitsOfTheTwoOpsForEveryTapCountAndPartialVectors) {
  for (std::int64_t taps = 1; taps <= 8; ++taps) {
    for (const auto& [dk, dv] : {std::pair<std::int64_t, std::int64_t>{20, 12}, {16, 32}}) {
      const test::LayerSpec s = spec(taps, dk, dv, true);
      for (DType activations : {DType::f32, DType::bf16}) {
        const test::LayerProblem p = problem(s, activations);
        for (CpuIsa isa : test::runnable_isas()) {
          LayerOptions o = p.options();
          o.isa = isa;
          o.chunk_size = 16;
          o.threads = 2;
          expect_bits_of_two_ops(p, o, TensorView{}, describe(activations, s, isa, 16, 2));
        }
      }
    }
  }
}

// qkv read through rows longer than D (read in place when Real) and through a channel stride
// (always staged), f32 and bf16.
TEST(CpuLayerFusedConv, BitsOfTheTwoOpsForPaddedRowsAndStridedChannels) {
  for (DType activations : {DType::f32, DType::bf16}) {
    for (const auto& [dk, dv] : {std::pair<std::int64_t, std::int64_t>{16, 8}, {20, 12}}) {
      const test::LayerSpec s = spec(4, dk, dv, true);
      const test::LayerProblem p = problem(s, activations);
      for (Layout layout : {Layout::padded_rows, Layout::strided_channels}) {
        const Qkv qkv = laid_out(p.qkv, layout);
        for (CpuIsa isa : test::runnable_isas()) {
          LayerOptions o = p.options();
          o.isa = isa;
          o.chunk_size = 16;
          o.threads = 2;
          const std::string what = describe(activations, s, isa, 16, 2) +
                                   (layout == Layout::padded_rows ? ", padded rows" : ", strided");
          expect_bits_of_two_ops(p, o, qkv.view, what);
        }
      }
    }
  }
}

// The states updated in place (outputs the views of the inputs, as a serving step passes them),
// a call without out (the states alone), and the float64 reference as the judge.
TEST(CpuLayerFusedConv, InPlaceStatesNoOutAndTheReference) {
  const test::LayerProblem p = problem(spec(4, 16, 8, true), DType::f32);
  LayerOptions o = p.options();
  o.chunk_size = 16;
  const LayerForwardResult one = fused_gdn_fwd(p.inputs(), o);
  Tensor conv = copy_of(p.conv_state), rec = copy_of(p.recurrent_state);
  Tensor out(DType::f32, one.out.rank(), one.out.sizes());
  LayerInputs in = p.inputs();
  in.conv_state = conv.view();
  in.recurrent_state = rec.view();
  fused_gdn_fwd(in, {out.mutable_view(), conv.mutable_view(), rec.mutable_view(), {}, {}}, o);
  EXPECT_TRUE(test::bit_identical(out, one.out, "out"));
  EXPECT_TRUE(test::bit_identical(conv, one.conv_state_out, "conv_state in place"));
  EXPECT_TRUE(test::bit_identical(rec, one.recurrent_state_out, "recurrent_state in place"));
  Tensor states_only(DType::f32, 4, one.recurrent_state_out.sizes());
  fused_gdn_fwd(p.inputs(), {{}, {}, states_only.mutable_view(), {}, {}}, o);
  EXPECT_TRUE(test::bit_identical(states_only, one.recurrent_state_out, "state without out"));
  const LayerForwardResult ref = ref::fused_gdn_fwd(p.inputs(), o);
  EXPECT_TRUE(test::within(out, ref.out, 1e-4, "out vs float64 reference"));
  EXPECT_TRUE(test::within(rec, ref.recurrent_state_out, 1e-4, "state vs float64 reference"));
}

}  // namespace
}  // namespace gdn
