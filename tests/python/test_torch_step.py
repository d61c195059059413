"""gdn.torch.fused_gdn_step (the serving step over pools of state slots, sglang's / vLLM's
batch description) against a whole GDN layer written in PyTorch (torch_reference.py's conv and
float64 token loop, one sequence at a time): out and both pools after a mixed batch, int32
indices, bf16 pools, a decode loop continuing a prefill, torch.compile and opcheck (errors,
which leave the pools untouched: test_torch_validation.py)."""

import pytest

torch = pytest.importorskip("torch")

import gdn.torch  # noqa: E402
import torch_reference as ref  # noqa: E402
from conftest import assert_close  # noqa: E402

HK, HV, DK, DV, K = 2, 4, 16, 8, 4
D = 2 * HK * DK + HV * DV
SLOTS = 8
HEADS = dict(num_k_heads=HK, num_v_heads=HV, head_k_dim=DK, head_v_dim=DV)


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class Layer:
    def __init__(self, tokens, seed=0):
        self.qkv = _rand(tokens, D, seed=seed)
        self.a, self.b = _rand(tokens, HV, seed=seed + 1), _rand(tokens, HV, seed=seed + 2)
        self.w = _rand(D, K, seed=3) / K ** 0.5
        self.bias = _rand(D, seed=4) * 0.2
        self.A_log = torch.linspace(-1.0, 1.0, HV)
        self.dt_bias = _rand(HV, seed=5) * 0.5
        self.conv_pool = _rand(SLOTS, K - 1, D, seed=6)
        self.ssm_pool = _rand(SLOTS, HV, DK, DV, seed=7) * 0.3

    def step(self, slots, cu, has, **kw):
        return gdn.torch.fused_gdn_step(self.qkv, self.a, self.b, self.w, self.A_log,
                                        self.dt_bias, self.conv_pool, self.ssm_pool, slots, cu,
                                        has, conv_bias=self.bias, **HEADS, **kw)


def _layer_reference(x, a, b, w, bias, A_log, dt_bias, conv0, ssm0):
    """One sequence through the layer in float64: x [L, D], conv0 [K - 1, D], ssm0 [Hv, Dk,
    Dv] (None: zeros). Returns (out [L, Hv Dv], new conv state, new ssm state)."""
    x, w, bias = x.double(), w.double(), bias.double()
    state = conv0.double().T[None] if conv0 is not None else None
    xh, final = ref.causal_conv1d(x.T[None], w, bias, state, "silu")
    xh = xh[0].T
    q = xh[:, :HK * DK].reshape(-1, HK, DK)[None]
    k = xh[:, HK * DK:2 * HK * DK].reshape(-1, HK, DK)[None]
    v = xh[:, 2 * HK * DK:].reshape(-1, HV, DV)[None]
    g = -A_log.double().exp() * torch.nn.functional.softplus(a.double() + dt_bias.double())
    beta = b.double().sigmoid()
    h0 = ssm0.double()[None] if ssm0 is not None else None
    o, ht = ref.chunk_gated_delta_rule(q, k, v, g[None], beta[None], initial_state=h0,
                                       use_qk_l2norm_in_kernel=True)
    return o[0].reshape(-1, HV * DV), final[0].T, ht[0]


