"""The core op, fla's ``chunk_gated_delta_rule``, over the C++ chunked forward and backward."""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from gdn import _gdn
from gdn.jax import _cp, _ffi


# The library's option names -> the op's arguments, in its error messages.
OPTION_NAMES = {"options.scale": "scale", "options.chunk_size": "chunk_size",
                "options.threads": "threads", "options.matmul_precision": "matmul_precision"}


def default_scale(q, scale):
    """scale as a float, default Dk ** -0.5; None where q has no Dk > 0 (the library names q)."""
    if scale is not None:
        return float(scale)
    return float(q.shape[-1]) ** -0.5 if q.ndim >= 1 and q.shape[-1] > 0 else None


class _Static(NamedTuple):
    """What is fixed when the call is traced: the FFI attributes and the layout."""

    scale: float
    l2norm: bool
    chunk_size: int  # resolved (never 0)
    bf16_matmul: bool
    threads: int
    has_h0: bool
    want_final_state: bool
    keep_states: bool
    keep_t_inv: bool
    num_seqs: int
    max_chunks: int
    compute_dtype: str


def _forward_call(st: _Static, q, k, v, g, beta, h0, cu, residuals: bool):
    # Every result is asked for; the ones the program never reads are dropped by the
    # dead-code pass (_ffi.OPTIONAL_RESULTS), e.g. o when a remat backward needs only the
    # residuals.
    hv, dk, dv = v.shape[-2], q.shape[-1], v.shape[-1]
    cdt = jnp.dtype(st.compute_dtype)
    keep_states = residuals and st.keep_states
    keep_t_inv = residuals and st.keep_t_inv
    results = (
        jax.ShapeDtypeStruct(v.shape[:-1] + (dv,), q.dtype),
        jax.ShapeDtypeStruct((st.num_seqs, hv, dk, dv), cdt) if st.want_final_state
        else _ffi.absent_result(),
        jax.ShapeDtypeStruct((st.max_chunks, hv, dk, dv), cdt) if keep_states
        else _ffi.absent_result(),
        jax.ShapeDtypeStruct((st.max_chunks, hv, st.chunk_size, st.chunk_size), cdt)
        if keep_t_inv else _ffi.absent_result(),
    )
    return _ffi.call(
        "gdn_forward", results, q, k, v, g, beta, _ffi.placeholder(h0), _ffi.placeholder(cu),
        scale=st.scale, l2norm=st.l2norm, chunk_size=st.chunk_size, bf16_matmul=st.bf16_matmul,
        threads=st.threads, has_h0=st.has_h0, has_cu_seqlens=cu is not None, want_o=True,
        want_final_state=st.want_final_state, want_chunk_states=keep_states,
        want_t_inv=keep_t_inv)


def _backward_call(st: _Static, q, k, v, g, beta, h0, cu, d_o, d_ht, chunk_states, t_inv):
    cdt = jnp.dtype(st.compute_dtype)
    results = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct(k.shape, k.dtype),
        jax.ShapeDtypeStruct(v.shape, v.dtype),
        jax.ShapeDtypeStruct(g.shape, cdt),
        jax.ShapeDtypeStruct(beta.shape, cdt),
        jax.ShapeDtypeStruct(h0.shape, cdt) if h0 is not None else _ffi.absent_result(),
    )
    return _ffi.call(
        "gdn_backward", results, q, k, v, g, beta, _ffi.placeholder(h0), _ffi.placeholder(cu),
        d_o, _ffi.placeholder(d_ht), _ffi.placeholder(chunk_states), _ffi.placeholder(t_inv),
        scale=st.scale, l2norm=st.l2norm, chunk_size=st.chunk_size, bf16_matmul=st.bf16_matmul,
        threads=st.threads, has_h0=st.has_h0, has_cu_seqlens=cu is not None,
        has_d_final_state=d_ht is not None, has_chunk_states=chunk_states is not None,
        has_t_inv=t_inv is not None, want_d_initial_state=h0 is not None)


