"""One test per validation rule of gdn.torch's public entry points (docs/validation.md lists them):
each breaks one argument of a valid call and checks that it raises ValueError whose message
names the caller's argument (``argument 'ssm_state'``, not the library's ``recurrent_state``),
says "expected" and "given", and carries the rule's own words; the calls that update state in
place (``fused_gdn_step``, ``torch.ops.gdn.step``, ``causal_conv1d_update``) leave it
bit-identical. The extension's own checks of what the ops hand it come last."""

import pytest

torch = pytest.importorskip("torch")

import gdn.torch  # noqa: E402
from gdn import _gdn  # noqa: E402
from gdn.torch import _ops  # noqa: E402


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def check_message(message, argument, words):
    assert f"argument '{argument}'" in message, message
    assert "expected" in message and "given" in message, message
    for word in words:
        assert word in message, (word, message)


def rejects(call, argument, words):
    with pytest.raises(ValueError) as info:
        call()
    check_message(str(info.value), argument, words)


def params(rules):
    return [pytest.param(*r[1:], id=r[0]) for r in rules]


# ---------------------------------------------------------------------------------------------
# chunk_gated_delta_rule and fused_recurrent_gated_delta_rule: B = 1, T = 8, H = 1, HV = 2,
# K = 8, V = 4.
# ---------------------------------------------------------------------------------------------

CORE = dict(q=rand(1, 8, 1, 8, seed=1), k=rand(1, 8, 1, 8, seed=2), v=rand(1, 8, 2, 4, seed=3),
            g=-rand(1, 8, 2, seed=4).abs(), beta=rand(1, 8, 2, seed=5).sigmoid())


def core(fn=gdn.torch.chunk_gated_delta_rule, **over):
    args = {**CORE, **over}
    q, k, v = (args.pop(n) for n in ("q", "k", "v"))
    if fn is gdn.torch.chunk_gated_delta_rule:
        g, beta = args.pop("g"), args.pop("beta")
        return lambda: fn(q, k, v, g, beta, **args)
    return lambda: fn(q, k, v, **args)


def recurrent(**over):
    return core(gdn.torch.fused_recurrent_gated_delta_rule, **over)


def expanded(tokens):
    """The core op's inputs of T = tokens, every token the same memory (stride 0)."""
    return {n: x[:, :1].expand(x.shape[0], tokens, *x.shape[2:]) for n, x in CORE.items()}


HV3 = dict(q=rand(1, 8, 2, 8), k=rand(1, 8, 2, 8), v=rand(1, 8, 3, 4), g=rand(1, 8, 3),
           beta=rand(1, 8, 3))
