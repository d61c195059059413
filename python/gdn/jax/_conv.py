"""The conv op (causal depthwise conv1d, gdn/conv.h) for JAX, differentiable: what the layer
op's context-parallel path runs before the core op. Validation happens in the C++ handlers
when the call runs; the layer op checks the same arguments when it is traced."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from gdn.jax import _ffi


class _Static(NamedTuple):
    silu: bool
    threads: int
    has_bias: bool
    has_initial_state: bool
    compute_dtype: str


def _attrs(st: _Static, cu):
    return dict(silu=st.silu, threads=st.threads, has_bias=st.has_bias,
                has_initial_state=st.has_initial_state, has_cu_seqlens=cu is not None)


def _forward_call(st: _Static, x, weight, bias, initial_state, cu):
    num_seqs = 1 if cu is None else cu.shape[0] - 1
    results = (jax.ShapeDtypeStruct(x.shape, x.dtype),
               jax.ShapeDtypeStruct((num_seqs, weight.shape[-1] - 1, x.shape[1]),
                                    jnp.dtype(st.compute_dtype)))
    return _ffi.call("gdn_conv_forward", results, x, weight, _ffi.placeholder(bias),
                     _ffi.placeholder(initial_state), _ffi.placeholder(cu),
                     want_final_state=True, **_attrs(st, cu))


@functools.lru_cache(maxsize=None)
def _op(st: _Static):

    @jax.custom_vjp
    def op(x, weight, bias, initial_state, cu):
        return _forward_call(st, x, weight, bias, initial_state, cu)

    def fwd(x, weight, bias, initial_state, cu):
        return _forward_call(st, x, weight, bias, initial_state, cu), (
            x, weight, bias, initial_state, cu)

    def bwd(res, cotangents):
        x, weight, bias, initial_state, cu = res
        d_out, d_final = cotangents
        cdt = jnp.dtype(st.compute_dtype)
        results = (
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            jax.ShapeDtypeStruct(weight.shape, cdt),
            jax.ShapeDtypeStruct(bias.shape, cdt) if bias is not None else _ffi.absent_result(),
            jax.ShapeDtypeStruct(initial_state.shape, cdt) if initial_state is not None
            else _ffi.absent_result(),
        )
        d_x, d_w, d_b, d_h0 = _ffi.call(
            "gdn_conv_backward", results, x, weight, _ffi.placeholder(bias),
            _ffi.placeholder(initial_state), _ffi.placeholder(cu), d_out, d_final,
            has_d_final_state=True, want_d_initial_state=initial_state is not None,
            **_attrs(st, cu))
        grads = (d_x, d_w, d_b if bias is not None else None,
                 d_h0 if initial_state is not None else None)
        return (*(_ffi.like_primal(d, p) for d, p in zip(grads, res)), None)

    op.defvjp(fwd, bwd)
    return op


def causal_conv1d(x, weight, *, bias=None, initial_state=None, cu_seqlens=None, silu=True,
                  threads=0):
    """(out [T, D] in x's dtype, final_state [N, K - 1, D] in the compute dtype) of the causal
    depthwise conv1d over packed sequences x [T, D] (gdn/conv.h): weight [D, K] or [D, 1, K],
    bias [D], initial_state [N, K - 1, D] (each sequence's K - 1 inputs before it; None:
    zeros), cu_seqlens [N + 1] (None: one sequence); SiLU after the sum when ``silu``;
    ``threads`` as in ``chunk_gated_delta_rule`` (XLA's intra-op pool, 0 = its size)."""
    cdt = _ffi.compute_dtype(x.dtype)
    weight, bias, initial_state = (_ffi.as_compute(t, cdt) for t in (weight, bias, initial_state))
    cu = _ffi.index_array(cu_seqlens, "cu_seqlens")
    st = _Static(silu=bool(silu), threads=int(threads), has_bias=bias is not None,
                 has_initial_state=initial_state is not None,
                 compute_dtype=jnp.dtype(cdt).name)
    return _op(st)(x, weight, bias, initial_state, cu)
