// gdn/step.h: one serving step of the fused GDN layer op (gdn/layer.h) over pools of state
// slots: the call an inference engine makes for a GDN layer at every step, for a batch that
// mixes single-token decodes, fresh prefills and continued (chunked) prefills. Each sequence
// reads and writes its own slot of a conv-state pool and a recurrent-state pool, updated in
// place. The semantics of Tokamax's ragged kernel as vLLM drives it (docs/math.md section 7).
//
// A batch of N sequences over T packed tokens:
//   query_start_loc  int64 [N + 1]  sequence s has tokens [query_start_loc[s],
//                                   query_start_loc[s + 1]); query_start_loc[0] = 0,
//                                   non-decreasing up to query_start_loc[mixed_end] <= T
//                                   (entries past mixed_end: anything, see below)
//   state_indices    int64 [N]      the slot of each sequence
//   seq_lens         int64 [N]      each sequence's total length after this step; it has
//                                   history (a state to start from) when seq_lens[s] is more
//                                   than its query length, else it starts from zeros and its
//                                   slot's stale contents are never read
//   distribution     int64 [3]      [decode_end, prefill_end, mixed_end]: sequences
//                                   [0, decode_end) are decodes, [decode_end, mixed_end)
//                                   prefills or chunked continuations (prefill_end only
//                                   orders them: 0 <= decode_end <= prefill_end <=
//                                   mixed_end), sequences from mixed_end on are padding.
//                                   Each value past N counts as N (Tokamax clamps them so)
//   read_state_indices int64 [N]    optional (absent: state_indices): the base of the slot a
//                                   sequence with history reads (prefix caching: read one
//                                   slot, write another)
//   read_offsets     int64 [N]      optional (absent: zeros), see the windows below
//
// Only the live part of the metadata is looked at (Tokamax pads the rest with anything):
// query_start_loc[0 .. mixed_end] (after the clamp) must start at 0, not decrease and end at
// most at T; its entries past mixed_end, and every per-sequence entry of a padding sequence
// (s >= mixed_end), may hold any value. Slot 0 is the null slot: no live sequence may read or
// write it. Padding sequences write nothing at all. The output rows of tokens outside every
// live sequence (from query_start_loc[mixed_end] on) are zero.
//
// Speculative decoding windows. A decode carries 1 to 1 + num_spec tokens (StepOptions). It
// starts from the state in its read slot and writes the conv and recurrent state after its
// window position t into slot state_indices[s] + t, so that the engine can keep the state of
// the last token it accepts:
//
//   read:   read_state_indices[s] + read_offsets[s]      (read_state_indices: state_indices
//                                                          when absent)
//   write:  state_indices[s] + 0  (after token 0), ..., state_indices[s] + n - 1  (after n - 1)
//
// A prefill reads the same read slot (when it has history) and writes its final states to
// slot state_indices[s]. With num_spec = 0 and neither read_state_indices nor read_offsets,
// every sequence reads and writes its own slot in place.
//
// vLLM's speculative layout (StepInputs::spec_state_indices present; docs/math.md section 7).
// The decode windows (s < decode_end, 1 to 1 + n tokens, n = num_spec) keep their states as
// vLLM's spec-aware GDN path does: the conv state in one rolling buffer per sequence, the
// recurrent state after each window position in a slot of the sequence's block-table row.
//   spec_state_indices   int64 [R, 1 + n]  window s's block-table row (any strides); R from
//                                          decode_end (vLLM's, the windows' rows alone) to
//                                          N (rows from decode_end on are not read)
//   num_accepted_tokens  int64 [R]         a = num_accepted_tokens[s] in [1, 1 + n]: the
//                                          tokens of s's previous window that were accepted
//                                          (1 after a prefill or a plain decode)
//   conv_state           [num_slots, K - 1 + n, D]: the rolling buffer, columns oldest first
// For window s with q tokens, c = spec_state_indices[s, 0]:
//   read:   recurrent state  slot spec_state_indices[s, a - 1]
//           conv state       columns [a - 1, a - 1 + K - 1) of slot c
//   write:  recurrent state after token t  slot spec_state_indices[s, t],  t = 0 .. q - 1
//           conv state after token t       columns [t, t + K - 1) of slot c (so columns
//                                          [0, K - 2 + q) are rewritten: the K - 2 inputs
//                                          before the window's first token, then its q
//                                          tokens; the columns from K - 2 + q on are kept)
// so that the next step, told a' accepted tokens, starts from the states after token a' - 1.
// A window without history (seq_lens[s] = q) starts from zeros and reads no slot. Every other
// live sequence (prefills, chunked continuations, one-token decodes that are not windows)
// reads and writes its own slot state_indices[s] as above, the conv state being columns
// [0, K - 1) of it (the rest of the buffer is kept): vLLM's rule for a prefill, or a decode
// without drafts, while speculation is configured. state_indices[s] of a window, and
// read_state_indices and read_offsets (which must be absent), are not used. vLLM's CPU path
// differs in one case: for a window of q < 1 + n tokens it keeps K - 1 + n - q old columns (not
// K - 2) before the new inputs, so that its next step reads a history that does not end at
// the accepted token (and it fails when a > q); gdn follows vLLM's GPU kernel
// (causal_conv1d_update), whose buffer above is the same for q = 1 + n.
//
// Validation happens before any write: a slot outside [1, num_slots), a read slot that another
// live sequence writes, two live sequences writing the same slot, a live query_start_loc entry
// that decreases or runs past T, a decode with no token or more than 1 + num_spec, a live
// prefill with no token, seq_lens[s] below the query length, a negative or misordered
// distribution, a pool dtype or layout outside the rule below, or a shape or dtype mismatch (in the
// speculative layout also a num_accepted_tokens entry of a live window outside [1, 1 + n], a
// window slot spec_state_indices[s, t] (t < q, and a - 1 when it has history) outside
// [1, num_slots), or read_state_indices or read_offsets given) throws
// gdn::InvalidArgument naming the argument, and leaves both pools bit-identical to before the
// call. A sequence's result depends only on its own tokens, its read slot's states, whether it
// is a decode window and the options, bit for bit: not on its place in the batch, the other
// sequences, its slot numbers, the batch size or the thread count. NaN or garbage in another
// slot never changes it. A one-token sequence is the same computation as a decode or as a
// prefill (both run it through the decode kernel), so a decode behind a prefill (vLLM and
// sglang call it a prefill) gives the bytes it gives stepped alone.
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
  TensorView read_state_indices;  // optional, int64 [N]
  // vLLM's speculative layout (above): both present or both absent (initialised, so that
  // brace lists that end before them stay valid).
  TensorView spec_state_indices = {};   // int64 [R, 1 + num_spec], decode_end <= R <= N
  TensorView num_accepted_tokens = {};  // int64 [R]
};

