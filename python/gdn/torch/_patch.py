"""``gdn.torch.patch(model)``: Hugging Face transformers' Qwen3-Next / Qwen3.5 GatedDeltaNet
layers on gdn's kernels.

transformers' GatedDeltaNet layers call four module-level functions of their modeling module:
``causal_conv1d_fn`` (the conv of a prefill or a training step), ``causal_conv1d_update`` (the
conv of a one-token decode, on the cache's conv state), ``torch_chunk_gated_delta_rule``
(prefill, training) and ``torch_recurrent_gated_delta_rule`` (one-token decode). Which
implementation those names hold is chosen when the module is imported: fla's Triton kernels or
the causal-conv1d package if they import (they fail on a CPU), else transformers' own PyTorch
code. The patch rebinds the four names in the module of every GatedDeltaNet class found in the
model to gdn's ops, whatever was there, and ``unpatch`` puts back what it found. The layers'
projections, gated norm and cache handling stay transformers' own.

The layers hand those functions the keywords the model's forward was given. Padding-free
batches (``DataCollatorWithFlattening``: one row of sequences with ``seq_idx`` and
``cu_seq_lens_q``) keep their sequences apart in the conv and in the delta rule, with the same
boundaries; keywords that ask nothing of the ops (output and cache flags, flash attention's
hints) are ignored, and any other is refused: a keyword dropped silently could change the
result (docs/torch.md lists them).
"""

from __future__ import annotations

import sys
from typing import Optional

import torch
from torch import Tensor, nn

from gdn.torch._conv import _cu_from_seq_idx, causal_conv1d_fn, causal_conv1d_update
from gdn.torch._core import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

_NAMES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
          "causal_conv1d_update")
_saved: dict[str, dict[str, object]] = {}  # module name -> the functions the patch replaced


# Keywords transformers' (5.24, 5.25) GatedDeltaNet layers hand on from the model's forward
# (TransformersKwargs, FlashAttentionKwargs) that ask nothing of the conv or the delta rule:
# output and cache flags, the loss's token count, flash attention's length hints, and its key
# boundaries (a linear layer has no keys apart from its queries). Any other keyword is refused
# unless it is None (not given).
_NOT_THE_OPS = frozenset({"use_cache", "output_attentions", "output_hidden_states",
                          "output_router_logits", "return_dict", "num_items_in_batch",
                          "position_ids", "max_length_q", "max_length_k", "cu_seq_lens_k",
                          "is_causal"})


def _check_model_kwargs(kwargs: dict) -> None:
    for name, value in kwargs.items():
        if value is None:
            continue
        if name == "is_causal" and value is False:
            raise ValueError("gdn: argument 'is_causal': expected True or None (a GatedDeltaNet "
                             "layer is causal), given False")
        if name not in _NOT_THE_OPS:
            raise ValueError(f"gdn: argument '{name}': expected one of the keywords transformers "
                             f"5.24 and 5.25 hand to a GatedDeltaNet layer's functions (seq_idx, "
                             f"cu_seq_lens_q, {', '.join(sorted(_NOT_THE_OPS))}), given "
                             f"{type(value).__name__} (gdn.torch.patch does not know what it "
                             f"asks)")


def _packed_cu_seqlens(query: Tensor, cu_seqlens: Optional[Tensor],
                       seq_idx: Optional[Tensor]) -> Optional[Tensor]:
    """The delta rule's boundaries: transformers' cu_seq_lens_q, else those of seq_idx
    (a padding-free batch described by seq_idx alone), else None."""
    if cu_seqlens is not None or seq_idx is None:
        return cu_seqlens
    if query.dim() != 4 or query.shape[0] != 1:
        raise ValueError(f"gdn: argument 'seq_idx': expected one packed row, query [1, T, H, K], "
                         f"given query {list(query.shape)}")
    return _cu_from_seq_idx(seq_idx, 1, query.shape[1])


