"""The XLA FFI targets of gdn's C++ handlers, registered once for the CPU platform, and the
helpers every op shares: argument specs for the library's trace-time validation, placeholders
for absent optional arguments, and dtype rules."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gdn import _gdn
# The ops call these from here.
from gdn._options import check_choice, library_names, static_int  # noqa: F401

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


def varying_axes(x):
    """The mesh axes x varies along inside ``shard_map`` (empty outside)."""
    mat = getattr(jax.typeof(x), "manual_axis_type", None)
    return frozenset(mat.varying) if mat is not None else frozenset()


def _typed_for_shard_map(results, args):
    """Inside ``shard_map`` (JAX >= 0.10 types arrays by the mesh axes they vary along), the
    operands made to vary along the same axes and the results typed so: a custom call's result
    differs per device like its operands. Outside, or on older JAX, unchanged."""
    axes = frozenset().union(*(varying_axes(x) for x in args))
    if not axes:
        return results, args
    args = tuple(x if varying_axes(x) == axes
                 else jax.lax.pcast(x, tuple(sorted(axes - varying_axes(x), key=str)), to="varying")
                 for x in args)
    typed = jax.typeof(args[0])
    sharding = jax.sharding.NamedSharding(typed.sharding.mesh, jax.sharding.PartitionSpec())
    results = tuple(jax.ShapeDtypeStruct(r.shape, r.dtype, sharding=sharding,
                                         manual_axis_type=typed.manual_axis_type)
                    for r in results)
    return results, args


def call(target, results, *args, vmap_method="sequential", **attrs):
    results, args = _typed_for_shard_map(results, args)
    return jax.ffi.ffi_call(target, results, vmap_method=vmap_method)(*args, **attrs)


def like_primal(cotangent, primal):
    """A custom_vjp cotangent typed like its primal inside ``shard_map``: where the primal is
    the same on every device of an axis and its cotangent is not, the cotangent is the psum
    over that axis (the transpose of broadcasting the primal to the devices); where the primal
    varies and the cotangent does not, the cotangent is cast to varying."""
    if cotangent is None or primal is None:
        return cotangent
    extra = varying_axes(cotangent) - varying_axes(primal)
    if extra:
        cotangent = jax.lax.psum(cotangent, tuple(sorted(extra, key=str)))
    missing = varying_axes(primal) - varying_axes(cotangent)
    if missing:  # a cotangent the same on every device of a primal that is not
        cotangent = jax.lax.pcast(cotangent, tuple(sorted(missing, key=str)), to="varying")
    return cotangent
