// bench_breakdown.cc: where a chunked case's time goes, stage by stage (`gdn bench
// --breakdown`, and the targets section of `gdn bench --suite`): the per-stage times of one
// profiled run (src/cpu/profile.h) beside the cost-model FLOPs each stage's products do
// (bench/cost_model.h) and the bytes each reading or writing stage moves.
#include <cstdio>
#include <string>
#include <vector>

#include "bench/cost_model.h"
#include "bench_cases.h"
#include "cpu/profile.h"

namespace gdn::cli {

namespace {

const char* what_of(cpu::Stage s) {
  switch (s) {
    case cpu::Stage::states:
      return "initial/final states (bwd: dS in and out)";
    case cpu::Stage::pack_qk:
      return "read q, k; L2 norm; K^T (per key head)";
    case cpu::Stage::gram:
      return "[Q;K] K^T, lower triangles (per key head)";
    case cpu::Stage::pack_v:
      return "read v, g, beta; G, e^G";
    case cpu::Stage::kkt:
      return "decay masks: P, L (bwd: Gamma, B)";
    case cpu::Stage::solve:
      return "T^-1 by forward substitution";
    case cpu::Stage::residuals:
      return "chunk_states, t_inv: store (fwd), load (bwd)";
    case cpu::Stage::wy:
      return "[Q;K] S; V_new = T^-1 R";
    case cpu::Stage::output:
      return "O = e^G Q S + P V_new";
    case cpu::Stage::write_o:
      return "write o";
    case cpu::Stage::state:
      return "S = e^G_last S + K^T D V_new";
    case cpu::Stage::rebuild:
      return "rebuild chunk states (forward steps)";
    case cpu::Stage::recompute:
      return "K S, R, V_new";
    case cpu::Stage::read_do:
      return "read d_o";
    case cpu::Stage::values:
      return "K dS', dV_new, dR, [dP; dL]";
    case cpu::Stage::mst:
      return "M S^T";
    case cpu::Stage::gates:
      return "dbeta, dg; write dv";
    case cpu::Stage::dqk:
      return "dQ, dK products";
    case cpu::Stage::dstate:
      return "dS = e^G_last dS' + [Q;K]^T M";
    case cpu::Stage::write_dqk:
      return "L2-norm backward; write dq, dk";
    case cpu::Stage::layer_conv:
      return "layer: conv parameters and states";
    case cpu::Stage::layer_gates:
      return "layer: g, beta";
    case cpu::Stage::layer_conv_state:
      return "layer: the new conv states";
    case cpu::Stage::step_slots:
      return "step: states read from, written to slots";
    case cpu::Stage::count:
      break;
  }
  return "";
}

}  // namespace

std::vector<StageRow> stage_rows(const CoreBenchConfig& config, const CoreCaseResult& result) {
  std::vector<StageRow> rows;
  if (result.stage_ms.size() != static_cast<std::size_t>(cpu::kStageCount)) return rows;
  const double dk = static_cast<double>(config.dk), dv = static_cast<double>(config.dv);
  const double in = static_cast<double>(dtype_size(config.dtype));
  const bool forward = result.op == "forward";
  // Sums over every chunk of every sequence, per value head (hv) or per key head (hk).
  auto per = [&](std::int64_t heads, auto&& per_chunk) {
    return bench::over_chunks(config.tokens, config.seqs, heads, config.chunk, per_chunk);
  };
  auto flops = [&](double bench::StageFlops::*field, std::int64_t heads) {
    return per(heads, [&](double n) {
      const bench::StageFlops f =
          forward ? bench::forward_stage_flops(n, dk, dv) : bench::backward_stage_flops(n, dk, dv);
      return f.*field;
    });
  };
  const double tokens = static_cast<double>(config.tokens * config.seqs);
  const double chunks = per(1, [](double) { return 1.0; });  // chunks of all sequences
  const double c = static_cast<double>(config.chunk);
  for (int i = 0; i < cpu::kStageCount; ++i) {
    const auto s = static_cast<cpu::Stage>(i);
    StageRow r{cpu::stage_name(s), what_of(s), result.stage_ms[static_cast<std::size_t>(i)]};
    if (!(r.ms > 0)) continue;
    const auto hk = config.hk, hv = config.hv;
    switch (s) {
      case cpu::Stage::gram:
        r.flops = flops(&bench::StageFlops::gram, hk);
        break;
      case cpu::Stage::solve:
        r.flops = flops(&bench::StageFlops::solve, hv);
        break;
      case cpu::Stage::wy:
        r.flops = flops(&bench::StageFlops::wy, hv);
        break;
      case cpu::Stage::output:
        r.flops = flops(&bench::StageFlops::output, hv);
        break;
      case cpu::Stage::state:
        r.flops = flops(&bench::StageFlops::state, hv);
        break;
      case cpu::Stage::recompute:
        r.flops = flops(&bench::StageFlops::recompute, hv);
        break;
      case cpu::Stage::values:
        r.flops = flops(&bench::StageFlops::values, hv);
        break;
      case cpu::Stage::mst:
        r.flops = flops(&bench::StageFlops::mst, hv);
        break;
      case cpu::Stage::dqk:
        r.flops = flops(&bench::StageFlops::dqk, hv);
        break;
      case cpu::Stage::dstate:
        r.flops = flops(&bench::StageFlops::dstate, hv);
        break;
      case cpu::Stage::pack_qk:
        r.bytes = tokens * static_cast<double>(hk) * 2 * dk * in;
        break;
      case cpu::Stage::pack_v:
        r.bytes = tokens * static_cast<double>(hv) * (dv * in + 8);
        break;
      case cpu::Stage::write_o:
      case cpu::Stage::read_do:
        r.bytes = tokens * static_cast<double>(hv) * dv * in;
        break;
      case cpu::Stage::gates:
        r.bytes = tokens * static_cast<double>(hv) * (dv * in + 8);
        break;
      case cpu::Stage::write_dqk:
        // Writes dq and dk (the L2-norm backward reads the packed rows, not q and k).
        r.bytes = tokens * static_cast<double>(hk) * 2 * dk * in;
        break;
      case cpu::Stage::residuals:
        if (result.residuals == "all") {
          r.bytes = chunks * static_cast<double>(hv) * (dk * dv + c * c) * 4;
        } else if (result.residuals == "t_inv") {
          r.bytes = chunks * static_cast<double>(hv) * c * c * 4;
        }
        break;
      default:
        break;
    }
    rows.push_back(r);
  }
  return rows;
}

double products_fraction_of_peak(const std::vector<StageRow>& rows, double peak_gflops) {
  double flops = 0, ms = 0;
  for (const StageRow& r : rows) {
    if (r.flops > 0) {
      flops += r.flops;
      ms += r.ms;
    }
  }
  return ms > 0 && peak_gflops > 0 ? flops / (ms * 1e-3) * 1e-9 / peak_gflops : 0.0;
}

void print_breakdown(std::FILE* out, const CoreBenchConfig& config, const CoreCaseResult& result) {
  const std::vector<StageRow> rows = stage_rows(config, result);
  if (rows.empty()) return;
  double total = 0, product_ms = 0, product_flops = 0;
  for (const StageRow& r : rows) total += r.ms;
  const std::string name = result.op == "forward"
                               ? (result.residuals == "all" ? "forward +residuals" : "forward")
                               : "backward-" + result.residuals;
  std::fprintf(out,
               "\nwhere the time goes: %s, %lld tokens, %d thread%s, %s, C = %d (one profiled "
               "run: %.1f ms wall, stages sum %.1f ms%s; the timed median %.1f ms)\n",
               name.c_str(), static_cast<long long>(config.tokens * config.seqs), config.threads,
               config.threads == 1 ? "" : "s", dtype_name(config.dtype), config.chunk,
               result.profiled_ms, total, config.threads == 1 ? "" : " of CPU time",
               result.timing.median_ms);
  std::fprintf(out, "%-10s %-44s %10s %7s %9s %7s %8s\n", "stage", "what", "ms", "share", "GFLOP/s",
               "% peak", "GB/s");
  const double peak = result.peak_gflops;
  for (const StageRow& r : rows) {
    char gflops[32] = "-", pct[32] = "-", gbps[32] = "-";
    if (r.flops > 0) {
      const double g = r.flops / (r.ms * 1e-3) * 1e-9;
      std::snprintf(gflops, sizeof gflops, "%.1f", g);
      // Per thread: the stage times are CPU time, the peak is of all the threads.
      std::snprintf(pct, sizeof pct, "%.1f%%", 100 * g * config.threads / peak);
      product_ms += r.ms;
      product_flops += r.flops;
    }
    if (r.bytes > 0) std::snprintf(gbps, sizeof gbps, "%.2f", r.bytes / (r.ms * 1e-3) * 1e-9);
    std::fprintf(out, "%-10s %-44s %10.3f %6.1f%% %9s %7s %8s\n", r.name, r.what, r.ms,
                 100 * r.ms / total, gflops, pct, gbps);
  }
  if (product_ms > 0) {
    const double g = product_flops / (product_ms * 1e-3) * 1e-9;
    std::fprintf(out, "%-10s %-44s %10.3f %6.1f%% %9.1f %6.1f%% %8s\n", "products",
                 "the stages with matrix products, together", product_ms, 100 * product_ms / total,
                 g, 100 * g * config.threads / peak, "-");
  }
  std::fprintf(out,
               "GFLOP/s: cost-model FLOPs of a stage's products over its time (bench/"
               "cost_model.h); GB/s: bytes the stage reads or writes in the caller's tensors.\n");
}

std::string breakdown_json(const CoreCaseResult& result) {
  std::string json = "{";
  for (int i = 0; i < cpu::kStageCount && static_cast<std::size_t>(i) < result.stage_ms.size();
       ++i) {
    if (!(result.stage_ms[static_cast<std::size_t>(i)] > 0)) continue;
    char item[96];
    std::snprintf(item, sizeof item, "%s\"%s\": %.3f", json.size() > 1 ? ", " : "",
                  cpu::stage_name(static_cast<cpu::Stage>(i)),
                  result.stage_ms[static_cast<std::size_t>(i)]);
    json += item;
  }
  return json + "}";
}

}  // namespace gdn::cli
