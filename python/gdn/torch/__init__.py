"""gdn's ops for PyTorch, on the C++ library's CPU kernels through ``torch.library`` custom ops.

- ``chunk_gated_delta_rule``: fla's chunked gated delta rule, differentiable, with a choice of
  what the forward keeps for the backward (``residuals="all" | "t_inv" | "none"``);
- ``fused_recurrent_gated_delta_rule``: fla's token recurrence (the decode path);
- ``causal_conv1d_fn``, ``causal_conv1d_update``: the causal-conv1d package's conv (prefill /
  training, and a decode step on a conv state updated in place);
- ``fused_gdn_step``: a serving step of a whole GDN layer over pools of state slots, updated in
  place (sglang's / vLLM's ``initial_state_indices``); ``torch.ops.gdn.step`` takes Tokamax's
  metadata;
- ``reference``: the library's float64 reference of both passes, for checking;
- ``patch(model)``: a transformers Qwen3-Next / Qwen3.5 model's GatedDeltaNet layers on gdn.

The ops are registered as ``torch.ops.gdn.chunk_fwd``, ``chunk_bwd``, ``conv_fwd``,
``conv_bwd``, ``conv_update``, ``step`` and ``fused_gdn_step``, with fake kernels
(``torch.compile(fullgraph=True)`` traces through them) and autograd formulas that call the
C++ backward with what the forward saved (the inference calls ``conv_update``, ``step`` and
``fused_gdn_step`` have none). Checks of tensor values run in the ops' bodies, so a compiled
graph raises what eager mode does. Every op runs on torch's intra-op thread count
(``torch.get_num_threads()``, read when the op runs); an explicit ``threads`` is clamped to it.
Helpers come from gdn's pool, or from torch's OpenMP team after ``run_on_torch_threads(True)``.
docs/torch.md explains them.
"""

try:
    import torch as _torch  # noqa: F401
except ModuleNotFoundError as _error:
    if _error.name != "torch":
        raise
    raise ImportError("gdn.torch needs PyTorch, which this environment does not have: install gdn "
                      "with its torch extra (pip install '.[torch]' in gdn's checkout) or "
                      "pip install 'torch>=2.4'") from _error

from gdn.torch import reference
from gdn.torch._conv import causal_conv1d_fn, causal_conv1d_update
from gdn.torch._core import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from gdn.torch._ops import run_on_torch_threads
from gdn.torch._patch import is_patched, patch, unpatch
from gdn.torch._step import fused_gdn_step

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "causal_conv1d_fn",
           "causal_conv1d_update", "fused_gdn_step", "reference", "patch", "unpatch", "is_patched",
           "run_on_torch_threads"]
