// cli_test.cc: the gdn tool as a user runs it: .npy files in, .npy files out, clear errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "common/compare.h"
#include "common/layer_problem.h"
#include "common/problem.h"
#include "npy.h"
#include "svg_plot.h"

#ifndef GDN_CLI_PATH
#error "GDN_CLI_PATH must name the gdn executable"
#endif

namespace gdn {
namespace {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string output;  // stdout and stderr
};

Result gdn_cli(const std::string& args) {
  const std::string command = std::string("'") + GDN_CLI_PATH + "' " + args + " 2>&1";
  Result r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           (std::string("gdn_cli_test_") +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "in");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes a packed problem with int32 cu_seqlens and h0 (as a framework dump would).
  test::Problem write_inputs(DType dtype = DType::f32) {
    test::ProblemSpec spec;
    spec.lengths = {70, 0, 33};
    spec.hk = 2;
    spec.hv = 4;
    spec.dk = 16;
    spec.dv = 8;
    spec.initial_state = true;
    spec.l2norm = true;
    spec.dtype = dtype;
    test::Problem p = test::make_problem(spec);
    npy::save(path("in/q.npy"), p.q);
    npy::save(path("in/k.npy"), p.k);
    npy::save(path("in/v.npy"), p.v);
    npy::save(path("in/g.npy"), p.g);
    npy::save(path("in/beta.npy"), p.beta);
    npy::save(path("in/h0.npy"), p.h0);
    Tensor cu32(DType::i32, {4});
    for (int i = 0; i < 4; ++i)
      cu32.data<std::int32_t>()[i] =
          static_cast<std::int32_t>(p.cu_seqlens.data<std::int64_t>()[i]);
    npy::save(path("in/cu_seqlens.npy"), cu32);
    return p;
  }
  // Writes a layer problem: two sequences (one shorter than K - 1) with both initial states,
  // a conv bias, conv_weight as [D, 1, K], int32 cu_seqlens, and the three cotangents.
  test::LayerProblem write_layer_inputs() {
    test::LayerSpec spec;
    spec.lengths = {45, 2};
    spec.hk = 2;
    spec.hv = 4;
    spec.dk = 16;
    spec.dv = 8;
    spec.conv_state = true;
    spec.recurrent_state = true;
    spec.weight_rank3 = true;
    test::LayerProblem p = test::make_layer_problem(spec);
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"qkv", &p.qkv},
                                  {"a", &p.a},
                                  {"b", &p.b},
                                  {"conv_weight", &p.conv_weight},
                                  {"conv_bias", &p.conv_bias},
                                  {"A_log", &p.A_log},
                                  {"dt_bias", &p.dt_bias},
                                  {"conv_state", &p.conv_state},
                                  {"recurrent_state", &p.recurrent_state},
                                  {"d_out", &p.d_out},
                                  {"d_conv_state_out", &p.d_conv_state_out},
                                  {"d_recurrent_state_out", &p.d_recurrent_state_out}}) {
      npy::save(path(std::string("in/") + name + ".npy"), *t);
    }
    Tensor cu32(DType::i32, {3});
    for (int i = 0; i < 3; ++i)
      cu32.data<std::int32_t>()[i] =
          static_cast<std::int32_t>(p.cu_seqlens.data<std::int64_t>()[i]);
    npy::save(path("in/cu_seqlens.npy"), cu32);
    return p;
  }
  static constexpr const char* kHeads = " --hk 2 --hv 4 --dk 16 --dv 8";

  // A serving step over pools of 10 slots (the heads of kHeads, K = 4, with conv bias,
  // conv_weight as [D, 1, K]): a decode in slot 2, a speculative window of 3 tokens over slots
  // 4 to 6 reading slot 5 (num_spec 2), a fresh prefill of 20 tokens into slot 7, a continued
  // prefill of 7 tokens in slot 8, and one padding sequence; T = 34 (3 padding rows).
  // state_indices and seq_lens as int32 (widened by the tool), the rest int64.
  struct StepFiles {
    test::LayerProblem tokens, pools;
    Tensor query_start_loc, state_indices, seq_lens, distribution, read_offsets;
    StepInputs inputs() const {
      return {tokens.qkv.view(),
              tokens.a.view(),
              tokens.b.view(),
              tokens.conv_weight.view(),
              tokens.conv_bias.view(),
              tokens.A_log.view(),
              tokens.dt_bias.view(),
              query_start_loc.view(),
              state_indices.view(),
              seq_lens.view(),
              distribution.view(),
              read_offsets.view(),
              TensorView{}};
    }
    StepOptions options() const {
      StepOptions o;
      static_cast<LayerOptions&>(o) = tokens.options();
      o.num_spec = 2;
      return o;
    }
  };
  static Tensor index_tensor(const std::vector<std::int64_t>& values) {
    Tensor t(DType::i64, {static_cast<std::int64_t>(values.size())});
    for (std::size_t i = 0; i < values.size(); ++i) t.data<std::int64_t>()[i] = values[i];
    return t;
  }
  StepFiles write_step_inputs() {
    test::LayerSpec spec;
    spec.lengths = {34};
    spec.hk = 2;
    spec.hv = 4;
    spec.dk = 16;
    spec.dv = 8;
    spec.weight_rank3 = true;
    StepFiles f;
    f.tokens = test::make_layer_problem(spec);
    spec.lengths = std::vector<std::int64_t>(10, 1);  // 10 "sequences": the 10 slots
    spec.conv_state = true;
    spec.recurrent_state = true;
    spec.seed = 2;
    f.pools = test::make_layer_problem(spec);
    f.query_start_loc = index_tensor({0, 1, 4, 24, 31, 31});
    f.state_indices = index_tensor({2, 4, 7, 8, -1});
    f.seq_lens = index_tensor({50, 9, 20, 40, 0});
    f.distribution = index_tensor({2, 3, 4});
    f.read_offsets = index_tensor({0, 1, 0, 0, 0});
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"qkv", &f.tokens.qkv},
                                  {"a", &f.tokens.a},
                                  {"b", &f.tokens.b},
                                  {"conv_weight", &f.tokens.conv_weight},
                                  {"conv_bias", &f.tokens.conv_bias},
                                  {"A_log", &f.tokens.A_log},
                                  {"dt_bias", &f.tokens.dt_bias},
                                  {"conv_state", &f.pools.conv_state},
                                  {"recurrent_state", &f.pools.recurrent_state},
                                  {"query_start_loc", &f.query_start_loc},
                                  {"distribution", &f.distribution},
                                  {"read_offsets", &f.read_offsets}}) {
      npy::save(path(std::string("in/") + name + ".npy"), *t);
    }
    for (const auto& [name, t] :
         {std::pair<const char*, const Tensor*>{"state_indices", &f.state_indices},
          {"seq_lens", &f.seq_lens}}) {
      Tensor narrow(DType::i32, {t->numel()});
      for (std::int64_t i = 0; i < t->numel(); ++i) {
        narrow.data<std::int32_t>()[i] = static_cast<std::int32_t>(t->data<std::int64_t>()[i]);
      }
      npy::save(path(std::string("in/") + name + ".npy"), narrow);
    }
    return f;
  }
  static Tensor copy_of(const Tensor& t, DType dtype) {
    Tensor c(dtype, t.rank(), t.sizes());
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      if (dtype == DType::f64) {
        c.data<double>()[i] = test::value_at(t, i);
      } else {
        c.data<float>()[i] = static_cast<float>(test::value_at(t, i));
      }
    }
    return c;
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string io(const std::string& out = "out") const {
    return "--in '" + path("in") + "' --out '" + path(out) + "'";
  }

  fs::path dir_;
};

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
  EXPECT_EQ(f64.code, 1);
  EXPECT_NE(f64.output.find("'--matmul (options.matmul_precision)'"), std::string::npos)
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