CORE_RULES = [
    # the binding's own checks
    ("tensor_on_another_device", core(beta=CORE["beta"].to("meta")), "beta", ["CPU", "meta"]),
    ("residuals_not_a_choice", core(residuals="some"), "residuals", ["one of"]),
    ("matmul_precision_not_a_choice", core(matmul_precision="fp8"), "matmul_precision",
     ["one of"]),
    ("chunk_size_not_an_integer", core(chunk_size=64.5), "chunk_size", ["an integer"]),
    ("threads_not_a_32_bit_integer", core(threads=2 ** 32), "threads", ["32-bit"]),
    ("cu_seqlens_float", core(cu_seqlens=torch.tensor([0.0, 8.0])), "cu_seqlens",
     ["int32 or int64"]),
    ("batch_not_1_with_cu_seqlens", core(q=rand(2, 8, 1, 8), cu_seqlens=torch.tensor([0, 8])),
     "q", ["[1, T, H, K] with cu_seqlens"]),
    # a packed batch is described in the caller's [1, T, ...], not the library's [T, ...] views
    ("k_shape_not_that_of_q_packed", core(k=rand(1, 8, 1, 4), cu_seqlens=torch.tensor([0, 8])),
     "k", ["[1, T, H, K] = [1, 8, 1, 8]", "given [1, 8, 1, 4]"]),
    ("v_tokens_not_those_of_q_packed", core(v=rand(1, 7, 2, 4), cu_seqlens=torch.tensor([0, 8])),
     "v", ["[1, T, HV, V] = [1, 8, 2, 4]", "given [1, 7, 2, 4]"]),
    ("g_heads_not_those_of_v_packed", core(g=rand(1, 8, 3), cu_seqlens=torch.tensor([0, 8])),
     "g", ["[1, T, HV] = [1, 8, 2]", "given [1, 8, 3]"]),
    # the library's, through the binding
    ("q_rank_2", core(q=rand(8, 8)), "q", ["rank"]),
    ("q_rank_5", core(q=rand(1, 1, 8, 1, 8)), "q", ["rank 1 to 4"]),
    ("q_integer_dtype", core(q=CORE["q"].to(torch.int32)), "q", ["dtype", "i32"]),
    ("q_complex_dtype", core(q=CORE["q"].to(torch.complex64)), "q", ["dtype", "complex64"]),
    ("k_dtype_not_that_of_q", core(k=CORE["k"].to(torch.bfloat16)), "k", ["dtype"]),
    ("k_shape_not_that_of_q", core(k=rand(1, 8, 1, 4)), "k", ["[1, 8, 1, 4]"]),
    ("v_tokens_not_those_of_q", core(v=rand(1, 5, 2, 4)), "v", ["leading [B, T] of q"]),
    ("hk_zero", core(q=rand(1, 8, 0, 8), k=rand(1, 8, 0, 8)), "q", ["Hk >= 1"]),
    ("hv_not_multiple_of_hk", core(**HV3), "v", ["multiple of Hk = 2", "Hv = 3"]),
    ("dk_zero", core(q=rand(1, 8, 1, 0), k=rand(1, 8, 1, 0)), "q", ["Dk in [1, 256]"]),
    ("dk_above_256", core(q=rand(1, 8, 1, 257), k=rand(1, 8, 1, 257)), "q",
     ["Dk in [1, 256]", "257"]),
    ("dv_above_256", core(v=rand(1, 8, 2, 257)), "v", ["Dv in [1, 256]", "257"]),
    ("g_shape", core(g=rand(1, 8, 1)), "g", ["[1, 8, 1]"]),
    ("beta_integer_dtype", core(beta=CORE["beta"].to(torch.int32)), "beta", ["dtype"]),
    ("initial_state_shape", core(initial_state=torch.zeros(1, 2, 8, 5)), "initial_state",
     ["[1, 2, 8, 4]", "[1, 2, 8, 5]"]),
    # the caller's [N, HV, V, K], not the transposed view the library sees
    ("initial_state_shape_state_v_first", core(initial_state=torch.zeros(1, 2, 8, 4),
                                               state_v_first=True), "initial_state",
     ["expected [N, HV, V, K] = [1, 2, 4, 8]", "given [1, 2, 8, 4]"]),
    ("scale_nan", core(scale=float("nan")), "scale", ["finite", "nan"]),
    ("scale_infinite", core(scale=float("inf")), "scale", ["finite", "inf"]),
    ("scale_not_representable_in_float32", core(scale=1e39), "scale", ["float32"]),
    ("chunk_size_negative", core(chunk_size=-1), "chunk_size", ["[1, 256]", "-1"]),
    ("chunk_size_above_256", core(chunk_size=257), "chunk_size", ["[1, 256]", "257"]),
    ("threads_negative", core(threads=-1), "threads", ["1024", "-1"]),
    ("threads_above_1024", core(threads=1025), "threads", ["1024", "1025"]),
    ("sequences_above_2_to_the_20", lambda: core(**{
        n: x.expand(2 ** 21, *x.shape[1:]) for n, x in CORE.items()})(), "q",
     ["2^20", "B = 2097152"]),
    ("byte_offsets_overflow", lambda: core(**expanded(2 ** 59))(), "q", ["fit in int64"]),
    ("cu_seqlens_rank_2", core(cu_seqlens=torch.zeros(1, 2, dtype=torch.int32)), "cu_seqlens",
     ["rank 1"]),
    ("cu_seqlens_no_sequence", core(cu_seqlens=torch.tensor([0])), "cu_seqlens", ["N >= 1"]),
    # values, checked when the op runs
    ("cu_seqlens_not_starting_at_0", core(cu_seqlens=torch.tensor([1, 5, 8])), "cu_seqlens",
     ["cu_seqlens[0] = 0", "given 1"]),
    ("cu_seqlens_decreasing", core(cu_seqlens=torch.tensor([0, 5, 3, 8])), "cu_seqlens",
     ["non-decreasing"]),
    ("cu_seqlens_not_ending_at_t", core(cu_seqlens=torch.tensor([0, 5, 7])), "cu_seqlens",
     ["cu_seqlens[N] = T = 8"]),
    ("cu_seqlens_past_t", core(cu_seqlens=torch.tensor([0, 5, 9])), "cu_seqlens", ["<= T = 8"]),
]
RECURRENT_RULES = [
    ("gk_given", recurrent(gk=CORE["g"]), "gk", ["None"]),
    ("gv_given", recurrent(gv=CORE["g"]), "gv", ["None"]),
    ("gate_in_kernel_without_A_log", recurrent(use_gate_in_kernel=True, dt_bias=torch.zeros(2)),
     "A_log", ["use_gate_in_kernel"]),
    ("gate_in_kernel_without_g", recurrent(g=None, use_gate_in_kernel=True, A_log=torch.zeros(2),
                                           dt_bias=torch.zeros(2)), "g", ["use_gate_in_kernel"]),
    ("gate_in_kernel_A_log_shape", recurrent(use_gate_in_kernel=True, A_log=torch.zeros(3),
                                             dt_bias=torch.zeros(2)), "A_log",
     ["[HV] = [2]", "given [3]"]),
    ("threads_not_an_integer", recurrent(threads="all"), "threads", ["an integer"]),
    ("threads_negative", recurrent(threads=-1), "threads", ["1024", "-1"]),
    ("hv_not_multiple_of_hk", recurrent(q=HV3["q"], k=HV3["k"], v=HV3["v"]), "v",
     ["multiple of Hk = 2"]),
    ("dk_zero", recurrent(q=rand(1, 8, 1, 0), k=rand(1, 8, 1, 0)), "q", ["Dk in [1, 256]"]),
    ("initial_state_shape", recurrent(initial_state=torch.zeros(1, 2, 8, 5)), "initial_state",
     ["[1, 2, 8, 4]"]),
    ("scale_nan", recurrent(scale=float("nan")), "scale", ["finite"]),
    ("cu_seqlens_decreasing", recurrent(cu_seqlens=torch.tensor([0, 5, 3, 8])), "cu_seqlens",
     ["non-decreasing"]),
]


