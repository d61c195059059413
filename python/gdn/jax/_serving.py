"""Tokamax's serving call ``fused_conv1d_gdn`` over gdn's C++ serving step (gdn/step.h)."""

from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from gdn import _gdn
from gdn.jax import _ffi

_STATIC = ("n_kq", "n_v", "d_k", "d_v", "kernel_size", "attention_mode", "gate_lower_bound",
           "num_spec_tokens", "zero_initialize_out", "compute_precision", "decode_tile_size",
           "mixed_tile_size", "threads")

# The library's names -> Tokamax's arguments, in its error messages (the index arrays' names
# are the same).
_LIBRARY_NAMES = {"options.hk": "n_kq", "options.hv": "n_v", "options.dk": "d_k",
                  "options.dv": "d_v", "options.num_spec": "num_spec_tokens",
                  "options.threads": "threads", "A_log": "a_log"}


def _precision_is_float32(compute_precision: Any) -> bool:
    try:
        return jnp.dtype(compute_precision) == jnp.float32
    except TypeError:
        return False


_INDEX_NAMES = ("query_start_loc", "state_indices", "distribution", "seq_lens",
                "read_state_indices", "read_offsets")


def _layout(x):
    """(shape, dtype) of an array, tracer or ShapeDtypeStruct, hashable; None for None."""
    if x is None:
        return None
    if not hasattr(x, "shape"):
        x = np.asarray(x)
    shape, dtype = x.shape, x.dtype
    return (shape if type(shape) is tuple else tuple(int(d) for d in shape),
            dtype if isinstance(dtype, np.dtype) else np.dtype(dtype))


# typed: n_kq = 2.0 must not find n_kq = 2's entry (static_int refuses a float).
@functools.lru_cache(maxsize=256, typed=True)
def _library_args(layouts, index_specs, n_kq, n_v, d_k, d_v, kernel_size, attention_mode,
                  gate_lower_bound, num_spec_tokens, compute_precision, threads):
    """gdn._gdn.check_step's arguments but the index values, from the layouts of qkv, b, a,
    the pools, conv_weight, conv_bias, a_log and dt_bias and the index arguments' specs;
    raises the checks of the Python-level options. Cached: an engine's steps come in few
    layouts, and building the specs costs more than the library's check (bench/
    jax_serving_check.py)."""
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
    qkv, weight = layouts[0], layouts[5]
    if len(weight[0]) >= 1 and weight[0][-1] != kernel_size:
        raise ValueError(
            f"gdn: argument 'conv_weight': expected K = kernel_size = {kernel_size} taps, given "
            f"shape {list(weight[0])}")
    cdt = np.dtype(_ffi.compute_dtype(qkv[1]))

    def spec(layout, widen=False):
        if layout is None:
            return None
        shape, dtype = layout
        return shape, (cdt if widen and jnp.issubdtype(dtype, jnp.floating) else dtype).name

    return (*(spec(x) for x in layouts[:5]), *(spec(x, widen=True) for x in layouts[5:]),
            *index_specs, ((qkv[0][0] if qkv[0] else 0, n_v * d_v), qkv[1].name),
            *(_ffi.static_int(x, name) for x, name in (
                (n_kq, "n_kq"), (n_v, "n_v"), (d_k, "d_k"), (d_v, "d_v"),
                (num_spec_tokens, "num_spec_tokens"), (threads, "threads"))))


def _check(floats, index_specs, index_values, options):
    """The step's whole validation: the Python-level options (_library_args), the rest the
    library's (gdn::check_fused_gdn_step) on the arguments' shapes and dtypes and, where
    ``index_values`` holds them (one per index argument or None), the index values.
    ``floats``: qkv, b, a, conv_state, recurrent_state, conv_weight, conv_bias, a_log,
    dt_bias; ``options``: _library_args' from n_kq on, in its order."""
    key = (tuple(_layout(x) for x in floats), index_specs, *options)
    try:
        library_args = _library_args(*key)
    except TypeError as e:
        if "unhashable" not in str(e):
            raise
        library_args = _library_args.__wrapped__(*key)  # the checks name the option
    with _ffi.library_names(_LIBRARY_NAMES):
        _gdn.check_step(*library_args, index_values)


_INDEX_DTYPES = {np.dtype(np.int32): "int32", np.dtype(np.int64): "int64"}


