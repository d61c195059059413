"""The C++ library's float64 reference (``gdn::ref``): the token recurrence that defines the op
and its reverse mode, and the conv op's definition, in float64 loops whatever the input dtype.
For checking, not for speed.

Same layouts and conventions as ``gdn.torch.chunk_gated_delta_rule`` (fla's [B, T, H, D], packed
varlen as B = 1 with ``cu_seqlens``); g and beta of the compute dtype (float32, or float64 for
float64 activations). Outputs are float64.

Example::

    o, ht = gdn.torch.reference.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    dq, dk, dv, dg, dbeta, dh0 = gdn.torch.reference.chunk_gated_delta_rule_bwd(
        q, k, v, g, beta, d_o)
    out, final_state = gdn.torch.reference.causal_conv1d(x, weight, bias)  # x [T, D]
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from gdn.torch import _conv, _ops


def _packed(cu_seqlens, *xs):
    return tuple(x[0] for x in xs) if cu_seqlens is not None else xs


def chunk_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                           scale: Optional[float] = None, initial_state: Optional[Tensor] = None,
                           output_final_state: bool = False,
                           use_qk_l2norm_in_kernel: bool = False,
                           cu_seqlens: Optional[Tensor] = None):
    """(o, final_state or None), float64, by gdn::ref::recurrent_fwd."""
    q, k, v, g, beta = _packed(cu_seqlens, q, k, v, g, beta)
    scale = float(q.shape[-1]) ** -0.5 if scale is None else float(scale)
    o, ht, _ = _ops.reference_forward(q, k, v, g, beta, initial_state, cu_seqlens, scale,
                                      use_qk_l2norm_in_kernel, 64, output_final_state, False)
    return (o.unsqueeze(0) if cu_seqlens is not None else o), ht


def chunk_gated_delta_rule_bwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                               d_o: Tensor, scale: Optional[float] = None,
                               initial_state: Optional[Tensor] = None,
                               d_final_state: Optional[Tensor] = None,
                               use_qk_l2norm_in_kernel: bool = False,
                               cu_seqlens: Optional[Tensor] = None):
    """(dq, dk, dv, dg, dbeta, d_initial_state or None), float64, by gdn::ref::recurrent_bwd."""
    q, k, v, g, beta, d_o = _packed(cu_seqlens, q, k, v, g, beta, d_o)
    scale = float(q.shape[-1]) ** -0.5 if scale is None else float(scale)
    grads = _ops.reference_backward(q, k, v, g, beta, initial_state, cu_seqlens, d_o,
                                    d_final_state, scale, use_qk_l2norm_in_kernel)
    if cu_seqlens is not None:
        grads = tuple(x.unsqueeze(0) for x in grads[:5]) + grads[5:]
    return grads


def causal_conv1d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                  initial_state: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                  activation: Optional[str] = "silu"):
    """The conv op's float64 reference (gdn::ref::causal_conv1d_fwd) in the library's packed
    layout: x [T, D], weight [D, K], bias [D], initial_state [N, K - 1, D], cu_seqlens [N + 1];
    weight, bias and state of the compute dtype. Returns (out [T, D], final_state
    [N, K - 1, D]), float64."""
    return _conv.reference_forward(x, weight, bias, initial_state, cu_seqlens,
                                   _conv._silu(activation))


def causal_conv1d_bwd(x: Tensor, weight: Tensor, d_out: Tensor, bias: Optional[Tensor] = None,
                      initial_state: Optional[Tensor] = None,
                      d_final_state: Optional[Tensor] = None,
                      cu_seqlens: Optional[Tensor] = None, activation: Optional[str] = "silu"):
    """The conv op's float64 reference backward: (d_x, d_weight, d_bias, d_initial_state),
    float64 (the last two empty without a bias or an initial state)."""
    return _conv.reference_backward(x, weight, bias, initial_state, cu_seqlens, d_out,
                                    d_final_state, _conv._silu(activation))
