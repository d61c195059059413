"""The checks of gdn.torch that look at tensor values (slots, boundaries, indices) or that rename
the library's names to the caller's, run under torch.compile(fullgraph=True) as in eager mode:
each rule here raises the same ValueError, with the same text, in both, and leaves the pools
as they were. A compiled graph cannot run a wrapper's Python check of a value (it is traced
away, or skipped): these checks run in the ops' bodies, when the op runs. One compiled function
per op serves all its rules (same shapes, so no recompilation); the aot_eager backend, and
inductor once for the serving step."""

import pytest

torch = pytest.importorskip("torch")

import gdn.torch  # noqa: E402


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def message(call):
    with pytest.raises(ValueError) as info:
        call()
    return str(info.value)


def same_error_eager_and_compiled(eager, compiled, pools, argument, words):
    """The rule's message from the eager and the compiled call (each on its own copy of the
    pools, which must be unchanged after it), checked equal and naming the argument."""
    texts = []
    for fn in (eager, compiled):
        copies = [p.clone() for p in pools]
        texts.append(message(lambda: fn(*copies)))
        for p, c in zip(pools, copies):
            assert torch.equal(p, c)
    assert texts[0] == texts[1], texts
    assert f"argument '{argument}'" in texts[0] and "expected" in texts[0], texts[0]
    for word in words:
        assert word in texts[0], (word, texts[0])


def params(rules):
    return [pytest.param(*r[1:], id=r[0]) for r in rules]


# ---------------------------------------------------------------------------------------------
# fused_gdn_step: N = 4 sequences of 2 tokens over pools of 6 slots (the batch).
# ---------------------------------------------------------------------------------------------

HK, HV, DK, DV, K, SLOTS, T = 1, 2, 8, 4, 4, 6, 8
D = 2 * HK * DK + HV * DV
HEADS = dict(num_k_heads=HK, num_v_heads=HV, head_k_dim=DK, head_v_dim=DV)
LAYER = dict(qkv=rand(T, D, seed=1), a=rand(T, HV, seed=2), b=rand(T, HV, seed=3),
             conv_weight=rand(D, K, seed=4) / 2, A_log=rand(HV, seed=5), dt_bias=rand(HV, seed=6))
POOLS = (rand(SLOTS, K - 1, D, seed=7), rand(SLOTS, HV, DK, DV, seed=8))
GOOD = dict(slots=torch.tensor([1, 2, 3, 4]), cu=torch.tensor([0, 2, 4, 6, 8]),
            has=torch.tensor([True, False, True, False]))


def fused_step(conv_pool, ssm_pool, slots, cu, has):
    x = LAYER
    return gdn.torch.fused_gdn_step(x["qkv"], x["a"], x["b"], x["conv_weight"], x["A_log"],
                                    x["dt_bias"], conv_pool, ssm_pool, slots, cu, has, **HEADS)


COMPILED_STEP = torch.compile(fused_step, fullgraph=True, backend="aot_eager")

STEP_RULES = [
    ("live_slot_after_padding", dict(slots=torch.tensor([1, -1, 3, 4])), "initial_state_indices",
     ["padding (negative) slots after every live one", "[1, -1, 3, 4]"]),
    ("slot_equal_to_num_slots", dict(slots=torch.tensor([1, 2, 3, 6])), "initial_state_indices",
     ["[1, 6)", "initial_state_indices[3] = 6"]),
    ("null_slot", dict(slots=torch.tensor([1, 0, 3, 4])), "initial_state_indices",
     ["null slot", "initial_state_indices[1] = 0"]),
    ("two_sequences_write_one_slot", dict(slots=torch.tensor([1, 3, 3, 4])),
     "initial_state_indices", ["distinct slot", "both write slot 3"]),
    ("cu_seqlens_not_starting_at_0", dict(cu=torch.tensor([1, 2, 4, 6, 8])), "cu_seqlens",
     ["cu_seqlens[0] = 0", "given 1"]),
    ("cu_seqlens_decreasing", dict(cu=torch.tensor([0, 3, 2, 6, 8])), "cu_seqlens",
     ["non-decreasing", "cu_seqlens[2] = 2 < cu_seqlens[1] = 3"]),
    ("cu_seqlens_past_t", dict(cu=torch.tensor([0, 2, 4, 6, 9])), "cu_seqlens",
     ["at most T = 8", "cu_seqlens[4] = 9"]),
    ("live_sequence_without_tokens", dict(cu=torch.tensor([0, 2, 2, 6, 8])), "cu_seqlens",
     ["at least one token", "sequence 1"]),
]


@pytest.mark.parametrize("over, argument, words", params(STEP_RULES))
def test_fused_gdn_step_rule_eager_and_compiled(over, argument, words):
    batch = {**GOOD, **over}

    def call(fn):
        return lambda c, s: fn(c, s, batch["slots"], batch["cu"], batch["has"])
    same_error_eager_and_compiled(call(fused_step), call(COMPILED_STEP), POOLS, argument, words)