@functools.lru_cache(maxsize=None)
def _op(st: _Static):
    """The differentiable op for one static configuration."""

    @jax.custom_vjp
    def op(q, k, v, g, beta, h0, cu):
        o, ht, _, _ = _forward_call(st, q, k, v, g, beta, h0, cu, residuals=False)
        return o, (ht if st.want_final_state else None)

    def fwd(q, k, v, g, beta, h0, cu):
        o, ht, chunk_states, t_inv = _forward_call(st, q, k, v, g, beta, h0, cu, residuals=True)
        chunk_states = checkpoint_name(chunk_states, "gdn_chunk_states") if st.keep_states else None
        t_inv = checkpoint_name(t_inv, "gdn_t_inv") if st.keep_t_inv else None
        out = (checkpoint_name(o, "gdn_core_attn_out"), ht if st.want_final_state else None)
        return out, (q, k, v, g, beta, h0, cu, chunk_states, t_inv)

    def bwd(res, cotangents):
        q, k, v, g, beta, h0, cu, chunk_states, t_inv = res
        d_o, d_ht = cotangents
        dq, dk, dv, dg, dbeta, dh0 = _backward_call(
            st, q, k, v, g, beta, h0, cu, d_o, d_ht, chunk_states, t_inv)
        grads = (dq, dk, dv, dg, dbeta, dh0 if h0 is not None else None)
        return (*(_ffi.like_primal(d, x) for d, x in zip(grads, res)), None)

    op.defvjp(fwd, bwd)
    return op


