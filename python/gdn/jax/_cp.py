"""Exact context parallelism: a sequence sharded along a mesh axis inside ``shard_map``.

The state leaving a segment is affine in the state entering it::

    S_out = M S_in + E        M [Dk, Dk] per value head: the product of the segment's
                              transitions alpha_t (I - beta_t k_t k_t^T); E: its final
                              state from zeros
    o_t   = o_t(0) + R_t S_in R_t [Dk] per token and head: scale * q_t^T M_{<=t}

One call of the C++ op gives all four: the state gets Dk extra value columns that start as
the identity and see zero values, so the final state is [E | M] and the output [o(0) | R].
(When Dv + Dk passes the op's 256, the two halves are two calls.) The devices all-gather
(M, E), each folds the prefix of segments before it to get its S_in, and corrects its
output: O(Hv Dk (Dk + Dv)) per device per segment to send, whatever the segment's length.
Gradients are JAX's own through these steps: the C++ backward of the widened call, the
transpose of the all-gather (a reduce-scatter) and of the fold.
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from gdn.jax import _ffi

MAX_WIDTH = 256  # the C++ op's largest Dv

_HIGHEST = jax.lax.Precision.HIGHEST


def check_axis(cp_axis, sharded) -> int:
    """The size of mesh axis ``cp_axis``; a ValueError naming it outside ``shard_map``, or when
    ``sharded`` (the activations) is typed as varying along other axes but not this one (the
    tokens are not sharded along it). Untyped arrays (``check_vma=False``) cannot be checked."""
    try:
        size = int(jax.lax.axis_size(cp_axis))
    except (NameError, KeyError, ValueError, TypeError) as e:
        raise ValueError(
            f"gdn: argument 'cp_axis': expected the name of a mesh axis of the enclosing "
            f"shard_map (the axis the sequence is sharded along), given {cp_axis!r} ({e})"
        ) from None
    varying = _ffi.varying_axes(sharded)
    names = cp_axis if isinstance(cp_axis, tuple) else (cp_axis,)
    if varying and not set(names) <= varying:
        raise ValueError(
            f"gdn: argument 'cp_axis': expected a mesh axis the tokens are sharded along "
            f"(in_specs with {cp_axis!r} on the T dimension), given {cp_axis!r} while the "
            f"activations vary only along {sorted(varying, key=str)}")
    return size


def segment_terms(call: Callable, v: jax.Array, dk: int, state_dtype):
    """(o(0), R, E, M) of this device's segment.

    ``call(v, h0)`` runs the op on this segment's q, k, g, beta with values v [B, T, Hv, W]
    and initial state h0 [B, Hv, Dk, W] (None: zeros), returning (o, final_state)."""
    batch, _, hv, dv = v.shape
    eye = jnp.broadcast_to(jnp.eye(dk, dtype=state_dtype), (batch, hv, dk, dk))
    no_values = jnp.zeros(v.shape[:-1] + (dk,), v.dtype)
    # Typed as varying like v, so their (unused) cotangents need no psum across devices.
    eye, no_values = (_vary_like(x, v) for x in (eye, no_values))
    if dv + dk <= MAX_WIDTH:
        h0 = jnp.concatenate([jnp.zeros((batch, hv, dk, dv), state_dtype), eye], axis=-1)
        o, ht = call(jnp.concatenate([v, no_values], axis=-1), h0)
        return o[..., :dv], o[..., dv:], ht[..., :dv], ht[..., dv:]
    o0, e = call(v, None)
    r, m = call(no_values, eye)
    return o0, r, e, m


def _vary_like(x, like):
    axes = _ffi.varying_axes(like) - _ffi.varying_axes(x)
    return jax.lax.pcast(x, tuple(sorted(axes, key=str)), to="varying") if axes else x


def combine(o0, r, e, m, initial_state: Optional[jax.Array], cp_axis, axis_size: int):
    """This device's output and the sequence's final state from every segment's (M, E).

    o0 [B, T, Hv, Dv], r [B, T, Hv, Dk], e [B, Hv, Dk, Dv], m [B, Hv, Dk, Dk] of this device;
    initial_state [B, Hv, Dk, Dv] or None (zeros), the state entering device 0's segment."""
    ms = jax.lax.all_gather(m, cp_axis)  # [P, B, Hv, Dk, Dk]
    es = jax.lax.all_gather(e, cp_axis)
    state = jnp.zeros_like(e) if initial_state is None else initial_state.astype(e.dtype)
    entering = []
    # S_{j+1} = M_j S_j + E_j in the same order on every device: all reach the same final state
    for j in range(axis_size):
        entering.append(state)
        state = jnp.einsum("bhij,bhjv->bhiv", ms[j], state, precision=_HIGHEST) + es[j]
    index = jax.lax.axis_index(cp_axis)
    s_in = jax.lax.dynamic_index_in_dim(jnp.stack(entering), index, keepdims=False)
    # R S_in per (batch, head) as one batched matmul over [B, Hv, T, Dk]: XLA's CPU dot runs
    # it 1.4x faster than the einsum over [B, T, Hv, Dk] (measured at the Qwen3-Next shape).
    o = o0 + jnp.matmul(r.transpose(0, 2, 1, 3), s_in.astype(r.dtype),
                        precision=_HIGHEST).transpose(0, 2, 1, 3)
    # The name of the op's output is on the widened call's [o(0) | R]; the corrected o gets
    # it too, so that a policy saving it spares the backward this correction's replay.
    o = checkpoint_name(o, "gdn_core_attn_out")
    # Every device has the same final state, but JAX types it as varying along the axis.
    return o, last_device_value(state, cp_axis, axis_size)