def test_fused_gdn_step_compiled_matches_eager_on_a_good_batch():
    # the compiled function the rules above reuse computes the step
    eager, compiled = [p.clone() for p in POOLS], [p.clone() for p in POOLS]
    want = fused_step(*eager, **GOOD)
    got = COMPILED_STEP(*compiled, **GOOD)
    assert torch.equal(got, want) and want.abs().sum() > 0
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)
    assert not torch.equal(eager[1], POOLS[1])


def test_fused_gdn_step_live_slot_after_padding_under_inductor():
    # the case: before, the compiled step raised nothing, gave sequences 2 and 3 zero
    # rows and left slots 3 and 4 unwritten
    compiled = torch.compile(fused_step, fullgraph=True, backend="inductor")
    batch = {**GOOD, "slots": torch.tensor([1, -1, 3, 4])}
    same_error_eager_and_compiled(lambda c, s: fused_step(c, s, **batch),
                                  lambda c, s: compiled(c, s, **batch), POOLS,
                                  "initial_state_indices", ["padding (negative) slots"])


def test_fused_gdn_step_conv_pool_in_the_callers_layout_eager_and_compiled():
    # a contiguous [num_slots, D, K - 1] tensor is not vLLM's view of a [num_slots, K - 1, D]
    # pool: the message describes it, not the transpose the library would see
    pools = (rand(SLOTS, D, K - 1, seed=7), POOLS[1])
    same_error_eager_and_compiled(lambda c, s: fused_step(c, s, **GOOD),
                                  lambda c, s: COMPILED_STEP(c, s, **GOOD), pools, "conv_state",
                                  ["given [6, 24, 3] with strides [72, 3, 1]"])


def tokamax_step(conv_pool, ssm_pool, query_start_loc, seq_lens, distribution):
    x = LAYER
    return torch.ops.gdn.step(x["qkv"], x["a"], x["b"], x["conv_weight"], None, x["A_log"],
                              x["dt_bias"], conv_pool, ssm_pool, query_start_loc,
                              GOOD["slots"], seq_lens, distribution, None, None, HK, HV, DK,
                              DV, 0, 0)


COMPILED_TOKAMAX = torch.compile(tokamax_step, fullgraph=True, backend="aot_eager")
TOKAMAX = dict(query_start_loc=torch.tensor([0, 1, 2, 5, 8]), seq_lens=torch.tensor([4, 4, 3, 9]),
               distribution=torch.tensor([2, 4, 4]))
TOKAMAX_RULES = [
    ("seq_lens_below_the_query_length", dict(seq_lens=torch.tensor([4, 4, 2, 9])), "seq_lens",
     ["seq_lens[2] = 2 < 3"]),
    ("decode_end_above_prefill_end", dict(distribution=torch.tensor([3, 2, 4])),
     "distribution", ["decode_end <= prefill_end <= mixed_end"]),
    ("decode_of_three_tokens", dict(distribution=torch.tensor([3, 4, 4])), "query_start_loc",
     ["1 + num_spec = 1 tokens"]),
]


@pytest.mark.parametrize("over, argument, words", params(TOKAMAX_RULES))
def test_step_op_rule_eager_and_compiled(over, argument, words):
    meta = {**TOKAMAX, **over}

    def call(fn):
        return lambda c, s: fn(c, s, **meta)
    same_error_eager_and_compiled(call(tokamax_step), call(COMPILED_TOKAMAX), POOLS, argument,
                                  words)


# ---------------------------------------------------------------------------------------------
# causal_conv1d_update: B = 2 rows of x over a pool of 3 conv states, D = 24, S = K = 4.
# ---------------------------------------------------------------------------------------------

UPDATE = dict(x=rand(2, 24, seed=1), weight=rand(24, 4, seed=2), bias=rand(24, seed=3))
POOL = (rand(3, 24, 4, seed=4),)


def update(pool, idx):
    u = UPDATE
    return gdn.torch.causal_conv1d_update(u["x"], pool, u["weight"], u["bias"], "silu",
                                          conv_state_indices=idx)


COMPILED_UPDATE = torch.compile(update, fullgraph=True, backend="aot_eager")
UPDATE_RULES = [
    ("duplicate_rows", torch.tensor([1, 1]), ["distinct rows", "batch rows 0 and 1 both continue "
                                              "row 1"]),
    ("row_past_the_pool", torch.tensor([0, 3]), ["[0, 3)", "[0, 3]"]),
    ("negative_row", torch.tensor([-1, 1]), ["[0, 3)", "[-1, 1]"]),
]