def chunk_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    scale: Optional[float] = None,
    initial_state: Optional[jax.Array] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Optional[jax.Array] = None,
    chunk_size: int = 64,
    residuals: str = "all",
    matmul_precision: str = "compute",
    threads: int = 0,
    cp_axis: Optional[str] = None,
) -> tuple[jax.Array, Optional[jax.Array]]:
    """The gated delta rule (fla's ``chunk_gated_delta_rule``), on gdn's C++ CPU kernels.

    Per token t and value head h, with a state S of [Dk, Dv] and alpha_t = exp(g_t)::

        u_t = beta_t * (v_t - alpha_t * S_{t-1}^T k_t)
        S_t = alpha_t * S_{t-1} + k_t u_t^T
        o_t = scale * S_t^T q_t

    Value head h reads query/key head ``h // (Hv // Hk)`` (grouped value attention).

    Args:
      q, k: [B, T, Hk, Dk], float32, bfloat16, float16 or float64.
      v: [B, T, Hv, Dv], the dtype of q. Hv a multiple of Hk; 1 <= Dk, Dv <= 256.
      g: [B, T, Hv], the log decay (alpha = exp(g)), float32 (any float dtype is widened to the
        compute dtype: float64 for float64 activations, else float32).
      beta: [B, T, Hv], the delta rule's step, float32 (widened like g).
      scale: multiplies q; default Dk ** -0.5. Must be finite.
      initial_state: [N, Hv, Dk, Dv] float32 (the compute dtype), N = B, or the number of
        sequences with ``cu_seqlens``; None means zeros.
      output_final_state: return the [N, Hv, Dk, Dv] final states (else None).
      use_qk_l2norm_in_kernel: normalise q and k per token and head, x / sqrt(sum x^2 + 1e-6);
        gradients flow to the unnormalised q and k.
      cu_seqlens: int32 or int64 [N + 1] sequence boundaries of a packed batch (B must be 1):
        cu_seqlens[0] = 0, non-decreasing, cu_seqlens[N] = T; zero-length sequences allowed.
      chunk_size: tokens per chunk of the chunked (WY) form, 1 to 256, or 0 for the tiling
        plan's choice on this machine.
      residuals: what the forward keeps for the backward under ``jax.grad``: "all" (the state
        entering every chunk, named ``gdn_chunk_states``, [chunks, Hv, Dk, Dv], and every
        chunk's T^-1, named ``gdn_t_inv``, [chunks, Hv, C, C]), "t_inv" (only T^-1; the C++
        backward rebuilds the states) or "none" (the backward rebuilds both). Gradients are the
        same bit for bit. The names let ``jax.checkpoint`` policies keep or drop them; a
        policy that drops them has the backward replay the C++ forward for them alone,
        without o unless the backward reads o too (docs/jax.md, "Gradients and the
        residual names").
      matmul_precision: "compute" or "bf16" (the chunked products' operands rounded to bf16,
        float32 sums; docs/numerics.md).
      threads: CPU threads of the call, taken from XLA's intra-op pool (gdn starts none of its
        own under JAX): 0 = the pool's size (one thread per CPU the process may run on), 1 =
        the calling thread alone, a count above the pool's size is lowered to it. Results do
        not depend on it (docs/jax.md, "Threads").
      cp_axis: context parallelism (MaxText's name): inside ``jax.shard_map``, the mesh axis
        the sequence is sharded along, each device holding a contiguous segment of [B, T, ...]
        in axis order; None = no context parallelism. Outputs and gradients equal the
        unsharded call's to float32 rounding (exact: no truncated decay). The initial state
        is the one entering the first segment and the final state the one leaving the last
        (the same on every device). Each device runs the op on Dv + Dk value columns and
        all-gathers Hv Dk (Dk + Dv) floats per sequence (docs/jax.md, "Context
        parallelism"). Not with cu_seqlens. With matmul_precision="bf16" the transfer
        between segments carries the bf16-operand error too.

    Returns:
      (o, final_state): o [B, T, Hv, Dv] in q's dtype; final_state [N, Hv, Dk, Dv] in the
      compute dtype, or None.

    Differentiable (reverse mode) in q, k, v, g, beta and initial_state, with a cotangent of
    the final state honoured; ``jax.vmap`` runs a loop of calls. Bad shapes, dtypes and options
    raise ValueError when the call is traced, with the library's message; bad cu_seqlens
    values raise when it runs.

    Example::

        o, ht = gdn.jax.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,
                                               use_qk_l2norm_in_kernel=True)
    """
    _ffi.check_choice(residuals, _ffi.RESIDUALS, "residuals")
    _ffi.check_choice(matmul_precision, _ffi.MATMUL_PRECISIONS, "matmul_precision")
    if cp_axis is not None:
        return _context_parallel(
            q, k, v, g, beta, cp_axis, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
            chunk_size=chunk_size, residuals=residuals, matmul_precision=matmul_precision,
            threads=threads)
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    cdt = _ffi.compute_dtype(q.dtype)
    g, beta = _ffi.as_compute(g, cdt), _ffi.as_compute(beta, cdt)
    initial_state = _ffi.as_compute(initial_state, cdt)
    cu = _ffi.index_array(cu_seqlens, "cu_seqlens")
    packed = cu is not None
    if packed:  # fla's packed layout: B = 1, passed on as [T, ...]
        for name, x, layout in (("q", q, "[1, T, Hk, Dk]"), ("k", k, "[1, T, Hk, Dk]"),
                                ("v", v, "[1, T, Hv, Dv]"), ("g", g, "[1, T, Hv]"),
                                ("beta", beta, "[1, T, Hv]")):
            if x.ndim != len(layout.split(",")) or x.shape[0] != 1:
                raise ValueError(
                    f"gdn: argument '{name}': expected {layout} with cu_seqlens (a packed "
                    f"batch), given {list(x.shape)}")
        q, k, v, g, beta = (x[0] for x in (q, k, v, g, beta))
    scale = default_scale(q, scale)
    with _ffi.library_names(OPTION_NAMES):
        shape = _gdn.core_shape(
            _ffi.spec(q), _ffi.spec(k), _ffi.spec(v), _ffi.spec(g), _ffi.spec(beta),
            _ffi.spec(initial_state), _ffi.spec(cu), scale, bool(use_qk_l2norm_in_kernel),
            _ffi.static_int(chunk_size, "chunk_size"), matmul_precision == "bf16",
            _ffi.static_int(threads, "threads"))
    st = _Static(
        scale=float(scale), l2norm=bool(use_qk_l2norm_in_kernel), chunk_size=shape["chunk_size"],
        bf16_matmul=matmul_precision == "bf16", threads=int(threads),
        has_h0=initial_state is not None, want_final_state=bool(output_final_state),
        keep_states=residuals == "all", keep_t_inv=residuals in ("all", "t_inv"),
        num_seqs=shape["num_seqs"], max_chunks=shape["max_chunks"],
        compute_dtype=shape["compute_dtype"])
    o, ht = _op(st)(q, k, v, g, beta, initial_state, cu)
    if packed:
        o = o[None]
    return o, ht