def last_device_value(x, cp_axis, axis_size: int):
    """The last device's x on every device (typed invariant along the axis: a psum of it and
    zeros, which is exact)."""
    index = jax.lax.axis_index(cp_axis)
    return jax.lax.psum(jnp.where(index == axis_size - 1, x, jnp.zeros_like(x)), cp_axis)


def conv_halo(x, conv_state, taps: int, cp_axis, axis_size: int):
    """The conv's initial state of each device's segment, x [B, T, D]: the previous device's
    last K - 1 inputs (a ppermute), or ``conv_state`` [B, K - 1, D] (None: zeros) on device
    0."""
    tail = x[:, x.shape[1] - (taps - 1):, :]
    received = jax.lax.ppermute(tail, cp_axis, [(i, i + 1) for i in range(axis_size - 1)])
    first = jnp.zeros_like(tail) if conv_state is None else conv_state.astype(tail.dtype)
    return jnp.where(jax.lax.axis_index(cp_axis) == 0, first, received)


def layer(core: Callable, qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_state,
          recurrent_state, *, heads, cp_axis, axis_size: int, threads: int):
    """The layer op on a batch of B sequences, each device holding the segment [B, T, ...] of
    every sequence: the conv (C++) with the halo as its initial state, the SiLU'd channels
    split into heads, the gates, and the core op ``core(q, k, v, g, beta, h0)`` under
    context parallelism. Returns (out [B, T, Hv Dv], conv_state_out, recurrent_state_out)."""
    from gdn.jax._conv import causal_conv1d

    hk, hv, dk, dv = heads
    batch, tokens, channels = qkv.shape
    taps = conv_weight.shape[-1]
    halo = conv_halo(qkv, conv_state, taps, cp_axis, axis_size) if taps > 1 else None
    cu = jnp.arange(batch + 1, dtype=jnp.int32) * tokens
    y, conv_out = causal_conv1d(qkv.reshape(batch * tokens, channels), conv_weight,
                                bias=conv_bias, initial_state=halo, cu_seqlens=cu,
                                threads=threads)
    y = y.reshape(batch, tokens, channels)
    q = y[..., :hk * dk].reshape(batch, tokens, hk, dk)
    k = y[..., hk * dk:2 * hk * dk].reshape(batch, tokens, hk, dk)
    v = y[..., 2 * hk * dk:].reshape(batch, tokens, hv, dv)
    # The layer op's gates (src/api/layer_parts.h), elementwise in the compute dtype.
    cdt = A_log.dtype
    beta = jax.nn.sigmoid(b.astype(cdt))
    g = -jnp.exp(A_log) * jax.nn.softplus(a.astype(cdt) + dt_bias)
    o, rec_out = core(q, k, v, g, beta, recurrent_state)
    conv_out = last_device_value(conv_out, cp_axis, axis_size)  # [B, 0, D] when K = 1
    return o.reshape(batch, tokens, hv * dv), conv_out, rec_out
