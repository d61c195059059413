"""A pure-PyTorch reference of the gated delta rule, written from the definition (docs/math.md)
and nothing of gdn: the token recurrence in a Python loop, gradients by torch.autograd. The
tests run it in float64."""

from __future__ import annotations

import torch


def l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _sequence(q, k, v, g, beta, h0, scale):
    """One sequence: q, k [T, Hk, Dk], v [T, Hv, Dv], g, beta [T, Hv], h0 [Hv, Dk, Dv]."""
    group = v.shape[1] // q.shape[1]
    q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
    s, outs = h0, []
    for t in range(q.shape[0]):
        s = g[t].exp()[:, None, None] * s
        u = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", s, k[t]))
        s = s + torch.einsum("hk,hv->hkv", k[t], u)
        outs.append(scale * torch.einsum("hkv,hk->hv", s, q[t]))
    o = torch.stack(outs) if outs else v.new_zeros(v.shape)
    return o, s


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    """fla's layout: q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g, beta [B, T, Hv]; cu_seqlens a
    list of N + 1 offsets (B = 1). Returns (o, final_state [N, Hv, Dk, Dv]) in v's dtype."""
    dk, hv, dv = q.shape[-1], v.shape[-2], v.shape[-1]
    scale = dk ** -0.5 if scale is None else scale
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    if cu_seqlens is None:
        spans = [(b, 0, q.shape[1]) for b in range(q.shape[0])]
    else:
        cu = [int(c) for c in cu_seqlens]
        spans = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    outs, states = [], []
    for n, (b, t0, t1) in enumerate(spans):
        h0 = v.new_zeros((hv, dk, dv)) if initial_state is None else initial_state[n].to(v.dtype)
        o, ht = _sequence(q[b, t0:t1], k[b, t0:t1], v[b, t0:t1], g[b, t0:t1].to(v.dtype),
                          beta[b, t0:t1].to(v.dtype), h0, scale)
        outs.append(o)
        states.append(ht)
    o = torch.stack(outs) if cu_seqlens is None else torch.cat(outs, dim=0)[None]
    return o, torch.stack(states)


def causal_conv1d(x, weight, bias=None, initial_state=None, activation="silu"):
    """The causal depthwise conv1d from its definition, by torch.nn.functional.conv1d over the
    inputs with the K - 1 before them (initial_state [B, D, K - 1], or zeros) prepended:
    x [B, D, T], weight [D, K] -> (out [B, D, T], final state [B, D, K - 1])."""
    k = weight.shape[-1]
    before = (initial_state if initial_state is not None
              else x.new_zeros(x.shape[0], x.shape[1], k - 1))
    full = torch.cat([before, x], dim=-1)
    y = torch.nn.functional.conv1d(full, weight.unsqueeze(1), bias, groups=x.shape[1])
    out = torch.nn.functional.silu(y) if activation is not None else y
    return out, full[..., full.shape[-1] - (k - 1):]
