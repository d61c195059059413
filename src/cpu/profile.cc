// profile.cc: the installed stage profile and its clock (src/cpu/profile.h).
#include "cpu/profile.h"

#include <chrono>

namespace gdn::cpu {

namespace {
std::atomic<StageProfile*> g_profile{nullptr};
}  // namespace

const char* stage_name(Stage stage) {
  // clang-format off
  static constexpr const char* kNames[kStageCount] = {
      "states",     "pack_qk",     "gram",             "pack_v",     "kkt",
      "solve",      "residuals",   "wy",               "output",     "write_o",
      "state",      "rebuild",     "recompute",        "read_do",    "values",
      "mst",        "gates",       "dqk",              "dstate",     "write_dqk",
      "layer_conv", "layer_gates", "layer_conv_state", "step_slots"};
  // clang-format on
  const int i = static_cast<int>(stage);
  return i >= 0 && i < kStageCount ? kNames[i] : "unknown";
}

StageProfile* active_stage_profile() { return g_profile.load(std::memory_order_acquire); }

void add_stage_time(StageProfile* profile, Stage stage, std::int64_t ns) {
  profile->ns[static_cast<int>(stage)].fetch_add(ns, std::memory_order_relaxed);
}

std::int64_t stage_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

StageLaps::StageLaps() : profile_(active_stage_profile()) {
  if (profile_ != nullptr) last_ = stage_clock_ns();
}

void StageLaps::lap(Stage stage) {
  if (profile_ == nullptr) return;
  const std::int64_t now = stage_clock_ns();
  add_stage_time(profile_, stage, now - last_);
  last_ = now;
}

void StageLaps::skip() {
  if (profile_ != nullptr) last_ = stage_clock_ns();
}

ScopedStageProfile::ScopedStageProfile(StageProfile* profile)
    : previous_(g_profile.exchange(profile, std::memory_order_acq_rel)) {}

ScopedStageProfile::~ScopedStageProfile() { g_profile.store(previous_, std::memory_order_release); }

}  // namespace gdn::cpu
