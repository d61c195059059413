// gdn/step.h: one serving step of the fused GDN layer op (gdn/layer.h) over pools of state
// slots: the call an inference engine makes for a GDN layer at every step, for a batch that
// mixes single-token decodes, fresh prefills and continued (chunked) prefills. Each sequence
// reads and writes its own slot of a conv-state pool and a recurrent-state pool, updated in
// place. The semantics of Tokamax's ragged kernel as vLLM drives it (docs/math.md section 7).
//
// A batch of N sequences over T packed tokens:
//   query_start_loc  int64 [N + 1]  sequence s has tokens [query_start_loc[s],
//                                   query_start_loc[s + 1]); query_start_loc[0] = 0,
//                                   non-decreasing, query_start_loc[N] <= T
//   state_indices    int64 [N]      the slot of each sequence
//   seq_lens         int64 [N]      each sequence's total length after this step; it has
//                                   history (a state to start from) when seq_lens[s] is more
//                                   than its query length, else it starts from zeros and its
//                                   slot's stale contents are never read
//   distribution     int64 [3]      [decode_end, prefill_end, mixed_end]: sequences
//                                   [0, decode_end) are decodes, [decode_end, mixed_end)
//                                   prefills or chunked continuations (prefill_end only
//                                   orders them: 0 <= decode_end <= prefill_end <= mixed_end
//                                   <= N), sequences from mixed_end on are padding
//   read_offsets     int64 [N]      optional (absent: zeros), see the windows below
//
// Slot 0 is the null slot: no live sequence (s < mixed_end) may read or write it. Padding
// sequences write nothing at all, and their state_indices are not looked at. The output rows
// of tokens outside every live sequence (from query_start_loc[mixed_end] on) are zero.
//
// Speculative decoding windows. A decode carries 1 to 1 + num_spec tokens (StepOptions). It
// starts from the state in slot state_indices[s] + read_offsets[s] and writes the conv and
// recurrent state after its window position t into slot state_indices[s] + t, so that the
// engine can keep the state of the last token it accepts:
//
//   read:   state_indices[s] + read_offsets[s]
//   write:  state_indices[s] + 0  (after token 0), ..., state_indices[s] + n - 1  (after n - 1)
//
// A prefill reads slot state_indices[s] + read_offsets[s] (when it has history) and writes its
// final states to slot state_indices[s]. With num_spec = 0 and no read_offsets, every sequence
// reads and writes its own slot in place.
//
// Validation happens before any write: a slot outside [1, num_slots), a read slot that another
// live sequence writes, two live sequences writing the same slot, a query_start_loc that
// decreases or runs past T, a decode with no token or more than 1 + num_spec, a live prefill with
// no token, seq_lens[s] below the query length, a distribution that does not fit N, or a shape
// or dtype mismatch throws gdn::InvalidArgument naming the argument, and leaves both pools
// bit-identical to before the call. A sequence's result depends only on its own tokens and
// slots: NaN or garbage in another slot never changes it.
#pragma once

#include <cstdint>

#include "gdn/layer.h"

namespace gdn {

// LayerOptions::matmul_precision must stay compute: a step's decodes are matrix-vector work and
// its prefills must match them (gdn::InvalidArgument otherwise).
struct StepOptions : LayerOptions {
  // Speculative tokens a decode window may carry beyond the first, 0 to 1024.
  std::int64_t num_spec = 0;
};

// Inputs. qkv, a, b and the parameters as in gdn/layer.h (f32 or f64; or bf16 / f16 qkv, a, b
// with float32 parameters); the index tensors int64, contiguous or strided.
struct StepInputs {
  TensorView qkv, a, b;  // [T, D], [T, Hv], [T, Hv]
  TensorView conv_weight, conv_bias, A_log, dt_bias;
  TensorView query_start_loc, state_indices, seq_lens, distribution, read_offsets;
};

// The state pools, updated in place; the compute dtype: float64 for f64 inputs, else float32
// (16-bit activations keep float32 states).
//   conv_state       [num_slots, K - 1, D]: each slot's last K - 1 raw inputs, oldest first
//   recurrent_state  [num_slots, Hv, Dk, Dv]
struct StatePools {
  MutableTensorView conv_state, recurrent_state;
};

// out [T, Hv Dv], the dtype of qkv, caller-owned.
void fused_gdn_step(const StepInputs& inputs, const StatePools& pools, const MutableTensorView& out,
                    const StepOptions& options);
// Allocating form: returns out.
Tensor fused_gdn_step(const StepInputs& inputs, const StatePools& pools,
                      const StepOptions& options);

// The step's validation alone: the checks fused_gdn_step runs before it writes anything, and
// the same gdn::InvalidArgument; nothing is computed or written. Only the index tensors' data
// is read: a binding that checks a call when it is traced may pass any distinct, aligned,
// non-null addresses for the other tensors and placeholder indices that pass (distribution
// [0, 0, 0]: every sequence padding).
void check_fused_gdn_step(const StepInputs& inputs, const StatePools& pools,
                          const MutableTensorView& out, const StepOptions& options);

namespace ref {
// The float64 reference: every live sequence through gdn::ref::fused_gdn_fwd on its own, a
// decode window one token at a time. Inputs, pools and out must be f64; same validation.
void fused_gdn_step(const StepInputs& inputs, const StatePools& pools, const MutableTensorView& out,
                    const StepOptions& options);
Tensor fused_gdn_step(const StepInputs& inputs, const StatePools& pools,
                      const StepOptions& options);
}  // namespace ref

}  // namespace gdn