def _check_against_reference(layer, before_conv, before_ssm, slots, cu, has, out, tol=1e-5):
    for s, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        lo, hi = int(cu[s]), int(cu[s + 1])
        h = bool(has[s])
        want, conv, ssm = _layer_reference(
            layer.qkv[lo:hi], layer.a[lo:hi], layer.b[lo:hi], layer.w, layer.bias, layer.A_log,
            layer.dt_bias, before_conv[slot] if h else None, before_ssm[slot] if h else None)
        assert_close(out[lo:hi], want, tol, f"out of sequence {s}")
        assert_close(layer.conv_pool[slot], conv, tol, f"conv slot {slot}")
        assert_close(layer.ssm_pool[slot], ssm, tol, f"ssm slot {slot}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["float32", "bfloat16", "float16"])
def test_mixed_batch_matches_the_torch_layer_and_updates_only_its_slots(dtype):
    # two decodes, a continued prefill, a fresh prefill shorter than K - 1, a fresh prefill,
    # then a padding sequence (PAD_SLOT_ID); 16-bit activations with float32 pools
    layer = Layer(tokens=40)
    layer.qkv, layer.a, layer.b = (x.to(dtype) for x in (layer.qkv, layer.a, layer.b))
    slots = torch.tensor([5, 2, 7, 1, 3, -1], dtype=torch.int32)
    cu = torch.tensor([0, 1, 2, 12, 14, 36, 40], dtype=torch.int32)
    has = torch.tensor([True, True, True, False, False, False])
    conv0, ssm0 = layer.conv_pool.clone(), layer.ssm_pool.clone()
    out = layer.step(slots, cu, has)
    assert out.shape == (40, HV * DV) and out.dtype == dtype
    # 16-bit: out rounded once (2^-9 relative for bf16), the new conv states the 16-bit inputs
    _check_against_reference(layer, conv0, ssm0, slots, cu, has, out,
                             tol=1e-5 if dtype == torch.float32 else 5e-3)
    assert torch.count_nonzero(out[36:]) == 0  # the padding's tokens
    for slot in (0, 4, 6):
        assert torch.equal(layer.conv_pool[slot], conv0[slot])
        assert torch.equal(layer.ssm_pool[slot], ssm0[slot])


def test_decode_steps_continue_a_prefill():
    layer = Layer(tokens=14, seed=10)
    slot = torch.tensor([4])
    whole, _, _ = _layer_reference(layer.qkv, layer.a, layer.b, layer.w, layer.bias,
                                   layer.A_log, layer.dt_bias, None, None)
    prefill = Layer(tokens=10, seed=10)
    prefill.qkv, prefill.a, prefill.b = layer.qkv[:10], layer.a[:10], layer.b[:10]
    outs = [prefill.step(slot, torch.tensor([0, 10]), torch.tensor([False]))]
    for t in range(10, 14):
        prefill.qkv, prefill.a, prefill.b = layer.qkv[t:t + 1], layer.a[t:t + 1], layer.b[t:t + 1]
        outs.append(prefill.step(slot, torch.tensor([0, 1]), None))
    assert_close(torch.cat(outs), whole, 1e-5, "prefill + 4 decodes")


def test_bf16_pools_and_vllm_conv_layout():
    layer = Layer(tokens=12)
    layer.ssm_pool = layer.ssm_pool.to(torch.bfloat16)
    # vLLM keeps the conv pool's memory [slots, K - 1, D] and hands it over as [slots, D, K - 1]
    layer.conv_pool = layer.conv_pool.transpose(1, 2)
    slots, cu, has = torch.tensor([3, 6]), torch.tensor([0, 1, 12]), torch.tensor([True, False])
    conv0 = layer.conv_pool.transpose(1, 2).clone()
    ssm0 = layer.ssm_pool.float()
    out = layer.step(slots, cu, has)
    layer.conv_pool = layer.conv_pool.transpose(1, 2)
    layer.ssm_pool = layer.ssm_pool.float()
    _check_against_reference(layer, conv0, ssm0, slots, cu, has, out, tol=1e-2)


def test_compile_fullgraph_step_matches_eager():
    eager, compiled_layer = Layer(tokens=20), Layer(tokens=20)
    slots, cu = torch.tensor([2, 5]), torch.tensor([0, 1, 20])
    has = torch.tensor([True, False])
    want = eager.step(slots, cu, has)

    def run(qkv, a, b, conv_pool, ssm_pool):
        return gdn.torch.fused_gdn_step(qkv, a, b, compiled_layer.w, compiled_layer.A_log,
                                        compiled_layer.dt_bias, conv_pool, ssm_pool, slots, cu,
                                        has, conv_bias=compiled_layer.bias, **HEADS)

    c = compiled_layer
    got = torch.compile(run, fullgraph=True, backend="aot_eager")(c.qkv, c.a, c.b, c.conv_pool,
                                                                   c.ssm_pool)
    assert torch.equal(got, want)
    assert torch.equal(c.conv_pool, eager.conv_pool) and torch.equal(c.ssm_pool, eager.ssm_pool)


def test_opcheck_step():
    layer = Layer(tokens=6)
    args = (layer.qkv, layer.a, layer.b, layer.w, layer.bias, layer.A_log, layer.dt_bias,
            layer.conv_pool, layer.ssm_pool, torch.tensor([0, 1, 6]), torch.tensor([2, 3]),
            torch.tensor([5, 5]), torch.tensor([1, 2, 2]), None, None, HK, HV, DK, DV, 0, 0)
    torch.library.opcheck(torch.ops.gdn.step.default, args)




def test_opcheck_fused_gdn_step():
    layer = Layer(tokens=6)
    args = (layer.qkv, layer.a, layer.b, layer.w, layer.bias, layer.A_log, layer.dt_bias,
            layer.conv_pool, layer.ssm_pool, torch.tensor([2, 3, -1]), torch.tensor([0, 1, 6, 6]),
            torch.tensor([True, False, False]), None, None, HK, HV, DK, DV, 0)
    torch.library.opcheck(torch.ops.gdn.fused_gdn_step.default, args)