def _check_cache(initial_state: Optional[Tensor], output_final_state: bool,
                 cu_seqlens: Optional[Tensor]) -> None:
    """A model with a cache hands its layers the cache's state (one per batch row) and asks for
    the final one (output_final_state = a cache exists): several packed sequences in a row can
    neither continue nor fill it, and transformers' attention layers do not keep packed
    sequences apart when a cache is in use, so the logits would be wrong. Refused, as
    unpatched transformers refuses packed sequences on the CPU."""
    if cu_seqlens is None or cu_seqlens.shape[0] <= 2:
        return
    packed = cu_seqlens.shape[0] - 1
    if initial_state is not None:
        raise ValueError(f"gdn: argument 'initial_state': expected None with {packed} packed "
                         f"sequences (a cache holds one state per batch row: packed sequences "
                         f"continue none, pass use_cache=False), given a cached state "
                         f"{list(initial_state.shape)}")
    if output_final_state:
        raise ValueError(f"gdn: argument 'output_final_state': expected False with {packed} "
                         f"packed sequences (transformers asks for it when the model has a "
                         f"cache, which holds one state per batch row, and its attention layers "
                         f"do not keep packed sequences apart then: pass use_cache=False), given "
                         f"True")


def _chunk(query: Tensor, key: Tensor, value: Tensor, g: Tensor, beta: Tensor,
           chunk_size: int = 64, initial_state: Optional[Tensor] = None,
           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
           cu_seqlens: Optional[Tensor] = None, seq_idx: Optional[Tensor] = None,
           **model_kwargs):
    """transformers' ``torch_chunk_gated_delta_rule`` signature on gdn: packed sequences by
    cu_seqlens (transformers' cu_seq_lens_q) or seq_idx; the model's other keywords are checked
    to be none of the op's business."""
    _check_model_kwargs(model_kwargs)
    cu_seqlens = _packed_cu_seqlens(query, cu_seqlens, seq_idx)
    _check_cache(initial_state, output_final_state, cu_seqlens)
    return chunk_gated_delta_rule(query, key, value, g, beta, initial_state=initial_state,
                                  output_final_state=output_final_state,
                                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                  cu_seqlens=cu_seqlens, chunk_size=chunk_size)


def _recurrent(query: Tensor, key: Tensor, value: Tensor, g: Tensor, beta: Tensor,
               initial_state: Optional[Tensor] = None, output_final_state: bool = False,
               use_qk_l2norm_in_kernel: bool = False, cu_seqlens: Optional[Tensor] = None,
               seq_idx: Optional[Tensor] = None, **model_kwargs):
    """transformers' ``torch_recurrent_gated_delta_rule`` signature on gdn, keywords as
    ``_chunk``'s."""
    _check_model_kwargs(model_kwargs)
    cu_seqlens = _packed_cu_seqlens(query, cu_seqlens, seq_idx)
    _check_cache(initial_state, output_final_state, cu_seqlens)
    return fused_recurrent_gated_delta_rule(query, key, value, g=g, beta=beta,
                                            initial_state=initial_state,
                                            output_final_state=output_final_state,
                                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                            cu_seqlens=cu_seqlens)


def _conv_fn(hidden_states: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
             activation: Optional[str] = None, seq_idx: Optional[Tensor] = None,
             cu_seq_lens_q: Optional[Tensor] = None, **model_kwargs):
    """transformers' ``causal_conv1d_fn`` signature on gdn: x [B, D, T']. A padding-free batch
    keeps its sequences apart with the delta rule's boundaries, cu_seq_lens_q (B = 1), else
    seq_idx [B, T]. With a cache, transformers puts the cache's conv context (or zeros) before
    the T new tokens: those T' - T inputs precede the first sequence's."""
    _check_model_kwargs(model_kwargs)
    if cu_seq_lens_q is not None:
        cu = cu_seq_lens_q
        if isinstance(cu, Tensor) and cu.dim() == 1 and cu.shape[0] >= 2 and \
                cu.dtype in (torch.int32, torch.int64):
            # The context joins the first sequence: every boundary after 0 moves by T' - T
            # (none when cu_seq_lens_q runs past T': the conv then names that).
            cu = cu.long()
            shifted = cu + (hidden_states.shape[-1] - cu[-1]).clamp(min=0)
            cu = torch.cat([cu[:1], shifted[1:]])
        return causal_conv1d_fn(hidden_states, weight, bias, activation=activation,
                                cu_seqlens=cu)
    if seq_idx is not None:
        context = hidden_states.shape[-1] - seq_idx.shape[-1] \
            if isinstance(seq_idx, Tensor) and seq_idx.dim() == 2 else 0
        if context > 0:
            seq_idx = torch.cat([seq_idx[:, :1].expand(-1, context), seq_idx], dim=1)
        return causal_conv1d_fn(hidden_states, weight, bias, activation=activation,
                                seq_idx=seq_idx)
    return causal_conv1d_fn(hidden_states, weight, bias, activation=activation)


