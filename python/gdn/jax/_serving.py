"""Tokamax's serving call ``fused_conv1d_gdn`` over gdn's C++ serving step (gdn/step.h)."""

from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp

from gdn import _gdn
from gdn.jax import _ffi

_STATIC = ("n_kq", "n_v", "d_k", "d_v", "kernel_size", "attention_mode", "gate_lower_bound",
           "num_spec_tokens", "zero_initialize_out", "compute_precision", "decode_tile_size",
           "mixed_tile_size", "threads")

# The library's names -> Tokamax's arguments, in its error messages (the index arrays' names
# are the same: the errors of their values, raised when the step runs, need none).
_LIBRARY_NAMES = {"options.hk": "n_kq", "options.hv": "n_v", "options.dk": "d_k",
                  "options.dv": "d_v", "options.num_spec": "num_spec_tokens",
                  "options.threads": "threads", "A_log": "a_log"}


def _precision_is_float32(compute_precision: Any) -> bool:
    try:
        return jnp.dtype(compute_precision) == jnp.float32
    except TypeError:
        return False


@functools.partial(jax.jit, donate_argnames=("conv_state", "recurrent_state"),
                   static_argnames=_STATIC)
def fused_conv1d_gdn(
    qkv: jax.Array,
    b: jax.Array,
    a: jax.Array,
    conv_state: jax.Array,
    recurrent_state: jax.Array,
    conv_weight: jax.Array,
    conv_bias: Optional[jax.Array],
    a_log: jax.Array,
    dt_bias: jax.Array,
    query_start_loc: jax.Array,
    state_indices: jax.Array,
    distribution: jax.Array,
    seq_lens: jax.Array,
    read_state_indices: Optional[jax.Array] = None,
    read_offsets: Optional[jax.Array] = None,
    *,
    n_kq: int,
    n_v: int,
    d_k: int,
    d_v: int,
    kernel_size: int,
    attention_mode: str = "GDN",
    gate_lower_bound: Optional[float] = None,
    num_spec_tokens: int = 0,
    zero_initialize_out: bool = True,
    compute_precision: Any = jnp.float32,
    decode_tile_size: Optional[int] = None,
    mixed_tile_size: Optional[int] = None,
    threads: int = 0,
) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
    """One serving step of a GDN layer over pools of state slots (Tokamax's signature).

    A batch of N sequences over T packed tokens mixes decodes (sequences
    [0, distribution[0])), prefills and continued prefills ([distribution[0],
    distribution[2])) and padding (from distribution[2] on). Each live sequence reads its
    states from a slot of each pool and writes them back; the pools are donated and updated in
    place (``input_output_aliases``: no copy of a pool per step when the caller's arrays can be
    donated).

    Args:
      qkv: [T, D] pre-conv channels [q heads | k heads | v heads], D = 2 n_kq d_k + n_v d_v;
        float32, bfloat16 or float16.
      b, a: [T, n_v] beta logits and gate inputs, the dtype of qkv.
      conv_state: [num_slots, K - 1, D] pool of each slot's last K - 1 raw inputs, oldest
        first. Slot 0 is the null slot (padding reads and writes nothing).
      recurrent_state: [num_slots, n_v, d_k, d_v] pool. Either pool is float32 (the default) or
        bfloat16 (Tokamax's default), each on its own: the state is read into float32, computed
        in float32 and rounded once when written back. A bf16 recurrent pool drifts from a
        float32 one: the output by 1e-4 (fast-decaying gates) to 3e-3 (slow ones) relative,
        settled within 8k decode steps and no larger at 64k (docs/numerics.md, "bf16 state
        pools"); keep float32 pools where that matters.
      conv_weight: [D, 1, K] (or [D, K]); conv_bias: [D] or None; a_log, dt_bias: [n_v]. Widened
        to float32 (Tokamax defaults them to bf16).
      query_start_loc: int32 [N + 1] token offsets; entries past distribution[2] may be
        anything (padding).
      state_indices: int32 [N] the slot each sequence writes; with speculative decoding the base
        of num_spec_tokens + 1 consecutive slots (window position t writes slot base + t).
      distribution: int32 [3] [decode_end, prefill_end, mixed_end]; values past N are clamped.
      seq_lens: int32 [N] total length with the cached prefix; a sequence has history (reads its
        slot) when seq_lens exceeds its query length, else it starts from zeros.
      read_state_indices: int32 [N] the slot a sequence with history reads (prefix caching:
        read one slot, write another); default state_indices.
      read_offsets: int32 [N] added to the read slot (accepted tokens - 1 of the last verify
        step); needed with num_spec_tokens > 0.
      n_kq, n_v, d_k, d_v, kernel_size: head counts and dims, conv taps K.
      attention_mode: "GDN" (KDA is not implemented). gate_lower_bound: None only.
      num_spec_tokens: speculative tokens a decode window carries beyond the first.
      zero_initialize_out: accepted for compatibility; rows of padding tokens are always zero.
      compute_precision: float32 only.
      decode_tile_size, mixed_tile_size: Tokamax's TPU tiling; accepted and ignored (the CPU
        plan chooses its own split).
      threads: CPU threads, 0 = all.

    Returns:
      ((new_conv_state, new_recurrent_state), out [T, n_v d_v] in qkv's dtype).

    Bad shapes and dtypes raise ValueError when traced; bad index values (a slot out of range,
    two sequences writing one slot, ...) raise when the step runs, before anything is written.
    Called directly, the step has donated the pools, so after such an error their arrays are
    gone (as after any failed donated call); called inside a jit of yours that does not donate
    them, they are left as they were.

    Example::

        (conv_pool, rec_pool), out = gdn.jax.fused_conv1d_gdn(
            qkv, b, a, conv_pool, rec_pool, conv_weight, None, a_log, dt_bias,
            query_start_loc, state_indices, distribution, seq_lens,
            n_kq=16, n_v=32, d_k=128, d_v=128, kernel_size=4)
    """
    if attention_mode != "GDN":
        raise NotImplementedError(
            f"gdn: argument 'attention_mode': expected 'GDN' (KDA is not implemented), given "
            f"{attention_mode!r}")
    if gate_lower_bound is not None:
        raise NotImplementedError(
            f"gdn: argument 'gate_lower_bound': expected None (a gate lower bound is not "
            f"implemented), given {gate_lower_bound!r}")
    if not _precision_is_float32(compute_precision):
        raise NotImplementedError(
            f"gdn: argument 'compute_precision': expected float32 (the only one implemented), "
            f"given {compute_precision!r}")
    if conv_weight.ndim >= 1 and conv_weight.shape[-1] != kernel_size:
        raise ValueError(
            f"gdn: argument 'conv_weight': expected K = kernel_size = {kernel_size} taps, given "
            f"shape {list(conv_weight.shape)}")
    cdt = _ffi.compute_dtype(qkv.dtype)
    conv_weight, conv_bias, a_log, dt_bias = (
        _ffi.as_compute(x, cdt) for x in (conv_weight, conv_bias, a_log, dt_bias))
    indices = tuple(_ffi.index_array(x, name) for x, name in (
        (query_start_loc, "query_start_loc"), (state_indices, "state_indices"),
        (distribution, "distribution"), (seq_lens, "seq_lens"),
        (read_state_indices, "read_state_indices"), (read_offsets, "read_offsets")))
    out_shape = jax.ShapeDtypeStruct((qkv.shape[0], n_v * d_v), qkv.dtype)
    with _ffi.library_names(_LIBRARY_NAMES):
        _gdn.check_step(
            *(_ffi.spec(x) for x in (qkv, b, a, conv_state, recurrent_state, conv_weight,
                                     conv_bias, a_log, dt_bias)),
            *(_ffi.spec(x) for x in indices), _ffi.spec(out_shape),
            *(_ffi.static_int(x, name) for x, name in (
                (n_kq, "n_kq"), (n_v, "n_v"), (d_k, "d_k"), (d_v, "d_v"),
                (num_spec_tokens, "num_spec_tokens"), (threads, "threads"))))
    results = (jax.ShapeDtypeStruct(conv_state.shape, conv_state.dtype),
               jax.ShapeDtypeStruct(recurrent_state.shape, recurrent_state.dtype), out_shape)
    qsl, slots, dist, lens, read_slots, offsets = indices
    new_conv, new_rec, out = jax.ffi.ffi_call(
        "gdn_step", results, input_output_aliases={3: 0, 4: 1}, vmap_method=None)(
            qkv, b, a, conv_state, recurrent_state, conv_weight, _ffi.placeholder(conv_bias),
            a_log, dt_bias, qsl, slots, dist, lens, _ffi.placeholder(read_slots),
            _ffi.placeholder(offsets), hk=int(n_kq), hv=int(n_v), dk=int(d_k), dv=int(d_v),
            num_spec=int(num_spec_tokens), threads=int(threads),
            has_conv_bias=conv_bias is not None, has_read_state_indices=read_slots is not None,
            has_read_offsets=offsets is not None)
    return (new_conv, new_rec), out