// `gdn plan` prints the machine and every choice with its reason; --time checks and times the
// alternatives and says whether the chosen one is within 5 % of the best (WARN when not: the
// machine may be busy, so either line passes here).
TEST_F(Cli, PlanPrintsChoicesAndTimesAlternatives) {
  const Result forward = gdn_cli("plan --hk 2 --hv 8 --dk 32 --dv 32 --seq 256 --threads 2");
  ASSERT_EQ(forward.code, 0) << forward.output;
  for (const char* text :
       {"gdn plan: forward, Hk=2 Hv=8 Dk=32 Dv=32, 1 x 256 tokens, f32", "machine: ", "L1d ",
        "isa ", "chunk size ", "heads per item ", "value heads per item: they share", "work items ",
        "threads ", "workspace "}) {
    EXPECT_NE(forward.output.find(text), std::string::npos) << text << " in " << forward.output;
  }
  const Result backward =
      gdn_cli("plan --op backward --hk 2 --hv 4 --dk 32 --dv 32 --seq 300 --policy none");
  ASSERT_EQ(backward.code, 0) << backward.output;
  EXPECT_NE(backward.output.find("rebuild segment "), std::string::npos) << backward.output;
  EXPECT_NE(backward.output.find("summed inside the item"), std::string::npos) << backward.output;
  const Result decode = gdn_cli("plan --op decode --hk 2 --hv 4 --dk 16 --dv 64 --threads 2");
  ASSERT_EQ(decode.code, 0) << decode.output;
  // 4 heads for 2 threads: whole heads, no column blocks.
  EXPECT_NE(decode.output.find("value blocks     1 "), std::string::npos) << decode.output;
  EXPECT_NE(decode.output.find("whole heads"), std::string::npos) << decode.output;

  for (const char* args :
       {"plan --time --hk 2 --hv 4 --dk 32 --dv 32 --seq 200 --repeats 1 --rounds 1",
        "plan --time --op backward --hk 1 --hv 2 --dk 16 --dv 16 --seq 100 --repeats 1",
        "plan --time --op decode --hk 2 --hv 4 --dk 16 --dv 64 --repeats 1 --rounds 1"}) {
    const Result timed = gdn_cli(args);
    ASSERT_EQ(timed.code, 0) << args << ": " << timed.output;
    for (const char* text : {"check: the library runs the plan printed above for this call: yes",
                             "bit-identical results: yes", "<- chosen"}) {
      EXPECT_NE(timed.output.find(text), std::string::npos) << text << " in " << timed.output;
    }
    EXPECT_TRUE(timed.output.find("within 5 % of the best tried: yes") != std::string::npos ||
                timed.output.find("WARN: the chosen plan") != std::string::npos)
        << timed.output;
  }

  for (const auto& [args, message] :
       {std::pair<const char*, const char*>{"plan --opp forward", "unknown option '--opp'"},
        {"plan --op sideways", "'--op'"},
        {"plan --op decode --seqs 2", "'--seqs': not with --op decode"},
        {"plan --hk 3 --hv 4", "multiple of --hk"},
        {"plan --chunk-size 300", "'--chunk-size'"},
        {"plan --policy none", "'--policy': only with --op backward"}}) {
    const Result bad = gdn_cli(args);
    EXPECT_EQ(bad.code, 2) << args << ": " << bad.output;
    EXPECT_NE(bad.output.find(message), std::string::npos) << args << ": " << bad.output;
  }
}

