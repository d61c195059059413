"""One test per validation rule of gdn.jax's public entry points (docs/validation.md lists them):
each breaks one argument of a valid call and checks the exception's type, that its message
names the caller's argument (``argument 'num_v_heads'``, not the library's ``options.hv``),
says "expected" and "given", and carries the rule's own words. Shape, dtype and option rules
raise when the call is traced (run here under ``jax.eval_shape``: nothing executes); index
values raise when the computation runs (the serving call's concrete ones before it, on the
host). The serving call's pools are bit-identical after every rejected call."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as P

import gdn.jax
from gdn.jax import nn

RUNTIME = jax.errors.JaxRuntimeError


def arr(*shape, dtype=jnp.float32, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def i32(values):
    return jnp.asarray(values, jnp.int32)


def check_message(message, argument, words):
    assert f"argument '{argument}'" in message, message
    assert "expected" in message and "given" in message, message
    for word in words:
        assert word in message, (word, message)


def raises(call, exception, argument, words, traced):
    """call() raises exception naming argument; a trace-time rule raises under eval_shape."""
    with pytest.raises(exception) as info:
        if traced:
            jax.eval_shape(call)
        else:
            jax.block_until_ready(call())
    check_message(str(info.value), argument, words)


def one_device_mesh(*names):
    return jax.make_mesh((1,) * len(names), names, axis_types=(AxisType.Auto,) * len(names))


# ---------------------------------------------------------------------------------------------
# chunk_gated_delta_rule: B = 1, T = 8, Hk = 1, Hv = 2, Dk = 8, Dv = 4.
# ---------------------------------------------------------------------------------------------

CORE = dict(q=arr(1, 8, 1, 8, seed=1), k=arr(1, 8, 1, 8, seed=2), v=arr(1, 8, 2, 4, seed=3),
            g=-jnp.abs(arr(1, 8, 2, seed=4)), beta=jax.nn.sigmoid(arr(1, 8, 2, seed=5)))


def core(**over):
    args = {**CORE, **over}
    q, k, v, g, beta = (args.pop(n) for n in ("q", "k", "v", "g", "beta"))
    return lambda: gdn.jax.chunk_gated_delta_rule(q, k, v, g, beta, **args)


def huge(shape_of, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape_of, dtype)


def core_element_count_overflows():
    shapes = {n: (1, 2 ** 61) + CORE[n].shape[2:] for n in CORE}
    return jax.eval_shape(lambda *x: gdn.jax.chunk_gated_delta_rule(*x),
                          *(huge(shapes[n]) for n in ("q", "k", "v", "g", "beta")))


def core_cp(in_spec=P(None, "cp"), mesh_axes=("cp",), **over):
    """The core op under shard_map over a one-device mesh, with cp_axis="cp"."""
    args = {**CORE, **over}
    rest = {n: args.pop(n) for n in list(args) if n not in ("q", "k", "v", "g", "beta")}

    def body(q, k, v, g, beta):
        return gdn.jax.chunk_gated_delta_rule(q, k, v, g, beta, cp_axis="cp", **rest)[0]

    inputs = [args[n] for n in ("q", "k", "v", "g", "beta")]
    specs = tuple(P(*in_spec[:x.ndim]) for x in inputs)
    fn = jax.shard_map(body, mesh=one_device_mesh(*mesh_axes), in_specs=specs,
                       out_specs=P(*in_spec))
    return lambda: fn(*inputs)


HV3 = dict(q=arr(1, 8, 2, 8), k=arr(1, 8, 2, 8), v=arr(1, 8, 3, 4), g=arr(1, 8, 3),
           beta=arr(1, 8, 3))
CORE_RULES = [
    # the binding's own checks
    ("residuals_not_a_choice", core(residuals="some"), "residuals", ["one of"]),
    ("matmul_precision_not_a_choice", core(matmul_precision="fp8"), "matmul_precision",
     ["one of"]),
    ("chunk_size_not_an_integer", core(chunk_size=64.5), "chunk_size", ["an integer"]),
    ("threads_not_a_32_bit_integer", core(threads=2 ** 32), "threads", ["32-bit"]),
    ("cu_seqlens_float", core(cu_seqlens=jnp.array([0.0, 8.0])), "cu_seqlens",
     ["int32 or int64"]),
    ("batch_not_1_with_cu_seqlens", core(q=arr(2, 8, 1, 8), cu_seqlens=i32([0, 8])), "q",
     ["[1, T, Hk, Dk] with cu_seqlens"]),
    ("g_not_packed_with_cu_seqlens", core(g=arr(8, 2), cu_seqlens=i32([0, 8])), "g",
     ["[1, T, Hv] with cu_seqlens"]),
    # the library's, through the binding
    ("q_rank_2", core(q=arr(8, 8)), "q", ["rank"]),
    ("q_rank_5", core(q=arr(1, 1, 8, 1, 8)), "q", ["rank 1 to 4"]),
    ("q_integer_dtype", core(q=CORE["q"].astype(jnp.int32)), "q", ["dtype", "i32"]),
    ("k_dtype_not_that_of_q", core(k=CORE["k"].astype(jnp.bfloat16)), "k", ["dtype"]),
    ("k_shape_not_that_of_q", core(k=arr(1, 8, 1, 4)), "k", ["[1, 8, 1, 4]"]),
    ("v_tokens_not_those_of_q", core(v=arr(1, 5, 2, 4)), "v", ["leading [B, T] of q"]),
    ("hk_zero", core(q=arr(1, 8, 0, 8), k=arr(1, 8, 0, 8)), "q", ["Hk >= 1"]),
    ("hv_not_multiple_of_hk", core(**HV3), "v", ["multiple of Hk = 2", "Hv = 3"]),
    ("dk_zero", core(q=arr(1, 8, 1, 0), k=arr(1, 8, 1, 0)), "q", ["Dk in [1, 256]", "Dk = 0"]),
    ("dk_above_256", core(q=arr(1, 8, 1, 257), k=arr(1, 8, 1, 257)), "q",
     ["Dk in [1, 256]", "257"]),
    ("dv_above_256", core(v=arr(1, 8, 2, 257)), "v", ["Dv in [1, 256]", "257"]),
    ("g_shape", core(g=arr(1, 8, 1)), "g", ["[1, 8, 1]"]),
    ("beta_integer_dtype", core(beta=CORE["beta"].astype(jnp.int32)), "beta", ["dtype"]),
    ("initial_state_shape", core(initial_state=jnp.zeros((1, 2, 8, 5))), "initial_state",
     ["[1, 2, 8, 4]", "[1, 2, 8, 5]"]),
    ("initial_state_integer_dtype", core(initial_state=jnp.zeros((1, 2, 8, 4), jnp.int32)),
     "initial_state", ["dtype"]),
    ("scale_nan", core(scale=float("nan")), "scale", ["finite", "nan"]),
    ("scale_infinite", core(scale=float("inf")), "scale", ["finite", "inf"]),
    ("scale_not_representable_in_float32", core(scale=1e39), "scale", ["float32"]),
    ("chunk_size_negative", core(chunk_size=-1), "chunk_size", ["[1, 256]", "-1"]),
    ("chunk_size_above_256", core(chunk_size=257), "chunk_size", ["[1, 256]", "257"]),
    ("threads_negative", core(threads=-1), "threads", ["1024", "-1"]),
    ("threads_above_1024", core(threads=1025), "threads", ["1024", "1025"]),
    ("cu_seqlens_rank_2", core(cu_seqlens=jnp.zeros((1, 2), jnp.int32)), "cu_seqlens",
     ["rank 1"]),
    ("cu_seqlens_no_sequence", core(cu_seqlens=i32([0])), "cu_seqlens", ["N >= 1"]),
    ("element_count_overflows", lambda: core_element_count_overflows(), "q", ["fits in int64"]),
    # context parallelism
    ("cp_axis_outside_shard_map", core(cp_axis="seq"), "cp_axis", ["mesh axis", "'seq'"]),
    ("cp_axis_with_cu_seqlens", core_cp(cu_seqlens=i32([0, 8])), "cu_seqlens", ["cp_axis"]),
    ("cp_axis_v_rank_3", core_cp(in_spec=P("cp"), q=arr(8, 1, 8), k=arr(8, 1, 8),
                                  v=arr(8, 2, 4), g=arr(8, 2), beta=arr(8, 2)), "v",
     ["[B, T, Hv, Dv]"]),
    ("cp_axis_initial_state_shape", core_cp(initial_state=jnp.zeros((1, 2, 8, 5))),
     "initial_state", ["[1, 2, 8, 4]", "[1, 2, 8, 5]"]),
    ("cp_axis_not_the_sharded_axis", core_cp(in_spec=P("dp"), mesh_axes=("dp", "cp")),
     "cp_axis", ["vary only along ['dp']"]),
    ("cp_axis_with_dk_zero", core_cp(q=arr(1, 8, 1, 0), k=arr(1, 8, 1, 0)), "q",
     ["Dk in [1, 256]"]),
]
# Values the library checks when the op runs.
CORE_RUNTIME_RULES = [
    ("cu_seqlens_not_starting_at_0", core(cu_seqlens=i32([1, 5, 8])), "cu_seqlens",
     ["cu_seqlens[0] = 0", "given 1"]),
    ("cu_seqlens_decreasing", core(cu_seqlens=i32([0, 5, 3, 8])), "cu_seqlens",
     ["non-decreasing"]),
    ("cu_seqlens_not_ending_at_t", core(cu_seqlens=i32([0, 5, 7])), "cu_seqlens",
     ["cu_seqlens[N] = T = 8"]),
    ("cu_seqlens_past_t", core(cu_seqlens=i32([0, 5, 9])), "cu_seqlens", ["<= T = 8"]),
]


@pytest.mark.parametrize("call, argument, words", [pytest.param(*r[1:], id=r[0])
                                                   for r in CORE_RULES])
def test_chunk_gated_delta_rule_rejects_when_traced(call, argument, words):
    raises(call, ValueError, argument, words, traced=True)


@pytest.mark.parametrize("call, argument, words", [pytest.param(*r[1:], id=r[0])
                                                   for r in CORE_RUNTIME_RULES])
def test_chunk_gated_delta_rule_rejects_when_run(call, argument, words):
    raises(call, RUNTIME, argument, words, traced=False)


# ---------------------------------------------------------------------------------------------
# fused_gdn: T = 8, Hk = 1, Hv = 2, Dk = 8, Dv = 4, K = 4.
# ---------------------------------------------------------------------------------------------

HK, HV, DK, DV, K, T = 1, 2, 8, 4, 4, 8
D = 2 * HK * DK + HV * DV
HEADS = dict(num_k_heads=HK, num_v_heads=HV, head_k_dim=DK, head_v_dim=DV)
LAYER = dict(qkv=arr(T, D, seed=1), a=arr(T, HV, seed=2), b=arr(T, HV, seed=3),
             conv_weight=arr(D, K, seed=4), A_log=arr(HV, seed=5), dt_bias=arr(HV, seed=6))
POSITIONAL = ("qkv", "a", "b", "conv_weight", "A_log", "dt_bias")


def layer(**over):
    args = {**LAYER, **HEADS, **over}
    pos = [args.pop(n) for n in POSITIONAL]
    return lambda: gdn.jax.fused_gdn(*pos, **args)


def layer_element_count_overflows():
    return jax.eval_shape(lambda x: layer(qkv=x)(), huge((2 ** 60, D)))


def layer_cp(tokens=T, **over):
    args = {**LAYER, **HEADS, **over}
    pos = [args.pop(n) for n in POSITIONAL]
    qkv, a, b = pos[0][:tokens], pos[1][:tokens], pos[2][:tokens]

    def body(qkv, a, b):
        return gdn.jax.fused_gdn(qkv, a, b, *pos[3:], cp_axis="cp", **args)[0]

    fn = jax.shard_map(body, mesh=one_device_mesh("cp"), in_specs=(P("cp"),) * 3,
                       out_specs=P("cp"))
    return lambda: fn(qkv, a, b)


LAYER_RULES = [
    ("residuals_not_a_choice", layer(residuals="some"), "residuals", ["one of"]),
    ("matmul_precision_not_a_choice", layer(matmul_precision="fp8"), "matmul_precision",
     ["one of"]),
    ("num_k_heads_not_an_integer", layer(num_k_heads=1.5), "num_k_heads", ["an integer"]),
    ("head_v_dim_not_a_32_bit_integer", layer(head_v_dim=2 ** 40), "head_v_dim", ["32-bit"]),
    ("chunk_size_not_an_integer", layer(chunk_size="64"), "chunk_size", ["an integer"]),
    ("cu_seqlens_float", layer(cu_seqlens=jnp.array([0.0, 8.0])), "cu_seqlens",
     ["int32 or int64"]),
    ("qkv_rank_3", layer(qkv=arr(1, T, D)), "qkv", ["rank 2"]),
    ("qkv_integer_dtype", layer(qkv=LAYER["qkv"].astype(jnp.int32)), "qkv", ["dtype", "i32"]),
    ("qkv_width_not_the_head_layout", layer(qkv=arr(T, D + 1)), "qkv",
     ["D = 2 Hk Dk + Hv Dv = 24", "[8, 25]"]),
    ("qkv_element_count_overflows", lambda: layer_element_count_overflows(), "qkv",
     ["fits in int64"]),
    ("num_k_heads_zero", layer(num_k_heads=0), "num_k_heads", [">= 1"]),
    ("hv_not_multiple_of_hk", layer(num_k_heads=2, num_v_heads=3), "num_v_heads",
     ["multiple of num_k_heads = 2", "given 3"]),
    ("dk_above_256", layer(head_k_dim=257), "head_k_dim", ["<= 256", "257"]),
    ("dv_above_256", layer(head_v_dim=257), "head_v_dim", ["<= 256", "257"]),
    ("a_shape", layer(a=arr(T, 1)), "a", ["[T, Hv] = [8, 2]", "[8, 1]"]),
    ("b_dtype_not_that_of_qkv", layer(b=arr(T, HV, dtype=jnp.float64)), "b", ["dtype"]),
    ("conv_weight_channels", layer(conv_weight=arr(D + 1, K)), "conv_weight", ["D = 24"]),
    ("conv_weight_taps_above_8", layer(conv_weight=arr(D, 9)), "conv_weight",
     ["K from 1 to 8", "K = 9"]),
    ("conv_bias_shape", layer(conv_bias=arr(D + 1)), "conv_bias", ["[24]", "[25]"]),
    ("A_log_integer_dtype", layer(A_log=LAYER["A_log"].astype(jnp.int32)), "A_log", ["dtype"]),
    ("dt_bias_shape", layer(dt_bias=arr(HV + 1)), "dt_bias", ["[2]", "[3]"]),
    ("conv_state_shape", layer(conv_state=arr(1, K, D)), "conv_state",
     ["[1, 3, 24]", "[1, 4, 24]"]),
    ("recurrent_state_shape", layer(recurrent_state=arr(1, HV, DK, DV + 1)), "recurrent_state",
     ["[1, 2, 8, 4]", "[1, 2, 8, 5]"]),
    ("chunk_size_above_256", layer(chunk_size=257), "chunk_size", ["[1, 256]", "257"]),
    ("threads_negative", layer(threads=-1), "threads", ["1024", "-1"]),
    ("cp_axis_outside_shard_map", layer(cp_axis="seq"), "cp_axis", ["mesh axis", "'seq'"]),
    ("cp_axis_with_cu_seqlens", layer(cp_axis="seq", cu_seqlens=i32([0, 8])), "cu_seqlens",
     ["cp_axis"]),
    ("cp_axis_segment_shorter_than_k_minus_1", layer_cp(tokens=2), "qkv",
     ["K - 1 = 3", "given 2"]),
]
LAYER_RUNTIME_RULES = [
    ("cu_seqlens_not_ending_at_t", layer(cu_seqlens=i32([0, 5, 7])), "cu_seqlens",
     ["cu_seqlens[N] = T = 8"]),
    ("cu_seqlens_decreasing", layer(cu_seqlens=i32([0, 5, 3, 8])), "cu_seqlens",
     ["non-decreasing"]),
]


@pytest.mark.parametrize("call, argument, words", [pytest.param(*r[1:], id=r[0])
                                                   for r in LAYER_RULES])
def test_fused_gdn_rejects_when_traced(call, argument, words):
    raises(call, ValueError, argument, words, traced=True)


@pytest.mark.parametrize("call, argument, words", [pytest.param(*r[1:], id=r[0])
                                                   for r in LAYER_RUNTIME_RULES])
def test_fused_gdn_rejects_when_run(call, argument, words):
    raises(call, RUNTIME, argument, words, traced=False)


# ---------------------------------------------------------------------------------------------
# fused_conv1d_gdn (serving): T = 4 tokens, a decode (slot 1, history) and a 3-token prefill
# (slot 2, fresh) over pools of 6 slots.
# ---------------------------------------------------------------------------------------------

SLOTS = 6
STATIC = dict(n_kq=HK, n_v=HV, d_k=DK, d_v=DV, kernel_size=K)
SERVING = dict(qkv=arr(4, D, seed=1), b=arr(4, HV, seed=2), a=arr(4, HV, seed=3),
               conv_weight=arr(D, 1, K, seed=4), conv_bias=None, a_log=arr(HV, seed=5),
               dt_bias=arr(HV, seed=6), query_start_loc=i32([0, 1, 4]), state_indices=i32([1, 2]),
               distribution=i32([1, 2, 2]), seq_lens=i32([5, 3]))
SERVING_ORDER = ("qkv", "b", "a", "conv_state", "recurrent_state", "conv_weight", "conv_bias",
                 "a_log", "dt_bias", "query_start_loc", "state_indices", "distribution",
                 "seq_lens", "read_state_indices", "read_offsets")


def pools(conv=(SLOTS, K - 1, D), recurrent=(SLOTS, HV, DK, DV), dtype=jnp.float32):
    return arr(*conv, dtype=dtype, seed=7), arr(*recurrent, dtype=dtype, seed=8)


def serving_args(conv_state, recurrent_state, **over):
    args = {**SERVING, **STATIC, "conv_state": conv_state, "recurrent_state": recurrent_state,
            **over}
    return [args.pop(n, None) for n in SERVING_ORDER], args


def serve(conv_state, recurrent_state, **over):
    """The direct call: jitted with both pools donated."""
    pos, kw = serving_args(conv_state, recurrent_state, **over)
    return gdn.jax.fused_conv1d_gdn(*pos, **kw)


INDEX_NAMES = ("query_start_loc", "state_indices", "distribution", "seq_lens",
               "read_state_indices", "read_offsets")


def serve_not_donating(conv_state, recurrent_state, **over):
    """Inside a jit of the caller's that does not donate the pools, the index arrays among its
    arguments (tracers: the handler checks their values when the step runs)."""
    index = {n: over.pop(n) if n in over else SERVING[n] for n in INDEX_NAMES
             if n in over or n in SERVING}
    return jax.jit(lambda c, r, index: serve(c, r, **index, **over))(
        conv_state, recurrent_state, index)


def check_pools_unchanged(conv_state, recurrent_state, before):
    assert not conv_state.is_deleted() and not recurrent_state.is_deleted()
    np.testing.assert_array_equal(np.asarray(conv_state), before[0])
    np.testing.assert_array_equal(np.asarray(recurrent_state), before[1])


NOT_IMPLEMENTED = [
    ("attention_mode_kda", dict(attention_mode="KDA"), "attention_mode", ["'GDN'", "'KDA'"]),
    ("gate_lower_bound_set", dict(gate_lower_bound=0.1), "gate_lower_bound", ["None", "0.1"]),
    ("compute_precision_bf16", dict(compute_precision=jnp.bfloat16), "compute_precision",
     ["float32"]),
]
SERVING_RULES = [
    ("kernel_size_not_the_weights_taps", dict(kernel_size=3), "conv_weight",
     ["kernel_size = 3", "[24, 1, 4]"]),
    ("query_start_loc_float", dict(query_start_loc=jnp.array([0.0, 1.0, 4.0])),
     "query_start_loc", ["int32 or int64"]),
    ("n_kq_not_an_integer", dict(n_kq=1.5), "n_kq", ["an integer"]),
    ("qkv_width_not_the_head_layout", dict(qkv=arr(4, D + 1)), "qkv",
     ["D = 2 Hk Dk + Hv Dv = 24", "[4, 25]"]),
    ("hv_not_multiple_of_hk", dict(n_kq=2, n_v=3), "n_v", ["multiple of n_kq = 2", "given 3"]),
    ("dk_above_256", dict(d_k=257), "d_k", ["<= 256", "257"]),
    ("dv_above_256", dict(d_v=257), "d_v", ["<= 256", "257"]),
    ("a_shape", dict(a=arr(4, 1)), "a", ["[4, 2]", "[4, 1]"]),
    ("a_log_shape", dict(a_log=arr(HV + 1)), "a_log", ["[2]", "[3]"]),
    ("conv_bias_shape", dict(conv_bias=arr(D + 1)), "conv_bias", ["[24]", "[25]"]),
    ("conv_pool_taps", dict(pools=pools(conv=(SLOTS, K, D))), "conv_state", ["[6, 3, 24]"]),
    ("recurrent_pool_dv", dict(pools=pools(recurrent=(SLOTS, HV, DK, DV + 1))),
     "recurrent_state", ["[6, 2, 8, 4]", "[6, 2, 8, 5]"]),
    ("pools_of_different_slot_counts", dict(pools=pools(conv=(SLOTS + 1, K - 1, D))),
     "conv_state", ["as many slots as recurrent_state (6)"]),
    ("pool_float64_with_float32_inputs", dict(pools=pools(dtype=jnp.float64)), "conv_state",
     ["f32 or bf16", "f64"]),
    ("pool_float16", dict(pools=pools(dtype=jnp.float16)), "conv_state", ["f32 or bf16", "f16"]),
    ("float64_inputs_with_float32_pools", dict(qkv=arr(4, D, dtype=jnp.float64),
                                               a=arr(4, HV, dtype=jnp.float64),
                                               b=arr(4, HV, dtype=jnp.float64)),
     "conv_state", ["f64"]),
    ("query_start_loc_not_n_plus_1", dict(query_start_loc=i32([0, 1, 4, 4])),
     "query_start_loc", ["[N + 1]", "[4]"]),
    ("seq_lens_not_n", dict(seq_lens=i32([5])), "seq_lens", ["[N]", "[1]"]),
    ("read_state_indices_not_n", dict(read_state_indices=i32([1])), "read_state_indices",
     ["[N]", "[1]"]),
    ("read_offsets_not_n", dict(read_offsets=i32([0])), "read_offsets", ["[N]", "[1]"]),
    ("distribution_of_two_entries", dict(distribution=i32([1, 2])), "distribution",
     ["[3]", "[2]"]),
    ("num_spec_tokens_negative", dict(num_spec_tokens=-1), "num_spec_tokens", ["0 to 1024"]),
    ("threads_above_1024", dict(threads=5000), "threads", ["1024", "5000"]),
]
SERVING_RUNTIME_RULES = [
    ("slot_equal_to_num_slots", dict(state_indices=i32([1, SLOTS])), "state_indices",
     ["[1, 6)", "state_indices[1] = 6"]),
    ("slot_negative", dict(state_indices=i32([-1, 2])), "state_indices",
     ["[1, 6)", "state_indices[0] = -1"]),
    ("null_slot_written_by_a_prefill", dict(state_indices=i32([1, 0])), "state_indices",
     ["null slot", "state_indices[1] = 0"]),
    ("two_sequences_write_one_slot", dict(state_indices=i32([2, 2])), "state_indices",
     ["distinct slot", "both write slot 2"]),
    ("read_slot_written_by_another_sequence", dict(read_state_indices=i32([2, 3])),
     "read_state_indices", ["no other live sequence writes"]),
    ("read_slot_past_the_pool", dict(read_state_indices=i32([SLOTS, 2])), "read_state_indices",
     ["[1, 6)"]),
    ("read_offset_past_the_pool", dict(read_offsets=i32([5, 0]), num_spec_tokens=1),
     "read_offsets", ["[1, 6)"]),
    ("query_start_loc_not_starting_at_0", dict(query_start_loc=i32([1, 2, 4])),
     "query_start_loc", ["query_start_loc[0] = 0", "given 1"]),
    ("query_start_loc_decreasing", dict(query_start_loc=i32([0, 3, 2])), "query_start_loc",
     ["non-decreasing"]),
    ("query_start_loc_past_t", dict(query_start_loc=i32([0, 1, 5])), "query_start_loc",
     ["at most T = 4"]),
    ("decode_longer_than_one_plus_num_spec", dict(query_start_loc=i32([0, 2, 4])),
     "query_start_loc", ["1 to 1 + num_spec = 1 tokens", "has 2 tokens"]),
    ("decode_with_no_token", dict(query_start_loc=i32([0, 0, 4])), "query_start_loc",
     ["has 0 tokens"]),
    ("live_prefill_with_no_token", dict(query_start_loc=i32([0, 1, 1])), "query_start_loc",
     ["at least one token for each prefill"]),
    ("seq_lens_below_the_query_length", dict(seq_lens=i32([5, 2])), "seq_lens",
     ["seq_lens[1] = 2 < 3"]),
    ("decode_end_above_prefill_end", dict(distribution=i32([2, 1, 2])), "distribution",
     ["decode_end <= prefill_end <= mixed_end", "[2, 1, 2]"]),
]


def _break(over):
    over = dict(over)
    conv_state, recurrent_state = over.pop("pools", None) or pools()
    return conv_state, recurrent_state, over


@pytest.mark.parametrize("over, argument, words", [pytest.param(*r[1:], id=r[0])
                                                   for r in NOT_IMPLEMENTED])
def test_fused_conv1d_gdn_rejects_what_is_not_implemented(over, argument, words):
    conv_state, recurrent_state, over = _break(over)
    before = (np.asarray(conv_state), np.asarray(recurrent_state))
    with pytest.raises(NotImplementedError) as info:
        serve(conv_state, recurrent_state, **over)
    check_message(str(info.value), argument, words)
    check_pools_unchanged(conv_state, recurrent_state, before)


@pytest.mark.parametrize("over, argument, words", [pytest.param(*r[1:], id=r[0])
                                                   for r in SERVING_RULES])
def test_fused_conv1d_gdn_rejects_when_traced_and_keeps_the_donated_pools(over, argument, words):
    """A trace-time error comes before the donation: the direct call's pools are left whole."""
    conv_state, recurrent_state, over = _break(over)
    before = (np.asarray(conv_state), np.asarray(recurrent_state))
    with pytest.raises(ValueError) as info:
        serve(conv_state, recurrent_state, **over)
    check_message(str(info.value), argument, words)
    check_pools_unchanged(conv_state, recurrent_state, before)


