"""gdn's ops for JAX, on the C++ library's CPU kernels through XLA FFI custom calls.

- ``chunk_gated_delta_rule``: the core op with fla's signature, differentiable, residuals
  named ``gdn_chunk_states`` and ``gdn_t_inv`` for ``jax.checkpoint`` policies;
- ``fused_gdn``: the fused layer op (conv1d + SiLU, gates, L2 norm, gated delta rule),
  differentiable in every input;
- ``fused_conv1d_gdn``: Tokamax's serving call over pools of state slots, updated in place;
  ``check_fused_conv1d_gdn`` checks such a step on the host (an engine runs it before a jit
  of its own that donates the pools);
- ``gdn.jax.nn``: a Qwen3-Next GatedDeltaNet block over a parameter pytree with
  Hugging Face's names, loading HF weights (``import gdn.jax.nn``).

docs/jax.md explains install, the ops, the residual names, the serving call and its pools.
"""

import re as _re

try:
    import jax as _jax
except ModuleNotFoundError as _error:
    if _error.name not in ("jax", "jaxlib"):
        raise
    raise ImportError("gdn.jax needs JAX, which this environment does not have: install gdn with "
                      "its jax extra (pip install '.[jax]' in gdn's checkout) or "
                      "pip install 'jax>=0.10.2'") from _error

from gdn import _gdn as _extension  # noqa: E402

if not _extension.has_xla_ffi:
    raise ImportError("this build of gdn has no JAX handlers (built with GDN_JAX=OFF, or on a "
                      "Python older than 3.11, without jaxlib's XLA FFI headers): rebuild it with "
                      "pip install '.[jax]' in gdn's checkout, on Python >= 3.11")

# The oldest JAX the tests pass on (docs/jax.md, "Install"). Tried and short of it: 0.10.0
# copies the serving call's donated pools instead of updating them in place, and 0.8.2 also
# fails the context parallelism's custom_vjp typing and lacks what the remat rule needs.
MIN_JAX = (0, 10, 2)
_MIN_TEXT = ".".join(map(str, MIN_JAX))


def _release(version):
    """(major, minor, micro) of a version string such as "0.10.2" or "0.11.0.dev20260101"."""
    parts = [int(_re.match(r"\d*", part).group() or 0) for part in version.split(".")[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


if _release(_jax.__version__) < MIN_JAX:
    raise ImportError(f"gdn.jax needs jax >= {_MIN_TEXT} (the oldest its tests pass on); this "
                      f"environment has jax {_jax.__version__}: pip install -U 'jax>={_MIN_TEXT}'")

from gdn.jax._core import chunk_gated_delta_rule  # noqa: E402
from gdn.jax._layer import fused_gdn  # noqa: E402
from gdn.jax._serving import check_fused_conv1d_gdn, fused_conv1d_gdn  # noqa: E402

RESIDUAL_NAMES = ("gdn_chunk_states", "gdn_t_inv")
"""The names ``jax.ad_checkpoint.checkpoint_name`` gives the residuals, for
``jax.checkpoint_policies.save_only_these_names(*gdn.jax.RESIDUAL_NAMES)``."""

OUTPUT_NAME = "gdn_core_attn_out"
"""The name of the ops' output o (MaxText's). A policy that saves it with the residuals keeps
the backward from replaying the forward call to get o back for the rest of the model; one that
saves it alone has the backward replay the forward without o (the C++ rebuild of the
residuals)."""

__all__ = ["chunk_gated_delta_rule", "fused_gdn", "fused_conv1d_gdn", "check_fused_conv1d_gdn",
           "RESIDUAL_NAMES", "OUTPUT_NAME"]