// The benchmark on a small shape: the check passes and the JSON lines carry every field.
TEST_F(Cli, BenchJsonLines) {
  const Result run =
      gdn_cli("bench --tokens 130 --hk 2 --hv 4 --dk 32 --dv 16 --repeats 2 --json --threads 2");
  ASSERT_EQ(run.code, 0) << run.output;
  int lines = 0;
  std::size_t at = 0;
  while ((at = run.output.find("{\"op\": ", at)) != std::string::npos) {
    const std::string line = run.output.substr(at, run.output.find('}', at) - at);
    for (const char* field :
         {"\"op\"", "\"impl\"", "\"dtype\"", "\"threads\"", "\"tokens\"", "\"hk\"", "\"hv\"",
          "\"dk\"", "\"dv\"", "\"median_ms\"", "\"min_ms\"", "\"max_ms\"", "\"us_per_token_head\"",
          "\"gflops\"", "\"peak_gflops\"", "\"residual_bytes\"", "\"peak_rss_bytes\""}) {
      EXPECT_NE(line.find(field), std::string::npos) << field << " missing in " << line;
    }
    ++lines;
    ++at;
  }
  EXPECT_EQ(lines, 6) << run.output;  // 3 forward cases, backward under 3 policies
  EXPECT_NE(run.output.find("PASS"), std::string::npos) << run.output;
}