@pytest.mark.parametrize("call, argument, words", params(CORE_RULES))
def test_chunk_gated_delta_rule_rejects(call, argument, words):
    rejects(call, argument, words)


@pytest.mark.parametrize("call, argument, words", params(RECURRENT_RULES))
def test_fused_recurrent_gated_delta_rule_rejects(call, argument, words):
    rejects(call, argument, words)


# The registered op, called directly (its arguments are the library's layout).
def chunk_fwd(scale=0.5, chunk_size=64, threads=0):
    q, k, v, g, beta = (CORE[n][0] for n in ("q", "k", "v", "g", "beta"))
    return lambda: torch.ops.gdn.chunk_fwd(q, k, v, g, beta, None, None, scale, False, chunk_size,
                                           False, False, threads, False, False, False)


def chunk_bwd_short_chunk_states():
    q, k, v, g, beta = (CORE[n][0] for n in ("q", "k", "v", "g", "beta"))
    cu = torch.tensor([0, 3, 8])
    _, _, states, t_inv = torch.ops.gdn.chunk_fwd(q, k, v, g, beta, None, cu, 0.5, False, 4,
                                                  False, False, 0, False, True, True)
    return torch.ops.gdn.chunk_bwd(q, k, v, g, beta, None, cu, torch.zeros_like(v), None,
                                   states[:2].clone(), t_inv, 0.5, False, 4, False, 0)


