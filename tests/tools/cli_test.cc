// cli_test.cc: the gdn tool as a user runs it: .npy files in, .npy files out, clear errors,
// usage and --help (the plan and bench commands: cli_bench_test.cc).
#include <cstring>
#include <fstream>
#include <iterator>

#include "cli_fixture.h"

namespace gdn {
namespace {

using cli_test::Cli;
using cli_test::gdn_cli;
using cli_test::Result;
namespace fs = std::filesystem;

TEST_F(Cli, ForwardRoundTripEqualsLibrary) {
  const test::Problem p = write_inputs();
  const Result run =
      gdn_cli("forward " + io() + " --l2norm --residuals --chunk-size 32 --threads 2");
  ASSERT_EQ(run.code, 0) << run.output;
  ForwardOptions options = p.options();
  options.chunk_size = 32;
  const ForwardResult expected = chunk_gated_delta_rule_fwd(p.inputs(), options, Residuals::all);
  EXPECT_TRUE(test::bit_identical(npy::load(path("out/o.npy")), expected.o, "o.npy"));
  EXPECT_TRUE(test::bit_identical(npy::load(path("out/ht.npy")), expected.final_state, "ht.npy"));
  EXPECT_TRUE(test::bit_identical(npy::load(path("out/chunk_states.npy")), expected.chunk_states,
                                  "chunk_states.npy"));
  EXPECT_TRUE(test::bit_identical(npy::load(path("out/t_inv.npy")), expected.t_inv, "t_inv.npy"));
}

TEST_F(Cli, ReferenceWritesFloat64) {
  const test::Problem p = write_inputs();
  const Result run = gdn_cli("forward " + io() + " --l2norm --reference --scale 0.5");
  ASSERT_EQ(run.code, 0) << run.output;
  ForwardOptions options = p.options();
  options.scale = 0.5;
  const ForwardResult expected = ref::recurrent_fwd(p.inputs(), options);
  const Tensor o = npy::load(path("out/o.npy"));
  EXPECT_EQ(o.dtype(), DType::f64);
  EXPECT_TRUE(test::bit_identical(o, expected.o, "o.npy"));
  EXPECT_TRUE(test::bit_identical(npy::load(path("out/ht.npy")), expected.final_state, "ht.npy"));
}

TEST_F(Cli, Float64InputsGiveFloat64Outputs) {
  write_inputs(DType::f64);
  const Result run = gdn_cli("forward " + io() + " --quiet");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_TRUE(run.output.empty()) << run.output;
  EXPECT_EQ(npy::load(path("out/o.npy")).dtype(), DType::f64);
}

TEST_F(Cli, MalformedInputsAreClearErrors) {
  write_inputs();
  // Truncated q.npy.
  {
    std::string bytes;
    {
      std::ifstream in(path("in/q.npy"), std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    std::ofstream(path("in/q.npy"), std::ios::binary | std::ios::trunc).write(bytes.data(), 300);
    const Result run = gdn_cli("forward " + io());
    EXPECT_EQ(run.code, 1) << run.output;
    EXPECT_NE(run.output.find("q.npy: truncated"), std::string::npos) << run.output;
  }
  write_inputs();
  // k with the wrong head dim: named by its file.
  {
    npy::save(path("in/k.npy"), Tensor(DType::f32, {103, 2, 15}));
    const Result run = gdn_cli("forward " + io());
    EXPECT_EQ(run.code, 1) << run.output;
    EXPECT_NE(run.output.find("k.npy"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("expected shape"), std::string::npos) << run.output;
  }
  write_inputs();
  // g in float64 while q is float32.
  {
    npy::save(path("in/g.npy"), Tensor(DType::f64, {103, 4}));
    const Result run = gdn_cli("forward " + io());
    EXPECT_EQ(run.code, 1) << run.output;
    EXPECT_NE(run.output.find("g.npy (g)': expected dtype f32"), std::string::npos) << run.output;
  }
  write_inputs();
  // Not a .npy file at all, and a missing one.
  {
    std::ofstream(path("in/beta.npy")) << "beta,0.5\n";
    const Result run = gdn_cli("forward " + io());
    EXPECT_EQ(run.code, 1) << run.output;
    EXPECT_NE(run.output.find("beta.npy: not a .npy file"), std::string::npos) << run.output;
    fs::remove(path("in/beta.npy"));
    const Result missing = gdn_cli("forward " + io());
    EXPECT_EQ(missing.code, 1) << missing.output;
    EXPECT_NE(missing.output.find("beta.npy: cannot open"), std::string::npos) << missing.output;
  }
  EXPECT_FALSE(fs::exists(path("out/o.npy"))) << "outputs written despite bad inputs";
}

// The backward on .npy files equals the library call, from every residual source: files
// written by `gdn forward --residuals`, a forward run inside the command (each policy), and
// the float64 reference.
TEST_F(Cli, BackwardRoundTripEqualsLibrary) {
  const test::Problem p = write_inputs();
  const test::Cotangents c = test::make_cotangents(p, 31);
  npy::save(path("in/do.npy"), c.d_o);
  npy::save(path("in/dht.npy"), c.d_ht);
  ForwardOptions options = p.options();
  options.chunk_size = 32;
  const BackwardInputs in{
      p.q.view(),  p.k.view(),          p.v.view(),   p.g.view(),    p.beta.view(),
      p.h0.view(), p.cu_seqlens.view(), c.d_o.view(), c.d_ht.view(), {},
      {}};
  const BackwardResult expected = chunk_gated_delta_rule_bwd(in, options);
  const char* names[] = {"dq", "dk", "dv", "dg", "dbeta", "dh0"};
  const Tensor* tensors[] = {&expected.dq, &expected.dk,    &expected.dv,
                             &expected.dg, &expected.dbeta, &expected.d_initial_state};
  auto expect_outputs = [&](const std::string& dir, const std::string& what) {
    for (int i = 0; i < 6; ++i) {
      EXPECT_TRUE(test::bit_identical(npy::load(path(dir + "/" + names[i] + ".npy")), *tensors[i],
                                      std::string(names[i]) + ".npy, " + what));
    }
  };
  for (const char* policy : {"all", "t_inv", "none"}) {
    const Result run = gdn_cli(std::string("backward ") + io(policy) +
                               " --l2norm --chunk-size 32 --policy " + policy);
    ASSERT_EQ(run.code, 0) << run.output;
    expect_outputs(policy, std::string("policy ") + policy);
  }
  // Residual files from the forward command are picked up.
  ASSERT_EQ(gdn_cli("forward --in '" + path("in") + "' --out '" + path("in") +
                    "' --l2norm --chunk-size 32 --residuals --quiet")
                .code,
            0);
  const Result files = gdn_cli("backward " + io("files") + " --l2norm --chunk-size 32");
  ASSERT_EQ(files.code, 0) << files.output;
  EXPECT_NE(files.output.find("chunk_states.npy and t_inv.npy from"), std::string::npos)
      << files.output;
  expect_outputs("files", "residual files");
  // The reference.
  const Result ref_run = gdn_cli("backward " + io("ref") + " --l2norm --chunk-size 32 --reference");
  ASSERT_EQ(ref_run.code, 0) << ref_run.output;
  const BackwardResult ref_expected = ref::recurrent_bwd(in, options);
  EXPECT_TRUE(
      test::bit_identical(npy::load(path("ref/dq.npy")), ref_expected.dq, "reference dq.npy"));
  EXPECT_TRUE(test::bit_identical(npy::load(path("ref/dh0.npy")), ref_expected.d_initial_state,
                                  "reference dh0.npy"));
  // Errors: a missing cotangent, residuals of another chunk size.
  std::filesystem::remove(path("in/do.npy"));
  const Result missing = gdn_cli("backward " + io("x") + " --l2norm --chunk-size 32");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.output.find("do.npy: cannot open"), std::string::npos) << missing.output;
  npy::save(path("in/do.npy"), c.d_o);
  // --chunk-size 0: the tiling plan's chunk size, for the residual files and the backward.
  ASSERT_EQ(gdn_cli("forward --in '" + path("in") + "' --out '" + path("in") +
                    "' --l2norm --chunk-size 0 --residuals --quiet")
                .code,
            0);
  const Result planned = gdn_cli("backward " + io("planned") + " --l2norm --chunk-size 0");
  ASSERT_EQ(planned.code, 0) << planned.output;
  EXPECT_NE(planned.output.find("chunk_states.npy and t_inv.npy from"), std::string::npos)
      << planned.output;
  EXPECT_TRUE(test::within(npy::load(path("planned/dq.npy")), expected.dq, 1e-4,
                           "dq.npy at the planned chunk size"));
  const Result mismatch = gdn_cli("backward " + io("x") + " --l2norm --chunk-size 16");
  EXPECT_EQ(mismatch.code, 1);
  EXPECT_NE(mismatch.output.find("chunk_states.npy (chunk_states)': expected shape"),
            std::string::npos)
      << mismatch.output;
}

TEST_F(Cli, LayerForwardRoundTripEqualsLibrary) {
  const test::LayerProblem p = write_layer_inputs();
  const Result run = gdn_cli("layer-forward " + io() + kHeads + " --residuals --threads 2");
  ASSERT_EQ(run.code, 0) << run.output;
  const LayerForwardResult expected = fused_gdn_fwd(p.inputs(), p.options(), Residuals::all);
  EXPECT_TRUE(test::bit_identical(npy::load(path("out/out.npy")), expected.out, "out.npy"));
  EXPECT_TRUE(test::bit_identical(npy::load(path("out/conv_state_out.npy")),
                                  expected.conv_state_out, "conv_state_out.npy"));
  EXPECT_TRUE(test::bit_identical(npy::load(path("out/recurrent_state_out.npy")),
                                  expected.recurrent_state_out, "recurrent_state_out.npy"));
  EXPECT_TRUE(test::bit_identical(npy::load(path("out/chunk_states.npy")), expected.chunk_states,
                                  "chunk_states.npy"));
  EXPECT_TRUE(test::bit_identical(npy::load(path("out/t_inv.npy")), expected.t_inv, "t_inv.npy"));
  // The float64 reference, and the CPU op within the float32 tolerance of it.
  const Result ref_run = gdn_cli("layer-forward " + io("ref") + kHeads + " --reference");
  ASSERT_EQ(ref_run.code, 0) << ref_run.output;
  const Tensor ref_out = npy::load(path("ref/out.npy"));
  EXPECT_EQ(ref_out.dtype(), DType::f64);
  EXPECT_TRUE(test::bit_identical(ref_out, ref::fused_gdn_fwd(p.inputs(), p.options()).out,
                                  "reference out.npy"));
  EXPECT_TRUE(test::within(npy::load(path("out/out.npy")), ref_out, 1e-4, "out.npy vs reference"));
}

// Every gradient file equals the library call, from residual files and from each policy.
TEST_F(Cli, LayerBackwardRoundTripEqualsLibrary) {
  const test::LayerProblem p = write_layer_inputs();
  const LayerBackwardInputs in{
      p.inputs(), p.d_out.view(), p.d_conv_state_out.view(), p.d_recurrent_state_out.view(), {},
      {}};
  const LayerBackwardResult expected = fused_gdn_bwd(in, p.options());
  const std::pair<const char*, const Tensor*> grads[] = {
      {"d_qkv", &expected.d_qkv},
      {"d_a", &expected.d_a},
      {"d_b", &expected.d_b},
      {"d_conv_weight", &expected.d_conv_weight},
      {"d_conv_bias", &expected.d_conv_bias},
      {"d_A_log", &expected.d_A_log},
      {"d_dt_bias", &expected.d_dt_bias},
      {"d_conv_state", &expected.d_conv_state},
      {"d_recurrent_state", &expected.d_recurrent_state}};
  auto expect_outputs = [&](const std::string& dir, const std::string& what) {
    for (const auto& [name, t] : grads) {
      EXPECT_TRUE(test::bit_identical(npy::load(path(dir + "/" + name + ".npy")), *t,
                                      std::string(name) + ".npy, " + what));
    }
  };
  for (const char* policy : {"all", "t_inv", "none"}) {
    const Result run =
        gdn_cli(std::string("layer-backward ") + io(policy) + kHeads + " --policy " + policy);
    ASSERT_EQ(run.code, 0) << run.output;
    expect_outputs(policy, std::string("policy ") + policy);
  }
  ASSERT_EQ(gdn_cli("layer-forward --in '" + path("in") + "' --out '" + path("in") + "'" + kHeads +
                    " --residuals --quiet")
                .code,
            0);
  const Result files = gdn_cli("layer-backward " + io("files") + kHeads + " --threads 1");
  ASSERT_EQ(files.code, 0) << files.output;
  EXPECT_NE(files.output.find("chunk_states.npy and t_inv.npy from"), std::string::npos)
      << files.output;
  expect_outputs("files", "residual files, 1 thread");
  const Result ref_run = gdn_cli("layer-backward " + io("ref") + kHeads + " --reference");
  ASSERT_EQ(ref_run.code, 0) << ref_run.output;
  const LayerBackwardResult ref_expected = ref::fused_gdn_bwd(in, p.options());
  EXPECT_TRUE(test::bit_identical(npy::load(path("ref/d_qkv.npy")), ref_expected.d_qkv,
                                  "reference d_qkv.npy"));
  EXPECT_TRUE(test::bit_identical(npy::load(path("ref/d_A_log.npy")), ref_expected.d_A_log,
                                  "reference d_A_log.npy"));
}

// --matmul bf16 reaches the library option in the forward, backward and layer commands (the
// files equal the library's bf16-operand results, which differ from float32 operands); a bad
// value or float64 inputs are errors naming the option.
TEST_F(Cli, MatmulOptionSelectsBf16Operands) {
  const test::Problem p = write_inputs();
  ForwardOptions options = p.options();
  options.chunk_size = 32;
  options.matmul_precision = MatmulPrecision::bf16;
  const ForwardResult expected = chunk_gated_delta_rule_fwd(p.inputs(), options);
  const Result run = gdn_cli("forward " + io() + " --l2norm --chunk-size 32 --matmul bf16");
  ASSERT_EQ(run.code, 0) << run.output;
  const Tensor o = npy::load(path("out/o.npy"));
  EXPECT_TRUE(test::bit_identical(o, expected.o, "o.npy"));
  options.matmul_precision = MatmulPrecision::compute;
  EXPECT_FALSE(test::bit_identical(o, chunk_gated_delta_rule_fwd(p.inputs(), options).o, "o.npy"));

  const test::Cotangents c = test::make_cotangents(p, 32);
  npy::save(path("in/do.npy"), c.d_o);
  npy::save(path("in/dht.npy"), c.d_ht);
  options.matmul_precision = MatmulPrecision::bf16;
  const BackwardInputs in{
      p.q.view(),  p.k.view(),          p.v.view(),   p.g.view(),    p.beta.view(),
      p.h0.view(), p.cu_seqlens.view(), c.d_o.view(), c.d_ht.view(), {},
      {}};
  const BackwardResult grads = chunk_gated_delta_rule_bwd(in, options);
  const Result bwd =
      gdn_cli("backward " + io("grads") + " --l2norm --chunk-size 32 --matmul bf16 --quiet");
  ASSERT_EQ(bwd.code, 0) << bwd.output;
  EXPECT_TRUE(test::bit_identical(npy::load(path("grads/dk.npy")), grads.dk, "dk.npy"));
  EXPECT_TRUE(test::bit_identical(npy::load(path("grads/dg.npy")), grads.dg, "dg.npy"));

  const Result with_ref = gdn_cli("forward " + io() + " --reference --matmul bf16");
  EXPECT_EQ(with_ref.code, 2);
  EXPECT_NE(with_ref.output.find("'--matmul' does not apply with --reference"), std::string::npos)
      << with_ref.output;
  const Result bad = gdn_cli("forward " + io() + " --matmul fp8");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("--matmul"), std::string::npos) << bad.output;
  write_inputs(DType::f64);
  const Result f64 = gdn_cli("forward " + io() + " --matmul bf16");
  EXPECT_EQ(f64.code, 2);
  EXPECT_NE(f64.output.find("option '--matmul': expected compute for float64 inputs"),
            std::string::npos)
      << f64.output;

  const test::LayerProblem lp = write_layer_inputs();
  LayerOptions lo = lp.options();
  lo.matmul_precision = MatmulPrecision::bf16;
  const LayerForwardResult layer = fused_gdn_fwd(lp.inputs(), lo);
  const Result lrun = gdn_cli("layer-forward " + io("layer") + kHeads + " --matmul bf16 --quiet");
  ASSERT_EQ(lrun.code, 0) << lrun.output;
  EXPECT_TRUE(test::bit_identical(npy::load(path("layer/out.npy")), layer.out, "out.npy"));
}

TEST_F(Cli, LayerErrorsNameTheFileOrOption) {
  write_layer_inputs();
  const Result heads = gdn_cli("layer-forward " + io() + " --hk 2 --hv 4 --dk 16");
  EXPECT_EQ(heads.code, 2);
  EXPECT_NE(heads.output.find("option '--dv' is required"), std::string::npos) << heads.output;
  const Result layout = gdn_cli("layer-forward " + io() + " --hk 2 --hv 4 --dk 16 --dv 9");
  EXPECT_EQ(layout.code, 1);
  EXPECT_NE(layout.output.find("qkv.npy (qkv)"), std::string::npos) << layout.output;
  const Result group = gdn_cli("layer-forward " + io() + " --hk 3 --hv 4 --dk 16 --dv 8");
  EXPECT_EQ(group.code, 2);
  EXPECT_NE(group.output.find("option '--hv'"), std::string::npos) << group.output;
  npy::save(path("in/conv_weight.npy"), Tensor(DType::f32, {96, 9}));  // D = 96
  const Result taps = gdn_cli("layer-forward " + io() + kHeads);
  EXPECT_EQ(taps.code, 1);
  EXPECT_NE(taps.output.find("conv_weight.npy (conv_weight)': expected K from 1 to 8"),
            std::string::npos)
      << taps.output;
  write_layer_inputs();
  fs::remove(path("in/d_out.npy"));
  const Result missing = gdn_cli("layer-backward " + io() + kHeads);
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.output.find("d_out.npy: cannot open"), std::string::npos) << missing.output;
  EXPECT_FALSE(fs::exists(path("out"))) << "outputs written despite bad inputs";
}

// One serving step on .npy files: out.npy and both updated pools equal the library call on
// the same pools, at any thread count; --reference equals the float64 reference, and the CPU
// step is within the float32 tolerance of it.
TEST_F(Cli, StepRoundTripEqualsLibrary) {
  const StepFiles f = write_step_inputs();
  Tensor conv = copy_of(f.pools.conv_state, DType::f32);
  Tensor state = copy_of(f.pools.recurrent_state, DType::f32);
  const Tensor expected =
      fused_gdn_step(f.inputs(), {conv.mutable_view(), state.mutable_view()}, f.options());
  for (const char* threads : {"1", "2"}) {
    const Result run =
        gdn_cli("step " + io(threads) + kHeads + " --num-spec 2 --threads " + threads);
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find("2 decodes, 2 prefills, 1 padding"), std::string::npos) << run.output;
    const std::string dir = std::string(threads) + "/";
    EXPECT_TRUE(test::bit_identical(npy::load(path(dir + "out.npy")), expected, "out.npy"));
    EXPECT_TRUE(
        test::bit_identical(npy::load(path(dir + "conv_state.npy")), conv, "conv_state.npy"));
    EXPECT_TRUE(test::bit_identical(npy::load(path(dir + "recurrent_state.npy")), state,
                                    "recurrent_state.npy"));
  }
  // Slots no sequence writes are unchanged; the written ones are not.
  const Tensor pool = npy::load(path("1/recurrent_state.npy"));
  const std::int64_t slot = 4 * 16 * 8;
  EXPECT_EQ(std::memcmp(pool.data<float>() + 3 * slot,
                        f.pools.recurrent_state.data<float>() + 3 * slot, slot * sizeof(float)),
            0);
  EXPECT_NE(std::memcmp(pool.data<float>() + 8 * slot,
                        f.pools.recurrent_state.data<float>() + 8 * slot, slot * sizeof(float)),
            0);