// --matmul bf16: the chunked cases run with bf16 operands (and say so), the token-recurrence
// baseline with float32 ones; every check passes its bf16-operand tolerance.
TEST_F(Cli, BenchMatmulBf16) {
  const Result run =
      gdn_cli("bench --tokens 130 --hk 2 --hv 4 --dk 32 --dv 16 --repeats 1 --json --matmul bf16");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_EQ(run.output.find("FAIL"), std::string::npos) << run.output;
  int bf16 = 0, compute = 0;
  std::size_t at = 0;
  while ((at = run.output.find("{\"op\": ", at)) != std::string::npos) {
    const std::string line = run.output.substr(at, run.output.find('}', at) - at);
    const bool recurrent = line.find("\"impl\": \"recurrent\"") != std::string::npos;
    EXPECT_NE(line.find(recurrent ? "\"matmul\": \"compute\"" : "\"matmul\": \"bf16\""),
              std::string::npos)
        << line;
    ++(recurrent ? compute : bf16);
    ++at;
  }
  EXPECT_EQ(bf16, 5) << run.output;
  EXPECT_EQ(compute, 1) << run.output;
}

// --matmul both: the float32 forward's cases, then the bf16-operand ones (with the --dtype
// activations), in one run, and one ratio per chunked case.
TEST_F(Cli, BenchMatmulBoth) {
  const std::string shape =
      "bench --tokens 130 --hk 2 --hv 4 --dk 32 --dv 16 --repeats 1 --cases forward --matmul both";
  for (const char* dtype : {"f32", "bf16"}) {
    const Result run = gdn_cli(shape + " --dtype " + dtype);
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_EQ(run.output.find("FAIL"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("-- float32 activations, float32 matrix operands --"),
              std::string::npos)
        << run.output;
    EXPECT_NE(run.output.find(std::string("-- ") + dtype + " activations, bf16 matrix operands --"),
              std::string::npos)
        << run.output;
    int ratios = 0;
    for (std::size_t at = run.output.find("  forward  chunked  "); at != std::string::npos;
         at = run.output.find("  forward  chunked  ", at + 1)) {
      ++ratios;
    }
    EXPECT_EQ(ratios, 2) << run.output;
  }
}

// --breakdown: a table of stages for every chunked case (not the token recurrence), whose
// stages are the ones the pass runs, and a stages_ms object in every chunked JSON line.
TEST_F(Cli, BenchBreakdown) {
  const std::string shape = "bench --tokens 130 --hk 2 --hv 4 --dk 32 --dv 16 --repeats 1 ";
  const Result table = gdn_cli(shape + "--threads 1 --breakdown");
  ASSERT_EQ(table.code, 0) << table.output;
  for (const char* title :
       {"where the time goes: forward, 130 tokens, 1 thread, f32",
        "where the time goes: forward +residuals,", "where the time goes: backward-all,",
        "where the time goes: backward-t_inv,", "where the time goes: backward-none,"}) {
    EXPECT_NE(table.output.find(title), std::string::npos) << title << "\n" << table.output;
  }
  EXPECT_EQ(table.output.find("where the time goes: forward recurrent"), std::string::npos);
  for (const char* row : {"\npack_qk ", "\ngram ", "\nwy ", "\nstate ", "\nrebuild ", "\nvalues ",
                          "\ndqk ", "\nwrite_dqk ", "\nproducts "}) {
    EXPECT_NE(table.output.find(row), std::string::npos) << row << "\n" << table.output;
  }
  const Result json = gdn_cli(shape + "--threads 2 --breakdown --json");
  ASSERT_EQ(json.code, 0) << json.output;
  int chunked = 0, with_stages = 0;
  std::size_t at = 0;
  while ((at = json.output.find("{\"op\": ", at)) != std::string::npos) {
    const std::string line = json.output.substr(at, json.output.find('\n', at) - at);
    const bool is_chunked = line.find("\"impl\": \"chunked\"") != std::string::npos;
    const bool has_stages = line.find(", \"stages_ms\": {\"") != std::string::npos;
    EXPECT_EQ(has_stages, is_chunked) << line;
    if (line.find("\"op\": \"backward-all\"") != std::string::npos) {
      EXPECT_NE(line.find("\"dstate\": "), std::string::npos) << line;
      EXPECT_EQ(line.find("\"rebuild\": "), std::string::npos) << line;
    }
    if (is_chunked) {
      EXPECT_EQ(line.substr(line.size() - 2), "}}") << line;
    }
    chunked += is_chunked;
    with_stages += has_stages;
    ++at;
  }
  EXPECT_EQ(chunked, 5) << json.output;
  EXPECT_EQ(with_stages, 5) << json.output;
}

// The layer and conv benchmarks on small problems: the checks pass and every JSON line carries
// the fields docs/perf.md reads.
TEST_F(Cli, BenchLayerAndConvJsonLines) {
  const Result layer = gdn_cli("bench --op layer --seq 70 --repeats 1 --json --threads 2");
  ASSERT_EQ(layer.code, 0) << layer.output;
  const Result conv =
      gdn_cli("bench --op=conv --channels 300 --seq 600 --decode-seqs 3 --repeats 2 --json");
  ASSERT_EQ(conv.code, 0) << conv.output;
  auto count = [](const std::string& output, const std::vector<const char*>& fields) {
    int lines = 0;
    std::size_t at = 0;
    while ((at = output.find("{\"op\": ", at)) != std::string::npos) {
      const std::string line = output.substr(at, output.find('}', at) - at);
      for (const char* field : fields) {
        EXPECT_NE(line.find(field), std::string::npos) << field << " missing in " << line;
      }
      ++lines;
      ++at;
    }
    return lines;
  };
  EXPECT_EQ(count(layer.output, {"\"model\"", "\"tokens\"", "\"channels\"", "\"median_ms\"",
                                 "\"pct_peak\"", "\"peak_rss_bytes\"", "\"check_error\""}),
            4)  // two models, forward and backward
      << layer.output;
  EXPECT_NE(layer.output.find("\"op\": \"layer-backward-all\""), std::string::npos);
  EXPECT_EQ(count(conv.output, {"\"median_ms\"", "\"gbytes_per_s\"", "\"check_error\""}), 4)
      << conv.output;  // memcpy, conv forward, decode, backward
  EXPECT_EQ(layer.output.find("FAIL"), std::string::npos) << layer.output;
  const Result bad = gdn_cli("bench --op attention");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("'--op'"), std::string::npos) << bad.output;
}