OP_RULES = [
    ("chunk_fwd_scale_nan", chunk_fwd(scale=float("nan")), "scale", ["finite"]),
    ("chunk_fwd_chunk_size_above_256", chunk_fwd(chunk_size=257), "chunk_size", ["[1, 256]"]),
    ("chunk_fwd_threads_negative", chunk_fwd(threads=-1), "threads", ["1024"]),
    ("chunk_bwd_chunk_states_fewer_rows_than_chunks", chunk_bwd_short_chunk_states,
     "chunk_states", ["rows"]),
]


@pytest.mark.parametrize("call, argument, words", params(OP_RULES))
def test_chunk_ops_reject(call, argument, words):
    rejects(call, argument, words)


# ---------------------------------------------------------------------------------------------
# causal_conv1d_fn and causal_conv1d_update: B = 2, D = 24, T = 8, K = 4.
# ---------------------------------------------------------------------------------------------

CONV = dict(x=rand(2, 24, 8, seed=1), weight=rand(24, 4, seed=2), bias=rand(24, seed=3))


def conv(**over):
    args = {**CONV, **over}
    x, weight = args.pop("x"), args.pop("weight")
    return lambda: gdn.torch.causal_conv1d_fn(x, weight, **args)


CONV_RULES = [
    ("tensor_on_another_device", conv(bias=CONV["bias"].to("meta")), "bias", ["CPU", "meta"]),
    ("activation_not_a_choice", conv(activation="relu"), "activation", ["'silu'", "'relu'"]),
    ("threads_not_a_32_bit_integer", conv(threads=2 ** 40), "threads", ["32-bit"]),
    ("threads_negative", conv(threads=-1), "threads", ["1024", "-1"]),
    ("weight_rank_4", conv(weight=CONV["weight"][:, None, None, :]), "weight", ["[D, K]"]),
    ("x_rank_2", conv(x=CONV["x"][0]), "x", ["[B, D, T]", "[24, 8]"]),
    ("x_channels_not_the_weights", conv(x=rand(2, 23, 8)), "x", ["D = 24"]),
    ("x_integer_dtype", conv(x=CONV["x"].to(torch.int32)), "x", ["dtype", "i32"]),
    ("weight_taps_above_8", conv(weight=rand(24, 9)), "weight", ["K from 1 to 8", "K = 9"]),
    ("weight_taps_zero", conv(weight=rand(24, 0)), "weight", ["K from 1 to 8", "K = 0"]),
    ("bias_shape", conv(bias=rand(25)), "bias", ["[24]", "[25]"]),
    ("initial_states_shape", conv(initial_states=rand(2, 24, 4)), "initial_states",
     ["[N, D, K - 1] = [2, 24, 3]", "[2, 24, 4]"]),
    ("batch_not_1_with_cu_seqlens", conv(cu_seqlens=torch.tensor([0, 8])), "x",
     ["[1, D, T] with cu_seqlens"]),
    ("cu_seqlens_float", conv(x=CONV["x"][:1], cu_seqlens=torch.tensor([0.0, 8.0])),
     "cu_seqlens", ["int32 or int64"]),
    ("cu_seqlens_decreasing", conv(x=CONV["x"][:1], cu_seqlens=torch.tensor([0, 5, 3, 8])),
     "cu_seqlens", ["non-decreasing"]),
    ("cu_seqlens_not_ending_at_t", conv(x=CONV["x"][:1], cu_seqlens=torch.tensor([0, 5, 7])),
     "cu_seqlens", ["T = 8"]),
    ("seq_idx_with_initial_states", conv(seq_idx=torch.zeros(2, 8, dtype=torch.int32),
                                         initial_states=rand(2, 24, 3)), "seq_idx",
     ["initial_states"]),
    ("seq_idx_with_return_final_states", conv(seq_idx=torch.zeros(2, 8, dtype=torch.int32),
                                              return_final_states=True), "seq_idx",
     ["return_final_states"]),
    ("seq_idx_shape", conv(seq_idx=torch.zeros(2, 7, dtype=torch.int32)), "seq_idx",
     ["[2, 8]", "[2, 7]"]),
    ("seq_idx_float", conv(seq_idx=torch.zeros(2, 8)), "seq_idx", ["int32 or int64"]),
]


@pytest.mark.parametrize("call, argument, words", params(CONV_RULES))
def test_causal_conv1d_fn_rejects(call, argument, words):
    rejects(call, argument, words)


