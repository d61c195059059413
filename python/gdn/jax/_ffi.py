"""The XLA FFI targets of gdn's C++ handlers, registered once for the CPU platform, and the
helpers every op shares: argument specs for the library's trace-time validation, placeholders
for absent optional arguments, and dtype rules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.interpreters import partial_eval as pe

try:  # the dead-code rule below needs them (JAX 0.10 has them; older JAX goes without it)
    from jax.extend.core import DropVar, new_jaxpr_eqn
except ImportError:  # pragma: no cover
    DropVar = new_jaxpr_eqn = None

from gdn import _gdn
# The ops call these from here.
from gdn._options import check_choice, library_names, static_int  # noqa: F401

for _name, _capsule in _gdn.ffi_handlers().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

RESIDUALS = ("all", "t_inv", "none")

# Per target, the attribute that asks for each result (None: always written). An output the
# rest of the program never reads is not computed: the dead-code pass below turns its
# attribute off. This is what makes a remat policy that drops the residual names cheap: the
# backward then needs the forward call only for its residuals, and the C++ forward without o
# is the backward's own rebuild (docs/jax.md, "Gradients and the residual names").
OPTIONAL_RESULTS = {
    "gdn_forward": ("want_o", "want_final_state", "want_chunk_states", "want_t_inv"),
    "gdn_layer_forward": ("want_out", "want_conv_state_out", "want_recurrent_state_out",
                          "want_chunk_states", "want_t_inv"),
}
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


def _ffi_call_primitive():
    """The primitive jax.ffi.ffi_call binds (read off a traced call: JAX does not export it)."""
    probe = jax.ffi.ffi_call("gdn_probe", jax.ShapeDtypeStruct((0,), jnp.float32))
    return jax.make_jaxpr(probe)().eqns[0].primitive


def _drop_unread_results(used_outputs, eqn):
    """Dead-code elimination of one gdn FFI call: results nobody reads are asked for no more
    (their attribute off, their buffer the zero-element placeholder)."""
    wants = OPTIONAL_RESULTS.get(eqn.params.get("target_name"))
    if wants is None:
        return _previous_rule(used_outputs, eqn)
    if not any(used_outputs) and not eqn.effects:
        return [False] * len(eqn.invars), None
    try:
        new_eqn = _without_results(used_outputs, eqn, wants)
    except (KeyError, AttributeError, TypeError, ValueError):
        # Parameters of ffi_call this JAX names otherwise: keep the call whole (correct, it
        # only computes more).
        new_eqn = eqn
    return [True] * len(eqn.invars), new_eqn


def _without_results(used_outputs, eqn, wants):
    attrs = dict(eqn.params["attributes"])
    drop = [i for i, (used, want) in enumerate(zip(used_outputs, wants))
            if not used and want is not None and attrs.get(want)]
    # A call must still write something (the library refuses one that writes nothing).
    if not drop or not any(attrs.get(w) for i, w in enumerate(wants)
                           if w is not None and i not in drop):
        return eqn
    avals, outvars = list(eqn.params["result_avals"]), list(eqn.outvars)
    layouts = eqn.params.get("output_layouts")
    layouts = list(layouts) if layouts is not None else None
    for i in drop:
        attrs[wants[i]] = False
        sharding = getattr(avals[i], "sharding", None)
        empty = {"shape": (0,), "dtype": jnp.dtype(jnp.float32)}
        if sharding is not None:  # rank 1 now: the placeholder's replicated spec
            empty["sharding"] = sharding.update(spec=jax.sharding.PartitionSpec())
        avals[i] = avals[i].update(**empty)
        outvars[i] = DropVar(avals[i])
        if layouts is not None:
            layouts[i] = (0,)
    params = dict(eqn.params, attributes=tuple(sorted(attrs.items())),
                  result_avals=tuple(avals))
    if layouts is not None:
        params["output_layouts"] = tuple(layouts)
    return new_jaxpr_eqn(eqn.invars, outvars, eqn.primitive, params, eqn.effects,
                         eqn.source_info, eqn.ctx)


def default_dce_rule(used_outputs, eqn):
    """What the dead-code pass does with a primitive that has no rule of its own."""
    if not any(used_outputs) and not eqn.effects:
        return [False] * len(eqn.invars), None
    return [True] * len(eqn.invars), eqn


# bench/jax_remat_bench.py swaps the rule for default_dce_rule to measure what it gains.
FFI_CALL = _ffi_call_primitive()
_previous_rule = pe.dce_rules.get(FFI_CALL, default_dce_rule)
if DropVar is not None:
    pe.dce_rules[FFI_CALL] = _drop_unread_results