  const Result ref_run = gdn_cli("step " + io("ref") + kHeads + " --num-spec 2 --reference");
  ASSERT_EQ(ref_run.code, 0) << ref_run.output;
  EXPECT_NE(ref_run.output.find("float64 reference"), std::string::npos) << ref_run.output;
  StepFiles wide;
  for (const auto& [to, from] :
       {std::pair{&wide.tokens.qkv, &f.tokens.qkv}, std::pair{&wide.tokens.a, &f.tokens.a},
        std::pair{&wide.tokens.b, &f.tokens.b},
        std::pair{&wide.tokens.conv_weight, &f.tokens.conv_weight},
        std::pair{&wide.tokens.conv_bias, &f.tokens.conv_bias},
        std::pair{&wide.tokens.A_log, &f.tokens.A_log},
        std::pair{&wide.tokens.dt_bias, &f.tokens.dt_bias}}) {
    *to = copy_of(*from, DType::f64);
  }
  wide.tokens.spec = f.tokens.spec;
  wide.query_start_loc = index_tensor({0, 1, 4, 24, 31, 31});
  wide.state_indices = index_tensor({2, 4, 7, 8, -1});
  wide.seq_lens = index_tensor({50, 9, 20, 40, 0});
  wide.distribution = index_tensor({2, 3, 4});
  wide.read_offsets = index_tensor({0, 1, 0, 0, 0});
  Tensor ref_conv = copy_of(f.pools.conv_state, DType::f64);
  Tensor ref_state = copy_of(f.pools.recurrent_state, DType::f64);
  const Tensor ref_expected = ref::fused_gdn_step(
      wide.inputs(), {ref_conv.mutable_view(), ref_state.mutable_view()}, f.options());
  const Tensor ref_out = npy::load(path("ref/out.npy"));
  EXPECT_EQ(ref_out.dtype(), DType::f64);
  EXPECT_TRUE(test::bit_identical(ref_out, ref_expected, "reference out.npy"));
  EXPECT_TRUE(test::bit_identical(npy::load(path("ref/conv_state.npy")), ref_conv,
                                  "reference conv_state.npy"));
  EXPECT_TRUE(test::bit_identical(npy::load(path("ref/recurrent_state.npy")), ref_state,
                                  "reference recurrent_state.npy"));
  EXPECT_TRUE(test::within(npy::load(path("1/out.npy")), ref_out, 1e-4, "out.npy vs reference"));
  EXPECT_TRUE(test::within(npy::load(path("1/recurrent_state.npy")), ref_state, 1e-4,
                           "recurrent_state.npy vs reference"));

