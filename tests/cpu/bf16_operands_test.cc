// bf16_operands_test.cc: bf16 matrix operands (ForwardOptions::matmul_precision = bf16) on
// every compiled ISA variant: the forward, the backward and the layer op against the float64
// reference within the bf16-operand bound, the rounding of operands (not of the state),
// determinism across thread counts, and the option's validation (docs/numerics.md,
// "bf16 matrix operands"). Helpers shared with the 16-bit activation tests: precision_common.h.
#include <cstring>

#include "precision_common.h"

namespace gdn {
namespace {

using namespace precision_test;

// bf16 matrix operands (ForwardOptions::matmul_precision = bf16; docs/numerics.md "bf16
// matrix operands"). The same-precision baseline is the plain float32 recurrence on q, k, v
// rounded to bf16, against the float64 reference on the unrounded inputs: what rounding each
// operand to bf16 once costs. The chunked form rounds the inputs and, in each chunk, a few
// intermediates (S, T^-1, R, V_new, P; in the backward the cotangents too), each an error of
// the same kind, so its tolerance is kOperandFactor x the baseline's error + the float32
// tolerance. kOperandFactor is measured: the largest ratio of error to baseline error over the
// outputs, ISA variants and cases below (operand_cases) was 1.9 (forward) and 2.4 (backward),
// 1.4 and 2.2 at Dk = Dv = 128, C = 64, and 3.7 in the layer test (whose baseline is the
// reference's output rounded to bf16); 6 leaves room and still fails a path whose error is
// several times that of rounding its operands once.
constexpr double kOperandFactor = 6.0;

ProblemSpec operand_spec(std::uint64_t seed) {
  ProblemSpec spec = mixed_spec();
  spec.seed = seed;
  return spec;
}

// The bound's cases: three seeds of the mixed-length problem at C = 16, and Qwen3-Next's head
// dims (Dk = Dv = 128) at C = 64, where every product sums over 64 or 128 terms.
struct OperandCase {
  ProblemSpec spec;
  int chunk_size;
  std::string name;
};
std::vector<OperandCase> operand_cases() {
  std::vector<OperandCase> cases;
  for (std::uint64_t seed : {1, 2, 3}) {
    cases.push_back({operand_spec(seed), 16, "mixed lengths, seed " + std::to_string(seed)});
  }
  ProblemSpec wide = mixed_spec();
  wide.lengths = {300, 77};
  wide.hk = 1;
  wide.hv = 2;
  wide.dk = wide.dv = 128;
  cases.push_back({wide, 64, "Dk = Dv = 128, C = 64"});
  // Head dims that are not whole vectors (nor even, for Dk: an odd k in the products over
  // Dk), short last chunks, C = 32 and 64: the pair packing's odd-k and remainder paths.
  ProblemSpec odd = mixed_spec();
  odd.lengths = {95, 1, 33};
  odd.dk = 21;
  odd.dv = 36;
  odd.seed = 7;
  cases.push_back({odd, 32, "Dk = 21, Dv = 36, C = 32"});
  odd.lengths = {150, 3, 64};
  odd.dk = 72;
  odd.dv = 41;
  odd.seed = 8;
  cases.push_back({odd, 64, "Dk = 72, Dv = 41, C = 64"});
  return cases;
}

// The inputs of `spec` with q, k, v rounded to bf16 (float32 tensors): the baseline's inputs.
Problem rounded_inputs(const ProblemSpec& spec) { return make_pair(spec, DType::bf16).wide; }

TEST(Bf16Operands, ForwardWithinBoundOfReference) {
  for (const OperandCase& oc : operand_cases()) {
    const ProblemSpec& spec = oc.spec;
    const Problem p = make_problem(spec);
    const ForwardOptions base = p.options();
    const ForwardResult ref = ref::recurrent_fwd(p.inputs(), base);
    const ForwardResult baseline = test::baseline_f32(rounded_inputs(spec), base);
    const ForwardResult plain = test::baseline_f32(p, base);
    const double o_tol = kOperandFactor * test::compare(baseline.o, ref.o).normalized() +
                         f32_tolerance(test::compare(plain.o, ref.o).normalized());
    const double state_tol =
        kOperandFactor * test::compare(baseline.final_state, ref.final_state).normalized() +
        f32_tolerance(test::compare(plain.final_state, ref.final_state).normalized());
    for (CpuIsa isa : compiled_isas()) {
      ForwardOptions o = base;
      o.isa = isa;
      o.algorithm = Algorithm::chunked;
      o.chunk_size = oc.chunk_size;
      const ForwardResult exact_ops = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
      o.matmul_precision = MatmulPrecision::bf16;
      const std::string what = std::string(cpu_isa_name(isa)) + ", " + oc.name;
      const ForwardResult r = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
      EXPECT_TRUE(test::within(r.o, ref.o, o_tol, "o, " + what));
      EXPECT_TRUE(test::within(r.final_state, ref.final_state, state_tol, "final_state, " + what));
      // The rounding is applied: bf16 operands cost accuracy against float32 ones.
      EXPECT_GT(test::compare(r.o, ref.o).normalized(),
                4 * test::compare(exact_ops.o, ref.o).normalized())
          << what;
    }
  }
}

TEST(Bf16Operands, BackwardWithinBoundOfReference) {
  const char* const names[6] = {"dq", "dk", "dv", "dg", "dbeta", "d_initial_state"};
  auto grads = [](const BackwardResult& r) {
    return std::vector<const Tensor*>{&r.dq, &r.dk, &r.dv, &r.dg, &r.dbeta, &r.d_initial_state};
  };
  std::uint64_t seed = 20;
  for (const OperandCase& oc : operand_cases()) {
    const ProblemSpec& spec = oc.spec;
    const Problem p = make_problem(spec), rounded = rounded_inputs(spec);
    const test::Cotangents c = test::make_cotangents(p, ++seed);
    const ForwardOptions base = p.options();
    const BackwardResult ref = ref::recurrent_bwd(backward_inputs(p, c.d_o, c.d_ht), base);
    // The baseline rounds d_o too: the backward's products take it as an operand.
    Tensor d_o_rounded = widen(to_half(c.d_o, DType::bf16));
    const BackwardResult baseline = test::baseline_f32_bwd(rounded, d_o_rounded, c.d_ht, base);
    const BackwardResult plain = test::baseline_f32_bwd(p, c.d_o, c.d_ht, base);
    for (CpuIsa isa : compiled_isas()) {
      ForwardOptions o = base;
      o.isa = isa;
      o.chunk_size = oc.chunk_size;
      const BackwardResult exact_ops =
          chunk_gated_delta_rule_bwd(backward_inputs(p, c.d_o, c.d_ht), o);
      o.matmul_precision = MatmulPrecision::bf16;
      const std::string what = std::string(cpu_isa_name(isa)) + ", " + oc.name;
      const ForwardResult fwd = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
      BackwardInputs in = backward_inputs(p, c.d_o, c.d_ht);
      in.chunk_states = fwd.chunk_states.view();
      in.t_inv = fwd.t_inv.view();
      const BackwardResult r = chunk_gated_delta_rule_bwd(in, o);
      // Without residuals the rebuild runs the same bf16-operand forward: the same gradients.
      const BackwardResult rebuilt =
          chunk_gated_delta_rule_bwd(backward_inputs(p, c.d_o, c.d_ht), o);
      for (int i = 0; i < 6; ++i) {
        const Tensor& want = *grads(ref)[i];
        const double tol = kOperandFactor * test::compare(*grads(baseline)[i], want).normalized() +
                           f32_tolerance(test::compare(*grads(plain)[i], want).normalized());
        EXPECT_TRUE(test::within(*grads(r)[i], want, tol, std::string(names[i]) + ", " + what));
        // The rounding is applied: bf16 operands cost accuracy against float32 ones.
        EXPECT_GT(test::compare(*grads(r)[i], want).normalized(),
                  4 * test::compare(*grads(exact_ops)[i], want).normalized())
            << names[i] << ", " << what;
        EXPECT_TRUE(test::bit_identical(*grads(rebuilt)[i], *grads(r)[i],
                                        std::string(names[i]) + " rebuilt vs residuals, " + what));
      }
    }
  }
}

// An exact case: one token with k = 0 and g = 0 leaves the state unchanged (S_1 = S_0) and
// makes o = scale S_0^T q. With S_0 = (1 + 2^-10) I, not a bf16 value, bf16 operands read S_0
// as I (the nearest bf16 is 1): o = scale q exactly, while the final state, never an operand
// of its own update's rounding, stays S_0 bit for bit. Float32 operands give scale (1 +
// 2^-10) q.
TEST(Bf16Operands, OperandsAreRoundedAndTheStateIsNot) {
  ProblemSpec spec;
  spec.lengths = {1};
  spec.hk = spec.hv = 1;
  spec.dk = spec.dv = 16;
  spec.initial_state = true;
  Problem p = make_problem(spec);
  const float s0 = 1.0f + 0x1p-10f;
  for (std::int64_t i = 0; i < 16; ++i) {
    p.q.data<float>()[i] = static_cast<float>(i - 8);  // bf16 values
    p.k.data<float>()[i] = 0;
    p.v.data<float>()[i] = static_cast<float>(i);
    for (std::int64_t j = 0; j < 16; ++j) p.h0.data<float>()[i * 16 + j] = i == j ? s0 : 0.0f;
  }
  p.g.data<float>()[0] = 0;
  for (CpuIsa isa : compiled_isas()) {
    ForwardOptions o = p.options();
    o.isa = isa;
    o.algorithm = Algorithm::chunked;
    o.scale = 0.25;
    o.matmul_precision = MatmulPrecision::bf16;
    const ForwardResult r = chunk_gated_delta_rule_fwd(p.inputs(), o);
    o.matmul_precision = MatmulPrecision::compute;
    const ForwardResult f = chunk_gated_delta_rule_fwd(p.inputs(), o);
    for (std::int64_t i = 0; i < 16; ++i) {
      const float q = p.q.data<float>()[i];
      EXPECT_EQ(r.o.data<float>()[i], 0.25f * q) << cpu_isa_name(isa) << " o[" << i << "]";
      EXPECT_EQ(f.o.data<float>()[i], 0.25f * q * s0) << cpu_isa_name(isa) << " o[" << i << "]";
    }
    EXPECT_TRUE(test::bit_identical(r.final_state, p.h0, cpu_isa_name(isa)));
  }
}

TEST(Bf16Operands, BitIdenticalForAnyThreadCount) {
  const Problem p = make_problem(operand_spec(4));
  const test::Cotangents c = test::make_cotangents(p, 30);
  for (CpuIsa isa : compiled_isas()) {
    for (int chunk : {16, 32, 64}) {
      ForwardOptions o = p.options();
      o.isa = isa;
      o.chunk_size = chunk;
      o.matmul_precision = MatmulPrecision::bf16;
      o.threads = 1;
      const ForwardResult f1 = chunk_gated_delta_rule_fwd(p.inputs(), o);
      const BackwardResult b1 = chunk_gated_delta_rule_bwd(backward_inputs(p, c.d_o, c.d_ht), o);
      for (int threads : {2, 3}) {
        o.threads = threads;
        const std::string what = std::string(cpu_isa_name(isa)) + ", C = " + std::to_string(chunk) +
                                 ", " + std::to_string(threads) + " threads";
        const ForwardResult f = chunk_gated_delta_rule_fwd(p.inputs(), o);
        EXPECT_TRUE(test::bit_identical(f.o, f1.o, "o, " + what));
        EXPECT_TRUE(test::bit_identical(f.final_state, f1.final_state, "final_state, " + what));
        const BackwardResult b = chunk_gated_delta_rule_bwd(backward_inputs(p, c.d_o, c.d_ht), o);
        EXPECT_TRUE(test::bit_identical(b.dq, b1.dq, "dq, " + what));
        EXPECT_TRUE(test::bit_identical(b.dk, b1.dk, "dk, " + what));
        EXPECT_TRUE(test::bit_identical(b.dv, b1.dv, "dv, " + what));
        EXPECT_TRUE(test::bit_identical(b.dg, b1.dg, "dg, " + what));
      }
    }
  }
}

TEST(Bf16Operands, ValidationNamesTheOption) {
  auto argument = [](auto&& fn) {
    try {
      fn();
    } catch (const InvalidArgument& e) {
      return std::string(e.argument()) + ": " + e.what();
    }
    return std::string("no error");
  };
  ProblemSpec spec = mixed_spec();
  spec.dtype = DType::f64;
  const Problem p64 = make_problem(spec);
  ForwardOptions o = p64.options();
  o.matmul_precision = MatmulPrecision::bf16;
  const std::string f64_error = argument([&] { chunk_gated_delta_rule_fwd(p64.inputs(), o); });
  EXPECT_EQ(f64_error.rfind("options.matmul_precision", 0), 0u) << f64_error;
  EXPECT_NE(f64_error.find("float32"), std::string::npos) << f64_error;

  const Problem p = make_problem(mixed_spec());
  o = p.options();
  o.matmul_precision = MatmulPrecision::bf16;
  o.algorithm = Algorithm::recurrent;
  const std::string rec_error = argument([&] { chunk_gated_delta_rule_fwd(p.inputs(), o); });
  EXPECT_EQ(rec_error.rfind("options.matmul_precision", 0), 0u) << rec_error;
  EXPECT_NE(rec_error.find("recurrent"), std::string::npos) << rec_error;

  o = p.options();
  o.matmul_precision = static_cast<MatmulPrecision>(7);
  const std::string bad = argument([&] { chunk_gated_delta_rule_fwd(p.inputs(), o); });
  EXPECT_EQ(bad.rfind("options.matmul_precision", 0), 0u) << bad;
}

// Under Algorithm::automatic a sequence shorter than the chunk size runs chunked with bf16
// operands whether or not residuals are kept: the output is the same function either way, the
// one the backward differentiates.
TEST(Bf16Operands, ShortSequencesRunChunkedUnderAutomatic) {
  ProblemSpec spec = mixed_spec();
  spec.lengths = {40, 7, 0, 1};
  const Problem p = make_problem(spec);
  for (CpuIsa isa : compiled_isas()) {
    ForwardOptions o = p.options();
    o.isa = isa;
    o.chunk_size = 64;
    o.matmul_precision = MatmulPrecision::bf16;
    const ForwardResult plain = chunk_gated_delta_rule_fwd(p.inputs(), o);
    const ForwardResult kept = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
    o.algorithm = Algorithm::chunked;
    const ForwardResult chunked = chunk_gated_delta_rule_fwd(p.inputs(), o);
    EXPECT_TRUE(test::bit_identical(plain.o, kept.o, std::string("o, ") + cpu_isa_name(isa)));
    EXPECT_TRUE(test::bit_identical(plain.o, chunked.o, std::string("o, ") + cpu_isa_name(isa)));
    EXPECT_TRUE(test::bit_identical(plain.final_state, chunked.final_state,
                                    std::string("final_state, ") + cpu_isa_name(isa)));
  }
}

// The layer op validates the option before it runs anything: float64 inputs and values out
// of range are errors naming options.matmul_precision.
TEST(Bf16Operands, LayerValidatesTheOption) {
  test::LayerSpec spec = mixed_layer_spec();
  spec.dtype = DType::f64;
  const test::LayerProblem p64 = test::make_layer_problem(spec);
  LayerOptions o = p64.options();
  o.matmul_precision = MatmulPrecision::bf16;
  try {
    fused_gdn_fwd(p64.inputs(), o);
    ADD_FAILURE() << "bf16 operands accepted for float64 inputs";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "options.matmul_precision") << e.what();
  }
  const test::LayerProblem p = test::make_layer_problem(mixed_layer_spec());
  o = p.options();
  o.matmul_precision = static_cast<MatmulPrecision>(5);
  try {
    fused_gdn_bwd(layer_backward_inputs(p), o);
    ADD_FAILURE() << "matmul_precision 5 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "options.matmul_precision") << e.what();
  }
  // The float64 reference ignores the option (every product is float64).
  o = p64.options();
  o.matmul_precision = MatmulPrecision::bf16;
  EXPECT_NO_THROW(ref::fused_gdn_fwd(p64.inputs(), o));
}

// The layer op end to end with bf16 operands, float32 and bf16 activations: the A_log and
// dt_bias gradients keep a cosine of at least 0.999 with the float64 reference on the
// unrounded inputs (the bound for bf16 operands), and every output stays within
// kOperandFactor x the error of the reference's own result rounded to bf16 + the layer's
// float32 tolerance.
TEST(Bf16Operands, LayerParameterGradientsKeepTheirDirection) {
  const test::LayerSpec spec = mixed_layer_spec();
  const test::LayerProblem original = test::make_layer_problem(spec);
  const LayerOptions base = original.options();
  const LayerRun exact{ref::fused_gdn_fwd(original.inputs(), base),
                       ref::fused_gdn_bwd(layer_backward_inputs(original), base)};
  for (DType dtype : {DType::f32, DType::bf16}) {
    test::LayerProblem run = test::make_layer_problem(spec);
    if (dtype == DType::bf16) {
      for (Tensor test::LayerProblem::*x : {&test::LayerProblem::qkv, &test::LayerProblem::a,
                                            &test::LayerProblem::b, &test::LayerProblem::d_out}) {
        run.*x = to_half(original.*x, dtype);
      }
    }
    for (CpuIsa isa : compiled_isas()) {
      LayerOptions o = base;
      o.isa = isa;
      o.matmul_precision = MatmulPrecision::bf16;
      const std::string what =
          std::string(dtype_name(dtype)) + " activations, " + cpu_isa_name(isa);
      const LayerRun got{fused_gdn_fwd(run.inputs(), o),
                         fused_gdn_bwd(layer_backward_inputs(run), o)};
      const auto g = layer_outputs(got), r = layer_outputs(exact);
      for (std::size_t i = 0; i < g.size(); ++i) {
        const auto& [name, x, activation] = g[i];
        const Tensor& want = *std::get<1>(r[i]);
        const double tolerance =
            kLayerF32Tolerance +
            kOperandFactor * test::compare(to_half(to_f32(want), DType::bf16), want).normalized();
        EXPECT_TRUE(test::within(*x, want, tolerance, std::string(name) + ", " + what));
      }
      EXPECT_GE(cosine(got.bwd.d_A_log, exact.bwd.d_A_log), kMinParameterCosine) << what;
      EXPECT_GE(cosine(got.bwd.d_dt_bias, exact.bwd.d_dt_bias), kMinParameterCosine) << what;
    }
  }
}

}  // namespace
}  // namespace gdn
