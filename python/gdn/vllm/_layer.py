"""One GDN layer call of vLLM's CPU path on gdn: vLLM's layer, batch metadata and state pools in,
one ``gdn.torch.fused_gdn_step`` call (conv + gates + delta rule), the output written where
vLLM's own path writes it.

What vLLM 0.32.0's CPU path hands over (read in its ``gdn_attention.py``, ``gdn_attn.py`` and
``qwen_gdn_linear_attn.py``):
- ``mixed_qkv`` [T, 2 Hk Dk + Hv Dv] ([q | k | v], heads in order: gdn's qkv), ``a`` and ``b``
  [T, Hv], bf16; ``core_attn_out`` [T, Hv, Dv], written in place. Hk, Hv are this rank's heads.
- the metadata: ``num_decodes`` one-token continuations first, then ``num_prefills`` sequences
  (fresh or continuing a chunked prefill), their slots in ``non_spec_state_indices_tensor`` and
  boundaries in ``non_spec_query_start_loc``; entries past them are padding (slot 0, vLLM's
  null block and gdn's null slot). ``has_initial_state`` covers every sequence when there is a
  prefill and is None in decode-only batches (every sequence continues).
- ``layer.kv_cache[0]``, the conv pool [slots, K - 1, D] (the "SD" layout, gdn's), and
  ``layer.kv_cache[1]``, the SSM pool declared [slots, Hv, Dv, Dk] whose memory vLLM's CPU
  kernels read as [slots, Hv, Dk, Dv] (they ``view`` it so), gdn's order. Both are views into
  vLLM's pages: each slot's conv and SSM state share one padded page, so the slot stride is
  the page's, not the state's.
"""

from __future__ import annotations

import torch
from torch import Tensor

import gdn.torch

# Where gdn's float32 copies of a layer's parameters live on the layer.
_PARAMS_ATTR = "_gdn_vllm_params"


def _key(t: Tensor):
    """What changes when a weight is (re)loaded: a new tensor, or an in-place copy into it (its
    version counter; an inference tensor has none, then its address alone)."""
    try:
        return (t.data_ptr(), t._version)
    except RuntimeError:
        return (t.data_ptr(),)


def conv_weight(layer) -> Tensor:
    """The plain [D, K] conv weight: on hosts where vLLM repacks ``conv1d.weight`` in place for
    its own conv kernel (avx512_bf16, ARM bf16), the plain one is kept beside it."""
    plain = getattr(layer.conv1d, "_cpu_unpacked_conv_weight", None)
    if plain is not None:
        return plain
    w = layer.conv1d.weight
    return w.reshape(w.shape[0], w.shape[-1])


def float32_params(layer):
    """(conv_weight [D, K], conv_bias [D] or None, A_log [Hv], dt_bias [Hv]) in float32, made once
    per weight load and kept on the layer; a call only compares the weights' keys."""
    sources = (conv_weight(layer), layer.conv1d.bias, layer.A_log, layer.dt_bias)
    key = tuple(None if t is None else _key(t) for t in sources)
    cached = getattr(layer, _PARAMS_ATTR, None)
    if cached is not None and cached[0] == key:
        return cached[1]
    params = tuple(None if t is None else t.detach().to(torch.float32).contiguous()
                   for t in sources)
    setattr(layer, _PARAMS_ATTR, (key, params))
    return params


def ssm_pool(layer) -> Tensor:
    """The SSM pool in gdn's [slots, Hv, Dk, Dv] order (vLLM declares [slots, Hv, Dv, Dk] and its
    CPU kernels view the same memory as gdn's order; Dk = Dv in every released model)."""
    ssm = layer.kv_cache[1]
    slots, heads, v_dim, k_dim = ssm.shape
    return ssm.view(slots, heads, k_dim, v_dim)


def run(layer, metadata, mixed_qkv: Tensor, b: Tensor, a: Tensor, core_attn_out: Tensor) -> None:
    """vLLM's non-speculative GDN call on gdn: every live sequence of the batch (decodes,
    fresh and continued prefills) in one ``fused_gdn_step``; padding entries are cut off."""
    n = metadata.num_decodes + metadata.num_prefills
    tokens = metadata.num_decode_tokens + metadata.num_prefill_tokens
    slots = metadata.non_spec_state_indices_tensor[:n]
    cu_seqlens = metadata.non_spec_query_start_loc[:n + 1]
    has = metadata.has_initial_state
    has = None if has is None else has[:n]
    w, bias, a_log, dt_bias = float32_params(layer)
    heads = dict(num_k_heads=layer.num_k_heads // layer.tp_size,
                 num_v_heads=layer.num_v_heads // layer.tp_size,
                 head_k_dim=layer.head_k_dim, head_v_dim=layer.head_v_dim)
    # vLLM's pools as they are (strided views into its pages): gdn's step reads and writes the
    # batch's slots in place through the slot stride; nothing is gathered or copied back.
    out = gdn.torch.fused_gdn_step(mixed_qkv[:tokens], a[:tokens], b[:tokens], w, a_log, dt_bias,
                                   layer.kv_cache[0], ssm_pool(layer), slots, cu_seqlens, has,
                                   conv_bias=bias, **heads)
    core_attn_out[:tokens] = out.view(tokens, heads["num_v_heads"], heads["head_v_dim"])

