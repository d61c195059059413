// layer_windows_test.cc: the fused layer op's forward in windows of tokens (src/cpu/layer.h:
// kLayerWindowBytes; src/api/layer.cc: forward_windows). A long input runs window by window
// through one reused xh, a sequence longer than a window in pieces carrying its conv inputs and
// its float32 state across: the results must be the bits of one call over every token, for
// packed sequences of every length against every window (whole sequences grouped, sequences
// split at chunk boundaries, short last pieces), float32 and bf16 activations, K = 1, 2 and 4,
// in-place states, every ISA variant; and a serving step's prefills through it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/compare.h"
#include "common/isas.h"
#include "common/layer_problem.h"
#include "cpu/layer.h"
#include "step_harness.h"

namespace gdn {
namespace {

// Windows smaller than every long sequence here, and one larger than the whole input.
constexpr std::int64_t kWindows[] = {8, 16, 48, 100};
constexpr std::int64_t kOneWindow = std::int64_t{1} << 40;

// t (f32) with every value rounded to 16 bits (the problem's f32 values, as bf16 or f16 inputs).
Tensor rounded(const Tensor& t, DType to) {
  Tensor r(to, t.rank(), t.sizes());
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float x = t.data<float>()[i];
    static_cast<std::uint16_t*>(r.raw())[i] = to == DType::bf16 ? bf16_bits(x) : f16_bits(x);
  }
  return r;
}

test::LayerProblem problem(std::int64_t taps, DType activations) {
  test::LayerSpec spec;
  // Split into pieces (300, 129, 64), grouped whole (0, 5, 1, 40), a last piece of one token
  // at window 16 and chunk 16 (129).
  spec.lengths = {300, 0, 5, 129, 40, 1, 64};
  spec.hk = 2;
  spec.hv = 4;
  spec.dk = 16;
  spec.dv = 8;
  spec.taps = taps;
  spec.conv_state = true;
  spec.recurrent_state = true;
  test::LayerProblem p = test::make_layer_problem(spec);
  if (activations != DType::f32) {
    p.spec.dtype = activations;
    p.qkv = rounded(p.qkv, activations);
    p.a = rounded(p.a, activations);
    p.b = rounded(p.b, activations);
  }
  return p;
}

LayerForwardResult forward(const test::LayerProblem& p, const LayerOptions& o,
                           std::int64_t window) {
  const cpu::ScopedLayerWindow scope(window);
  return fused_gdn_fwd(p.inputs(), o);
}

TEST(CpuLayerWindows, BitsOfOneCallForEveryWindow) {
  for (DType activations : {DType::f32, DType::bf16}) {
    for (std::int64_t taps : {4, 2, 1}) {
      const test::LayerProblem p = problem(taps, activations);
      for (CpuIsa isa : test::runnable_isas()) {
        for (int chunk : {16, 32}) {
          LayerOptions o = p.options();
          o.isa = isa;
          o.chunk_size = chunk;
          o.threads = 2;
          const LayerForwardResult one = forward(p, o, kOneWindow);
          for (std::int64_t window : kWindows) {
            const LayerForwardResult w = forward(p, o, window);
            const std::string what = std::string(dtype_name(activations)) + ", K " +
                                     std::to_string(taps) + ", " + cpu_isa_name(isa) + ", chunk " +
                                     std::to_string(chunk) + ", window " + std::to_string(window);
            EXPECT_TRUE(test::bit_identical(w.out, one.out, "out, " + what));
            EXPECT_TRUE(test::bit_identical(w.conv_state_out, one.conv_state_out,
                                            "conv_state_out, " + what));
            EXPECT_TRUE(test::bit_identical(w.recurrent_state_out, one.recurrent_state_out,
                                            "recurrent_state_out, " + what));
          }
        }
      }
    }
  }
}

// The states updated in place (the outputs the views of the inputs, as a serving step passes
// them), and the float64 reference as the judge of the windowed result.
TEST(CpuLayerWindows, InPlaceStatesAndTheReference) {
  const test::LayerProblem p = problem(4, DType::f32);
  LayerOptions o = p.options();
  o.chunk_size = 16;
  const LayerForwardResult one = forward(p, o, kOneWindow);
  Tensor conv = step_test::clone(p.conv_state), rec = step_test::clone(p.recurrent_state);
  Tensor out(DType::f32, one.out.rank(), one.out.sizes());
  LayerInputs in = p.inputs();
  in.conv_state = conv.view();
  in.recurrent_state = rec.view();
  {
    const cpu::ScopedLayerWindow scope(16);
    fused_gdn_fwd(in, {out.mutable_view(), conv.mutable_view(), rec.mutable_view(), {}, {}}, o);
  }
  EXPECT_TRUE(test::bit_identical(out, one.out, "out"));
  EXPECT_TRUE(test::bit_identical(conv, one.conv_state_out, "conv_state in place"));
  EXPECT_TRUE(test::bit_identical(rec, one.recurrent_state_out, "recurrent_state in place"));
  const LayerForwardResult ref = ref::fused_gdn_fwd(p.inputs(), o);
  EXPECT_TRUE(test::within(out, ref.out, 1e-4, "out vs float64 reference"));
  EXPECT_TRUE(test::within(rec, ref.recurrent_state_out, 1e-4, "state vs float64 reference"));
}

// A step's prefills (fresh and continued, bf16 activations, float32 and bf16 pools) give the
// same bytes in windows as in one.
TEST(CpuLayerWindows, StepPrefillsBitsOfOneCall) {
  step_test::StepSpec spec;
  spec.num_slots = 6;
  spec.decodes = {{1, 1, 7}};
  spec.prefills = {{150, 2, 0}, {9, 3, 0}};
  spec.continued = {{70, 4, 33}};
  for (const bool bf16_pools : {false, true}) {
    spec.bf16_conv_pool = spec.bf16_rec_pool = bf16_pools;
    step_test::StepProblem p = step_test::make_step_problem(spec);
    p.spec.dtype = DType::bf16;
    p.qkv = rounded(p.qkv, DType::bf16);
    p.a = rounded(p.a, DType::bf16);
    p.b = rounded(p.b, DType::bf16);
    StepOptions o = p.options();
    o.chunk_size = 16;
    step_test::StepResult one, windowed;
    {
      const cpu::ScopedLayerWindow scope(kOneWindow);
      one = step_test::run_step(p, o);
    }
    {
      const cpu::ScopedLayerWindow scope(16);
      windowed = step_test::run_step(p, o);
    }
    const std::string what = bf16_pools ? "bf16 pools" : "f32 pools";
    EXPECT_TRUE(test::bit_identical(windowed.out, one.out, "out, " + what));
    EXPECT_TRUE(test::bit_identical(windowed.conv_pool, one.conv_pool, "conv pool, " + what));
    EXPECT_TRUE(test::bit_identical(windowed.rec_pool, one.rec_pool, "rec pool, " + what));
  }
}

}  // namespace
}  // namespace gdn
