// bench_step_data.h: the problems of `gdn bench --op step` (bench_step.cc): a preset's batch at
// a model's shape, its float64 check slice and the check of a step against it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gdn/gdn.h"
#include "gdn/step.h"

namespace gdn::cli::step_bench {

struct Model {
  std::string name;
  std::int64_t hk, hv, dk, dv;
};
constexpr std::int64_t kTaps = 4;
constexpr std::int64_t kHistory = 4096;  // tokens before the step, of sequences with history

// A batch: `decodes` decode windows of `window` tokens (1 + num_spec), then prefills (fresh
// ones first, then continued ones), then `padding` sequences of no token, in a pool of
// `pool_slots` slots (0: just enough, each sequence's slots next to the previous one's; else
// at random places in that pool).
struct Prefill {
  std::int64_t tokens, history;
};
struct Preset {
  const char* name;
  const char* what;
  std::int64_t decodes = 0, window = 1;
  std::vector<Prefill> prefills;
  std::int64_t padding = 0, pool_slots = 0;
};

// One step problem (float32, or float64 for the reference's slice). With 16-bit activations,
// qkv, a and b hold their values rounded, and the step reads their 16-bit copies.
struct StepData {
  Model model;
  std::int64_t channels = 0, tokens = 0, live_tokens = 0, seqs = 0, decodes = 0, prefills = 0;
  std::int64_t slots = 0, states_read = 0, states_written = 0;
  Tensor qkv, a, b, conv_weight, A_log, dt_bias, conv_state, recurrent_state;
  Tensor qkv16, a16, b16;  // --dtype bf16: the step's activations
  Tensor query_start_loc, state_indices, seq_lens, distribution, read_offsets;
  StepOptions options;

  StepInputs inputs() const {
    const bool narrow = qkv16.present();
    return {(narrow ? qkv16 : qkv).view(),
            (narrow ? a16 : a).view(),
            (narrow ? b16 : b).view(),
            conv_weight.view(),
            {},
            A_log.view(),
            dt_bias.view(),
            query_start_loc.view(),
            state_indices.view(),
            seq_lens.view(),
            distribution.view(),
            read_offsets.view(),
            TensorView{}};
  }
  StatePools pools() { return {conv_state.mutable_view(), recurrent_state.mutable_view()}; }
};

// The preset's batch at the model's shape, activations of `dtype` (f32 or bf16). Inputs as
// `gdn bench --op layer` makes them (qkv, a, b uniform in [-1, 1), conv weights in [-0.5,
// 0.5), A = exp(A_log) in [1, 16), dt around [0.001, 0.1)); the states a sequence reads uniform
// (conv state in [-1, 1), recurrent state in [-0.5, 0.5)), the slots it writes without reading
// NaN, every other slot zero.
StepData make_step(const Preset& p, const Model& m, int threads, CpuIsa isa, DType dtype,
                   std::uint64_t seed);

// The check slice in float64: key head 0 and its value heads (Hk = 1, Hv = Hv / Hk), every
// sequence, token and slot, copied from `d` (before it runs).
StepData slice_of(const StepData& d);

// The worst normalised error of the CPU step's first run on `d` (out, float32, and both pools,
// on the slice's heads and channels) against the float64 reference's step on the slice `s`.
double check_step(const StepData& d, const StepData& s, const Tensor& out, const Tensor& ref_out);

// A float32 tensor's bf16 copy (a pool, or activations); the tensor itself rounded to the same
// values in place, so that the reference's slice starts from them. widen_into: a bf16 pool's
// values into the float32 one.
Tensor bf16_copy(Tensor& pool);
void widen_into(const Tensor& pool16, Tensor& pool);

}  // namespace gdn::cli::step_bench
