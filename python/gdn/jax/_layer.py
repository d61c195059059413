"""The fused GDN layer op (conv1d + SiLU, gates, L2 norm, gated delta rule) over the C++ op."""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from gdn import _gdn
from gdn.jax import _cp, _ffi
from gdn.jax._core import chunk_gated_delta_rule


# The library's option names -> the op's arguments, in its error messages.
OPTION_NAMES = {"options.hk": "num_k_heads", "options.hv": "num_v_heads",
                "options.dk": "head_k_dim", "options.dv": "head_v_dim",
                "options.chunk_size": "chunk_size", "options.threads": "threads",
                "options.matmul_precision": "matmul_precision"}


class _Static(NamedTuple):
    hk: int
    hv: int
    dk: int
    dv: int
    chunk_size: int  # resolved
    bf16_matmul: bool
    threads: int
    has_conv_bias: bool
    has_conv_state: bool
    has_recurrent_state: bool
    keep_states: bool
    keep_t_inv: bool
    num_seqs: int
    max_chunks: int
    compute_dtype: str


def _head_attrs(st: _Static):
    return dict(hk=st.hk, hv=st.hv, dk=st.dk, dv=st.dv, chunk_size=st.chunk_size,
                bf16_matmul=st.bf16_matmul, threads=st.threads)


def _input_flags(st: _Static, cu):
    return dict(has_conv_bias=st.has_conv_bias, has_conv_state=st.has_conv_state,
                has_recurrent_state=st.has_recurrent_state, has_cu_seqlens=cu is not None)


def _forward_call(st: _Static, args, residuals: bool):
    qkv, a, b, w, bias, A_log, dt_bias, conv_state, rec_state, cu = args
    cdt = jnp.dtype(st.compute_dtype)
    taps, channels = w.shape[-1], qkv.shape[1]
    keep_states, keep_t_inv = residuals and st.keep_states, residuals and st.keep_t_inv
    results = (
        jax.ShapeDtypeStruct((qkv.shape[0], st.hv * st.dv), qkv.dtype),
        jax.ShapeDtypeStruct((st.num_seqs, taps - 1, channels), cdt),
        jax.ShapeDtypeStruct((st.num_seqs, st.hv, st.dk, st.dv), cdt),
        jax.ShapeDtypeStruct((st.max_chunks, st.hv, st.dk, st.dv), cdt) if keep_states
        else _ffi.absent_result(),
        jax.ShapeDtypeStruct((st.max_chunks, st.hv, st.chunk_size, st.chunk_size), cdt)
        if keep_t_inv else _ffi.absent_result(),
    )
    return _ffi.call(
        "gdn_layer_forward", results, qkv, a, b, w, _ffi.placeholder(bias), A_log, dt_bias,
        _ffi.placeholder(conv_state), _ffi.placeholder(rec_state), _ffi.placeholder(cu),
        **_head_attrs(st), **_input_flags(st, cu), want_out=True, want_conv_state_out=True,
        want_recurrent_state_out=True, want_chunk_states=keep_states, want_t_inv=keep_t_inv)


def _backward_call(st: _Static, args, d_out, d_conv_state_out, d_rec_state_out, states, t_inv):
    qkv, a, b, w, bias, A_log, dt_bias, conv_state, rec_state, cu = args
    cdt = jnp.dtype(st.compute_dtype)
    taps, channels = w.shape[-1], qkv.shape[1]
    results = (
        jax.ShapeDtypeStruct(qkv.shape, qkv.dtype),
        jax.ShapeDtypeStruct(a.shape, a.dtype),
        jax.ShapeDtypeStruct(b.shape, b.dtype),
        jax.ShapeDtypeStruct(w.shape, cdt),
        jax.ShapeDtypeStruct((channels,), cdt) if st.has_conv_bias else _ffi.absent_result(),
        jax.ShapeDtypeStruct((st.hv,), cdt),
        jax.ShapeDtypeStruct((st.hv,), cdt),
        jax.ShapeDtypeStruct((st.num_seqs, taps - 1, channels), cdt),
        jax.ShapeDtypeStruct((st.num_seqs, st.hv, st.dk, st.dv), cdt),
    )
    return _ffi.call(
        "gdn_layer_backward", results, qkv, a, b, w, _ffi.placeholder(bias), A_log, dt_bias,
        _ffi.placeholder(conv_state), _ffi.placeholder(rec_state), _ffi.placeholder(cu), d_out,
        d_conv_state_out, d_rec_state_out, _ffi.placeholder(states), _ffi.placeholder(t_inv),
        **_head_attrs(st), **_input_flags(st, cu), has_d_conv_state_out=True,
        has_d_recurrent_state_out=True, has_chunk_states=states is not None,
        has_t_inv=t_inv is not None)


