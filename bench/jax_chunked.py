"""The chunked (WY) gated delta rule in plain JAX: the baseline bench/jax_bench.py times gdn.jax
against (the same algorithm MaxText and fla's naive chunk form use, written here from
docs/math.md). Dense batches only. tests/python/test_jax_bench_baseline.py checks it against
the token recurrence.

Per chunk of C tokens with entry state S0 and gc the in-chunk cumulative log decay:
    L  = strictly lower (beta_t exp(gc_t - gc_j) k_t . k_j),  T = (I + L)^-1
    U  = T (beta V) - T (beta exp(gc) K) S0
    O  = (exp(gc) Q) S0 + (lower-incl. exp(gc_t - gc_j) q_t . k_j) U
    S1 = exp(gc_C) S0 + (exp(gc_C - gc) K)^T U
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _l2norm(x):
    return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def chunk_gated_delta_rule(q, k, v, g, beta, *, chunk_size=64, scale=None, initial_state=None,
                           use_qk_l2norm_in_kernel=False):
    """fla's layout and result: q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g, beta [B, T, Hv];
    returns (o [B, T, Hv, Dv], final_state [B, Hv, Dk, Dv] float32)."""
    bsz, tokens, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    c = chunk_size
    scale = dk ** -0.5 if scale is None else scale
    f32 = jnp.float32
    q, k, v, g, beta = (x.astype(f32) for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    q = jnp.repeat(q, hv // hk, axis=2) * scale
    k = jnp.repeat(k, hv // hk, axis=2)
    pad = (-tokens) % c
    if pad:
        widen = lambda x: jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))  # noqa: E731
        q, k, v, g, beta = (widen(x) for x in (q, k, v, g, beta))
    n = (tokens + pad) // c
    # [B, H, N, C, D] and [B, H, N, C]
    heads = lambda x: x.reshape(bsz, n, c, hv, -1).transpose(0, 3, 1, 2, 4)  # noqa: E731
    q, k, v = heads(q), heads(k), heads(v)
    g, beta = (x.reshape(bsz, n, c, hv).transpose(0, 3, 1, 2) for x in (g, beta))
    gc = jnp.cumsum(g, axis=-1)
    lower = jnp.tril(jnp.ones((c, c), bool), -1)
    lower_incl = jnp.tril(jnp.ones((c, c), bool))
    diff = gc[..., :, None] - gc[..., None, :]
    decay = jnp.where(lower_incl, jnp.exp(jnp.where(lower_incl, diff, 0.0)), 0.0)
    kk = jnp.einsum("bhnid,bhnjd->bhnij", k, k)
    lmat = jnp.where(lower, beta[..., :, None] * decay * kk, 0.0)
    # T = (I + L)^-1 by forward substitution, row i = e_i - L[i, :i] T[:i] (HF's and MaxText's
    # loop; jax.scipy's solve_triangular deadlocks in XLA's CPU thread pool at this batch size,
    # jaxlib 0.10.2).
    def substitute(i, t):
        return t.at[..., i, :].set(jnp.eye(c, dtype=f32)[i]
                                   - jnp.einsum("...j,...jk->...k", lmat[..., i, :], t))

    t_inv = jax.lax.fori_loop(1, c, substitute, jnp.broadcast_to(jnp.eye(c, dtype=f32),
                                                                 lmat.shape))
    u_base = t_inv @ (beta[..., None] * v)
    w = t_inv @ ((beta * jnp.exp(gc))[..., None] * k)
    attn = decay * jnp.einsum("bhnid,bhnjd->bhnij", q, k)
    q_decayed = q * jnp.exp(gc)[..., None]
    k_to_end = k * jnp.exp(gc[..., -1:] - gc)[..., None]
    gamma = jnp.exp(gc[..., -1])

    def step(s, xs):
        u_b, w_c, attn_c, qd, ke, gm = xs
        u = u_b - jnp.einsum("bhcd,bhdv->bhcv", w_c, s)
        o = jnp.einsum("bhcd,bhdv->bhcv", qd, s) + jnp.einsum("bhij,bhjv->bhiv", attn_c, u)
        s = gm[..., None, None] * s + jnp.einsum("bhcd,bhcv->bhdv", ke, u)
        return s, o

    s0 = (jnp.zeros((bsz, hv, dk, dv), f32) if initial_state is None
          else initial_state.astype(f32))
    per_chunk = lambda x: jnp.moveaxis(x, 2, 0)  # noqa: E731
    ht, o = jax.lax.scan(step, s0, tuple(per_chunk(x) for x in (
        u_base, w, attn, q_decayed, k_to_end, gamma)))
    o = jnp.moveaxis(o, 0, 2).transpose(0, 2, 3, 1, 4).reshape(bsz, n * c, hv, dv)
    return o[:, :tokens], ht


def fused_gdn(qkv, a, b, conv_weight, A_log, dt_bias, *, num_k_heads, num_v_heads, head_k_dim,
              head_v_dim, chunk_size=64):
    """The layer op on one sequence from zero states: qkv [T, D], a, b [T, Hv], conv_weight
    [D, K]; returns out [T, Hv Dv]."""
    hk, hv, dk, dv = num_k_heads, num_v_heads, head_k_dim, head_v_dim
    tokens = qkv.shape[0]
    taps = conv_weight.shape[-1]
    x = jnp.pad(qkv.astype(jnp.float32), [(taps - 1, 0), (0, 0)])
    y = sum(conv_weight[:, i] * x[i:i + tokens] for i in range(taps))
    xh = y * jax.nn.sigmoid(y)
    q = xh[:, :hk * dk].reshape(1, tokens, hk, dk)
    k = xh[:, hk * dk:2 * hk * dk].reshape(1, tokens, hk, dk)
    v = xh[:, 2 * hk * dk:].reshape(1, tokens, hv, dv)
    beta = jax.nn.sigmoid(b)[None]
    g = (-jnp.exp(A_log) * jax.nn.softplus(a + dt_bias))[None]
    o, _ = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=chunk_size,
                                  use_qk_l2norm_in_kernel=True)
    return o.reshape(tokens, hv * dv)


def reference_block(params, x, cfg, **kw):
    """gdn.jax.nn's GatedDeltaNet block with this file's ``fused_gdn`` in place of gdn's op
    (zero initial states, each of x's B rows one sequence): the block's projections, norm and
    gating are gdn.jax.nn's, the conv and the gated delta rule plain JAX. The training example
    and bench/jax_nn_bench.py run it as their pure-JAX baseline."""
    from gdn.jax import nn

    if kw.get("cp_axis") is not None:  # that path would run gdn's kernels, not this file's
        raise ValueError("reference_block: cp_axis is not supported")
    batch, tokens = x.shape[0], x.shape[1]

    def block_op(qkv, a, b, conv_weight, A_log, dt_bias, *, conv_state, recurrent_state,
                 cu_seqlens, num_k_heads, num_v_heads, head_k_dim, head_v_dim, **_):
        del cu_seqlens  # the block packs B rows of T tokens
        if conv_state is not None or recurrent_state is not None:
            raise ValueError("reference_block: initial states are not supported")
        heads = dict(num_k_heads=num_k_heads, num_v_heads=num_v_heads, head_k_dim=head_k_dim,
                     head_v_dim=head_v_dim)
        weight = conv_weight.reshape(conv_weight.shape[0], conv_weight.shape[-1])
        rows = lambda t: t.reshape(batch, tokens, *t.shape[1:])  # noqa: E731
        out = jax.vmap(lambda q, a_, b_: fused_gdn(q, a_, b_, weight, A_log, dt_bias, **heads))(
            rows(qkv), rows(a), rows(b))
        return out.reshape(batch * tokens, -1).astype(qkv.dtype), None, None

    original = nn.fused_gdn
    nn.fused_gdn = block_op
    try:
        return nn.gated_delta_net(params, x, cfg, **kw)
    finally:
        nn.fused_gdn = original
