// bench_noise_test.cc: the verdict `gdn bench` and `gdn plan --time` give on a host's noise
// (tools/gdn/bench_noise.h), on synthetic figures: quiet runs pass, each sign of a busy host
// alone makes a case noisy and says why with its figures, and the JSON member carries both.
#include "bench_noise.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_util.h"

namespace gdn::cli {
namespace {

// A quiet run of the default benchmark on the development machine (docs/perf.md: forward
// chunked, 119.43 ms (118.31 - 139.74), 5 repeats; peak 466.5 GFLOP/s).
NoiseFigures quiet() {
  NoiseFigures f;
  f.min_ms = 118.31;
  f.median_ms = 119.43;
  f.max_ms = 139.74;
  f.repeats = 5;
  f.cpu_wait = 0.004;
  f.peak_before = 466.5;
  f.peak_after = 461.0;
  return f;
}

bool mentions(const NoiseVerdict& v, const std::string& text) {
  return v.why().find(text) != std::string::npos;
}

TEST(BenchNoise, QuietRunIsNotNoisy) {
  const NoiseVerdict v = judge_noise(quiet());
  EXPECT_FALSE(v.noisy) << v.why();
  EXPECT_TRUE(v.reasons.empty());
}

// The busy host of issue 33: repeats from 593 to 1521 ms.
TEST(BenchNoise, RepeatsSpreadTwoAndAHalfTimesIsNoisy) {
  NoiseFigures f = quiet();
  f.min_ms = 593;
  f.median_ms = 640;
  f.max_ms = 1521;
  const NoiseVerdict v = judge_noise(f);
  EXPECT_TRUE(v.noisy);
  ASSERT_EQ(v.reasons.size(), 1u) << v.why();
  EXPECT_TRUE(mentions(v, "593.000 to 1521.000 ms (2.56x")) << v.why();
}

TEST(BenchNoise, MedianFarAboveTheFastestIsNoisy) {
  NoiseFigures f = quiet();
  f.median_ms = 1.3 * f.min_ms;
  f.max_ms = 1.4 * f.min_ms;
  const NoiseVerdict v = judge_noise(f);
  EXPECT_TRUE(v.noisy);
  EXPECT_TRUE(mentions(v, "the median repeat took 1.30x the fastest")) << v.why();
}

// Below 1 ms one interrupt can double a single repeat: only the median counts there.
TEST(BenchNoise, OneSlowRepeatOfAShortCaseIsNotNoisy) {
  NoiseFigures f = quiet();
  f.min_ms = 0.110;
  f.median_ms = 0.118;
  f.max_ms = 3.35;
  f.repeats = 20;
  EXPECT_FALSE(judge_noise(f).noisy) << judge_noise(f).why();
  f.min_ms = 1.10;  // the same shape at 1.1 ms: the spread counts
  f.median_ms = 1.18;
  f.max_ms = 33.5;
  EXPECT_TRUE(judge_noise(f).noisy);
}

TEST(BenchNoise, ThreadsWaitingForACpuIsNoisy) {
  NoiseFigures f = quiet();
  f.cpu_wait = 0.45;
  const NoiseVerdict v = judge_noise(f);
  EXPECT_TRUE(v.noisy);
  EXPECT_TRUE(mentions(v, "waited for a CPU 45% of the time")) << v.why();
  f.cpu_wait = kNoisyCpuWait;  // at the limit: still quiet
  EXPECT_FALSE(judge_noise(f).noisy);
}

// The other busy host of issue 33: a peak of 48 GFLOP/s where a quiet run measures 466.
TEST(BenchNoise, PeakChangingAcrossTheCaseIsNoisy) {
  NoiseFigures f = quiet();
  f.peak_after = 48;
  NoiseVerdict v = judge_noise(f);
  EXPECT_TRUE(v.noisy);
  EXPECT_TRUE(mentions(v, "466.5 GFLOP/s before and 48.0 after")) << v.why();
  f.peak_before = 48;  // a rise counts the same
  f.peak_after = 466.5;
  EXPECT_TRUE(judge_noise(f).noisy);
}

TEST(BenchNoise, UnknownFiguresAreNotJudged) {
  NoiseFigures f;
  f.min_ms = f.median_ms = f.max_ms = 5;
  f.repeats = 1;  // one repeat has no spread; CPU wait and peaks unknown
  EXPECT_FALSE(judge_noise(f).noisy);
  const std::string json = noise_json(f, judge_noise(f));
  EXPECT_EQ(json,
            "\"noise\": {\"noisy\": false, \"why\": \"\", \"median_over_min\": null, "
            "\"max_over_min\": null, \"cpu_wait\": null, \"peak_before_gflops\": null, "
            "\"peak_after_gflops\": null}");
}

TEST(BenchNoise, JsonCarriesTheVerdictAndTheFigures) {
  NoiseFigures f = quiet();
  f.cpu_wait = 0.5;
  const std::string json = noise_json(f, judge_noise(f));
  EXPECT_NE(json.find("\"noisy\": true"), std::string::npos) << json;
  EXPECT_NE(json.find("\"why\": \"its threads waited for a CPU 50%"), std::string::npos) << json;
  EXPECT_NE(json.find("\"cpu_wait\": 0.5000"), std::string::npos) << json;
  EXPECT_NE(json.find("\"peak_before_gflops\": 466.50"), std::string::npos) << json;
}

TEST(BenchNoise, BaselineVerdictIsTakenIn) {
  NoiseVerdict v = judge_noise(quiet());
  NoiseFigures busy = quiet();
  busy.cpu_wait = 0.3;
  v.add("its baseline", judge_noise(busy));
  EXPECT_TRUE(v.noisy);
  EXPECT_TRUE(mentions(v, "its baseline: its threads waited")) << v.why();
}

// The watch without peak checks judges each case from its timing, and its WARN line names
// the noisy case and counts them.
TEST(BenchNoise, WatchWarnsOnlyAfterANoisyCase) {
  NoiseWatch watch(CpuIsa::generic);
  watch.start(1, 0);
  Timing t;
  t.min_ms = 10;
  t.median_ms = 10.2;
  t.max_ms = 11;
  t.repeats = 5;
  t.cpu_wait = 0.01;
  EXPECT_FALSE(watch.judge("quiet case", t).noisy);
  EXPECT_FALSE(watch.noisy());
  char* text = nullptr;
  std::size_t size = 0;
  std::FILE* out = open_memstream(&text, &size);
  watch.warn(out, "gdn bench");
  std::fclose(out);
  EXPECT_EQ(std::string(text, size), "");
  std::free(text);

  t.cpu_wait = 0.6;
  EXPECT_TRUE(watch.judge("busy case", t).noisy);
  out = open_memstream(&text, &size);
  watch.warn(out, "gdn bench");
  std::fclose(out);
  const std::string line(text, size);
  std::free(text);
  EXPECT_EQ(line.rfind("WARN: gdn bench: the host was too busy to trust these timings (1 of 2 "
                       "cases noisy): busy case: its threads waited for a CPU 60%",
                       0),
            0u)
      << line;
}

}  // namespace
}  // namespace gdn::cli
