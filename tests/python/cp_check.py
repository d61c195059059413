"""Context parallelism on 4 host devices, run by test_jax_cp.py in its own process (the device
count is fixed when JAX starts). Each case runs an op sharded along a mesh axis with
``jax.shard_map`` and prints, as one JSON line, its relative errors against the same op
unsharded (same kernels: rounding apart) and against a float64 reference (the pure-JAX one for
the core and layer ops; gdn's float64 kernels for the block), and how far segments run alone
would be ("carried": what the test's exactness depends on).

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
              l2norm=True, dtype=jnp.float32, chunk=16, residuals="all", cp=True, decay=0.05,
              seed=0):
    """Errors of the core op's output, final state and every gradient with the tokens over
    the "cp" axis (cp=False: without it, the batch or heads over the other axes). g is
    scaled by ``decay`` (g in [-0.05, -0.0005] by default) so that much of each segment's
    state reaches the next ones: the cross-segment terms are what is tested."""
    p = Problem(seed, batch, tokens, hk, hv, dk, dv, h0=h0)
    p.g *= decay
    if not l2norm:
        p.q *= dk ** -0.5
        p.k *= dk ** -0.5
    opts = dict(use_qk_l2norm_in_kernel=l2norm, chunk_size=chunk, residuals=residuals,
                output_final_state=True)
    act = P(spec_b, "cp" if cp else None, spec_h)
    state = P(spec_b, spec_h)

    def shard(cp_axis):
        def run(q, k, v, g, beta, h0):
            def body(q, k, v, g, beta, h0):
                return gdn.jax.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                                      cp_axis=cp_axis, **opts)
            # segments alone (cp, no cp_axis): device 0's final state, unchecked and unused
            return jax.shard_map(body, mesh=mesh, in_specs=(act,) * 5 + (state,),
                                 out_specs=(act, state), check_vma=bool(cp_axis) or not cp)(
                q, k, v, g, beta, h0)
        return run

    def single(q, k, v, g, beta, h0):
        return gdn.jax.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, **opts)

    def reference(q, k, v, g, beta, h0):
        return ref.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                          use_qk_l2norm_in_kernel=l2norm)

    h0 = jnp.asarray(p.h0) if h0 else jnp.zeros((batch, hv, dk, dv), jnp.float32)
    if dtype == jnp.float64:
        h0 = h0.astype(dtype)
    args = (*p.args(dtype), h0)
    args64 = tuple(jnp.asarray(x, jnp.float64) for x in args)
    errors = compare(shard("cp" if cp else None), single, reference, args, args64,
                     (p.d_o, p.d_ht), ("o", "final_state"), ("q", "k", "v", "g", "beta", "h0"))
    return errors, carried(shard(None), single, args) if cp else None


def carried(segments_alone, single, args):
    """How far the output of segments run each on its own (zero entering state, no CP) is
    from the unsharded output: how much the test depends on the state passed between them."""
    return rel_error(jax.jit(segments_alone)(*args)[0], jax.jit(single)(*args)[0])


def compare(sharded, single, reference, args, args64, cotangents, out_names, arg_names):
    """{output or d_argument: (error vs unsharded, error vs float64, unsharded vs float64)}
    for the outputs and the gradients of <outputs, cotangents>."""
    def loss(fn):
        def f(*a):
            return sum(jnp.sum(o.astype(jnp.float64) * c) for o, c in zip(fn(*a), cotangents))
        return f

    argnums = tuple(range(len(args)))
    out_cp = jax.jit(sharded)(*args)
    out_1 = jax.jit(single)(*args)
    out_64 = reference(*args64)
    grads_cp = jax.jit(jax.grad(loss(sharded), argnums))(*args)
    grads_1 = jax.jit(jax.grad(loss(single), argnums))(*args)
    grads_64 = jax.grad(loss(reference), argnums)(*args64)
    errors = {}
    for what, a, b, c in zip(out_names, out_cp, out_1, out_64):
        errors[what] = (rel_error(a, b), rel_error(a, c), rel_error(b, c))
    for name, a, b, c in zip(arg_names, grads_cp, grads_1, grads_64):
        errors["d_" + name] = (rel_error(a, b), rel_error(a, c), rel_error(b, c))
    return errors


def layer_case(tokens, hk, hv, dk, dv, taps, *, mesh, states=True, dtype=jnp.float32,
               weight_3d=False, seed=0):
    """Errors of the layer op's output, both final states and every gradient under CP (one
    sequence, its tokens over the 4 devices)."""
    rng = np.random.default_rng(seed)
    channels = 2 * hk * dk + hv * dv
    f32 = lambda *shape, s=1.0: jnp.asarray(s * rng.standard_normal(shape), jnp.float32)  # noqa
    qkv, a, b = f32(tokens, channels), f32(tokens, hv), f32(tokens, hv)
    w = f32(channels, 1, taps, s=0.5) if weight_3d else f32(channels, taps, s=0.5)
    # slow decay (g = -exp(A_log) softplus(a + dt_bias) about -0.01 per token), so that much
    # of each segment's state reaches the next ones
    bias, A_log, dt_bias = f32(channels, s=0.1), f32(hv, s=0.5) - 2.3, f32(hv, s=0.5) - 2.0
    conv_state = f32(1, taps - 1, channels) if states else jnp.zeros((1, taps - 1, channels))
    rec_state = f32(1, hv, dk, dv, s=0.5) if states else jnp.zeros((1, hv, dk, dv))
    heads = dict(num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
    cotangents = (rng.standard_normal((tokens, hv * dv)),
                  rng.standard_normal((1, taps - 1, channels)),
                  rng.standard_normal((1, hv, dk, dv)))
    seq, rep, chan = P("cp"), P(), P(None, None, None)

    def shard(cp_axis):
        def run(qkv, a, b, w, bias, A_log, dt_bias, conv_state, rec_state):
            def body(qkv, a, b, w, bias, A_log, dt_bias, conv_state, rec_state):
                return gdn.jax.fused_gdn(qkv, a, b, w, A_log, dt_bias, conv_bias=bias,
                                         conv_state=conv_state, recurrent_state=rec_state,
                                         chunk_size=16, cp_axis=cp_axis, **heads)
            return jax.shard_map(body, mesh=mesh, in_specs=(seq, seq, seq) + (rep,) * 6,
                                 out_specs=(seq, chan, rep), check_vma=cp_axis is not None)(
                qkv, a, b, w, bias, A_log, dt_bias, conv_state, rec_state)
        return run

    def single(qkv, a, b, w, bias, A_log, dt_bias, conv_state, rec_state):
        return gdn.jax.fused_gdn(qkv, a, b, w, A_log, dt_bias, conv_bias=bias,
                                 conv_state=conv_state, recurrent_state=rec_state,
                                 chunk_size=16, **heads)

    def reference(qkv, a, b, w, bias, A_log, dt_bias, conv_state, rec_state):
        return ref.fused_gdn(qkv, a, b, w, A_log, dt_bias, conv_bias=bias,
                             conv_state=conv_state, recurrent_state=rec_state, **heads)

    args = (qkv.astype(dtype), a.astype(dtype), b.astype(dtype), w, bias, A_log, dt_bias,
            conv_state, rec_state)
    if dtype == jnp.float64:
        args = tuple(x.astype(dtype) for x in args)
    args64 = tuple(jnp.asarray(x, jnp.float64) for x in args)
    errors = compare(shard("cp"), single, reference, args, args64, cotangents,
                     ("out", "conv_state_out", "recurrent_state_out"),
                     ("qkv", "a", "b", "conv_weight", "conv_bias", "A_log", "dt_bias",
                      "conv_state", "recurrent_state"))
    return errors, carried(shard(None), single, args)


def block_case(batch, tokens, *, mesh, spec_b=None, dtype=jnp.float32, cp=True, seed=0):
    """Errors of gdn.jax.nn's block (y, both final states, the gradients of x and of every
    parameter) with x's tokens over the devices, against the unsharded block and against the
    unsharded block in float64 (gdn's float64 kernels, tested against the pure-JAX reference in
    test_jax_nn.py)."""
    from gdn.jax import nn

    cfg = nn.GatedDeltaNetConfig(hidden_size=32, num_k_heads=1, num_v_heads=2, head_k_dim=8,
                                 head_v_dim=8)
    params = nn.init_params(jax.random.PRNGKey(seed), cfg)
    params["in_proj_qkvz.weight"] *= 10.0  # O(1) activations into the op
    params["A_log"] = jnp.full((2,), -2.3, jnp.float32)  # slow decay: the state crosses
    params["dt_bias"] = jnp.full((2,), -2.0, jnp.float32)  # segments
    names = sorted(params)
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((batch, tokens, cfg.hidden_size)), jnp.float32)
    states = (jnp.asarray(rng.standard_normal((batch, 3, cfg.conv_dim)), jnp.float32),
              jnp.asarray(0.5 * rng.standard_normal((batch, 2, 8, 8)), jnp.float32))
    cotangents = (rng.standard_normal(x.shape), rng.standard_normal(states[0].shape),
                  rng.standard_normal(states[1].shape))
    seq, rep = P(spec_b, "cp" if cp else None), P(spec_b)

    def run(cp_axis):
        def fn(x, conv_state, rec_state, *leaves):
            y, (c, r) = nn.gated_delta_net(dict(zip(names, leaves)), x, cfg,
                                           conv_state=conv_state, recurrent_state=rec_state,
                                           return_state=True, cp_axis=cp_axis)
            return y, c, r
        return fn

    def shard(cp_axis):
        def sharded(x, conv_state, rec_state, *leaves):
            return jax.shard_map(run(cp_axis), mesh=mesh,
                                 in_specs=(seq, rep, rep) + (P(),) * len(leaves),
                                 out_specs=(seq, rep, rep),
                                 check_vma=cp_axis is not None or not cp)(
                x, conv_state, rec_state, *leaves)
        return sharded

    args = tuple(a.astype(dtype) for a in (x, *states, *(params[n] for n in names)))
    args64 = tuple(jnp.asarray(a, jnp.float64) for a in args)
    errors = compare(shard("cp" if cp else None), run(None), run(None), args, args64,
                     cotangents, ("y", "conv_state_out", "recurrent_state_out"),
                     ("x", "conv_state", "recurrent_state", *names))
    return errors, carried(shard(None), run(None), args) if cp else None


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


def case_layer_f32_states_gva_k4():
    return layer_case(4 * 20, 1, 2, 8, 8, 4, mesh=mesh_of(("cp",), (4,)))


def case_layer_f32_no_states_weight_d1k_k3_dk_ne_dv():
    return layer_case(4 * 18, 2, 2, 8, 12, 3, mesh=mesh_of(("cp",), (4,)), states=False,
                      weight_3d=True)


def case_layer_bf16_activations():
    return layer_case(4 * 16, 1, 2, 8, 8, 4, mesh=mesh_of(("cp",), (4,)), dtype=jnp.bfloat16)


def case_layer_f32_one_tap_conv():
    return layer_case(4 * 12, 1, 1, 8, 8, 1, mesh=mesh_of(("cp",), (4,)))


def case_block_batch_over_dp_and_sequence_over_cp():
    return block_case(2, 2 * 12, mesh=mesh_of(("dp", "cp"), (2, 2)), spec_b="dp")


def case_core_f64_exact():
    return core_case(2, 4 * 24, 1, 2, 16, 8, mesh=mesh_of(("cp",), (4,)), dtype=jnp.float64)


def case_layer_f64_exact():
    return layer_case(4 * 20, 1, 2, 8, 8, 4, mesh=mesh_of(("cp",), (4,)), dtype=jnp.float64)


def case_block_f64_exact():
    return block_case(1, 4 * 12, mesh=mesh_of(("cp",), (4,)), dtype=jnp.float64)


def case_core_batch_over_dp_without_cp():
    return core_case(4, 40, 1, 2, 8, 8, mesh=mesh_of(("dp",), (4,)), spec_b="dp", cp=False)


def case_block_batch_over_dp_without_cp():
    return block_case(4, 20, mesh=mesh_of(("dp",), (4,)), spec_b="dp", cp=False)


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}


def main(names):
    for name in names or CASES:
        errors, carried_error = CASES[name]()
        print(json.dumps({"case": name, "errors": errors, "carried": carried_error}),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