// The state pools, updated in place, slot by slot where they are (no copy of a pool):
//   conv_state       [num_slots, K - 1, D]: each slot's last K - 1 raw inputs, oldest first
//                    ([num_slots, K - 1 + num_spec, D] in the speculative layout)
//   recurrent_state  [num_slots, Hv, Dk, Dv]
// Each slot is one dense block: the inner dimensions have a contiguous tensor's strides
// ((D, 1) and (Dk Dv, Dv, 1)). The slot stride (dim 0) is any number of elements from one
// slot up, and the base any address aligned to the element, so the two pools may interleave
// in one buffer: vLLM's hybrid allocator gives each slot's conv and recurrent state one padded
// page (e.g. conv strides (294912, 2048, 1) bf16 and recurrent strides (147456, 16384, 128, 1)
// f32 at storage offset 3072). With num_slots = 1 the slot stride is never used (0 is fine).
// Other inner strides, a negative slot stride or one below a slot (slots sharing memory), or
// pools that share a byte with each other, with out or with an input throw
// gdn::InvalidArgument.
// Dtypes: f64 inputs take f64 pools only. Otherwise (f32, bf16 or f16 qkv) each pool is f32
// (the default) or bf16 (Tokamax's default), independently of the other and of qkv. The
// compute is float32 either way: a bf16 slot is read into float32, and a state is rounded to
// bf16 (nearest even, as gdn::bf16_bits) once, when it is written to a bf16 pool. A decode
// window carries its float32 state from one position to the next; each position's slot gets
// that state rounded, exactly as a prefill's final state is. So a step over bf16 pools gives
// the same out as over float32 pools holding the same (bf16) values, and writes the float32
// pools' new values rounded to bf16, bit for bit.
// A bf16 recurrent pool rounds the state once per step, and the output drifts from the float32
// pools': by 1e-4 (fast-decaying gates) to 3e-3 (slow ones) relative, settling within 8k
// decode steps and no larger at 64k (docs/numerics.md, "bf16 state pools"; float32 pools:
// 2e-7). A bf16 conv pool adds about 2e-3 with float32 activations (each input rounded once)
// and nothing with bf16 ones. Keep float32 pools where that matters.
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