UPDATE_RULES = [
    ("tensor_on_another_device", dict(bias=CONV["bias"].to("meta")), "bias", ["CPU", "meta"]),
    ("cache_seqlens_given", dict(cache_seqlens=torch.tensor([1, 2])), "cache_seqlens",
     ["None"]),
    ("activation_not_a_choice", dict(activation="relu"), "activation", ["'relu'"]),
    ("threads_negative", dict(threads=-1), "threads", ["1024", "-1"]),
    ("x_rank_1", dict(x=CONV["x"][0, :, 0]), "x", ["[B, D] or [B, D, T]"]),
    ("x_integer_dtype", dict(x=CONV["x"][..., 0].to(torch.int32)), "x", ["dtype", "i32"]),
    ("conv_state_shorter_than_k_minus_1", dict(pool=rand(2, 24, 2)), "conv_state",
     ["S >= K - 1 = 3", "[2, 24, 2]"]),
    ("conv_state_rows_not_the_batch", dict(pool=rand(3, 24, 4)), "conv_state",
     ["2 rows", "[3, 24, 4]"]),
    ("conv_state_indices_float", dict(pool=rand(3, 24, 4),
                                      conv_state_indices=torch.tensor([0.0, 1.0])),
     "conv_state_indices", ["int32", "float32"]),
    ("conv_state_indices_past_the_pool", dict(pool=rand(3, 24, 4),
                                              conv_state_indices=torch.tensor([0, 3])),
     "conv_state_indices", ["[0, 3)", "[0, 3]"]),
    ("conv_state_indices_negative", dict(pool=rand(3, 24, 4),
                                         conv_state_indices=torch.tensor([-1, 1])),
     "conv_state_indices", ["[0, 3)", "[-1, 1]"]),
    ("conv_state_indices_duplicate", dict(pool=rand(3, 24, 4),
                                          conv_state_indices=torch.tensor([1, 1])),
     "conv_state_indices", ["distinct rows", "given [1, 1]", "batch rows 0 and 1"]),
    ("conv_state_integer_dtype", dict(pool=torch.zeros(2, 24, 4, dtype=torch.int32)),
     "conv_state", ["floating-point", "int32"]),
    ("conv_state_a_list", dict(pool=[[0.0]]), "conv_state", ["a tensor", "list"]),
    ("weight_taps_above_8", dict(weight=rand(24, 9), pool=rand(2, 24, 9)), "weight",
     ["K from 1 to 8"]),
]


@pytest.mark.parametrize("over, argument, words", params(UPDATE_RULES))
def test_causal_conv1d_update_rejects_and_leaves_the_state(over, argument, words):
    over = dict(over)
    pool = over.pop("pool", None)
    pool = rand(2, 24, 4, seed=9) if pool is None else pool
    x = over.pop("x", CONV["x"][..., 0])
    weight = over.pop("weight", CONV["weight"])
    bias = over.pop("bias", CONV["bias"])
    before = pool.clone() if isinstance(pool, torch.Tensor) else None
    rejects(lambda: gdn.torch.causal_conv1d_update(x, pool, weight, bias, **over), argument,
            words)
    assert before is None or torch.equal(pool, before)


# ---------------------------------------------------------------------------------------------
# fused_gdn_step and torch.ops.gdn.step: T = 4 tokens, a decode (slot 1, with a state) and a
# 3-token prefill (slot 2, fresh) over pools of 6 slots; Hk = 1, Hv = 2, Dk = 8, Dv = 4, K = 4.
# ---------------------------------------------------------------------------------------------

HK, HV, DK, DV, K, SLOTS = 1, 2, 8, 4, 4, 6
D = 2 * HK * DK + HV * DV
HEADS = dict(num_k_heads=HK, num_v_heads=HV, head_k_dim=DK, head_v_dim=DV)
STEP = dict(qkv=rand(4, D, seed=1), a=rand(4, HV, seed=2), b=rand(4, HV, seed=3),
            conv_weight=rand(D, K, seed=4), A_log=rand(HV, seed=5), dt_bias=rand(HV, seed=6),
            initial_state_indices=torch.tensor([1, 2]), cu_seqlens=torch.tensor([0, 1, 4]),
            has_initial_state=torch.tensor([True, False]))
