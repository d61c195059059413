"""gdn.torch.fused_gdn_step in vLLM's speculative layout (spec_state_indices [R, 1 + n],
num_accepted_tokens [R], a conv buffer of K - 1 + n columns per sequence; gdn/step.h) against a
float64 reference written here in PyTorch: each window token by token through the whole layer
(torch_reference.py's conv and delta rule, as test_torch_step.py's), the buffer rolled as vLLM's
GPU kernel rolls it. Several steps in a row with varying accepted counts, windows beside a
prefill and a plain decode, int32 block-table slices, vLLM's transposed conv view, eager and
compiled (fullgraph) alike, errors in both, opcheck."""

import pytest

torch = pytest.importorskip("torch")

import gdn.torch  # noqa: E402
from conftest import assert_close  # noqa: E402
from test_torch_step import D, DK, DV, HEADS, HK, HV, K, _layer_reference, _rand  # noqa: E402

NUM_SPEC = 2
COLUMNS = K - 1 + NUM_SPEC
SLOTS = 16


class Batch:
    """Two windows (rows of a block table), then a chunked prefill and a one-token decode."""

    def __init__(self, lengths, accepted, seed):
        self.lengths = lengths  # the windows' tokens, then the others'
        tokens = sum(lengths)
        self.qkv = _rand(tokens, D, seed=seed)
        self.a, self.b = _rand(tokens, HV, seed=seed + 1), _rand(tokens, HV, seed=seed + 2)
        self.cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
        self.accepted = torch.tensor(accepted, dtype=torch.int32)
        # vLLM's block table is wider than 1 + n and int32: the windows' rows, a slice of it
        table = torch.tensor([[3, 9, 12, 0], [5, 1, 14, 0]], dtype=torch.int32)
        self.table = table[:, :1 + NUM_SPEC]
        self.slots = torch.tensor([3, 5, 7, 10], dtype=torch.int32)  # windows: column 0
        self.has = torch.tensor([True, True, True, True])


class Params:
    def __init__(self):
        self.w = _rand(D, K, seed=3) / K ** 0.5
        self.bias = _rand(D, seed=4) * 0.2
        self.A_log = torch.linspace(-1.0, 1.0, HV)
        self.dt_bias = _rand(HV, seed=5) * 0.5


P = Params()


def pools(seed=6):
    return _rand(SLOTS, COLUMNS, D, seed=seed), _rand(SLOTS, HV, DK, DV, seed=seed + 1) * 0.3


def step(batch, conv_pool, ssm_pool):
    return gdn.torch.fused_gdn_step(batch.qkv, batch.a, batch.b, P.w, P.A_log, P.dt_bias,
                                    conv_pool, ssm_pool, batch.slots, batch.cu, batch.has,
                                    conv_bias=P.bias, spec_state_indices=batch.table,
                                    num_accepted_tokens=batch.accepted, **HEADS)


def reference(batch, conv0, ssm0):
    """(out, conv pool, ssm pool) after the step, in float64, from the pools before it."""
    out = torch.zeros(batch.qkv.shape[0], HV * DV, dtype=torch.float64)
    conv, ssm = conv0.double().clone(), ssm0.double().clone()
    cu = batch.cu.tolist()
    windows = batch.table.shape[0]
    for s in range(len(batch.lengths)):
        lo, hi = cu[s], cu[s + 1]
        if s < windows:
            row, a = batch.table[s].tolist(), int(batch.accepted[s])
            buffer = conv0[row[0]].double()
            c, h = buffer[a - 1:a - 1 + K - 1], ssm0[row[a - 1]].double()
            for t in range(hi - lo):
                o, c, h = _layer_reference(batch.qkv[lo + t:lo + t + 1], batch.a[lo + t:lo + t + 1],
                                           batch.b[lo + t:lo + t + 1], P.w, P.bias, P.A_log,
                                           P.dt_bias, c, h)
                out[lo + t] = o[0]
                ssm[row[t]] = h
            inputs = torch.cat([buffer[a - 1:a - 1 + K - 1], batch.qkv[lo:hi].double()])
            conv[row[0], :K - 2 + hi - lo] = inputs[1:]
        else:
            slot = int(batch.slots[s])
            o, c, h = _layer_reference(batch.qkv[lo:hi], batch.a[lo:hi], batch.b[lo:hi], P.w,
                                       P.bias, P.A_log, P.dt_bias, conv0[slot, :K - 1], ssm0[slot])
            out[lo:hi] = o
            conv[slot, :K - 1] = c
            ssm[slot] = h
    return out, conv, ssm


# Per step: the windows' lengths (1 to 1 + n) and accepted counts (at most the previous
# step's lengths), a 6-token chunk and a one-token decode beside them.
STEPS = [([3, 3, 6, 1], [1, 3]), ([3, 2, 6, 1], [3, 1]), ([1, 3, 6, 1], [2, 2]),
         ([3, 1, 6, 1], [1, 3])]


