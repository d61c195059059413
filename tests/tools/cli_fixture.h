// cli_fixture.h: runs the gdn tool as a user does (cli_test.cc, cli_bench_test.cc): a fixture
// with a scratch directory and writers of .npy problems.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "common/compare.h"
#include "common/layer_problem.h"
#include "common/problem.h"
#include "npy.h"

#ifndef GDN_CLI_PATH
#error "GDN_CLI_PATH must name the gdn executable"
#endif

namespace gdn::cli_test {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string output;  // stdout and stderr
};

// Runs the tool with `args` (shell words), its stdout and stderr together; `environment`
// ("NAME=value ...") is set for the tool alone.
inline Result gdn_cli(const std::string& args, const std::string& environment = "") {
  const std::string command = environment + " '" + GDN_CLI_PATH + "' " + args + " 2>&1";
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

// gdn_cli in a child process with a file size limit of `file_size` bytes (RLIMIT_FSIZE, which
// holds for root too), as `ulimit -f` in a shell sets it: SIGXFSZ at its default, which kills a
// process that writes past the limit unless it ignores the signal (the tool does, so that the
// write fails with EFBIG as on a full disk), killed by SIGALRM after `seconds` (a tool that
// blocks, e.g. on a FIFO, fails the test instead of hanging it). code is -1 when it was killed.
inline Result gdn_cli_limited(const std::string& args, rlim_t file_size, unsigned seconds) {
  const std::string command = std::string("exec '") + GDN_CLI_PATH + "' " + args;
  Result r;
  int out[2];
  if (pipe(out) != 0) return r;
  const pid_t pid = fork();
  if (pid == 0) {  // only async-signal-safe calls until exec
    dup2(out[1], 1);
    dup2(out[1], 2);
    close(out[0]);
    close(out[1]);
    signal(SIGXFSZ, SIG_DFL);
    const struct rlimit limit = {file_size, file_size};
    setrlimit(RLIMIT_FSIZE, &limit);
    alarm(seconds);  // kept across exec
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  std::array<char, 4096> buf{};
  ssize_t n = 0;
  while ((n = read(out[0], buf.data(), buf.size())) > 0) {
    r.output.append(buf.data(), static_cast<std::size_t>(n));
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
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

}  // namespace gdn::cli_test
