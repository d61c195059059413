// bench_cases.h: the measured cases of `gdn bench` (the core: forward and backward under each
// remat policy, bench_command.cc) and the decode batches of `gdn bench --op step`
// (bench_step.cc), callable in-process so that `gdn bench --suite` (bench_suite.cc) runs them
// with the same checks and the same JSON lines.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_noise.h"
#include "bench_util.h"
#include "gdn/gdn.h"

namespace gdn::cli {

// One problem shape and the way to run `gdn bench`'s cases on it.
struct CoreBenchConfig {
  std::int64_t tokens = 8192, seqs = 1, hk = 16, hv = 32, dk = 128, dv = 128;
  int chunk = 64, repeats = 5, threads = 1;
  CpuIsa isa = CpuIsa::generic;
  DType dtype = DType::f32;  // activations: f32, bf16 or f16 (gates, states: float32)
  MatmulPrecision matmul = MatmulPrecision::compute;  // of the chunked cases' products
  std::string cases = "all";                          // all, forward, backward or case names
  bool json = false;                                  // one JSON line per case on stdout
  bool table = true;         // the table and the ratios on stdout (when not json)
  std::FILE* info = stdout;  // the peak and check lines
  double peak_gflops = 0;    // the fp32 FMA peak; 0: measure it (and say so on `info`)
  bool breakdown = false;    // one more run of each chunked case, profiled stage by stage
  // Judges each case (bench_noise.h); null: a watch of the run's own, whose WARN line ends
  // the run on `info`. A caller that passes one prints the WARN line itself, and has started
  // it (NoiseWatch::start) when it also passes peak_gflops.
  NoiseWatch* noise = nullptr;
};

// One measured case.
struct CoreCaseResult {
  std::string op, impl, residuals;  // op: forward or backward; residuals: all, t_inv or none
  Timing timing;                    // with the case's peak RSS
  double flops = 0, us_per_token_head = 0, gflops = 0, peak_gflops = 0, check_error = 0;
  std::int64_t residual_bytes = 0;
  NoiseFigures noise;  // the case's figures of noise and their verdict (bench_noise.h)
  NoiseVerdict verdict;
  // With config.breakdown, chunked cases only: ms per stage (src/cpu/profile.h, summed over
  // threads) of one more run, and that run's wall time; empty otherwise.
  std::vector<double> stage_ms;
  double profiled_ms = 0;
};

// Checks and times the cases; 0, or 1 when a check failed (said on stderr).
int run_core_bench(const CoreBenchConfig& config, std::vector<CoreCaseResult>* results);

// One decode-only serving step (gdn::fused_gdn_step, conv K = 4): `batch` sequences of one
// token each, with a history, at the given head shape.
struct DecodeBenchConfig {
  std::int64_t batch = 1, hk = 16, hv = 32, dk = 128, dv = 128;
  int repeats = 20, threads = 1;
  CpuIsa isa = CpuIsa::generic;
  std::FILE* info = stdout;     // the check line
  NoiseWatch* noise = nullptr;  // judges the step (bench_noise.h); null: not judged
};

struct DecodeBenchResult {
  Timing timing;  // with the peak RSS of making, checking and timing the step
  double check_error = 0, gbps = 0, copy_gbps = 0, tokens_per_s = 0;
  std::int64_t bytes = 0, slots = 0;
  NoiseFigures noise;  // with config.noise: the step's figures of noise and their verdict
  NoiseVerdict verdict;
};

// Checks and times the step (and the copy of its states, the floor); 0, or 1 when the check
// failed (said on stderr).
int run_decode_bench(const DecodeBenchConfig& config, DecodeBenchResult* result);

// The breakdown of a profiled case (bench_breakdown.cc). One row per stage that took time:
// what it does, its ms, the cost-model FLOPs of the matrix products it runs (0 for the other
// stages) and the bytes it reads or writes in the caller's tensors (0 for in-cache stages).
struct StageRow {
  const char* name;
  const char* what;
  double ms = 0, flops = 0, bytes = 0;
};
std::vector<StageRow> stage_rows(const CoreBenchConfig& config, const CoreCaseResult& result);

// The share of the peak the case's matrix products reach: their FLOPs over their stages' time
// (a fraction; 0 without a breakdown).
double products_fraction_of_peak(const std::vector<StageRow>& rows, double peak_gflops);

// The breakdown as a table on `out`, and as a JSON object (stage name: ms) for the case's line.
void print_breakdown(std::FILE* out, const CoreBenchConfig& config, const CoreCaseResult& result);
std::string breakdown_json(const CoreCaseResult& result);

}  // namespace gdn::cli
