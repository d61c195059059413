// cli_files_test.cc: what the gdn tool does with files. Every command puts all of its outputs
// in place together, whole, or none of them: a write that fails midway (here at a file size
// limit, which holds for root too) leaves every file as it was, readable, and no temporary
// file behind. An input that is not a regular file (a FIFO) is refused at once. float16 .npy
// files are read. Errors speak the command line's names (flags and files), not the library's.
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>

#include "cli_fixture.h"

namespace gdn {
namespace {

using cli_test::Cli;
using cli_test::gdn_cli;
using cli_test::gdn_cli_limited;
using cli_test::Result;
namespace fs = std::filesystem;

// Every file of a directory (names, hidden ones too) and its bytes.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    files[entry.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  return files;
}

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

// The case: `gdn step` with --out = --in, its last file (recurrent_state.npy, 20608
// bytes) past a 16 KiB file size limit that out.npy (4480) and conv_state.npy (11648) are
// under. Before, conv_state.npy was already advanced and recurrent_state.npy truncated and
// unreadable; now every file is as it was, and the same step without the limit still runs.
TEST_F(Cli, StepInPlaceKeepsBothPoolsWhenAWriteFailsMidway) {
  write_step_inputs();
  const std::string step = "step --in " + quoted(dir_ / "in") + " --out " + quoted(dir_ / "in") +
                           kHeads + " --num-spec 2 --quiet";
  ASSERT_EQ(gdn_cli(step).code, 0);  // the pools in `in` are now a step's output
  const auto before = snapshot(dir_ / "in");
  const Result failed = gdn_cli_limited(step, 16384, 60);
  EXPECT_EQ(failed.code, 1) << failed.output;
  EXPECT_NE(failed.output.find("recurrent_state.npy: write failed (File too large); no output "
                               "file was changed"),
            std::string::npos)
      << failed.output;
  EXPECT_TRUE(snapshot(dir_ / "in") == before) << "a file changed, or a temporary file is left";
  for (const char* name : {"out.npy", "conv_state.npy", "recurrent_state.npy"}) {
    EXPECT_NO_THROW(npy::load(path(std::string("in/") + name))) << name;
  }
  ASSERT_EQ(gdn_cli(step).code, 0);
  EXPECT_NE(snapshot(dir_ / "in")["recurrent_state.npy"], before.at("recurrent_state.npy"));
}

// Every command that writes .npy files, with a file size limit one byte under its largest
// output: the files it would replace (sentinels here) are all as they were, and nothing else
// is left in the directory. Without the limit the same command runs.
TEST_F(Cli, EveryCommandWritesAllItsFilesOrNone) {
  struct Case {
    std::string args;
    std::function<void()> inputs;
  };
  const std::vector<Case> cases = {
      {"forward --l2norm --residuals", [&] { write_inputs(); }},
      {"backward --l2norm",
       [&] {
         const test::Problem p = write_inputs();
         npy::save(path("in/do.npy"), test::make_cotangents(p, 31).d_o);
       }},
      {std::string("layer-forward --residuals") + kHeads, [&] { write_layer_inputs(); }},
      {std::string("layer-backward") + kHeads, [&] { write_layer_inputs(); }},
      {std::string("step --num-spec 2") + kHeads, [&] { write_step_inputs(); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "in");
    c.inputs();
    const Result full = gdn_cli(c.args + " " + io("full"));
    ASSERT_EQ(full.code, 0) << full.output;
    std::uintmax_t largest = 0;
    fs::create_directories(dir_ / "out");
    Tensor sentinel(DType::f32, {1});
    sentinel.data<float>()[0] = 7.0f;
    for (const auto& entry : fs::directory_iterator(dir_ / "full")) {
      largest = std::max(largest, fs::file_size(entry.path()));
      npy::save((dir_ / "out" / entry.path().filename()).string(), sentinel);
    }
    const auto before = snapshot(dir_ / "out");
    const Result failed =
        gdn_cli_limited(c.args + " " + io("out"), static_cast<rlim_t>(largest - 1), 60);
    EXPECT_EQ(failed.code, 1) << failed.output;
    EXPECT_NE(failed.output.find("write failed (File too large); no output file was changed"),
              std::string::npos)
        << failed.output;
    EXPECT_TRUE(snapshot(dir_ / "out") == before) << "a file changed, or a temporary file is left";
    const Result again = gdn_cli(c.args + " " + io("out"));
    ASSERT_EQ(again.code, 0) << again.output;
    EXPECT_TRUE(snapshot(dir_ / "out") == snapshot(dir_ / "full"));
  }
}

// A FIFO where an input file belongs (a required one, an optional one, a step's pool) is
// refused at once with what it is; before, the tool waited for a writer forever (here it would
// be killed after 20 s and the test fail).
TEST_F(Cli, FifoInputIsRefusedAtOnce) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"forward", "q.npy"},
      {"forward", "h0.npy"},
      {std::string("step --num-spec 2") + kHeads, "conv_state.npy"},
  };
  for (const auto& [command, file] : cases) {
    SCOPED_TRACE(command + ", " + file);
    if (command == "forward") {
      write_inputs();
    } else {
      write_step_inputs();
    }
    fs::remove(dir_ / "in" / file);
    ASSERT_EQ(mkfifo((dir_ / "in" / file).c_str(), 0600), 0);
    const auto start = std::chrono::steady_clock::now();
    const Result run = gdn_cli_limited(command + " " + io(), RLIM_INFINITY, 20);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(run.code, 1) << run.output;
    EXPECT_NE(run.output.find(file + ": expected a regular .npy file, given a FIFO"),
              std::string::npos)
        << run.output;
    EXPECT_LT(seconds, 10.0);
    EXPECT_FALSE(fs::exists(dir_ / "out")) << "outputs written despite a bad input";
    fs::remove(dir_ / "in" / file);
  }
}

