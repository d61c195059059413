"""Pure-JAX references of gdn's ops, written from the definition (docs/math.md) and nothing of
gdn: the gated delta rule as a ``lax.scan`` token recurrence, the layer op's conv, SiLU and
gates around it, and the serving step as a loop over sequences. Gradients come from
``jax.grad`` of these. The tests run them in float64 (x64 is on in conftest.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def l2norm(x):
    return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def _scan_sequence(q, k, v, g, beta, h0, scale):
    """One sequence: q, k [T, Hk, Dk], v [T, Hv, Dv], g, beta [T, Hv], h0 [Hv, Dk, Dv]."""
    group = v.shape[1] // q.shape[1]
    q, k = jnp.repeat(q, group, axis=1), jnp.repeat(k, group, axis=1)

    def step(s, x):
        qt, kt, vt, gt, bt = x
        alpha = jnp.exp(gt)[:, None, None]
        s = alpha * s
        u = bt[:, None] * (vt - jnp.einsum("hkv,hk->hv", s, kt))
        s = s + jnp.einsum("hk,hv->hkv", kt, u)
        return s, scale * jnp.einsum("hkv,hk->hv", s, qt)

    ht, o = jax.lax.scan(step, h0, (q, k, v, g, beta))
    return o, ht


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    """fla's layout: q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g, beta [B, T, Hv]; cu_seqlens a
    concrete sequence of N + 1 offsets (B = 1). Returns (o, final_state [N, Hv, Dk, Dv])."""
    dk, hv, dv = q.shape[-1], v.shape[-2], v.shape[-1]
    scale = dk ** -0.5 if scale is None else scale
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    if cu_seqlens is None:
        spans = [(b, 0, q.shape[1]) for b in range(q.shape[0])]
    else:
        cu = [int(c) for c in np.asarray(cu_seqlens)]
        spans = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    outs, states = [], []
    for n, (b, t0, t1) in enumerate(spans):
        h0 = (jnp.zeros((hv, dk, dv), v.dtype) if initial_state is None
              else initial_state[n].astype(v.dtype))
        o, ht = _scan_sequence(q[b, t0:t1], k[b, t0:t1], v[b, t0:t1], g[b, t0:t1],
                               beta[b, t0:t1], h0, scale)
        outs.append(o)
        states.append(ht)
    if cu_seqlens is None:
        o = jnp.stack(outs)
    else:
        o = jnp.concatenate(outs, axis=0)[None]
    return o, jnp.stack(states)


def causal_conv(x, weight, bias, state):
    """Depthwise causal conv of one sequence: x [T, D], weight [D, K] (tap K - 1 on the
    current token), state [K - 1, D] (the inputs before the sequence, oldest first)."""
    taps = weight.shape[1]
    padded = jnp.concatenate([state.astype(x.dtype), x], axis=0)
    y = sum(weight[:, i] * padded[i:i + x.shape[0]] for i in range(taps))
    if bias is not None:
        y = y + bias
    new_state = padded[padded.shape[0] - (taps - 1):] if taps > 1 else state
    return y, new_state


def fused_gdn(qkv, a, b, conv_weight, A_log, dt_bias, *, conv_bias=None, conv_state=None,
              recurrent_state=None, cu_seqlens=None, num_k_heads, num_v_heads, head_k_dim,
              head_v_dim):
    """The layer op on packed tokens: returns (out [T, Hv Dv], conv_state_out,
    recurrent_state_out)."""
    hk, hv, dk, dv = num_k_heads, num_v_heads, head_k_dim, head_v_dim
    weight = conv_weight.reshape(conv_weight.shape[0], conv_weight.shape[-1])
    taps, channels = weight.shape[1], qkv.shape[1]
    tokens = qkv.shape[0]
    cu = [0, tokens] if cu_seqlens is None else [int(c) for c in np.asarray(cu_seqlens)]
    outs, conv_states, rec_states = [], [], []
    for n in range(len(cu) - 1):
        x = qkv[cu[n]:cu[n + 1]]
        cs = (jnp.zeros((taps - 1, channels), qkv.dtype) if conv_state is None
              else conv_state[n])
        y, new_cs = causal_conv(x, weight, conv_bias, cs)
        xh = y * jax.nn.sigmoid(y)
        t = x.shape[0]
        q = xh[:, :hk * dk].reshape(t, hk, dk)
        k = xh[:, hk * dk:2 * hk * dk].reshape(t, hk, dk)
        v = xh[:, 2 * hk * dk:].reshape(t, hv, dv)
        beta = jax.nn.sigmoid(b[cu[n]:cu[n + 1]])
        g = -jnp.exp(A_log) * jax.nn.softplus(a[cu[n]:cu[n + 1]] + dt_bias)
        h0 = None if recurrent_state is None else recurrent_state[n:n + 1]
        o, ht = chunk_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None],
                                       initial_state=h0, use_qk_l2norm_in_kernel=True)
        outs.append(o[0].reshape(t, hv * dv))
        conv_states.append(new_cs)
        rec_states.append(ht[0])
    return jnp.concatenate(outs, axis=0), jnp.stack(conv_states), jnp.stack(rec_states)


def serving_step(qkv, b, a, conv_pool, rec_pool, conv_weight, conv_bias, a_log, dt_bias,
                 query_start_loc, state_indices, distribution, seq_lens, read_state_indices=None,
                 read_offsets=None, *, n_kq, n_v, d_k, d_v, num_spec_tokens=0):
    """Tokamax's step semantics on concrete (NumPy) metadata: every live sequence through the
    layer reference alone, a decode window one token at a time, each position's states written
    to slot base + t. Returns ((conv_pool, rec_pool), out)."""
    qsl = np.asarray(query_start_loc)
    slots = np.asarray(state_indices)
    lens = np.asarray(seq_lens)
    n = slots.shape[0]
    decode_end, mixed_end = min(int(distribution[0]), n), min(int(distribution[2]), n)
    reads = slots if read_state_indices is None else np.asarray(read_state_indices)
    offsets = np.zeros(n, np.int64) if read_offsets is None else np.asarray(read_offsets)
    out = jnp.zeros((qkv.shape[0], n_v * d_v), qkv.dtype)
    heads = dict(num_k_heads=n_kq, num_v_heads=n_v, head_k_dim=d_k, head_v_dim=d_v)
    for s in range(mixed_end):
        t0, t1 = int(qsl[s]), int(qsl[s + 1])
        has_history = int(lens[s]) > t1 - t0
        read = int(reads[s] + offsets[s])
        cs = conv_pool[read][None] if has_history else jnp.zeros_like(conv_pool[:1])
        rs = rec_pool[read][None] if has_history else jnp.zeros_like(rec_pool[:1])
        if s < decode_end:
            for t in range(t0, t1):
                o, cs, rs = fused_gdn(qkv[t:t + 1], a[t:t + 1], b[t:t + 1], conv_weight, a_log,
                                      dt_bias, conv_bias=conv_bias, conv_state=cs,
                                      recurrent_state=rs, **heads)
                out = out.at[t].set(o[0])
                slot = int(slots[s]) + t - t0
                conv_pool = conv_pool.at[slot].set(cs[0].astype(conv_pool.dtype))
                rec_pool = rec_pool.at[slot].set(rs[0].astype(rec_pool.dtype))
        else:
            o, cs, rs = fused_gdn(qkv[t0:t1], a[t0:t1], b[t0:t1], conv_weight, a_log, dt_bias,
                                  conv_bias=conv_bias, conv_state=cs, recurrent_state=rs,
                                  **heads)
            out = out.at[t0:t1].set(o)
            conv_pool = conv_pool.at[int(slots[s])].set(cs[0].astype(conv_pool.dtype))
            rec_pool = rec_pool.at[int(slots[s])].set(rs[0].astype(rec_pool.dtype))
    return (conv_pool, rec_pool), out