def _host_index(x, name):
    """(spec, values) of a concrete index argument, (None, None) for an absent one; the
    extension widens int32 values."""
    if x is None:
        return None, None
    values = np.asarray(x)
    dtype = _INDEX_DTYPES.get(values.dtype)
    if dtype is None:
        raise ValueError(f"gdn: argument '{name}': expected dtype int32 or int64, given "
                         f"{values.dtype}")
    if values.ndim != 1:
        return (values.shape, dtype), None  # the library names the wrong rank from the spec
    return (values.shape, dtype), np.ascontiguousarray(values)


def _host_check(floats, indices, options):
    """check_fused_conv1d_gdn's work, positional (fused_conv1d_gdn calls it on every step)."""
    specs, values = [], []
    for x, name in zip(indices, _INDEX_NAMES):
        if isinstance(x, jax.core.Tracer):
            raise TypeError(
                f"gdn: argument '{name}': expected a concrete index array (NumPy or a JAX "
                f"array on the host), given a tracer: call check_fused_conv1d_gdn before "
                f"your jitted step, on the values it will be given")
        spec, value = _host_index(x, name)
        specs.append(spec)
        values.append(value)
    if any(s is not None and v is None for s, v in zip(specs, values)):
        values = None  # a wrong rank: the library names it from the specs
    _check(floats, tuple(specs), values, options)