def _conv_update(hidden_states: Tensor, conv_state: Tensor, weight: Tensor,
                 bias: Optional[Tensor] = None, activation: Optional[str] = None):
    """transformers' ``causal_conv1d_update`` signature on gdn: the cache's conv state [B, D, K]
    updated in place."""
    return causal_conv1d_update(hidden_states, conv_state, weight, bias, activation)


_REPLACEMENTS = {"torch_chunk_gated_delta_rule": _chunk,
                 "torch_recurrent_gated_delta_rule": _recurrent,
                 "causal_conv1d_fn": _conv_fn,
                 "causal_conv1d_update": _conv_update}


def _gdn_modules(model: nn.Module):
    """The modeling modules of the model's GatedDeltaNet layers."""
    names = []
    for layer in model.modules():
        cls = type(layer)
        if cls.__name__.endswith("GatedDeltaNet"):
            module = sys.modules[cls.__module__]
            if all(hasattr(module, n) for n in _NAMES) and module.__name__ not in names:
                names.append(module.__name__)
    return names


def patch(model: nn.Module) -> nn.Module:
    """Runs every GatedDeltaNet layer of a transformers Qwen3-Next (or Qwen3.5) model on gdn's
    kernels: prefill and training through ``gdn.torch.causal_conv1d_fn`` and
    ``gdn.torch.chunk_gated_delta_rule``, cached one-token decode through
    ``gdn.torch.causal_conv1d_update`` and ``gdn.torch.fused_recurrent_gated_delta_rule``.
    Works whether or not fla or causal-conv1d is installed, with padding-free batches too
    (``seq_idx`` / ``cu_seq_lens_q``, as transformers' DataCollatorWithFlattening makes them).
    Returns the model.

    The functions are rebound in the layers' modeling module, so every model of that class in
    the process runs on gdn until ``gdn.torch.unpatch()``. Raises ValueError when the model has
    no GatedDeltaNet layer.

    Example::

        model = transformers.AutoModelForCausalLM.from_pretrained(name)  # a Qwen3-Next model
        gdn.torch.patch(model)
        out = model.generate(**inputs, max_new_tokens=32)
    """
    modules = _gdn_modules(model)
    if not modules:
        raise ValueError(f"gdn: argument 'model': expected a model with GatedDeltaNet layers "
                         f"(transformers' Qwen3-Next or Qwen3.5), given {type(model).__name__}")
    for name in modules:
        module = sys.modules[name]
        if name not in _saved:
            _saved[name] = {n: getattr(module, n) for n in _NAMES}
        for n, f in _REPLACEMENTS.items():
            setattr(module, n, f)
    return model


def unpatch() -> None:
    """Puts back the functions ``patch`` replaced, in every module it patched."""
    for name, functions in _saved.items():
        for n, f in functions.items():
            setattr(sys.modules[name], n, f)
    _saved.clear()


def is_patched(model: nn.Module) -> bool:
    """Whether the model's GatedDeltaNet layers run on gdn."""
    modules = _gdn_modules(model)
    return bool(modules) and all(
        getattr(sys.modules[m], n) is f for m in modules for n, f in _REPLACEMENTS.items())