@functools.lru_cache(maxsize=None)
def _op(st: _Static):

    @jax.custom_vjp
    def op(*args):
        out, conv_out, rec_out, _, _ = _forward_call(st, args, residuals=False)
        return out, conv_out, rec_out

    def fwd(*args):
        out, conv_out, rec_out, states, t_inv = _forward_call(st, args, residuals=True)
        states = checkpoint_name(states, "gdn_chunk_states") if st.keep_states else None
        t_inv = checkpoint_name(t_inv, "gdn_t_inv") if st.keep_t_inv else None
        out = checkpoint_name(out, "gdn_core_attn_out")
        return (out, conv_out, rec_out), (args, states, t_inv)

    def bwd(res, cotangents):
        args, states, t_inv = res
        d_out, d_conv_out, d_rec_out = cotangents
        (d_qkv, d_a, d_b, d_w, d_bias, d_A_log, d_dt_bias, d_conv_state,
         d_rec_state) = _backward_call(st, args, d_out, d_conv_out, d_rec_out, states, t_inv)
        grads = (d_qkv, d_a, d_b, d_w, d_bias if st.has_conv_bias else None, d_A_log,
                 d_dt_bias, d_conv_state if st.has_conv_state else None,
                 d_rec_state if st.has_recurrent_state else None)
        return (*(_ffi.like_primal(d, x) for d, x in zip(grads, args)), None)

    op.defvjp(fwd, bwd)
    return op