def _step_impl(
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
    """fused_conv1d_gdn's computation (jitted below, with the pools donated or not); its index
    values are checked by the handler when it runs (fused_conv1d_gdn checks them first when
    they are concrete)."""
    indices = tuple(_ffi.index_array(x, name) for x, name in zip(
        (query_start_loc, state_indices, distribution, seq_lens, read_state_indices,
         read_offsets), _INDEX_NAMES))
    _check((qkv, b, a, conv_state, recurrent_state, conv_weight, conv_bias, a_log, dt_bias),
           tuple(_ffi.spec(x) for x in indices), None,
           (n_kq, n_v, d_k, d_v, kernel_size, attention_mode, gate_lower_bound, num_spec_tokens,
            compute_precision, threads))
    cdt = _ffi.compute_dtype(qkv.dtype)
    conv_weight, conv_bias, a_log, dt_bias = (
        _ffi.as_compute(x, cdt) for x in (conv_weight, conv_bias, a_log, dt_bias))
    out_shape = jax.ShapeDtypeStruct((qkv.shape[0], n_v * d_v), qkv.dtype)
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


# The step with both pools donated (updated in place), and without: in check mode
# (GDN_CHECK_FINITE=1) a step can fail after it ran, when its results are not finite, and a
# donated pool would then be gone; undonated, XLA works on a copy and the caller keeps its pools.
_step = jax.jit(_step_impl, donate_argnames=("conv_state", "recurrent_state"),
                static_argnames=_STATIC)
_step_undonated = jax.jit(_step_impl, static_argnames=_STATIC)


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
      threads: CPU threads from XLA's intra-op pool, as in ``chunk_gated_delta_rule``: 0 =
        the pool's size, 1 = the calling thread alone.

    Returns:
      ((new_conv_state, new_recurrent_state), out [T, n_v d_v] in qkv's dtype).

    A rejected call leaves the caller's pools as they were, except inside a jit of yours that
    donates them (below). Bad shapes, dtypes and options raise
    ValueError (NotImplementedError for attention_mode, gate_lower_bound, compute_precision)
    when the call is traced. Bad index values (a slot out of range, -1 or the null slot 0 for
    a live sequence, two sequences writing one slot, query_start_loc past T, a decode longer
    than 1 + num_spec_tokens, ...) are the library's rules, checked as follows:

    - Called directly with concrete index arrays (NumPy, or JAX arrays outside a trace), the
      values are checked on the host first (``check_fused_conv1d_gdn``: the library's
      validation, the code the handler runs), so a bad one raises ValueError before the pools
      are donated: the caller still holds them, valid and unchanged. This reads the index
      arrays back to the host, waiting for a JAX one still being computed.
    - Inside a jit of yours the index arrays are tracers, and the handler checks their values
      when the step runs, before it writes anything: the jit raises JaxRuntimeError
      (INVALID_ARGUMENT). If that jit does not donate the pools, the caller's arrays are left
      as they were; if it donates them, JAX has consumed them before the computation ran, so
      they are gone. A serving engine that donates its pools calls
      ``check_fused_conv1d_gdn`` on its host index arrays before its jitted step.

    In check mode (GDN_CHECK_FINITE=1 in the environment) a step whose results are not finite
    raises after it ran; the pools are then not donated (the step works on a copy of each, a
    cost of check mode only), so the caller keeps them as they were. A failure no check can
    foresee (memory) still fails a donated call after the donation.

    Example::

        (conv_pool, rec_pool), out = gdn.jax.fused_conv1d_gdn(
            qkv, b, a, conv_pool, rec_pool, conv_weight, None, a_log, dt_bias,
            query_start_loc, state_indices, distribution, seq_lens,
            n_kq=16, n_v=32, d_k=128, d_v=128, kernel_size=4)
    """
    indices = (query_start_loc, state_indices, distribution, seq_lens, read_state_indices,
               read_offsets)
    if not any(isinstance(x, jax.core.Tracer) for x in indices):
        _host_check((qkv, b, a, conv_state, recurrent_state, conv_weight, conv_bias, a_log,
                     dt_bias), indices,
                    (n_kq, n_v, d_k, d_v, kernel_size, attention_mode, gate_lower_bound,
                     num_spec_tokens, compute_precision, threads))
    step = _step_undonated if _gdn.check_finite_from_environment() else _step
    return step(
        qkv, b, a, conv_state, recurrent_state, conv_weight, conv_bias, a_log, dt_bias,
        query_start_loc, state_indices, distribution, seq_lens, read_state_indices, read_offsets,
        n_kq=n_kq, n_v=n_v, d_k=d_k, d_v=d_v, kernel_size=kernel_size,
        attention_mode=attention_mode, gate_lower_bound=gate_lower_bound,
        num_spec_tokens=num_spec_tokens, zero_initialize_out=zero_initialize_out,
        compute_precision=compute_precision, decode_tile_size=decode_tile_size,
        mixed_tile_size=mixed_tile_size, threads=threads)


def check_fused_conv1d_gdn(
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
) -> None:
    """Checks a serving step on the host without running it: raises what
    ``fused_conv1d_gdn`` would raise for these arguments, the index values included, and
    returns None for a step that passes. Nothing is computed, written or donated.

    The arguments are ``fused_conv1d_gdn``'s. The float arrays may be arrays or
    ``jax.ShapeDtypeStruct`` (only their shapes and dtypes are read); the index arrays must be
    concrete (NumPy arrays or JAX arrays, not tracers), as a serving engine holds them on the
    host before its step. The rules are the library's (gdn::check_fused_gdn_step), run on the
    index values: the same code the step's handler runs.

    ``fused_conv1d_gdn`` calls this itself when every index array it is given is concrete. An
    engine that calls ``fused_conv1d_gdn`` inside a jit of its own that donates the pools
    should call this before that jit: there the index arrays are tracers, a bad value is found
    only when the computation runs, and by then JAX has consumed the donated pools.

    Raises:
      ValueError: the library's message, naming the argument, what was expected and what
        was given (e.g. ``gdn: argument 'state_indices': expected a distinct slot for every
        live sequence, given sequences 0 and 1 both write slot 2``).
      NotImplementedError: attention_mode, gate_lower_bound or compute_precision.
      TypeError: an index array is a tracer.

    Example::

        gdn.jax.check_fused_conv1d_gdn(
            qkv, b, a, conv_pool, rec_pool, conv_weight, None, a_log, dt_bias,
            query_start_loc, state_indices, distribution, seq_lens,
            n_kq=16, n_v=32, d_k=128, d_v=128, kernel_size=4)  # raises, pools untouched
        (conv_pool, rec_pool), y = engine_step(params, conv_pool, rec_pool, batch)
    """
    del zero_initialize_out, decode_tile_size, mixed_tile_size  # accepted, ignored
    _host_check((qkv, b, a, conv_state, recurrent_state, conv_weight, conv_bias, a_log, dt_bias),
                (query_start_loc, state_indices, distribution, seq_lens, read_state_indices,
                 read_offsets),
                (n_kq, n_v, d_k, d_v, kernel_size, attention_mode, gate_lower_bound,
                 num_spec_tokens, compute_precision, threads))
