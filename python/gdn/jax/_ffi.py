"""The XLA FFI targets of gdn's C++ handlers, registered once for the CPU platform, and the
helpers every op shares: argument specs for the library's trace-time validation, placeholders
for absent optional arguments, and dtype rules."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gdn import _gdn
from gdn._options import check_choice, static_int  # noqa: F401 (the ops call them here)

for _name, _capsule in _gdn.ffi_handlers().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

RESIDUALS = ("all", "t_inv", "none")
MATMUL_PRECISIONS = ("compute", "bf16")


def spec(x):
    """(shape, dtype name) of an array or ShapeDtypeStruct, None for None."""
    if x is None:
        return None
    return (tuple(int(d) for d in x.shape), jnp.dtype(x.dtype).name)


def absent():
    """The zero-element placeholder passed where an optional argument is left out."""
    return jnp.zeros((0,), jnp.float32)


def absent_result():
    return jax.ShapeDtypeStruct((0,), jnp.float32)


def compute_dtype(activation_dtype):
    """float64 for float64 activations, else float32 (state, gates, parameters, residuals)."""
    return jnp.float64 if jnp.dtype(activation_dtype) == jnp.float64 else jnp.float32


def as_compute(x, dtype):
    """A float argument of the compute dtype (a bf16 gate or parameter is widened: the cast is
    differentiable, so its gradient arrives in the caller's dtype)."""
    if x is None:
        return None
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x  # the library names the wrong dtype
    return x.astype(dtype) if x.dtype != dtype else x


def index_array(x, name):
    """An int32 or int64 index array (the handlers widen int32)."""
    if x is None:
        return None
    x = jnp.asarray(x)
    if x.dtype not in (jnp.int32, jnp.int64):
        raise ValueError(f"gdn: argument '{name}': expected dtype int32 or int64, given {x.dtype}")
    return x


def placeholder(x):
    return absent() if x is None else x


def call(target, results, *args, vmap_method="sequential", **attrs):
    return jax.ffi.ffi_call(target, results, vmap_method=vmap_method)(*args, **attrs)