// The step benchmark on a small shape: every preset's check passes and its JSON line carries
// every field, numbers or null (the copy of batches with prefills), nothing else.
TEST_F(Cli, BenchStepJsonLines) {
  const Result run = gdn_cli(
      "bench --op step --hk 1 --hv 2 --dk 16 --dv 16 --preset decode-8,spec-64x4,mixed-8 "
      "--repeats 2 --threads 2 --json");
  ASSERT_EQ(run.code, 0) << run.output;
  int lines = 0;
  std::size_t at = 0;
  while ((at = run.output.find("{\"op\": ", at)) != std::string::npos) {
    const std::size_t end = run.output.find('}', at);
    ASSERT_NE(end, std::string::npos) << run.output;
    const std::string line = run.output.substr(at, end - at);
    EXPECT_NE(line.find("\"op\": \"step\""), std::string::npos) << line;
    for (const char* field :
         {"\"preset\"", "\"model\": \"custom\"", "\"threads\": 2", "\"tokens\"", "\"seqs\"",
          "\"slots\"", "\"median_ms\"", "\"min_ms\"", "\"max_ms\"", "\"tokens_per_s\"", "\"gbps\"",
          "\"copy_gbps\"", "\"vs_copy\"", "\"check_error\""}) {
      EXPECT_NE(line.find(field), std::string::npos) << field << " missing in " << line;
    }
    for (const char* bad : {"nan", "inf", ": ,", ": }"}) {
      EXPECT_EQ(line.find(bad), std::string::npos) << bad << " in " << line;
    }
    ++lines;
    at = end;
  }
  EXPECT_EQ(lines, 3) << run.output;
  EXPECT_NE(run.output.find("\"preset\": \"spec-64x4\", \"model\": \"custom\""), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("\"num_spec\": 3"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("\"copy_gbps\": null"), std::string::npos) << run.output;  // mixed
  EXPECT_EQ(run.output.find("FAIL"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("PASS"), std::string::npos) << run.output;
  const Result bad = gdn_cli("bench --op step --preset decode-3");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("'--preset'"), std::string::npos) << bad.output;
}

// The suite on its tiny shape: a JSON line for every op at every token count, thread count and
// activation dtype (f32 and bf16 by default), the bf16 note, and a well-formed plot naming the
// ops.
TEST_F(Cli, BenchSuiteJsonLinesAndPlot) {
  const std::string svg_path = path("s.svg");
  const Result run =
      gdn_cli("bench --suite --quick --repeats 1 --json --threads 1,2 --out '" + svg_path + "'");
  ASSERT_EQ(run.code, 0) << run.output;
  std::vector<std::string> lines;
  std::size_t at = 0;
  while ((at = run.output.find("{\"op\": ", at)) != std::string::npos) {
    const std::size_t end = run.output.find('\n', at);
    ASSERT_NE(end, std::string::npos) << run.output;
    const std::string line = run.output.substr(at, end - at);
    for (const char* field :
         {"\"impl\"", "\"dtype\": \"", "\"threads\"", "\"tokens\"", "\"median_ms\"", "\"min_ms\"",
          "\"max_ms\"", "\"us_per_token_head\"", "\"gflops\"", "\"peak_gflops\"", "\"pct_peak\"",
          "\"residual_bytes\"", "\"peak_rss_bytes\"", "\"check_error\""}) {
      EXPECT_NE(line.find(field), std::string::npos) << field << " missing in " << line;
    }
    for (const char* bad : {"nan", "inf", ": ,", ": }", ",}"}) {
      EXPECT_EQ(line.find(bad), std::string::npos) << bad << " in " << line;
    }
    lines.push_back(line);
    at = end;
  }
  // 2 thread counts x (2 token counts x 2 dtypes x 6 cases + 2 decode batches).
  EXPECT_EQ(lines.size(), 52u) << run.output;
  auto count = [&](const std::string& needle) {
    int n = 0;
    for (const std::string& line : lines) n += line.find(needle) != std::string::npos ? 1 : 0;
    return n;
  };
  EXPECT_EQ(count("\"op\": \"forward\", \"impl\": \"chunked\""), 16);
  EXPECT_EQ(count("\"op\": \"forward\", \"impl\": \"recurrent\""), 8);  // the baseline
  for (const char* op : {"backward-all", "backward-t_inv", "backward-none"}) {
    EXPECT_EQ(count(std::string("\"op\": \"") + op + "\""), 8) << op;
  }
  EXPECT_EQ(count("\"op\": \"decode\""), 4);
  EXPECT_EQ(count("\"dtype\": \"bf16\""), 24);
  EXPECT_EQ(count("\"threads\": 2,"), 26);
  EXPECT_EQ(count("\"tokens\": 256,"), 24);
  // The breakdown: one thread, float32, the chunked cases (2 token counts x 5 cases).
  EXPECT_EQ(count("\"stages_ms\": {"), 10);
  for (const std::string& line : lines) {
    if (line.find("\"stages_ms\"") == std::string::npos) continue;
    EXPECT_NE(line.find("\"threads\": 1,"), std::string::npos) << line;
    EXPECT_NE(line.find("\"dtype\": \"f32\""), std::string::npos) << line;
  }
  // The targets and the breakdown of the forward and of the backward from full residuals
  // (stderr with --json).
  for (const char* text : {"the CPU-speed targets: one thread, 128 tokens (--quick",
                           "forward, float32: <= 1.0 us per token*head",
                           "forward's matrix products: >= 70% of the fp32 peak",
                           "backward from full residuals, float32: <= 2.5 us",
                           "where the time goes: forward, 128 tokens, 1 thread",
                           "where the time goes: backward-all, 128 tokens, 1 thread"}) {
    EXPECT_NE(run.output.find(text), std::string::npos) << text;
  }
  EXPECT_NE(run.output.find("bf16 and f16 rows: 16-bit activations"), std::string::npos);
  EXPECT_EQ(run.output.find("FAIL"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("plot written to " + svg_path), std::string::npos) << run.output;

  std::ifstream in(svg_path);
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(svg.rfind("<svg", 0), 0u) << svg.substr(0, 100);
  EXPECT_EQ(svg.substr(svg.find_last_not_of('\n') - 5, 6), "</svg>");
  for (const char* name : {"forward", "baseline", "backward-all", "backward-t_inv", "backward-none",
                           "decode", "peak RSS", "residual MiB", "% of peak"}) {
    EXPECT_NE(svg.find(name), std::string::npos) << name;
  }
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(gdn_cli("bench --suite --threads 0").code, 2);
  EXPECT_EQ(gdn_cli("bench --suite --seq 8q").code, 2);
  const Result bad_dtype = gdn_cli("bench --suite --dtypes f32,int8");
  EXPECT_EQ(bad_dtype.code, 2);
  EXPECT_NE(bad_dtype.output.find("'--dtypes'"), std::string::npos) << bad_dtype.output;
  const Result help = gdn_cli("bench --suite --help");
  EXPECT_NE(help.output.find("bf16 and f16 rows: 16-bit activations"), std::string::npos);
}

// Counts `needle` in `text`.
int occurrences(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++n;
  return n;
}

// The plot writer alone: panels side by side, escaped text, balanced groups, points that a
// log axis cannot show left out, empty panels still well-formed.
TEST(SvgPlot, RendersWellFormedPanels) {
  using cli::svg::Panel;
  using cli::svg::Series;
  Panel lines{Panel::Kind::log_lines, "latency", "tokens", "ms", {}, {}};
  lines.series.push_back({"a<b", {1, 10, 100}, {0.5, 5, 50}, -1, false});
  lines.series.push_back({"c & d", {1, 100}, {0, 20}, -1, true});  // 0 is left out
  Panel bars{Panel::Kind::bars, "memory", "policy", "MiB", {"all", "none"}, {}};
  bars.series.push_back({"rss", {}, {12.5, 3}, 0, false});
  const Panel empty{Panel::Kind::bars, "empty", "x", "y", {}, {}};
  const std::string svg = cli::svg::render("title \"q\"", {lines, bars, empty});
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(occurrences(svg, "<g "), 3);
  EXPECT_EQ(occurrences(svg, "</g>"), 3);
  EXPECT_EQ(occurrences(svg, "<polyline"), 2);
  EXPECT_EQ(occurrences(svg, "<text"), occurrences(svg, "</text>"));
  EXPECT_NE(svg.find("a&lt;b"), std::string::npos);
  EXPECT_NE(svg.find("c &amp; d"), std::string::npos);
  EXPECT_NE(svg.find("title &quot;q&quot;"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_NE(svg.find("rss all: 12.5"), std::string::npos);
  for (const char* bad : {"nan", "inf"}) EXPECT_EQ(svg.find(bad), std::string::npos) << bad;
  const std::string none = cli::svg::render("nothing", {});
  EXPECT_EQ(none.rfind("<svg", 0), 0u);
  EXPECT_EQ(none.substr(none.size() - 7), "</svg>\n");
}

}  // namespace
}  // namespace gdn
