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
"""

from __future__ import annotations

import sys
from typing import Optional

from torch import Tensor, nn

from gdn.torch._conv import causal_conv1d_fn, causal_conv1d_update
from gdn.torch._core import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

_NAMES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
          "causal_conv1d_update")
_saved: dict[str, dict[str, object]] = {}  # module name -> the functions the patch replaced


def _chunk(query: Tensor, key: Tensor, value: Tensor, g: Tensor, beta: Tensor,
           chunk_size: int = 64, initial_state: Optional[Tensor] = None,
           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
           cu_seqlens: Optional[Tensor] = None, **_model_kwargs):
    """transformers' ``torch_chunk_gated_delta_rule`` signature on gdn (model kwargs the
    layer passes along, such as position ids, are not the op's and are ignored)."""
    return chunk_gated_delta_rule(query, key, value, g, beta, initial_state=initial_state,
                                  output_final_state=output_final_state,
                                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                  cu_seqlens=cu_seqlens, chunk_size=chunk_size)


def _recurrent(query: Tensor, key: Tensor, value: Tensor, g: Tensor, beta: Tensor,
               initial_state: Optional[Tensor] = None, output_final_state: bool = False,
               use_qk_l2norm_in_kernel: bool = False, cu_seqlens: Optional[Tensor] = None,
               **_model_kwargs):
    """transformers' ``torch_recurrent_gated_delta_rule`` signature on gdn."""
    return fused_recurrent_gated_delta_rule(query, key, value, g=g, beta=beta,
                                            initial_state=initial_state,
                                            output_final_state=output_final_state,
                                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                            cu_seqlens=cu_seqlens)


def _conv_fn(hidden_states: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
             activation: Optional[str] = None, **_model_kwargs):
    """transformers' ``causal_conv1d_fn`` signature on gdn: x [B, D, T]. As transformers' own
    fallback, each row is one sequence (packed-sequence kwargs are not the conv's)."""
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
    Works whether or not fla or causal-conv1d is installed. Returns the model.

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