// An output path that is a symbolic link is written through: the file it names is replaced
// whole by the new contents and the link stays a link (a rename over the link would have made
// it a regular file and left its target stale). An --out that exists and is not a directory is
// refused in the option's name, before a file is written.
TEST_F(Cli, OutputLinksAreWrittenThroughAndOutMustBeADirectory) {
  write_step_inputs();
  const std::string step = std::string("step --num-spec 2 --quiet") + kHeads;
  ASSERT_EQ(gdn_cli(step + " " + io("full")).code, 0);
  fs::create_directories(dir_ / "elsewhere");
  fs::create_directories(dir_ / "out");
  Tensor sentinel(DType::f32, {1});
  sentinel.data<float>()[0] = 7.0f;
  npy::save(path("elsewhere/recurrent_state.npy"), sentinel);
  fs::create_symlink("../elsewhere/recurrent_state.npy", dir_ / "out" / "recurrent_state.npy");
  const Result run = gdn_cli(step + " " + io("out"));
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_TRUE(fs::is_symlink(dir_ / "out" / "recurrent_state.npy"));
  EXPECT_EQ(snapshot(dir_ / "elsewhere"),
            (std::map<std::string, std::string>{
                {"recurrent_state.npy", snapshot(dir_ / "full").at("recurrent_state.npy")}}))
      << "the link's target is not the new file, or a temporary file is left beside it";
  EXPECT_EQ(snapshot(dir_ / "out"), snapshot(dir_ / "full"));

  { std::ofstream(dir_ / "afile") << "not a directory"; }
  const Result file =
      gdn_cli(step + " --in " + quoted(dir_ / "in") + " --out " + quoted(dir_ / "afile"));
  EXPECT_EQ(file.code, 1) << file.output;
  EXPECT_NE(file.output.find("option '--out': expected a directory (made if missing), given '" +
                             (dir_ / "afile").string() + "', which is not one"),
            std::string::npos)
      << file.output;
}

// float16 where the op takes 16-bit activations (q, k, v; qkv, a, b): read from '<f2' files,
// run as the library runs them, out written as '<f2'.
Tensor to_f16(const Tensor& t) {
  Tensor h(DType::f16, t.rank(), t.sizes());
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    static_cast<std::uint16_t*>(h.raw())[i] = f16_bits(static_cast<float>(test::value_at(t, i)));
  }
  return h;
}

TEST_F(Cli, Float16InputsAreRead) {
  test::Problem p = write_inputs();
  p.q = to_f16(p.q);
  p.k = to_f16(p.k);
  p.v = to_f16(p.v);
  for (const auto& [name, t] : {std::pair{"q", &p.q}, std::pair{"k", &p.k}, std::pair{"v", &p.v}}) {
    npy::save(path(std::string("in/") + name + ".npy"), *t);
  }
  const Result run = gdn_cli("forward " + io() + " --l2norm");
  ASSERT_EQ(run.code, 0) << run.output;
  const ForwardResult expected = chunk_gated_delta_rule_fwd(p.inputs(), p.options());
  const Tensor o = npy::load(path("out/o.npy"));
  EXPECT_EQ(o.dtype(), DType::f16);
  EXPECT_TRUE(test::bit_identical(o, expected.o, "o.npy"));
  EXPECT_TRUE(test::bit_identical(npy::load(path("out/ht.npy")), expected.final_state, "ht.npy"));

  StepFiles f = write_step_inputs();
  f.tokens.qkv = to_f16(f.tokens.qkv);
  f.tokens.a = to_f16(f.tokens.a);
  f.tokens.b = to_f16(f.tokens.b);
  npy::save(path("in/qkv.npy"), f.tokens.qkv);
  npy::save(path("in/a.npy"), f.tokens.a);
  npy::save(path("in/b.npy"), f.tokens.b);
  Tensor conv = copy_of(f.pools.conv_state, DType::f32);
  Tensor state = copy_of(f.pools.recurrent_state, DType::f32);
  const Tensor out =
      fused_gdn_step(f.inputs(), {conv.mutable_view(), state.mutable_view()}, f.options());
  const Result step = gdn_cli("step " + io("step") + kHeads + " --num-spec 2");
  ASSERT_EQ(step.code, 0) << step.output;
  EXPECT_EQ(npy::load(path("step/out.npy")).dtype(), DType::f16);
  EXPECT_TRUE(test::bit_identical(npy::load(path("step/out.npy")), out, "step out.npy"));
  EXPECT_TRUE(test::bit_identical(npy::load(path("step/recurrent_state.npy")), state,
                                  "step recurrent_state.npy"));
  const Result ref = gdn_cli("step " + io("ref") + kHeads + " --num-spec 2 --reference");
  ASSERT_EQ(ref.code, 0) << ref.output;
  EXPECT_TRUE(test::within(npy::load(path("step/out.npy")), npy::load(path("ref/out.npy")), 2e-3,
                           "float16 step vs the float64 reference on the same inputs"));
}