STEP_ORDER = ("qkv", "a", "b", "conv_weight", "A_log", "dt_bias", "conv_state", "ssm_state",
              "initial_state_indices", "cu_seqlens", "has_initial_state")


def pools(conv=(SLOTS, K - 1, D), ssm=(SLOTS, HV, DK, DV), dtype=torch.float32):
    return rand(*conv, seed=7, dtype=dtype), rand(*ssm, seed=8, dtype=dtype)


def overlapping_pools():
    """An ssm pool whose memory holds dt_bias too."""
    conv_pool, ssm_pool = pools()
    return conv_pool, ssm_pool, ssm_pool.view(-1)[:HV]


STEP_RULES = [
    ("tensor_on_another_device", dict(a=STEP["a"].to("meta")), "a", ["CPU", "meta"]),
    ("threads_not_an_integer", dict(threads=1.5), "threads", ["an integer"]),
    ("num_k_heads_not_an_integer", dict(num_k_heads=1.5), "num_k_heads", ["an integer"]),
    ("initial_state_indices_float", dict(initial_state_indices=torch.tensor([1.0, 2.0])),
     "initial_state_indices", ["int32 or int64", "float32"]),
    ("cu_seqlens_not_n_plus_1", dict(cu_seqlens=torch.tensor([0, 4])), "cu_seqlens",
     ["[N + 1] = [3]", "[2]"]),
    ("has_initial_state_a_list", dict(has_initial_state=[True, False]), "has_initial_state",
     ["[N] = [2]", "list"]),
    ("has_initial_state_shape", dict(has_initial_state=torch.tensor([True])),
     "has_initial_state", ["[N] = [2]", "[1]"]),
    ("live_sequence_after_padding", dict(initial_state_indices=torch.tensor([-1, 2])),
     "initial_state_indices", ["padding (negative) slots after every live one"]),
    # the library's, through the binding
    ("slot_equal_to_num_slots", dict(initial_state_indices=torch.tensor([1, SLOTS])),
     "initial_state_indices", ["[1, 6)", "initial_state_indices[1] = 6"]),
    ("null_slot_written_by_a_prefill", dict(initial_state_indices=torch.tensor([1, 0])),
     "initial_state_indices", ["null slot", "= 0"]),
    ("two_sequences_write_one_slot", dict(initial_state_indices=torch.tensor([2, 2])),
     "initial_state_indices", ["distinct slot", "both write slot 2"]),
    ("cu_seqlens_not_starting_at_0", dict(cu_seqlens=torch.tensor([1, 2, 4])), "cu_seqlens",
     ["cu_seqlens[0] = 0", "given 1"]),
    ("cu_seqlens_decreasing", dict(cu_seqlens=torch.tensor([0, 3, 2])), "cu_seqlens",
     ["non-decreasing"]),
    ("cu_seqlens_past_t", dict(cu_seqlens=torch.tensor([0, 1, 5])), "cu_seqlens",
     ["at most T = 4"]),
    ("live_prefill_with_no_token", dict(cu_seqlens=torch.tensor([0, 1, 1])), "cu_seqlens",
     ["at least one token for each live sequence"]),
    ("qkv_width_not_the_head_layout", dict(qkv=rand(4, D + 1)), "qkv",
     ["D = 2 Hk Dk + Hv Dv = 24", "[4, 25]"]),
    ("hv_not_multiple_of_hk", dict(num_k_heads=2, num_v_heads=3), "num_v_heads",
     ["multiple of num_k_heads = 2", "given 3"]),
    ("dk_above_256", dict(head_k_dim=257), "head_k_dim", ["<= 256", "257"]),
    ("dv_above_256", dict(head_v_dim=257), "head_v_dim", ["<= 256", "257"]),
    ("threads_negative", dict(threads=-1), "threads", ["1024", "-1"]),
    ("A_log_shape", dict(A_log=rand(HV + 1)), "A_log", ["[2]", "[3]"]),
    ("A_log_bf16", dict(A_log=STEP["A_log"].to(torch.bfloat16)), "A_log", ["dtype", "bf16"]),
    ("conv_weight_taps_above_8", dict(conv_weight=rand(D, 9)), "conv_weight", ["K from 1 to 8"]),
    ("conv_bias_shape", dict(conv_bias=rand(D + 1)), "conv_bias", ["[24]", "[25]"]),
    ("conv_pool_taps", dict(pools=pools(conv=(SLOTS, K, D))), "conv_state", ["[6, 3, 24]"]),
    ("ssm_pool_dv", dict(pools=pools(ssm=(SLOTS, HV, DK, DV + 1))), "ssm_state",
     ["[6, 2, 8, 4]", "[6, 2, 8, 5]"]),
    ("pools_of_different_slot_counts", dict(pools=pools(conv=(SLOTS + 1, K - 1, D))),
     "conv_state", ["as many slots as ssm_state (6)"]),
    ("ssm_pool_float64", dict(pools=(pools()[0], pools()[1].double())), "ssm_state",
     ["f32 or bf16", "f64"]),
    ("ssm_pool_not_contiguous", dict(pools=(pools()[0], rand(SLOTS, HV, DV, DK).transpose(2, 3))),
     "ssm_state", ["contiguous"]),
    # a contiguous [num_slots, D, K - 1] tensor is not vLLM's view: told in its own layout
    ("conv_pool_contiguous_in_vllms_shape", dict(pools=(rand(SLOTS, D, K - 1), pools()[1])),
     "conv_state", ["[6, 3, 24]", "vLLM's [num_slots, D, K - 1] view", "strides [*, 1, 24]",
                    "given [6, 24, 3] with strides [72, 3, 1]"]),
    ("ssm_pool_overlaps_an_input", dict(pools=overlapping_pools()), "ssm_state",
     ["does not overlap the input 'dt_bias'"]),
]