@pytest.mark.parametrize("idx, words", params(UPDATE_RULES))
def test_causal_conv1d_update_rule_eager_and_compiled(idx, words):
    same_error_eager_and_compiled(lambda p: update(p, idx), lambda p: COMPILED_UPDATE(p, idx),
                                  POOL, "conv_state_indices", words)


def test_causal_conv1d_update_compiled_matches_eager():
    idx = torch.tensor([2, 0])
    eager, compiled = POOL[0].clone(), POOL[0].clone()
    assert torch.equal(COMPILED_UPDATE(compiled, idx), update(eager, idx))
    assert torch.equal(compiled, eager) and not torch.equal(eager, POOL[0])


# ---------------------------------------------------------------------------------------------
# causal_conv1d_fn and the delta rule: cu_seqlens values and the options the library checks
# when the op runs (named as the function's arguments in both modes).
# ---------------------------------------------------------------------------------------------

def conv(x, cu, threads=0):
    return gdn.torch.causal_conv1d_fn(x, UPDATE["weight"], activation="silu", cu_seqlens=cu,
                                      threads=threads)


COMPILED_CONV = torch.compile(conv, fullgraph=True, backend="aot_eager")
X = rand(1, 24, 8, seed=5)


@pytest.mark.parametrize("cu, words", [
    pytest.param(torch.tensor([0, 5, 3, 8]), ["non-decreasing"], id="cu_seqlens_decreasing"),
    pytest.param(torch.tensor([0, 5, 7, 7]), ["T = 8"], id="cu_seqlens_not_ending_at_t"),
])
def test_causal_conv1d_fn_cu_seqlens_eager_and_compiled(cu, words):
    same_error_eager_and_compiled(lambda: conv(X, cu), lambda: COMPILED_CONV(X, cu), (),
                                  "cu_seqlens", words)


def test_causal_conv1d_fn_threads_named_as_the_functions_argument_when_compiled():
    # the library's options.threads, renamed in the op's body (eager mode only, before)
    compiled = torch.compile(lambda x: conv(x, None, threads=-1), fullgraph=True,
                             backend="aot_eager")
    same_error_eager_and_compiled(lambda: conv(X, None, threads=-1), lambda: compiled(X), (),
                                  "threads", ["1024", "-1"])


CORE = dict(q=rand(1, 8, 1, 8, seed=1), k=rand(1, 8, 1, 8, seed=2), v=rand(1, 8, 2, 4, seed=3),
            g=-rand(1, 8, 2, seed=4).abs(), beta=rand(1, 8, 2, seed=5).sigmoid())


def chunk(q, k, v, g, beta, cu=None, scale=None, threads=0):
    return gdn.torch.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, cu_seqlens=cu,
                                            threads=threads)[0]


def recurrent(q, k, v, g, beta, cu=None):
    return gdn.torch.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, cu_seqlens=cu)[0]


COMPILED_CHUNK = torch.compile(chunk, fullgraph=True, backend="aot_eager")
COMPILED_RECURRENT = torch.compile(recurrent, fullgraph=True, backend="aot_eager")


@pytest.mark.parametrize("fn, compiled", [(chunk, COMPILED_CHUNK),
                                          (recurrent, COMPILED_RECURRENT)],
                         ids=["chunk", "recurrent"])
@pytest.mark.parametrize("cu, words", [
    pytest.param(torch.tensor([1, 5, 8]), ["cu_seqlens[0] = 0"], id="cu_seqlens_not_from_0"),
    pytest.param(torch.tensor([0, 5, 3, 8]), ["non-decreasing"], id="cu_seqlens_decreasing"),
    pytest.param(torch.tensor([0, 5, 9]), ["<= T = 8"], id="cu_seqlens_past_t"),
])
def test_delta_rule_cu_seqlens_eager_and_compiled(fn, compiled, cu, words):
    args = tuple(CORE.values())
    same_error_eager_and_compiled(lambda: fn(*args, cu), lambda: compiled(*args, cu), (),
                                  "cu_seqlens", words)


@pytest.mark.parametrize("over, argument, words", [
    pytest.param(dict(k=rand(1, 8, 1, 4)), "k", ["[1, 8, 1, 4]"], id="k_shape_not_that_of_q"),
    pytest.param(dict(scale=float("nan")), "scale", ["finite"], id="scale_nan"),
    pytest.param(dict(threads=1025), "threads", ["1024", "1025"], id="threads_above_1024"),
])
def test_chunk_gated_delta_rule_library_rule_eager_and_compiled(over, argument, words):
    # eager mode checks shapes and options before the call (the library's core_shape); a
    # compiled graph, when the op runs: the same message
    args = {**CORE, **over}
    compiled = torch.compile(lambda: chunk(**args), fullgraph=True, backend="aot_eager")
    same_error_eager_and_compiled(lambda: chunk(**args), compiled, (), argument, words)