  // --out may be --in: the pools there are updated, and a second step reads them.
  const Result again = gdn_cli("step --in '" + path("in") + "' --out '" + path("in") + "'" +
                               kHeads + " --num-spec 2 --quiet");
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_TRUE(again.output.empty()) << again.output;
  EXPECT_TRUE(test::bit_identical(npy::load(path("in/recurrent_state.npy")), state,
                                  "recurrent_state.npy stepped in place"));
}

TEST_F(Cli, StepErrorsNameTheFileOrOption) {
  write_step_inputs();
  const Result heads = gdn_cli("step " + io() + " --hk 2 --hv 4 --dk 16 --num-spec 2");
  EXPECT_EQ(heads.code, 2);
  EXPECT_NE(heads.output.find("option '--dv' is required"), std::string::npos) << heads.output;
  // The window of 3 tokens needs --num-spec 2.
  const Result spec = gdn_cli("step " + io() + kHeads);
  EXPECT_EQ(spec.code, 1);
  EXPECT_NE(spec.output.find("query_start_loc.npy (query_start_loc)"), std::string::npos)
      << spec.output;
  const Result negative = gdn_cli("step " + io() + kHeads + " --num-spec -1");
  EXPECT_EQ(negative.code, 2);
  EXPECT_NE(negative.output.find("'--num-spec'"), std::string::npos) << negative.output;
  // A pool of the wrong head dim, a live sequence in the null slot, a missing index file.
  npy::save(path("in/recurrent_state.npy"), Tensor(DType::f32, {10, 4, 16, 9}));
  const Result pool = gdn_cli("step " + io() + kHeads + " --num-spec 2");
  EXPECT_EQ(pool.code, 1);
  EXPECT_NE(pool.output.find("recurrent_state.npy (recurrent_state)"), std::string::npos)
      << pool.output;
  write_step_inputs();
  npy::save(path("in/state_indices.npy"), index_tensor({0, 4, 7, 8, -1}));
  const Result null_slot = gdn_cli("step " + io() + kHeads + " --num-spec 2");
  EXPECT_EQ(null_slot.code, 1);
  EXPECT_NE(null_slot.output.find("state_indices.npy (state_indices)"), std::string::npos)
      << null_slot.output;
  write_step_inputs();
  npy::save(path("in/a.npy"), Tensor(DType::f64, {34, 4}));
  const Result dtype = gdn_cli("step " + io() + kHeads + " --num-spec 2 --reference");
  EXPECT_EQ(dtype.code, 1);
  EXPECT_NE(dtype.output.find("a.npy (a)': expected dtype f32"), std::string::npos) << dtype.output;
  write_step_inputs();
  fs::remove(path("in/seq_lens.npy"));
  const Result missing = gdn_cli("step " + io() + kHeads + " --num-spec 2");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.output.find("seq_lens.npy: cannot open"), std::string::npos) << missing.output;
  EXPECT_FALSE(fs::exists(path("out"))) << "outputs written despite bad inputs";
}

