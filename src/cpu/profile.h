// profile.h: where the time of the chunked forward and backward goes, stage by stage, and
// that of the fused layer op's forward and a serving step's prefills around them.
//
// While a StageProfile is installed (ScopedStageProfile), every work item reads a clock
// between its stages and adds the elapsed time to the stage's counter; with none installed
// (the default) the kernels only test a pointer per stage. The counters sum over threads (CPU
// time), so a profiled run on one thread adds up to its wall time. `gdn bench --breakdown` and
// `gdn bench --suite` print the breakdown (tools/gdn/bench_breakdown.cc).
//
// Not for concurrent calls: one profile at a time, installed around calls of one thread.
#pragma once

#include <atomic>
#include <cstdint>

namespace gdn::cpu {

// The stages, in the order of a forward and then a backward chunk (src/cpu/chunked_fwd-inl.h,
// src/cpu/chunked_bwd-inl.h say what each computes).
enum class Stage : int {
  states,     // initial and final states (forward), dS in and out (backward)
  pack_qk,    // read q, k of a chunk (the fused layer op: conv1d + SiLU of qkv), L2-normalise,
              // K^T (once per key head)
  gram,       // [Q;K] K^T (once per key head)
  pack_v,     // read v (the fused layer op: conv1d + SiLU of qkv), g, beta; G, e^G
  kkt,        // the decay masks: P, L (and Gamma, B in the backward)
  solve,      // T^-1 by forward substitution
  residuals,  // store (forward) or load (backward) chunk_states and t_inv
  wy,         // [Q;K] S and V_new = T^-1 R
  output,     // O = e^G Q S + P V_new
  write_o,    // write the chunk's o rows
  state,      // S = e^G_last S + K^T D V_new
  rebuild,    // backward without kept states: the forward steps that rebuild them
  recompute,  // backward: K S, U0, R and V_new
  read_do,    // backward: read the chunk's d_o rows
  values,     // backward: K dS', dV_new, dR, [dP; dL]
  mst,        // backward: M S^T
  gates,      // backward: dbeta, dg, dv (written)
  dqk,        // backward: the dQ, dK products
  dstate,     // backward: dS = e^G_last dS' + [Q;K]^T M
  write_dqk,  // backward: the L2-norm backward and writing dq, dk
  // The fused layer op's forward (src/api/layer.cc) and a serving step's prefills
  // (src/api/step.cc) around the gated delta rule, whose stages are the ones above.
  layer_conv,        // conv parameters and states in the kernel's layout (the conv1d + SiLU
                     // itself runs in pack_qk and pack_v)
  layer_gates,       // g and beta
  layer_conv_state,  // the new conv states
  step_slots,        // a step's prefills: start states read from and final states written to slots
  count,
};
inline constexpr int kStageCount = static_cast<int>(Stage::count);

// "pack_qk", ... (the enumerator's name).
const char* stage_name(Stage stage);

struct StageProfile {
  std::atomic<std::int64_t> ns[kStageCount] = {};
};

// The installed profile, or null.
StageProfile* active_stage_profile();

// Adds `ns` nanoseconds to `stage` of `profile` (out of line: the kernels' translation units,
// compiled with ISA flags, call it only while profiling).
void add_stage_time(StageProfile* profile, Stage stage, std::int64_t ns);

// A monotonic clock in nanoseconds.
std::int64_t stage_clock_ns();

// The layer op's and a step's clock (src/api): as the kernels' StageClock (profile-inl.h), out of
// line; with no profile installed a lap is one test of a pointer.
class StageLaps {
 public:
  StageLaps();
  // The time since the previous lap (or skip, or the start) goes to `stage`.
  void lap(Stage stage);
  // The time since the previous lap is dropped (it was a call that profiles its own stages).
  void skip();

 private:
  StageProfile* profile_;
  std::int64_t last_ = 0;
};

// Installs `profile` for the scope (and restores the previous one after it).
class ScopedStageProfile {
 public:
  explicit ScopedStageProfile(StageProfile* profile);
  ~ScopedStageProfile();
  ScopedStageProfile(const ScopedStageProfile&) = delete;
  ScopedStageProfile& operator=(const ScopedStageProfile&) = delete;

 private:
  StageProfile* previous_;
};

}  // namespace gdn::cpu