def fused_gdn(
    qkv: jax.Array,
    a: jax.Array,
    b: jax.Array,
    conv_weight: jax.Array,
    A_log: jax.Array,
    dt_bias: jax.Array,
    *,
    conv_bias: Optional[jax.Array] = None,
    conv_state: Optional[jax.Array] = None,
    recurrent_state: Optional[jax.Array] = None,
    cu_seqlens: Optional[jax.Array] = None,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    chunk_size: int = 64,
    residuals: str = "all",
    matmul_precision: str = "compute",
    threads: int = 0,
    cp_axis: Optional[str] = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The fused GDN layer op of Qwen3-Next / Qwen3.5, on gdn's C++ CPU kernels.

    With D = 2 Hk Dk + Hv Dv channels and K conv taps::

        y      = causal depthwise conv1d(qkv, conv_weight) + conv_bias  (tap K-1: current token)
        q|k|v  = split(SiLU(y)) into [T, Hk, Dk], [T, Hk, Dk], [T, Hv, Dv]
        beta   = sigmoid(b),  g = -exp(A_log) * softplus(a + dt_bias)
        out    = gated delta rule(q, k, v, g, beta), q and k L2-normalised, scale Dk ** -0.5

    Args:
      qkv: [T, D] projected, pre-conv channels [q heads | k heads | v heads], packed sequences;
        float32, bfloat16, float16 or float64.
      a, b: [T, Hv] gate inputs, the dtype of qkv.
      conv_weight: [D, K] or [D, 1, K] (Tokamax's / HF's layout), K from 1 to 8.
      A_log, dt_bias: [Hv]. Parameters (conv weight and bias too) are float32 inside (float64
        for float64 qkv); other float dtypes are widened, and their gradients come back in
        their own dtype.
      conv_bias: [D] or None.
      conv_state: [N, K - 1, D], each sequence's last K - 1 raw inputs before it, oldest
        first; None means zeros.
      recurrent_state: [N, Hv, Dk, Dv], float32; None means zeros.
      cu_seqlens: int32 or int64 [N + 1] sequence boundaries; None means one sequence.
      num_k_heads, num_v_heads, head_k_dim, head_v_dim: Hk, Hv (a multiple of Hk), Dk, Dv.
      chunk_size, residuals, matmul_precision, threads: as in ``chunk_gated_delta_rule``; the
        residuals are named ``gdn_chunk_states`` and ``gdn_t_inv``.
      cp_axis: context parallelism: inside ``jax.shard_map``, the mesh axis the one sequence's
        tokens are sharded along (contiguous segments in axis order, each at least K - 1
        tokens); None = none. The conv gets the previous device's last K - 1 inputs (a
        ppermute), the core op runs as ``chunk_gated_delta_rule(cp_axis=...)``; conv_state
        and recurrent_state enter the first segment, the states returned leave the last (the
        same on every device). Equal to the unsharded call to float32 rounding. Not with
        cu_seqlens.

    Returns:
      (out [T, Hv Dv] in qkv's dtype, conv_state_out [N, K - 1, D], recurrent_state_out
      [N, Hv, Dk, Dv]), the states in the compute dtype.

    Differentiable (reverse mode) in qkv, a, b, conv_weight, conv_bias, A_log, dt_bias and
    both initial states; cotangents of both final states are honoured.

    Example::

        out, conv_out, rec_out = gdn.jax.fused_gdn(
            qkv, a, b, conv_weight, A_log, dt_bias, num_k_heads=16, num_v_heads=32,
            head_k_dim=128, head_v_dim=128)
    """
    _ffi.check_choice(residuals, _ffi.RESIDUALS, "residuals")
    _ffi.check_choice(matmul_precision, _ffi.MATMUL_PRECISIONS, "matmul_precision")
    qkv, a, b = jnp.asarray(qkv), jnp.asarray(a), jnp.asarray(b)
    cdt = _ffi.compute_dtype(qkv.dtype)
    conv_weight, conv_bias, A_log, dt_bias, conv_state, recurrent_state = (
        _ffi.as_compute(x, cdt)
        for x in (conv_weight, conv_bias, A_log, dt_bias, conv_state, recurrent_state))
    cu = _ffi.index_array(cu_seqlens, "cu_seqlens")
    args = (qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_state, recurrent_state, cu)
    heads = tuple(_ffi.static_int(x, name) for x, name in (
        (num_k_heads, "num_k_heads"), (num_v_heads, "num_v_heads"), (head_k_dim, "head_k_dim"),
        (head_v_dim, "head_v_dim")))
    with _ffi.library_names(OPTION_NAMES):
        shape = _gdn.layer_shape(*(_ffi.spec(x) for x in args), *heads,
                                 _ffi.static_int(chunk_size, "chunk_size"),
                                 matmul_precision == "bf16", _ffi.static_int(threads, "threads"))
    if cp_axis is not None:
        if cu is not None:
            raise ValueError(
                "gdn: argument 'cu_seqlens': expected None with cp_axis (context parallelism "
                "shards one sequence's tokens), given an array")
        out, conv_out, rec_out = context_parallel(
            *(None if x is None else x[None] for x in (qkv, a, b)), *args[3:9], heads=heads,
            chunk_size=shape["chunk_size"], residuals=residuals,
            matmul_precision=matmul_precision, threads=int(threads), cp_axis=cp_axis)
        return out[0], conv_out, rec_out
    st = _Static(
        *heads, chunk_size=shape["chunk_size"], bf16_matmul=matmul_precision == "bf16",
        threads=int(threads), has_conv_bias=conv_bias is not None,
        has_conv_state=conv_state is not None, has_recurrent_state=recurrent_state is not None,
        keep_states=residuals == "all", keep_t_inv=residuals in ("all", "t_inv"),
        num_seqs=shape["num_seqs"], max_chunks=shape["max_chunks"],
        compute_dtype=shape["compute_dtype"])
    return _op(st)(*args)


def context_parallel(qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_state,
                     recurrent_state, *, heads, chunk_size, residuals, matmul_precision,
                     threads, cp_axis):
    """The layer op on B sequences, qkv [B, T, D], a and b [B, T, Hv], each device holding
    segment T of every sequence along ``cp_axis`` (checked by the caller; _cp.py has the
    math). Returns (out [B, T, Hv Dv], conv_state_out [B, K - 1, D], recurrent_state_out)."""
    axis_size = _cp.check_axis(cp_axis, qkv)
    taps = conv_weight.shape[-1]
    if qkv.shape[1] < taps - 1:
        raise ValueError(
            f"gdn: argument 'qkv': expected each device's segment to hold at least K - 1 = "
            f"{taps - 1} tokens with cp_axis (the next device's conv reads them), given "
            f"{qkv.shape[1]}")
    out_dtype = qkv.dtype
    cdt = _ffi.compute_dtype(qkv.dtype)
    # 16-bit activations are widened (exactly): the conv's output and the core op's stay in
    # the compute dtype, as inside the unsharded op, and out is rounded once.
    qkv, a, b = (x.astype(cdt) for x in (qkv, a, b))

    def core(q, k, v, g, beta, h0):
        return chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=h0, output_final_state=True,
            use_qk_l2norm_in_kernel=True, chunk_size=chunk_size, residuals=residuals,
            matmul_precision=matmul_precision, threads=threads, cp_axis=cp_axis)

    out, conv_out, rec_out = _cp.layer(
        core, qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_state, recurrent_state,
        heads=heads, cp_axis=cp_axis, axis_size=axis_size, threads=threads)
    return out.astype(out_dtype), conv_out, rec_out


def batched_context_parallel(qkv, a, b, conv_weight, A_log, dt_bias, *, conv_state,
                             recurrent_state, num_k_heads, num_v_heads, head_k_dim, head_v_dim,
                             residuals, threads, cp_axis):
    """The layer op under context parallelism on B sequences of one segment length each (qkv
    [B, T, D], a and b [B, T, Hv]; gdn.jax.nn's block): checked as ``fused_gdn`` checks the
    packed batch, then run by ``context_parallel``."""
    batch, tokens = qkv.shape[0], qkv.shape[1]
    cdt = _ffi.compute_dtype(qkv.dtype)
    conv_weight, A_log, dt_bias, conv_state, recurrent_state = (
        _ffi.as_compute(x, cdt)
        for x in (conv_weight, A_log, dt_bias, conv_state, recurrent_state))
    flat = tuple(jax.ShapeDtypeStruct((batch * tokens,) + x.shape[2:], x.dtype)
                 for x in (qkv, a, b))
    cu = jax.ShapeDtypeStruct((batch + 1,), jnp.int32)
    heads = tuple(_ffi.static_int(x, name) for x, name in (
        (num_k_heads, "num_k_heads"), (num_v_heads, "num_v_heads"), (head_k_dim, "head_k_dim"),
        (head_v_dim, "head_v_dim")))
    specs = (_ffi.spec(x) for x in (*flat, conv_weight, None, A_log, dt_bias, conv_state,
                                    recurrent_state, cu))
    with _ffi.library_names(OPTION_NAMES):
        shape = _gdn.layer_shape(*specs, *heads, 64, False, _ffi.static_int(threads, "threads"))
    return context_parallel(qkv, a, b, conv_weight, None, A_log, dt_bias, conv_state,
                            recurrent_state, heads=heads, chunk_size=shape["chunk_size"],
                            residuals=residuals, matmul_precision="compute",
                            threads=int(threads), cp_axis=cp_axis)