def _context_parallel(q, k, v, g, beta, cp_axis, *, initial_state, output_final_state,
                      cu_seqlens, **options):
    """This device's segment of a sequence sharded along ``cp_axis`` (_cp.py has the math)."""
    if cu_seqlens is not None:
        raise ValueError(
            "gdn: argument 'cu_seqlens': expected None with cp_axis (context parallelism "
            "shards [B, T, ...] batches along T), given an array")
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    if v.ndim != 4 or q.ndim != 4:
        raise ValueError(
            f"gdn: argument 'v': expected [B, T, Hv, Dv] (and q [B, T, Hk, Dk]) with cp_axis, "
            f"given v {list(v.shape)}, q {list(q.shape)}")
    batch, hv, dk, dv = v.shape[0], v.shape[2], q.shape[-1], v.shape[-1]
    if initial_state is not None and tuple(initial_state.shape) != (batch, hv, dk, dv):
        raise ValueError(
            f"gdn: argument 'initial_state': expected [B, Hv, Dk, Dv] = "
            f"{[batch, hv, dk, dv]} (the state entering the first segment), given "
            f"{list(initial_state.shape)}")
    axis_size = _cp.check_axis(cp_axis, v)
    # The unsharded call's checks on the arguments as given (the widened call's would name
    # shapes the caller never passed).
    cdt = _ffi.compute_dtype(q.dtype)
    scale = default_scale(q, options.pop("scale"))
    with _ffi.library_names(OPTION_NAMES):
        _gdn.core_shape(
            _ffi.spec(q), _ffi.spec(k), _ffi.spec(v), _ffi.spec(_ffi.as_compute(g, cdt)),
            _ffi.spec(_ffi.as_compute(beta, cdt)),
            _ffi.spec(_ffi.as_compute(initial_state, cdt)), None, scale,
            bool(options["use_qk_l2norm_in_kernel"]),
            _ffi.static_int(options["chunk_size"], "chunk_size"),
            options["matmul_precision"] == "bf16", _ffi.static_int(options["threads"], "threads"))
    options["scale"] = scale
    out_dtype = q.dtype
    # 16-bit activations are widened (exactly) so that o(0) and R stay in the compute dtype
    # until the correction: one rounding of o, as in the unsharded call.
    q, k, v = (x.astype(cdt) if x.dtype != cdt and x.dtype in (jnp.bfloat16, jnp.float16)
               else x for x in (q, k, v))

    def call(values, h0):
        return chunk_gated_delta_rule(q, k, values, g, beta, initial_state=h0,
                                      output_final_state=True, **options)

    o0, r, e, m = _cp.segment_terms(call, v, q.shape[-1], cdt)
    o, final_state = _cp.combine(o0, r, e, m, initial_state, cp_axis, axis_size)
    return o.astype(out_dtype), (final_state if output_final_state else None)