TEST_F(Cli, UsageErrors) {
  write_inputs();
  const Result unknown = gdn_cli("forward " + io() + " --chunksize 32");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.output.find("unknown option '--chunksize'"), std::string::npos)
      << unknown.output;
  const Result bad = gdn_cli("forward " + io() + " --chunk-size 1000");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("'--chunk-size': expected an integer in [0, 256], given '1000'"),
            std::string::npos)
      << bad.output;
  const Result missing = gdn_cli("forward --out x");
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.output.find("'--in' is required"), std::string::npos) << missing.output;
  const Result command = gdn_cli("backwards");
  EXPECT_EQ(command.code, 2);
  EXPECT_NE(command.output.find("unknown command 'backwards'"), std::string::npos)
      << command.output;
  const Result bench = gdn_cli("bench --hk 3 --hv 4");
  EXPECT_EQ(bench.code, 2);
  EXPECT_NE(bench.output.find("multiple of --hk"), std::string::npos) << bench.output;
}

TEST_F(Cli, HelpShowsExamples) {
  for (const char* args :
       {"--help", "forward --help", "backward --help", "bench --help", "help forward",
        "help backward", "layer-forward --help", "layer-backward --help", "help layer-forward",
        "bench --op layer --help", "bench --op conv --help", "step --help", "help step",
        "bench --op step --help", "plan --help", "help plan"}) {
    const Result run = gdn_cli(args);
    EXPECT_EQ(run.code, 0) << args;
    EXPECT_NE(run.output.find("examples:"), std::string::npos) << args << ": " << run.output;
    EXPECT_NE(run.output.find("gdn "), std::string::npos) << args;
  }
}

}  // namespace
}  // namespace gdn