@pytest.mark.parametrize("over, argument, words", params(STEP_RULES))
def test_fused_gdn_step_rejects_and_leaves_the_pools(over, argument, words):
    args = {**STEP, **HEADS, **over}
    pool_pair = args.pop("pools", None) or pools()
    conv_pool, ssm_pool = pool_pair[:2]
    if len(pool_pair) == 3:
        args["dt_bias"] = pool_pair[2]
    args["conv_state"], args["ssm_state"] = conv_pool, ssm_pool
    before = conv_pool.clone(), ssm_pool.clone()
    positional = [args.pop(n) for n in STEP_ORDER]
    rejects(lambda: gdn.torch.fused_gdn_step(*positional, **args), argument, words)
    assert torch.equal(conv_pool, before[0]) and torch.equal(ssm_pool, before[1])


# torch.ops.gdn.step with Tokamax's metadata (the rules fused_gdn_step's description cannot
# reach).
OP_STEP = dict(query_start_loc=torch.tensor([0, 1, 4]), state_indices=torch.tensor([1, 2]),
               seq_lens=torch.tensor([5, 3]), distribution=torch.tensor([1, 2, 2]),
               read_state_indices=None, read_offsets=None, num_spec=0, threads=0)
OP_STEP_RULES = [
    ("num_spec_negative", dict(num_spec=-1), "num_spec", ["0 to 1024"]),
    ("seq_lens_below_the_query_length", dict(seq_lens=torch.tensor([5, 2])), "seq_lens",
     ["seq_lens[1] = 2 < 3"]),
    ("seq_lens_not_n", dict(seq_lens=torch.tensor([5])), "seq_lens", ["[N]", "[1]"]),
    ("decode_end_above_prefill_end", dict(distribution=torch.tensor([2, 1, 2])), "distribution",
     ["decode_end <= prefill_end <= mixed_end"]),
    ("distribution_of_two_entries", dict(distribution=torch.tensor([1, 2])), "distribution",
     ["[3]", "[2]"]),
    ("decode_longer_than_one_plus_num_spec", dict(query_start_loc=torch.tensor([0, 2, 4])),
     "query_start_loc", ["1 + num_spec = 1 tokens"]),
    ("read_slot_written_by_another_sequence", dict(read_state_indices=torch.tensor([2, 3])),
     "read_state_indices", ["no other live sequence writes"]),
    ("read_offset_past_the_pool", dict(read_state_indices=torch.tensor([1, 3]),
                                       read_offsets=torch.tensor([5, 0])), "read_offsets",
     ["[1, 6)"]),
    ("ssm_pool_dv", dict(ssm_state=rand(SLOTS, HV, DK, DV + 1)), "ssm_state", ["[6, 2, 8, 4]"]),
    ("hv_not_multiple_of_hk", dict(num_k_heads=2, num_v_heads=3), "num_v_heads",
     ["multiple of num_k_heads = 2"]),
]