@pytest.mark.parametrize("over, argument, words", [pytest.param(*r[1:], id=r[0])
                                                   for r in SERVING_RUNTIME_RULES])
def test_fused_conv1d_gdn_rejects_when_run_and_writes_nothing(over, argument, words):
    """A run-time error inside a jit that does not donate the pools: nothing written."""
    conv_state, recurrent_state, over = _break(over)
    before = (np.asarray(conv_state), np.asarray(recurrent_state))
    with pytest.raises(RUNTIME) as info:
        jax.block_until_ready(serve_not_donating(conv_state, recurrent_state, **over))
    check_message(str(info.value), argument, words)
    check_pools_unchanged(conv_state, recurrent_state, before)


@pytest.mark.parametrize("over, argument, words", [pytest.param(*r[1:], id=r[0])
                                                   for r in SERVING_RUNTIME_RULES])
def test_fused_conv1d_gdn_direct_call_rejects_index_values_and_keeps_the_donated_pools(
        over, argument, words):
    """The direct call checks concrete index values on the host before it donates the pools:
    the error is raised while the caller still holds them, bit-identical, and the next good
    call runs on them."""
    conv_state, recurrent_state, over = _break(over)
    before = (np.asarray(conv_state), np.asarray(recurrent_state))
    with pytest.raises(ValueError) as info:
        jax.block_until_ready(serve(conv_state, recurrent_state, **over))
    check_message(str(info.value), argument, words)
    check_pools_unchanged(conv_state, recurrent_state, before)
    (want_conv, want_rec), want_out = serve(jnp.array(before[0]), jnp.array(before[1]))
    (conv_state, recurrent_state), out = serve(conv_state, recurrent_state)
    for got, want in ((conv_state, want_conv), (recurrent_state, want_rec), (out, want_out)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_fused_conv1d_gdn_direct_call_rejects_numpy_index_values_and_keeps_the_pools(dtype):
    """Index arrays an engine holds in NumPy (int32 as vLLM passes them, or int64)."""
    conv_state, recurrent_state = pools()
    before = (np.asarray(conv_state), np.asarray(recurrent_state))
    host = {n: np.asarray(SERVING[n], dtype) for n in ("query_start_loc", "distribution",
                                                       "seq_lens")}
    with pytest.raises(ValueError) as info:
        serve(conv_state, recurrent_state, state_indices=np.asarray([2, 2], dtype), **host)
    check_message(str(info.value), "state_indices", ["both write slot 2"])
    check_pools_unchanged(conv_state, recurrent_state, before)
    serve(conv_state, recurrent_state, state_indices=np.asarray([1, 2], dtype), **host)


def check_only(conv_state, recurrent_state, **over):
    pos, kw = serving_args(conv_state, recurrent_state, **over)
    return gdn.jax.check_fused_conv1d_gdn(*pos, **kw)


@pytest.mark.parametrize("over, argument, words", [pytest.param(*r[1:], id=r[0])
                                                   for r in SERVING_RUNTIME_RULES + SERVING_RULES])
def test_check_fused_conv1d_gdn_raises_what_the_step_raises(over, argument, words):
    """The host check an engine runs before a jit of its own: the step's every rule, on pools
    given as shapes alone."""
    conv_state, recurrent_state, over = _break(over)
    shapes = (jax.ShapeDtypeStruct(conv_state.shape, conv_state.dtype),
              jax.ShapeDtypeStruct(recurrent_state.shape, recurrent_state.dtype))
    with pytest.raises(ValueError) as info:
        check_only(*shapes, **over)
    check_message(str(info.value), argument, words)


def test_check_fused_conv1d_gdn_passes_a_valid_step_and_refuses_tracers():
    conv_state, recurrent_state = pools()
    assert check_only(conv_state, recurrent_state) is None
    with pytest.raises(TypeError, match=r"argument 'state_indices': expected a concrete"):
        jax.jit(lambda s: check_only(conv_state, recurrent_state, state_indices=s))(i32([1, 2]))


def test_check_fused_conv1d_gdn_refuses_a_float_head_count_after_the_same_integer_passed():
    """The checks of the options are cached per layout: n_kq = 2.0 is not n_kq = 2's entry."""
    conv_state, recurrent_state = pools()
    check_only(conv_state, recurrent_state)
    with pytest.raises(ValueError, match=r"argument 'n_kq': expected an integer"):
        check_only(conv_state, recurrent_state, n_kq=float(HK))


def engine_step(conv_state, recurrent_state, state_indices):
    """An engine's own step: the serving call inside its jit, which donates the pools."""
    return jax.jit(lambda c, r, s: serve(c, r, state_indices=s), donate_argnums=(0, 1))(
        conv_state, recurrent_state, state_indices)


def test_engine_jit_donating_the_pools_keeps_them_when_it_checks_first():
    """Inside the engine's jit the indices are tracers: the host check before the jit keeps
    the pools (docs/jax.md, "The serving call")."""
    conv_state, recurrent_state = pools()
    before = (np.asarray(conv_state), np.asarray(recurrent_state))
    bad = i32([1, SLOTS])
    with pytest.raises(ValueError, match=r"argument 'state_indices'"):
        check_only(conv_state, recurrent_state, state_indices=bad)
        engine_step(conv_state, recurrent_state, bad)
    check_pools_unchanged(conv_state, recurrent_state, before)
    (conv_state, recurrent_state), _ = engine_step(conv_state, recurrent_state, i32([1, 2]))
    assert np.isfinite(np.asarray(recurrent_state)).all()


def test_engine_jit_donating_the_pools_without_the_check_consumes_them():
    """docs/jax.md: without the check, a bad index inside a donating jit of the caller's is
    found when the computation runs, after JAX has taken the donated pools (the handler wrote
    nothing into them: test_fused_conv1d_gdn_rejects_when_run_and_writes_nothing)."""
    conv_state, recurrent_state = pools()
    with pytest.raises(RUNTIME, match=r"argument 'state_indices'"):
        jax.block_until_ready(engine_step(conv_state, recurrent_state, i32([1, SLOTS])))
    assert conv_state.is_deleted() and recurrent_state.is_deleted()


# ---------------------------------------------------------------------------------------------
# gdn.jax.nn: the block's own checks (its op's arrive through fused_gdn, above).
# ---------------------------------------------------------------------------------------------

NN_CFG = nn.GatedDeltaNetConfig(hidden_size=16, num_k_heads=HK, num_v_heads=HV, head_k_dim=DK,
                                head_v_dim=DV)


def block(**over):
    params = nn.init_params(jax.random.key(0), NN_CFG)
    return lambda: nn.gated_delta_net(params, arr(1, T, 16), NN_CFG, **over)


NN_RULES = [
    ("config_without_a_field", lambda: nn.GatedDeltaNetConfig.from_hf({"hidden_size": 16}),
     "config", ["'linear_num_key_heads'"]),
    ("block_conv_state_shape", block(conv_state=jnp.zeros((1, K, D))), "conv_state",
     ["[1, 3, 24]", "[1, 4, 24]"]),
    ("block_recurrent_state_shape", block(recurrent_state=jnp.zeros((2, HV, DK, DV))),
     "recurrent_state", ["[1, 2, 8, 4]", "[2, 2, 8, 4]"]),
    ("block_threads_negative", block(threads=-1), "threads", ["1024", "-1"]),
    ("block_residuals_not_a_choice", block(residuals="some"), "residuals", ["one of"]),
]


@pytest.mark.parametrize("call, argument, words", [pytest.param(*r[1:], id=r[0])
                                                   for r in NN_RULES])
def test_gated_delta_net_rejects_when_traced(call, argument, words):
    raises(call, ValueError, argument, words, traced=True)


def test_import_under_an_older_jax_names_the_version_it_needs():
    code = "import jax; jax.__version__ = '0.10.1'; import gdn.jax"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "ImportError: gdn.jax needs jax >= 0.10.2" in r.stderr, r.stderr
    assert "has jax 0.10.1" in r.stderr, r.stderr


@pytest.mark.parametrize("version, release", [("0.10.2", (0, 10, 2)), ("0.9.2", (0, 9, 2)),
                                              ("0.11.0.dev20260101", (0, 11, 0)),
                                              ("1.0rc1", (1, 0, 0))])
def test_jax_release_is_read_off_the_version_string(version, release):
    assert gdn.jax._release(version) == release
