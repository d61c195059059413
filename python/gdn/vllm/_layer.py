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

With speculative decoding configured (``_cpu_gdn_attention_spec_aware``), the conv pool is a
rolling buffer [slots, K - 1 + n, D] (n speculative tokens) and the metadata splits the batch:
- ``num_spec_decodes`` windows (1 + the drafts of a decode, 1 to 1 + n tokens; a decode that
  got no drafts is a window of one token), their block-table rows ``spec_state_indices_tensor``
  [R, 1 + n] (the conv buffer in column 0's slot, the SSM state after window token t in column
  t's), ``num_accepted_tokens`` [R] (of the window before) and boundaries
  ``spec_query_start_loc``;
- the other sequences (prefills, chunked continuations; one-token prompt chunks count as
  prefills beside windows) in the ``non_spec_*`` fields and ``has_initial_state``, as above;
  they use columns [0, K - 1) of their conv slot;
- which of the batch's tokens belong to which: ``spec_token_indx`` and ``non_spec_token_indx``
  (the engine orders short sequences first, so a short prefill chunk may sit among the windows).
``spec_sequence_masks`` is None in a batch without windows (the prompt steps): then the batch
is a non-speculative one over columns [0, K - 1) of the buffers.
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


def _heads(layer) -> dict:
    return dict(num_k_heads=layer.num_k_heads // layer.tp_size,
                num_v_heads=layer.num_v_heads // layer.tp_size,
                head_k_dim=layer.head_k_dim, head_v_dim=layer.head_v_dim)


def run(layer, metadata, mixed_qkv: Tensor, b: Tensor, a: Tensor, core_attn_out: Tensor,
        conv_pool: Tensor | None = None) -> None:
    """vLLM's non-speculative GDN call on gdn: every live sequence of the batch (decodes,
    fresh and continued prefills) in one ``fused_gdn_step``; padding entries are cut off.
    ``conv_pool``: the conv pool to use (default ``layer.kv_cache[0]``)."""
    n = metadata.num_decodes + metadata.num_prefills
    tokens = metadata.num_decode_tokens + metadata.num_prefill_tokens
    slots = metadata.non_spec_state_indices_tensor[:n]
    cu_seqlens = metadata.non_spec_query_start_loc[:n + 1]
    has = metadata.has_initial_state
    has = None if has is None else has[:n]
    w, bias, a_log, dt_bias = float32_params(layer)
    heads = _heads(layer)
    # vLLM's pools as they are (strided views into its pages): gdn's step reads and writes the
    # batch's slots in place through the slot stride; nothing is gathered or copied back.
    conv = layer.kv_cache[0] if conv_pool is None else conv_pool
    out = gdn.torch.fused_gdn_step(mixed_qkv[:tokens], a[:tokens], b[:tokens], w, a_log, dt_bias,
                                   conv, ssm_pool(layer), slots, cu_seqlens, has,
                                   conv_bias=bias, **heads)
    core_attn_out[:tokens] = out.view(tokens, heads["num_v_heads"], heads["head_v_dim"])


def run_spec(layer, metadata, mixed_qkv: Tensor, b: Tensor, a: Tensor,
             core_attn_out: Tensor) -> None:
    """vLLM's speculative-aware GDN call on gdn: the windows and the other live sequences of
    the batch in one ``fused_gdn_step`` in vLLM's speculative layout (the windows first, as the
    step takes them); padding entries are cut off."""
    windows = 0 if metadata.spec_sequence_masks is None else metadata.num_spec_decodes
    if windows == 0:
        # No window (a prompt step while speculation is configured): ordinary sequences, which
        # keep their conv state in columns [0, K - 1) of the buffer; the rest stays as it is.
        taps = conv_weight(layer).shape[-1]
        return run(layer, metadata, mixed_qkv, b, a, core_attn_out,
                   conv_pool=layer.kv_cache[0][:, :taps - 1])
    table = metadata.spec_state_indices_tensor[:windows]
    accepted = metadata.num_accepted_tokens[:windows]
    spec_cu = metadata.spec_query_start_loc[:windows + 1]
    spec_tokens = int(spec_cu[windows])
    others = metadata.num_decodes + metadata.num_prefills
    order = None  # order[i]: the batch token that is the step's token i (None: token i)
    if others == 0:
        tokens, slots, cu_seqlens, has = spec_tokens, table[:, 0], spec_cu, None
    else:
        other_cu = metadata.non_spec_query_start_loc[:others + 1]
        tokens = spec_tokens + int(other_cu[others])
        slots = torch.cat([table[:, 0], metadata.non_spec_state_indices_tensor[:others]])
        cu_seqlens = torch.cat([spec_cu, other_cu[1:] + spec_tokens])
        other_has = metadata.has_initial_state
        other_has = (torch.ones(others, dtype=torch.bool) if other_has is None
                     else other_has[:others])
        has = torch.cat([torch.ones(windows, dtype=torch.bool), other_has])
        order = torch.cat([metadata.spec_token_indx, metadata.non_spec_token_indx]).long()
        if torch.equal(order, torch.arange(tokens)):
            order = None  # the windows' tokens come first already: no gather, no scatter
    if order is None:
        qkv, a_, b_ = mixed_qkv[:tokens], a[:tokens], b[:tokens]
    else:
        qkv, a_, b_ = (x.index_select(0, order) for x in (mixed_qkv, a, b))
    w, bias, a_log, dt_bias = float32_params(layer)
    heads = _heads(layer)
    out = gdn.torch.fused_gdn_step(qkv, a_, b_, w, a_log, dt_bias, layer.kv_cache[0],
                                   ssm_pool(layer), slots, cu_seqlens, has, conv_bias=bias,
                                   spec_state_indices=table, num_accepted_tokens=accepted,
                                   **heads)
    out = out.view(tokens, heads["num_v_heads"], heads["head_v_dim"])
    if order is None:
        core_attn_out[:tokens] = out
    else:
        core_attn_out.index_copy_(0, order, out.to(core_attn_out.dtype))