@pytest.mark.parametrize("over, argument, words", params(OP_STEP_RULES))
def test_step_op_rejects_and_leaves_the_pools(over, argument, words):
    conv_pool, ssm_pool = pools()
    args = {**STEP, **HEADS, **OP_STEP, "conv_bias": None, "conv_state": conv_pool,
            "ssm_state": ssm_pool, **over}
    conv_pool, ssm_pool = args["conv_state"], args["ssm_state"]
    before = conv_pool.clone(), ssm_pool.clone()
    names = ("qkv", "a", "b", "conv_weight", "conv_bias", "A_log", "dt_bias", "conv_state",
             "ssm_state", "query_start_loc", "state_indices", "seq_lens", "distribution",
             "read_state_indices", "read_offsets", "num_k_heads", "num_v_heads", "head_k_dim",
             "head_v_dim", "num_spec", "threads")
    rejects(lambda: torch.ops.gdn.step(*(args[n] for n in names)), argument, words)
    assert torch.equal(conv_pool, before[0]) and torch.equal(ssm_pool, before[1])


# ---------------------------------------------------------------------------------------------
# The extension's checks of what the ops hand it, (address, sizes, strides, dtype) per tensor
# (gdn._gdn.core_forward; internal): sizes and strides no Python tensor can have.
# ---------------------------------------------------------------------------------------------

def core_forward(q_raw=None, cu_raw=None):
    q, k, v, g, beta = (CORE[n][0] for n in ("q", "k", "v", "g", "beta"))
    o = torch.empty_like(v)
    raw_q = _ops.raw(q) if q_raw is None else q_raw(q)
    return lambda: _gdn.core_forward(raw_q, _ops.raw(k), _ops.raw(v), _ops.raw(g),
                                     _ops.raw(beta), None, cu_raw, _ops.raw(o), None, None, None,
                                     0.5, False, 16, False, False, 1, False)


def with_q(**change):
    def make(q):
        address, sizes, strides, dtype = _ops.raw(q)
        fields = {**dict(address=address, sizes=sizes, strides=strides, dtype=dtype), **change}
        return (fields["address"], fields["sizes"], fields["strides"], fields["dtype"])
    return make


EXTENSION_RULES = [
    ("strides_not_one_per_dimension", core_forward(with_q(strides=[])), "q", ["strides"]),
    ("size_negative", core_forward(with_q(sizes=[8, -1, 8])), "q", ["sizes >= 0"]),
    ("sizes_overflow", core_forward(with_q(sizes=[2 ** 62, 1, 2 ** 62])), "q", ["int64"]),
    ("rank_above_4", core_forward(with_q(sizes=[1] * 5, strides=[1] * 5)), "q", ["rank 1 to 4"]),
    ("dtype_unknown", core_forward(with_q(dtype="complex64")), "q", ["dtype", "complex64"]),
    ("null_pointer", core_forward(cu_raw=(0, [3], [1], "int32")), "cu_seqlens", ["non-null"]),
    ("misaligned_pointer", core_forward(with_q(address=_ops.raw(CORE["q"])[0] + 1)), "q",
     ["align"]),
]


@pytest.mark.parametrize("call, argument, words", params(EXTENSION_RULES))
def test_extension_rejects(call, argument, words):
    rejects(call, argument, words)


# ---------------------------------------------------------------------------------------------
# patch
# ---------------------------------------------------------------------------------------------

def test_patch_rejects_a_model_without_gated_delta_net_layers():
    rejects(lambda: gdn.torch.patch(torch.nn.Linear(2, 2)), "model",
            ["GatedDeltaNet layers", "Linear"])
