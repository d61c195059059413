"""Context parallelism on 4 host devices, run by test_jax_cp.py in its own process (the device
count is fixed when JAX starts). Each case runs an op sharded along a mesh axis with
``jax.shard_map`` and prints, as one JSON line, its relative errors against the same op
unsharded (same kernels: float32 rounding apart) and against the float64 pure-JAX reference.

    python cp_check.py            # every case
    python cp_check.py CASE ...   # the named ones
"""

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=4")

import json  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, PartitionSpec as P  # noqa: E402

import gdn.jax  # noqa: E402
from gdn.jax import _cp  # noqa: E402
import jax_reference as ref  # noqa: E402
from conftest import Problem, rel_error  # noqa: E402


def mesh_of(names, sizes):
    return jax.make_mesh(sizes, names, axis_types=(AxisType.Auto,) * len(names))


def core_case(batch, tokens, hk, hv, dk, dv, *, mesh, spec_b=None, spec_h=None, h0=True,
              l2norm=True, dtype=jnp.float32, chunk=16, residuals="all", seed=0):
    """Errors of the core op's output, final state and every gradient under CP."""
    p = Problem(seed, batch, tokens, hk, hv, dk, dv, h0=h0)
    if not l2norm:
        p.q *= dk ** -0.5
        p.k *= dk ** -0.5
    opts = dict(use_qk_l2norm_in_kernel=l2norm, chunk_size=chunk, residuals=residuals,
                output_final_state=True)
    act = P(spec_b, "cp", spec_h)
    gate = P(spec_b, "cp", spec_h)
    state = P(spec_b, spec_h)

    def sharded(q, k, v, g, beta, h0):
        def body(q, k, v, g, beta, h0):
            return gdn.jax.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                                  cp_axis="cp", **opts)
        return jax.shard_map(body, mesh=mesh, in_specs=(act, act, act, gate, gate, state),
                             out_specs=(act, state))(q, k, v, g, beta, h0)

    def single(q, k, v, g, beta, h0):
        return gdn.jax.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, **opts)

    def reference(q, k, v, g, beta, h0):
        return ref.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                          use_qk_l2norm_in_kernel=l2norm)

    h0 = jnp.asarray(p.h0) if h0 else jnp.zeros((batch, hv, dk, dv), jnp.float32)
    args = (*p.args(dtype), h0)
    args64 = tuple(jnp.asarray(x, jnp.float64) for x in args)
    return compare(sharded, single, reference, args, args64, p.d_o, p.d_ht,
                   ("q", "k", "v", "g", "beta", "h0"))


def compare(sharded, single, reference, args, args64, d_o, d_ht, names):
    def loss(fn):
        def f(*a):
            o, ht = fn(*a)
            return jnp.sum(o.astype(jnp.float64) * d_o) + jnp.sum(ht.astype(jnp.float64) * d_ht)
        return f

    argnums = tuple(range(len(args)))
    out_cp = jax.jit(sharded)(*args)
    out_1 = jax.jit(single)(*args)
    out_64 = reference(*args64)
    grads_cp = jax.jit(jax.grad(loss(sharded), argnums))(*args)
    grads_1 = jax.jit(jax.grad(loss(single), argnums))(*args)
    grads_64 = jax.grad(loss(reference), argnums)(*args64)
    errors = {}
    for what, a, b, c in zip(("o", "final_state"), out_cp, out_1, out_64):
        errors[what] = (rel_error(a, b), rel_error(a, c), rel_error(b, c))
    for name, a, b, c in zip(names, grads_cp, grads_1, grads_64):
        errors["d_" + name] = (rel_error(a, b), rel_error(a, c), rel_error(b, c))
    return errors


def case_core_f32_h0_l2norm_gva():
    return core_case(2, 4 * 24, 1, 2, 16, 8, mesh=mesh_of(("cp",), (4,)))


def case_core_f32_no_h0_no_l2norm_chunk32():
    return core_case(1, 4 * 40, 2, 2, 12, 20, mesh=mesh_of(("cp",), (4,)), h0=False,
                     l2norm=False, chunk=32, residuals="none")


def case_core_split_calls_when_dv_plus_dk_passes_max_width():
    _cp.MAX_WIDTH = 16  # Dv + Dk = 24: the (o(0), E) and (R, M) calls run apart
    try:
        return core_case(1, 4 * 20, 1, 2, 8, 16, mesh=mesh_of(("cp",), (4,)))
    finally:
        _cp.MAX_WIDTH = 256


def case_core_bf16_activations():
    return core_case(1, 4 * 32, 1, 2, 16, 16, mesh=mesh_of(("cp",), (4,)), dtype=jnp.bfloat16)


def case_core_batch_over_dp_and_sequence_over_cp():
    return core_case(2, 2 * 24, 1, 2, 8, 8, mesh=mesh_of(("dp", "cp"), (2, 2)), spec_b="dp")


def case_core_heads_over_tp_and_sequence_over_cp():
    return core_case(1, 2 * 24, 2, 4, 8, 8, mesh=mesh_of(("tp", "cp"), (2, 2)), spec_h="tp")


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}


def main(names):
    for name in names or CASES:
        print(json.dumps({"case": name, "errors": CASES[name]()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