// Errors in the command line's names: an option the library rejects is reported as its flag
// with the text given to it (never "options.scale"), library option names inside the message
// as flags, and an integer activation file is told what the .npy reader and the op take.
TEST_F(Cli, ErrorsNameTheFlagsAndFilesTheUserGave) {
  const test::Problem p = write_inputs();
  npy::save(path("in/do.npy"), test::make_cotangents(p, 31).d_o);
  for (const char* command : {"forward", "backward"}) {
    const Result scale = gdn_cli(std::string(command) + " " + io() + " --scale 1e39");
    EXPECT_EQ(scale.code, 2) << command;
    EXPECT_NE(scale.output.find("option '--scale': expected a finite number representable in "
                                "float32, given '1e39'"),
              std::string::npos)
        << scale.output;
    EXPECT_EQ(scale.output.find("options."), std::string::npos) << scale.output;
  }
  const Result matmul = gdn_cli("forward " + io() + " --algorithm recurrent --matmul bf16");
  EXPECT_EQ(matmul.code, 2);
  EXPECT_NE(matmul.output.find("option '--matmul': expected compute with --algorithm"),
            std::string::npos)
      << matmul.output;
  EXPECT_EQ(matmul.output.find("options."), std::string::npos) << matmul.output;

  // A variant the build or the CPU cannot run, before any work.
  for (const CpuIsa isa : {CpuIsa::avx512, CpuIsa::avx512_bf16}) {
    const char* why = cpu_isa_unavailable_reason(isa);
    if (why == nullptr) continue;
    const std::string name = cpu_isa_name(isa);
    const Result variant = gdn_cli("forward " + io() + " --isa " + name);
    EXPECT_EQ(variant.code, 2);
    EXPECT_NE(variant.output.find("option '--isa': expected a variant this build runs on this "
                                  "CPU (auto, generic"),
              std::string::npos)
        << variant.output;
    EXPECT_NE(variant.output.find("given '" + name + "' (" + why + ")"), std::string::npos)
        << variant.output;
  }

  const char* const kDtype =
      "expected dtype float32, float64 or float16 (.npy <f4, <f8 or <f2), given int32 (<i4)";
  npy::save(path("in/q.npy"), Tensor(DType::i32, {103, 2, 16}));
  const Result q = gdn_cli("forward " + io());
  EXPECT_EQ(q.code, 1);
  EXPECT_NE(q.output.find(std::string("q.npy (q)': ") + kDtype), std::string::npos) << q.output;

  write_layer_inputs();
  const Result group = gdn_cli("layer-forward " + io() + " --hk 3 --hv 4 --dk 16 --dv 8");
  EXPECT_EQ(group.code, 2);
  EXPECT_NE(group.output.find("option '--hv'"), std::string::npos) << group.output;
  EXPECT_EQ(group.output.find("options."), std::string::npos) << group.output;
  npy::save(path("in/qkv.npy"), Tensor(DType::i32, {47, 96}));
  const Result layer = gdn_cli("layer-forward " + io() + kHeads);
  EXPECT_EQ(layer.code, 1);
  EXPECT_NE(layer.output.find(std::string("qkv.npy (qkv)': ") + kDtype), std::string::npos)
      << layer.output;

  write_step_inputs();
  npy::save(path("in/qkv.npy"), Tensor(DType::i32, {34, 96}));
  for (const char* reference : {"", " --reference"}) {
    const Result step = gdn_cli("step " + io() + kHeads + " --num-spec 2" + reference);
    EXPECT_EQ(step.code, 1);
    EXPECT_NE(step.output.find(std::string("qkv.npy (qkv)': ") + kDtype), std::string::npos)
        << step.output;
  }
}

}  // namespace
}  // namespace gdn
