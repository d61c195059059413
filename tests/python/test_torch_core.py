"""gdn.torch's core op against the pure-PyTorch reference (torch_reference.py) and the C++
float64 reference (gdn.torch.reference): forward, every gradient, residual policies,
gradcheck in float64, torch.compile(fullgraph=True), opcheck, strides, 16-bit activations,
thread counts (errors: test_torch_validation.py)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gdn.torch  # noqa: E402
import torch_reference as ref  # noqa: E402
from conftest import assert_close  # noqa: E402

TOL_F32 = 1e-4

# (id, batch, tokens, hk, hv, dk, dv, cu_seqlens, h0, l2norm, chunk)
CASES = [
    ("batched_h0_gva_dk_ne_dv", 2, 37, 2, 4, 16, 24, None, True, True, 16),
    ("varlen_zero_and_one_token_h0", 1, 50, 1, 2, 20, 12, [0, 0, 1, 20, 20, 49, 50], True, False,
     16),
    ("varlen_no_h0_gva3", 1, 40, 2, 6, 8, 8, [0, 1, 2, 23, 40], False, True, 32),
    ("one_sequence_c64_short_last_chunk", 1, 70, 1, 1, 32, 16, None, False, True, 64),
]
IDS = [c[0] for c in CASES]


class Case:
    """Inputs (float64 masters), cotangents and options of one case."""

    def __init__(self, case, seed=0):
        _, batch, tokens, hk, hv, dk, dv, cu, h0, l2, chunk = case
        n = batch if cu is None else len(cu) - 1
        g = torch.Generator().manual_seed(seed)
        rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
        self.q, self.k = rnd(batch, tokens, hk, dk), rnd(batch, tokens, hk, dk)
        if not l2:  # keep the unnormalised recurrence stable (beta |k|^2 < 2)
            self.q, self.k = self.q * dk ** -0.5, self.k * dk ** -0.5
        self.v = rnd(batch, tokens, hv, dv)
        self.g = -(torch.rand(batch, tokens, hv, generator=g, dtype=torch.float64) * 0.99 + 0.01)
        self.beta = torch.rand(batch, tokens, hv, generator=g, dtype=torch.float64) * 0.95 + 0.05
        self.h0 = 0.5 * rnd(n, hv, dk, dv) if h0 else None
        self.d_o, self.d_ht = rnd(batch, tokens, hv, dv), rnd(n, hv, dk, dv)
        self.cu_list = cu
        self.cu = None if cu is None else torch.tensor(cu, dtype=torch.int32)
        self.l2, self.chunk = l2, chunk

    def inputs(self, dtype=torch.float32, grad=False):
        xs = [x.to(dtype) if x is not None else None
              for x in (self.q, self.k, self.v, self.g, self.beta, self.h0)]
        xs[3:] = [x.to(torch.float64 if dtype == torch.float64 else torch.float32)
                  if x is not None else None for x in xs[3:]]
        if grad:
            for x in xs:
                if x is not None:
                    x.requires_grad_(True)
        return xs

    def grads(self, fn, dtype=torch.float32, **kw):
        """(o, ht, [dq, dk, dv, dg, dbeta, dh0]) of <o, d_o> + <ht, d_ht>."""
        q, k, v, g, beta, h0 = xs = self.inputs(dtype, grad=True)
        o, ht = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                   use_qk_l2norm_in_kernel=self.l2, **kw)
        loss = (o.double() * self.d_o).sum() + (ht.double() * self.d_ht).sum()
        loss.backward()
        return o.detach(), ht.detach(), [x.grad if x is not None else None for x in xs]

    def gdn(self, **extra):
        cu = self.cu

        def fn(q, k, v, g, beta, **kw):
            return gdn.torch.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu,
                                                    chunk_size=self.chunk, **kw, **extra)
        return fn

    def reference(self):
        cu = self.cu_list

        def fn(q, k, v, g, beta, **kw):
            kw.pop("output_final_state")
            return ref.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, **kw)
        return fn


NAMES = ["dq", "dk", "dv", "dg", "dbeta", "dh0"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_gradients_match_the_torch_reference(case):
    c = Case(case)
    o, ht, grads = c.grads(c.gdn())
    o_ref, ht_ref, grads_ref = c.grads(c.reference(), dtype=torch.float64)
    assert o.dtype == torch.float32 and ht.dtype == torch.float32
    assert_close(o, o_ref, TOL_F32, "o")
    assert_close(ht, ht_ref, TOL_F32, "final_state")
    for name, x, y in zip(NAMES, grads, grads_ref):
        if y is not None:
            assert_close(x, y, TOL_F32, name)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_float64_matches_the_cpp_float64_reference(case):
    c = Case(case)
    q, k, v, g, beta, h0 = c.inputs(torch.float64)
    kw = dict(initial_state=h0, use_qk_l2norm_in_kernel=c.l2, cu_seqlens=c.cu)
    o, ht = gdn.torch.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,
                                             chunk_size=c.chunk, **kw)
    o_ref, ht_ref = gdn.torch.reference.chunk_gated_delta_rule(q, k, v, g, beta,
                                                               output_final_state=True, **kw)
    assert_close(o, o_ref, 1e-12, "o")
    assert_close(ht, ht_ref, 1e-12, "final_state")
    _, _, grads = c.grads(c.gdn(), dtype=torch.float64)
    grads_ref = gdn.torch.reference.chunk_gated_delta_rule_bwd(
        q, k, v, g, beta, c.d_o, d_final_state=c.d_ht, **kw)
    for name, x, y in zip(NAMES, grads, grads_ref):
        if y is not None:
            assert_close(x, y, 1e-12, name)
    # and the torch reference agrees with the C++ one (two independent definitions)
    o_t, ht_t = ref.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                           use_qk_l2norm_in_kernel=c.l2, cu_seqlens=c.cu_list)
    assert_close(o_t, o_ref, 1e-12, "torch reference o")
    assert_close(ht_t, ht_ref, 1e-12, "torch reference final_state")


def test_gradcheck_in_float64_every_input():
    c = Case(("small", 1, 9, 1, 2, 4, 3, [0, 4, 4, 9], True, True, 4))
    q, k, v, g, beta, h0 = c.inputs(torch.float64, grad=True)

    def f(q, k, v, g, beta, h0):
        o, ht = gdn.torch.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                                 output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True, cu_seqlens=c.cu,
                                                 chunk_size=4)
        return o, ht

    assert torch.autograd.gradcheck(f, (q, k, v, g, beta, h0), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_residual_policies_give_identical_gradients():
    c = Case(CASES[1])
    results = {r: c.grads(c.gdn(residuals=r)) for r in ("all", "t_inv", "none")}
    for r in ("t_inv", "none"):
        for x, y in zip(results[r][2], results["all"][2]):
            if y is not None:
                assert torch.equal(x, y), r


def test_fused_recurrent_matches_the_reference_and_differentiates():
    c = Case(CASES[0])
    fn = lambda q, k, v, g, beta, **kw: gdn.torch.fused_recurrent_gated_delta_rule(  # noqa: E731
        q, k, v, g=g, beta=beta, **kw)
    o, ht, grads = c.grads(fn)
    o_ref, ht_ref, grads_ref = c.grads(c.reference(), dtype=torch.float64)
    assert_close(o, o_ref, TOL_F32, "o")
    assert_close(ht, ht_ref, TOL_F32, "final_state")
    for name, x, y in zip(NAMES, grads, grads_ref):
        assert_close(x, y, TOL_F32, name)


def test_fused_recurrent_gate_in_kernel_and_beta_sigmoid():
    torch.manual_seed(0)
    q, k = torch.randn(1, 6, 1, 8), torch.randn(1, 6, 1, 8)
    v, a, b = torch.randn(1, 6, 2, 4), torch.randn(1, 6, 2), torch.randn(1, 6, 2)
    A_log, dt_bias = torch.tensor([0.5, -1.0]), torch.tensor([0.1, 0.2])
    o, _ = gdn.torch.fused_recurrent_gated_delta_rule(
        q, k, v, g=a, beta=b, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
        use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True)
    g = -A_log.exp() * torch.nn.functional.softplus(a + dt_bias)
    o_ref, _ = ref.chunk_gated_delta_rule(q.double(), k.double(), v.double(), g.double(),
                                          b.sigmoid().double(), use_qk_l2norm_in_kernel=True)
    assert_close(o, o_ref, TOL_F32, "o")


def test_state_v_first_transposes_the_states():
    c = Case(CASES[0])
    q, k, v, g, beta, h0 = c.inputs()
    o1, ht1 = gdn.torch.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                               output_final_state=True, chunk_size=16)
    o2, ht2 = gdn.torch.chunk_gated_delta_rule(q, k, v, g, beta,
                                               initial_state=h0.transpose(-1, -2).contiguous(),
                                               output_final_state=True, state_v_first=True,
                                               chunk_size=16)
    assert torch.equal(o1, o2) and torch.equal(ht1, ht2.transpose(-1, -2))


def test_strided_inputs_give_the_same_bits_as_contiguous():
    c = Case(CASES[0])
    q, k, v, g, beta, h0 = c.inputs()
    want = gdn.torch.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                            output_final_state=True, chunk_size=16)
    # q and k as views into wider tensors, v as a transpose of a [B, H, T, V] tensor
    q2 = torch.cat([q, torch.zeros_like(q)], dim=-1)[..., :q.shape[-1]]
    k2 = torch.cat([torch.zeros_like(k), k], dim=2)[:, :, k.shape[2]:]
    v2 = v.transpose(1, 2).contiguous().transpose(1, 2)
    assert not (q2.is_contiguous() or k2.is_contiguous() or v2.is_contiguous())
    got = gdn.torch.chunk_gated_delta_rule(q2, k2, v2, g, beta, initial_state=h0,
                                           output_final_state=True, chunk_size=16)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_thread_count_does_not_change_a_bit():
    c = Case(CASES[1])
    one = c.grads(c.gdn(threads=1))
    two = c.grads(c.gdn(threads=2))
    for x, y in zip([one[0], one[1], *one[2]], [two[0], two[1], *two[2]]):
        if x is not None:
            assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_activations_within_their_rounding(dtype):
    c = Case(CASES[0])
    o, ht, grads = c.grads(c.gdn(), dtype=dtype)
    assert o.dtype == dtype and ht.dtype == torch.float32 and grads[0].dtype == dtype
    # the reference on the same rounded inputs, in float64
    rounded = Case(CASES[0])
    for name in ("q", "k", "v"):
        setattr(rounded, name, getattr(c, name).to(dtype).double())
    o_ref, ht_ref, _ = rounded.grads(rounded.reference(), dtype=torch.float64)
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    assert_close(o.double(), o_ref, tol, "o")
    assert_close(ht, ht_ref, tol, "final_state")


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic_shapes"])
def test_compile_fullgraph_forward_and_backward_match_eager(dynamic):
    c = Case(CASES[1])
    fn = c.gdn()

    def loss(q, k, v, g, beta, h0):
        o, ht = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                   use_qk_l2norm_in_kernel=c.l2)
        return (o * c.d_o.float()).sum() + (ht * c.d_ht.float()).sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    xs = c.inputs(grad=True)
    eager = loss(*xs)
    eager_grads = torch.autograd.grad(eager, [x for x in xs if x is not None])
    ys = c.inputs(grad=True)
    got = compiled(*ys)
    got_grads = torch.autograd.grad(got, [y for y in ys if y is not None])
    assert torch.equal(got, eager)
    for x, y in zip(got_grads, eager_grads):
        assert torch.equal(x, y)


def test_opcheck_both_ops():
    c = Case(CASES[1])
    q, k, v, g, beta, h0 = c.inputs(grad=True)
    args = (q[0], k[0], v[0], g[0], beta[0], h0, c.cu, 0.5, False, 16, False, False, 0, True,
            True, True)
    torch.library.opcheck(torch.ops.gdn.chunk_fwd.default, args)
    o, ht, states, t_inv = torch.ops.gdn.chunk_fwd(*[x.detach() if isinstance(x, torch.Tensor)
                                                     else x for x in args])
    bargs = (q[0].detach(), k[0].detach(), v[0].detach(), g[0].detach(), beta[0].detach(),
             h0.detach(), c.cu, c.d_o[0].float(), c.d_ht.float(), states, t_inv, 0.5, False, 16,
             False, 0)
    torch.library.opcheck(torch.ops.gdn.chunk_bwd.default, bargs)


def test_op_modules_keep_their_annotations_as_objects():
    # torch 2.4's torch.library.custom_op infers the schema from the annotations as objects and
    # rejects strings, which `from __future__ import annotations` would make them (pyproject
    # says torch >= 2.4; the test environment has a newer torch, which accepts both).
    import inspect
    import re

    from gdn.torch import _conv, _ops, _step
    for module in (_ops, _conv, _step):
        source = inspect.getsource(module)
        assert not re.search(r"^from __future__ import annotations", source, re.M), module


def test_residual_rows_past_the_batch_are_zero():
    c = Case(CASES[1])  # 6 sequences over 50 tokens: at most 9 chunks of 16, 5 used
    q, k, v, g, beta, h0 = c.inputs()
    _, _, states, t_inv = torch.ops.gdn.chunk_fwd(q[0], k[0], v[0], g[0], beta[0], h0, c.cu,
                                                  0.5, False, 16, False, False, 0, False, True,
                                                  True)
    used = sum(-(-(c.cu_list[i + 1] - c.cu_list[i]) // 16) for i in range(len(c.cu_list) - 1))
    assert states.shape[0] > used
    assert torch.count_nonzero(states[used:]) == 0 and torch.count_nonzero(t_inv[used:]) == 0
    assert torch.count_nonzero(states[:used]) > 0


_FORK_SCRIPT = """
import multiprocessing as mp, torch, gdn.torch
torch.manual_seed(0)
xs = (torch.randn(1, 40, 2, 16), torch.randn(1, 40, 2, 16), torch.randn(1, 40, 4, 8),
      -torch.rand(1, 40, 4), torch.rand(1, 40, 4))
def child(xs):
    return gdn.torch.chunk_gated_delta_rule(*xs, threads=2, chunk_size=16)[0]
if __name__ == "__main__":
    want = child(xs)  # the parent's OpenMP pool is up
    with mp.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(child, (xs,)).get(timeout=120)
    print("identical", torch.equal(got, want))
"""


def test_a_forked_child_runs_the_op_after_a_threaded_parent(tmp_path):
    # GNU OpenMP's thread pool does not survive fork: the child must run on one thread, not
    # hang. In its own process, without JAX (whose threads make any fork unsafe).
    import subprocess
    import sys
    script = tmp_path / "fork.py"
    script.write_text(_FORK_SCRIPT)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "identical True" in run.stdout, run.stdout
