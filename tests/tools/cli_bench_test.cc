// cli_bench_test.cc: the gdn tool's plan and bench commands (their tables, JSON lines and the
// suite's plot) and the plot writer alone.
#include <cstring>
#include <fstream>
#include <iterator>

#include "cli_fixture.h"
#include "svg_plot.h"

namespace gdn {
namespace {

using cli_test::Cli;
using cli_test::gdn_cli;
using cli_test::Result;
namespace fs = std::filesystem;

const std::string kWarned = ": the host was too busy to trust these timings (";

// The noise verdict (tools/gdn/bench_noise.h) in a run's output. A test host may be busy or
// not, so what holds either way: every JSON line carries a "noise" member with its verdict (and
// the member ends the line's fields before any stages_ms), and the WARN line is there exactly
// when a line says noisy. Returns the number of JSON lines.
int expect_noise_in_json(const std::string& output, const std::string& tool) {
  int lines = 0, noisy = 0;
  for (std::size_t at = output.find("{\"op\": "); at != std::string::npos;
       at = output.find("{\"op\": ", at + 1)) {
    const std::string line = output.substr(at, output.find('\n', at) - at);
    const std::string member = ", \"noise\": {\"noisy\": ";
    const std::size_t noise = line.find(member);
    EXPECT_NE(noise, std::string::npos) << line;
    if (noise != std::string::npos) {
      const std::string verdict = line.substr(noise + member.size(), 5);
      EXPECT_TRUE(verdict == "true," || verdict == "false") << line;
      noisy += verdict == "true,";
      for (const char* field :
           {"\"why\": \"", "\"median_over_min\": ", "\"max_over_min\": ", "\"cpu_wait\": ",
            "\"peak_before_gflops\": ", "\"peak_after_gflops\": "}) {
        EXPECT_NE(line.find(field, noise), std::string::npos) << field << " missing in " << line;
      }
    }
    ++lines;
  }
  const bool warned = output.find("WARN: " + tool + kWarned) != std::string::npos;
  EXPECT_EQ(warned, noisy > 0) << output;
  return lines;
}

// The same for a table: rows marked "  noisy" exactly when the WARN line is there.
void expect_noise_in_table(const std::string& output, const std::string& tool) {
  const bool marked = output.find("  noisy\n") != std::string::npos;
  const bool warned = output.find("WARN: " + tool + kWarned) != std::string::npos;
  EXPECT_EQ(warned, marked) << output;
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
    expect_noise_in_table(timed.output, "gdn plan --time");
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
// GDN_SPIN_US is read once per process: a bad value fails the first call that would start
// helpers, naming the variable, what it takes and what it was given; one thread needs none.
TEST_F(Cli, BadSpinTimeIsAClearErrorOnlyForCallsWithHelpers) {
  const std::string step = "bench --op step --preset decode-64 --repeats 1 --threads ";
  const Result two = gdn_cli(step + "2", "GDN_SPIN_US=fast");
  EXPECT_NE(two.code, 0) << two.output;
  EXPECT_NE(two.output.find("GDN_SPIN_US: expected a whole number of microseconds from 0 to "
                            "1000000, given 'fast'"),
            std::string::npos)
      << two.output;
  const Result one = gdn_cli(step + "1", "GDN_SPIN_US=fast");
  EXPECT_EQ(one.code, 0) << one.output;
  const Result zero = gdn_cli(step + "2", "GDN_SPIN_US=0");
  EXPECT_EQ(zero.code, 0) << zero.output;
}

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
  EXPECT_EQ(expect_noise_in_json(run.output, "gdn bench"), 6);
}

// --cases names single cases (bench/contention.py times only the forward without residuals
// and the backward from all of them); each picked case runs, checked, and no other; a name
// that is no case is a usage error that names it.
TEST_F(Cli, BenchCasesPicksSingleCasesByName) {
  const Result run = gdn_cli(
      "bench --tokens 130 --hk 2 --hv 4 --dk 32 --dv 16 --repeats 1 --json "
      "--cases forward-none,backward-all");
  ASSERT_EQ(run.code, 0) << run.output;
  // "op residuals" of each JSON line, in order.
  auto string_field = [](const std::string& line, const std::string& key) {
    const std::size_t at = line.find("\"" + key + "\": \"") + key.size() + 5;
    return line.substr(at, line.find('"', at) - at);
  };
  std::vector<std::string> rows;
  for (std::size_t at = 0; (at = run.output.find("{\"op\": ", at)) != std::string::npos; ++at) {
    const std::string line = run.output.substr(at, run.output.find('}', at) - at);
    rows.push_back(string_field(line, "op") + " " + string_field(line, "residuals"));
  }
  EXPECT_EQ(rows, (std::vector<std::string>{"forward none", "backward-all all"})) << run.output;
  EXPECT_EQ(expect_noise_in_json(run.output, "gdn bench"), 2);

  const Result recurrent = gdn_cli(
      "bench --tokens 70 --hk 1 --hv 1 --dk 16 --dv 16 --repeats 1 --json --cases recurrent");
  ASSERT_EQ(recurrent.code, 0) << recurrent.output;
  EXPECT_NE(recurrent.output.find("\"impl\": \"recurrent\""), std::string::npos);
  EXPECT_EQ(recurrent.output.find("\"impl\": \"chunked\""), std::string::npos);

  for (const char* cases : {"forward-chunked", "forward,", "backward-al"}) {
    const Result bad = gdn_cli(std::string("bench --tokens 70 --cases ") + cases);
    EXPECT_EQ(bad.code, 2) << cases << ": " << bad.output;
    EXPECT_NE(bad.output.find("option '--cases': expected all, forward, backward or case names"),
              std::string::npos)
        << cases << ": " << bad.output;
    EXPECT_NE(bad.output.find(std::string("given '") + cases + "'"), std::string::npos)
        << bad.output;
  }
}

// The table of `gdn bench` and its --help say what the noise verdict means.
TEST_F(Cli, BenchTableMarksNoisyRowsAndHelpGivesTheThresholds) {
  const Result run =
      gdn_cli("bench --tokens 130 --hk 2 --hv 4 --dk 32 --dv 16 --repeats 3 --cases forward");
  ASSERT_EQ(run.code, 0) << run.output;
  expect_noise_in_table(run.output, "gdn bench");
  for (const char* command : {"bench", "bench --op layer", "bench --op conv", "bench --op step",
                              "bench --suite", "plan"}) {
    const Result help = gdn_cli(std::string(command) + " --help");
    ASSERT_EQ(help.code, 0) << command;
    for (const char* text : {"Noise: a case is marked noisy", "more than 1.25x its fastest",
                             "waited for a CPU more than 10%", "differs by more than 15%"}) {
      EXPECT_NE(help.output.find(text), std::string::npos) << command << ": " << text;
    }
  }
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
  EXPECT_EQ(expect_noise_in_json(layer.output, "gdn bench --op layer"), 4);
  EXPECT_EQ(expect_noise_in_json(conv.output, "gdn bench --op conv"), 4);
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
  EXPECT_EQ(expect_noise_in_json(run.output, "gdn bench --op step"), 3);
  EXPECT_EQ(run.output.find("FAIL"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("PASS"), std::string::npos) << run.output;
  const Result bad = gdn_cli("bench --op step --preset decode-3");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("'--preset'"), std::string::npos) << bad.output;
}

// The step benchmark comparing bf16 and float32 pools in one run, bf16 activations: both
// checks pass, the text table has a row per pools, and the speed-up line names each preset;
// in JSON, two lines per preset, the bf16 one with the speed-up, the float32 one with null.
TEST_F(Cli, BenchStepComparesPoolsInAlternatingRounds) {
  const std::string step =
      "bench --op step --hk 1 --hv 2 --dk 16 --dv 32 --preset decode-1,decode-16 --repeats 2 "
      "--threads 1 --dtype bf16 --pools f32,bf16 --rounds 2";
  const Result text = gdn_cli(step);
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_NE(text.output.find("bf16 activations, f32,bf16 pools"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("2 rounds of 2 repeats"), std::string::npos) << text.output;
  EXPECT_EQ(text.output.find("FAIL"), std::string::npos) << text.output;
  for (const char* row : {"decode-16         f32", "decode-16         bf16",
                          "bf16 pools against float32 pools, same run, 2 alternating rounds"}) {
    EXPECT_NE(text.output.find(row), std::string::npos) << row << " missing in " << text.output;
  }
  const std::size_t speedups = text.output.find("speed-up = float32 median / bf16 median");
  ASSERT_NE(speedups, std::string::npos) << text.output;
  for (const char* preset : {"decode-1 ", "decode-16 "}) {
    EXPECT_NE(text.output.find(preset, speedups), std::string::npos) << text.output;
  }

  const Result json = gdn_cli(step + " --json");
  ASSERT_EQ(json.code, 0) << json.output;
  for (const char* field :
       {"\"preset\": \"decode-16\", \"model\": \"custom\", \"dtype\": \"bf16\", \"pools\": \"f32\"",
        "\"preset\": \"decode-16\", \"model\": \"custom\", \"dtype\": \"bf16\", \"pools\": "
        "\"bf16\"",
        "\"rounds\": 2", "\"speedup_vs_f32_pools\": null"}) {
    EXPECT_NE(json.output.find(field), std::string::npos) << field << " missing in " << json.output;
  }
  std::size_t at = 0;
  int lines = 0, with_speedup = 0;
  while ((at = json.output.find("{\"op\": ", at)) != std::string::npos) {
    const std::size_t end = json.output.find('}', at);
    ASSERT_NE(end, std::string::npos) << json.output;
    const std::string line = json.output.substr(at, end - at);
    const bool bf16_pools = line.find("\"pools\": \"bf16\"") != std::string::npos;
    const bool null_speedup = line.find("\"speedup_vs_f32_pools\": null") != std::string::npos;
    EXPECT_EQ(bf16_pools, !null_speedup) << line;
    with_speedup += bf16_pools ? 1 : 0;
    ++lines;
    at = end;
  }
  EXPECT_EQ(lines, 4) << json.output;
  EXPECT_EQ(with_speedup, 2) << json.output;
  const Result bad = gdn_cli("bench --op step --pools f16");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("'--pools'"), std::string::npos) << bad.output;
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
  EXPECT_EQ(expect_noise_in_json(run.output, "gdn bench --suite"), 52);
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