def test_steps_in_a_row_with_varying_accepted_counts_match_the_torch_reference():
    conv_pool, ssm_pool = pools()
    for i, (lengths, accepted) in enumerate(STEPS):
        batch = Batch(lengths, accepted, seed=20 + i)
        conv0, ssm0 = conv_pool.clone(), ssm_pool.clone()
        want, want_conv, want_ssm = reference(batch, conv0, ssm0)
        out = step(batch, conv_pool, ssm_pool)
        assert_close(out, want, 1e-5, f"out, step {i}")
        assert_close(conv_pool, want_conv, 1e-6, f"conv pool, step {i}")
        assert_close(ssm_pool, want_ssm, 1e-5, f"ssm pool, step {i}")
        written = set(batch.table[0, :lengths[0]].tolist() + batch.table[1, :lengths[1]].tolist()
                      + [7, 10])
        for slot in set(range(SLOTS)) - written:
            assert torch.equal(ssm_pool[slot], ssm0[slot]), slot
        for slot in set(range(SLOTS)) - {3, 5, 7, 10}:
            assert torch.equal(conv_pool[slot], conv0[slot]), slot


def test_vllm_transposed_conv_view_and_bf16_ssm_pool():
    batch = Batch(*STEPS[0], seed=30)
    conv_pool, ssm_pool = pools(seed=8)
    ssm_pool = ssm_pool.bfloat16()
    want, want_conv, want_ssm = reference(batch, conv_pool, ssm_pool.float())
    view = conv_pool.transpose(1, 2)  # vLLM's [slots, D, K - 1 + n] view of the same memory
    out = step(batch, view, ssm_pool)
    assert_close(out, want, 1e-5, "out")
    assert_close(conv_pool, want_conv, 1e-6, "conv pool")
    assert_close(ssm_pool.float(), want_ssm, 1e-2, "ssm pool (bf16)")


def test_compiled_fullgraph_matches_eager_bit_for_bit():
    batch = Batch(*STEPS[1], seed=40)
    eager_pools, compiled_pools = pools(), pools()
    want = step(batch, *eager_pools)
    got = torch.compile(lambda c, s: step(batch, c, s), fullgraph=True,
                        backend="aot_eager")(*compiled_pools)
    assert torch.equal(got, want)
    for x, y in zip(compiled_pools, eager_pools):
        assert torch.equal(x, y)


@pytest.mark.parametrize("case,argument,words", [
    ("accepted_zero", "num_accepted_tokens", ["num_accepted_tokens[1] = 0"]),
    ("slot_past_pool", "spec_state_indices", ["spec_state_indices[0, 2] = 16"]),
    ("table_alone", "num_accepted_tokens", ["present with spec_state_indices"]),
    ("too_many_rows", "spec_state_indices", ["at most the 4 live ones"]),
    ("narrow_conv_pool", "conv_state", ["K - 1 + num_spec"]),
])
def test_errors_are_the_same_in_eager_and_compiled_mode_and_write_nothing(case, argument, words):
    batch = Batch(*STEPS[0], seed=50)
    conv_pool, ssm_pool = pools()
    if case == "accepted_zero":
        batch.accepted = torch.tensor([1, 0], dtype=torch.int32)
    elif case == "slot_past_pool":
        batch.table = torch.tensor([[3, 9, 16], [5, 1, 14]])
    elif case == "table_alone":
        batch.accepted = None
    elif case == "too_many_rows":
        batch.table = torch.ones(5, 1 + NUM_SPEC, dtype=torch.int64)
        batch.accepted = torch.ones(5, dtype=torch.int64)
    elif case == "narrow_conv_pool":
        conv_pool = _rand(SLOTS, K - 1, D, seed=1)
    texts = []
    compiled = torch.compile(lambda c, s: step(batch, c, s), fullgraph=True, backend="aot_eager")
    for fn in (lambda c, s: step(batch, c, s), compiled):
        copies = [conv_pool.clone(), ssm_pool.clone()]
        with pytest.raises(ValueError) as info:
            fn(*copies)
        texts.append(str(info.value))
        assert torch.equal(copies[0], conv_pool) and torch.equal(copies[1], ssm_pool)
    assert texts[0] == texts[1], texts
    assert f"argument '{argument}'" in texts[0], texts[0]
    for word in words:
        assert word in texts[0], (word, texts[0])


def test_opcheck_fused_gdn_step_speculative():
    batch = Batch(*STEPS[0], seed=60)
    conv_pool, ssm_pool = pools()
    args = (batch.qkv, batch.a, batch.b, P.w, P.bias, P.A_log, P.dt_bias, conv_pool, ssm_pool,
            batch.slots, batch.cu, batch.has, batch.table.contiguous(), batch.accepted, HK, HV, DK,
            DV, 0)
    torch.library.opcheck(torch.ops.gdn.fused_gdn_step.default, args)
