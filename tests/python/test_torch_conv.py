"""gdn.torch's causal conv1d (causal_conv1d_fn, causal_conv1d_update: the causal-conv1d
package's functions, as transformers calls them) against the conv written in PyTorch
(torch_reference.py) and the C++ float64 reference: forward, final states, every gradient,
gradcheck in float64, packed batches, layouts, 16-bit x, the decode update, torch.compile,
opcheck (errors: test_torch_validation.py)."""

import pytest

torch = pytest.importorskip("torch")

import gdn.torch  # noqa: E402
import torch_reference as ref  # noqa: E402
from conftest import assert_close  # noqa: E402

TOL_F32 = 1e-5
fn = gdn.torch.causal_conv1d_fn
update = gdn.torch.causal_conv1d_update


def _rand(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# (id, batch, channels, tokens, taps, bias, initial_states, activation, channel_last)
CASES = [
    ("batch2_k4_bias_state_silu_channel_last", 2, 24, 37, 4, True, True, "silu", True),
    ("batch1_k4_no_bias_silu_contiguous", 1, 40, 19, 4, False, False, "silu", False),
    ("batch3_k2_state_none_activation", 3, 16, 9, 2, True, True, None, False),
    ("batch2_k8_tokens_shorter_than_k", 2, 8, 3, 8, True, True, "swish", True),
    ("batch1_k1", 1, 5, 11, 1, True, False, "silu", True),
]


def _inputs(case, dtype=torch.float32, grad=False):
    _, b, d, t, k, bias, state, _, channel_last = case
    x = _rand(b, t, d, seed=1).transpose(1, 2) if channel_last else _rand(b, d, t, seed=1)
    w = _rand(d, k, seed=2) / k ** 0.5
    bb = _rand(d, seed=3) * 0.2 if bias else None
    s = _rand(b, d, k - 1, seed=4) if state else None
    # float32 values in any dtype: the float64 reference sees exactly the op's inputs.
    out = [v.float().to(dtype) if v is not None else None for v in (x, w, bb, s)]
    if grad:
        for v in out:
            if v is not None:
                v.requires_grad_(True)
    return out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_conv_fn_and_its_gradients_match_the_torch_reference(case):
    activation = case[7]
    x, w, b, s = _inputs(case, grad=True)
    out, final = fn(x, w, b, initial_states=s, return_final_states=True, activation=activation)
    assert out.shape == x.shape and out.dtype == torch.float32
    x64, w64, b64, s64 = _inputs(case, torch.float64, grad=True)
    want, want_final = ref.causal_conv1d(x64, w64, b64, s64, activation)
    assert_close(out, want, TOL_F32, "out")
    assert_close(final, want_final, 0, "final states")  # copies of inputs
    d_out = _rand(*out.shape, seed=9)
    d_final = _rand(*final.shape, seed=10)
    got = torch.autograd.grad((out * d_out.float()).sum() + (final * d_final.float()).sum(),
                              [v for v in (x, w, b, s) if v is not None])
    exp = torch.autograd.grad((want * d_out).sum() + (want_final * d_final).sum(),
                              [v for v in (x64, w64, b64, s64) if v is not None])
    for name, a, e in zip(("d_x", "d_weight", "d_bias_or_state", "d_initial_states"), got, exp):
        assert_close(a, e, TOL_F32, name)


def test_conv_fn_float64_matches_the_cpp_float64_reference():
    x = _rand(40, 24, seed=1)
    w, b, s = _rand(24, 4, seed=2), _rand(24, seed=3), _rand(3, 3, 24, seed=4)
    cu = torch.tensor([0, 17, 18, 40])
    out, final = fn(x.T[None], w, b, initial_states=s.transpose(1, 2), return_final_states=True,
                    activation="silu", cu_seqlens=cu)
    want, want_final = gdn.torch.reference.causal_conv1d(x, w, b, s, cu, "silu")
    assert_close(out[0].T, want, 1e-13, "out")
    assert_close(final.transpose(1, 2), want_final, 0, "final states")


def test_packed_batches_by_cu_seqlens_or_seq_idx_equal_one_call_per_sequence():
    lengths = [7, 1, 0, 12, 2]
    x = _rand(1, 22, 16, seed=5, dtype=torch.float32).transpose(1, 2)
    w, b = _rand(16, 4, seed=6, dtype=torch.float32), _rand(16, seed=7, dtype=torch.float32)
    cu = torch.tensor([0, 7, 8, 8, 20, 22])
    by_cu = fn(x, w, b, activation="silu", cu_seqlens=cu)
    seq_idx = torch.repeat_interleave(torch.arange(5), torch.tensor(lengths))[None].int()
    by_idx = fn(x, w, b, seq_idx=seq_idx, activation="silu")
    parts = [fn(x[:, :, cu[i]:cu[i + 1]], w, b, activation="silu") for i in range(5)]
    assert torch.equal(by_cu, torch.cat(parts, dim=-1))
    assert torch.equal(by_idx, by_cu)


def test_conv_gradcheck_in_float64_every_input():
    small = ("small", 2, 6, 9, 4, True, True, "silu", True)
    x, w, b, s = _inputs(small, torch.float64, grad=True)

    def f(x, w, b, s):
        out, final = fn(x, w, b, initial_states=s, return_final_states=True, activation="silu")
        return out, final

    assert torch.autograd.gradcheck(f, (x, w, b, s))


def test_16bit_x_is_the_float32_conv_rounded_once():
    for dtype in (torch.bfloat16, torch.float16):
        x, w, b, s = _inputs(CASES[0])
        x16 = x.to(dtype)
        out = fn(x16, w, b, initial_states=s, activation="silu")
        wide = fn(x16.float(), w, b, initial_states=s, activation="silu")
        assert out.dtype == dtype
        assert torch.equal(out, wide.to(dtype))


def test_final_states_out_is_filled_and_returned():
    x, w, b, s = _inputs(CASES[0])
    buf = torch.empty(2, 24, 3)
    out, final = fn(x, w, b, initial_states=s, return_final_states=True, final_states_out=buf,
                    activation="silu")
    assert final is buf
    assert torch.equal(buf, x[..., -3:])


@pytest.mark.parametrize("state_len", [4, 3], ids=["S=K", "S=K-1"])
@pytest.mark.parametrize("tokens", [1, 3], ids=["one_token_2d", "three_tokens"])
def test_update_matches_the_definition_and_updates_the_state_in_place(state_len, tokens):
    d, k = 24, 4
    w, b = _rand(d, k, seed=2, dtype=torch.float32), _rand(d, seed=3, dtype=torch.float32)
    pool = _rand(5, d, state_len, seed=4, dtype=torch.float32)
    idx = torch.tensor([3, 0], dtype=torch.int32)
    x = _rand(2, d, tokens, seed=5, dtype=torch.float32)
    x_in = x[..., 0] if tokens == 1 else x
    before = pool.clone()
    got = update(x_in, pool, w, b, "silu", conv_state_indices=idx)
    assert got.shape == x_in.shape
    full = torch.cat([before[idx.long()].double(), x.double()], dim=-1)
    want, _ = ref.causal_conv1d(x.double(), w.double(), b.double(),
                                full[..., state_len - (k - 1):state_len], "silu")
    assert_close(got if tokens > 1 else got[..., None], want, TOL_F32, "out")
    assert torch.equal(pool[idx.long()], full[..., -state_len:].float())
    untouched = [1, 2, 4]
    assert torch.equal(pool[untouched], before[untouched])


def test_update_token_by_token_equals_the_prefill():
    x, w, b, _ = _inputs(CASES[1])
    whole = fn(x, w, b, activation="silu")
    state = torch.zeros(1, x.shape[1], 4)  # transformers' [B, D, K] conv state
    steps = [update(x[:, :, t], state, w, b, "silu") for t in range(x.shape[-1])]
    assert torch.equal(torch.stack(steps, dim=-1), whole)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic_shapes"])
def test_compile_fullgraph_conv_forward_and_backward_match_eager(dynamic):
    def loss(x, w, b, s):
        out, final = fn(x, w, b, initial_states=s, return_final_states=True, activation="silu")
        return (out * out).sum() + final.sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    xs = _inputs(CASES[0], grad=True)
    eager = loss(*xs)
    eager_grads = torch.autograd.grad(eager, xs)
    ys = _inputs(CASES[0], grad=True)
    got = compiled(*ys)
    assert torch.equal(got, eager)
    for a, e in zip(torch.autograd.grad(got, ys), eager_grads):
        assert torch.equal(a, e)


def test_compile_fullgraph_seq_idx_matches_eager():
    # the boundaries of seq_idx are read from the data: a data-dependent size in the graph, and
    # other values through the same compiled function give other boundaries
    def loss(x, w, seq_idx):
        return (fn(x, w, seq_idx=seq_idx, activation="silu") ** 2).sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    w = _rand(8, 4, seed=2, dtype=torch.float32).requires_grad_()
    for seq_idx in ([[0, 0, 0, 1, 1, 2]], [[0, 1, 1, 1, 1, 1]]):
        seq_idx = torch.tensor(seq_idx, dtype=torch.int32)
        xs = [_rand(1, 8, 6, seed=1, dtype=torch.float32).requires_grad_() for _ in range(2)]
        want, got = loss(xs[0], w, seq_idx), compiled(xs[1], w, seq_idx)
        assert torch.equal(got, want)
        grads = torch.autograd.grad(got, (xs[1], w)), torch.autograd.grad(want, (xs[0], w))
        for a, e in zip(*grads):
            assert torch.equal(a, e)


def test_opcheck_both_conv_ops():
    x, w, b, s = _inputs(CASES[0], grad=True)
    rows = x[0].T  # [T, D], strided
    state = s[:1].transpose(1, 2)
    args = (rows, w, b, state, None, True, 0, True)
    torch.library.opcheck(torch.ops.gdn.conv_fwd.default, args)
    d_out = _rand(*rows.shape, seed=8, dtype=torch.float32)
    d_final = _rand(1, 3, 24, seed=9, dtype=torch.float32)
    bargs = (rows.detach(), w.detach(), b.detach(), state.detach(), None, d_out, d_final, True, 0)
    torch.library.opcheck(torch.ops.gdn.conv_bwd.default, bargs)


def test_opcheck_conv_update():
    # the pool mutated in place (its schema's Tensor(a!)), rows picked by index
    w, b = _rand(24, 4, seed=2, dtype=torch.float32), _rand(24, seed=3, dtype=torch.float32)
    x = _rand(2, 24, 3, seed=5, dtype=torch.float32)
    pool = _rand(5, 24, 4, seed=4, dtype=torch.float32)
    args = (x, pool, w, b, torch.tensor([3, 0]), True, 0)
    torch.library.opcheck(torch.ops.gdn.conv_update.default, args)


def test_empty_batches_and_zero_tokens():
    w = _rand(8, 4, seed=2, dtype=torch.float32)
    for b, t in ((0, 5), (1, 0), (3, 0)):
        x = _rand(b, 8, t, seed=1, dtype=torch.float32)
        s = _rand(b, 8, 3, seed=3, dtype=torch.float32)
        out, final = fn(x, w, initial_states=s, return_final_states=True, activation="silu")
        assert out.shape == (b, 8, t) and final.shape == (b, 8, 3)
        assert torch.equal(final, s)  # no new input: the state carries over
    pool = torch.zeros(2, 8, 4)
    empty = torch.zeros(0, dtype=torch.int32)
    assert update(torch.zeros(0, 8), pool, w, conv_state_indices=empty).shape == (0, 8)
    assert torch.count_nonzero(pool) == 0
