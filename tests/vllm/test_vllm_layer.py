"""gdn.vllm's layer call against vLLM's own CPU GDN call, without an engine: the same layer,
metadata and pools (vLLM's interleaved pages: each slot's conv and SSM state in one padded page,
so both pools are strided views of one buffer) handed to both, in one mixed batch of decodes, a
continued (chunked) prefill, a fresh prefill and padding entries.

Bound: vLLM's CPU kernels keep q, k, v and the intermediates in bf16 (against float64 its
output is off by about 5e-3 and its state by 3e-3, relative; gdn's by 2e-3 and 1e-7, measured
on Qwen3-Next heads); the outputs of the two paths land in bf16 (2^-8 = 3.9e-3 relative
rounding), so the two agree to 2e-2 relative and no closer."""

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

import gdn.vllm  # noqa: E402
from gdn.vllm import _layer  # noqa: E402

HK, HV, DK, DV, K = 2, 4, 64, 64, 4
D = 2 * HK * DK + HV * DV
SLOTS = 8
TOL = 2e-2


def vllm_path():
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention
    return gdn.vllm._state["original_nonspec"] or gdn_attention._cpu_gdn_attention_nonspec


class Layer:
    """What vLLM's CPU GDN call reads of QwenGatedDeltaNetAttention, with its pools as strided
    views of one paged buffer: page = conv [K - 1 + num_spec, D] bf16 (vLLM's rolling buffer
    when speculative decoding is configured), a gap, SSM [Hv, Dv, Dk], a tail."""

    def __init__(self, ssm_dtype, seed=0, num_spec=0, slots=SLOTS):
        g = torch.Generator().manual_seed(seed)
        self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim = HK, HV, DK, DV
        self.tp_size, self.activation = 1, "silu"
        self.key_dim, self.value_dim = HK * DK, HV * DV
        weight = (torch.randn(D, 1, K, generator=g) * 0.4).bfloat16()
        self.conv1d = types.SimpleNamespace(weight=weight, bias=None)
        # What vLLM's loader does to the conv weight, by vLLM's own function: on avx512_bf16
        # (and aarch64 bf16) hosts it packs the weight in place for its C++ conv, which its own
        # path then reads, and keeps the plain one in `_cpu_unpacked_conv_weight`; elsewhere
        # nothing. Without it vLLM's path read a plain weight as packed there.
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        dispatch_cpu_unquantized_gemm(self.conv1d, remove_weight=False)
        self.A_log = torch.linspace(0.5, 16.0, HV).log()
        self.dt_bias = torch.linspace(-1.0, 1.0, HV).bfloat16()
        self.num_spec, columns = num_spec, K - 1 + num_spec
        conv_bytes, ssm_bytes = columns * D * 2, HV * DV * DK * ssm_dtype.itemsize
        gap, page = 512, conv_bytes + 512 + ssm_bytes + 256
        self.pages = torch.randn(slots, page // 4, generator=g).view(torch.uint8)
        conv = self.pages.view(torch.bfloat16)[:, :conv_bytes // 2].view(slots, columns, D)
        start = (conv_bytes + gap) // ssm_dtype.itemsize
        ssm = self.pages.view(ssm_dtype)[:, start:start + ssm_bytes // ssm_dtype.itemsize]
        self.kv_cache = (conv, ssm.view(slots, HV, DV, DK))
        assert not self.kv_cache[0].is_contiguous() and not self.kv_cache[1].is_contiguous()
        with torch.no_grad():  # states of a plausible size (the pages start as random bits)
            self.kv_cache[0].copy_(torch.randn(slots, columns, D, generator=g))
            self.kv_cache[1].copy_(torch.randn(slots, HV, DV, DK, generator=g) * 0.1)

    def plain_conv_weight(self):
        """The conv weight [D, K] as the model has it, packed by vLLM or not."""
        w = getattr(self.conv1d, "_cpu_unpacked_conv_weight", None)
        return w if w is not None else self.conv1d.weight.reshape(D, K)

    def rearrange_mixed_qkv(self, x):
        q, k, v = x.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        return tuple(t.reshape(1, x.shape[0], -1, d).contiguous()
                     for t, d in ((q, DK), (k, DK), (v, DV)))

    def copy(self, ssm_dtype):
        other = Layer(ssm_dtype, num_spec=self.num_spec, slots=self.pages.shape[0])
        other.pages.copy_(self.pages)
        other.conv1d = types.SimpleNamespace(**vars(self.conv1d))  # packed or not, as here
        other.A_log, other.dt_bias = self.A_log, self.dt_bias
        return other


def metadata(lengths, slots, has, decodes, padding=0):
    """vLLM's GDNAttentionMetadata fields the non-speculative call reads: decodes first, then
    prefills; ``padding`` entries of slot 0 past them (boundaries repeated)."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    live = len(lengths)
    return types.SimpleNamespace(
        num_decodes=decodes, num_decode_tokens=sum(lengths[:decodes]),
        num_prefills=live - decodes, num_prefill_tokens=sum(lengths[decodes:]),
        non_spec_state_indices_tensor=torch.tensor(slots + [0] * padding, dtype=torch.int32),
        non_spec_query_start_loc=torch.tensor(cu + [cu[-1]] * padding, dtype=torch.int32),
        has_initial_state=None if has is None else torch.tensor(has + [False] * padding),
        spec_sequence_masks=None, num_accepted_tokens=None)


def inputs(tokens, seed=1):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, D, generator=g).bfloat16()
    b = torch.randn(tokens, HV, generator=g).bfloat16()
    a = torch.randn(tokens, HV, generator=g).bfloat16()
    return qkv, b, a


def rel(x, ref):
    x, ref = x.double(), ref.double()
    return float((x - ref).norm() / ref.norm())


# Two decodes (slots 3, 5), a prefill continuing from slot 2 (chunked prefill), a fresh prefill
# into slot 6 (whose old contents must be ignored); slots 1, 4, 7 and the null slot 0 untouched.
MIXED = dict(lengths=[1, 1, 7, 9], slots=[3, 5, 2, 6], has=[True, True, True, False], decodes=2)


@pytest.mark.parametrize("ssm_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_mixed_batch_with_padding_matches_vllm_path_on_strided_pages(ssm_dtype):
    ref_layer = Layer(ssm_dtype)
    layer = ref_layer.copy(ssm_dtype)
    before = ref_layer.pages.clone()
    md = metadata(**MIXED, padding=2)
    tokens = sum(MIXED["lengths"])
    qkv, b, a = inputs(tokens + 3)  # 3 padding tokens past the live ones
    ref_out = torch.zeros(tokens + 3, HV, DV, dtype=torch.bfloat16)
    out = torch.zeros_like(ref_out)
    vllm_path()(ref_layer, md, qkv, b, a, ref_out)
    _layer.run(layer, md, qkv, b, a, out)

    assert rel(out[:tokens], ref_out[:tokens]) < TOL
    assert torch.count_nonzero(out[tokens:]) == 0, "padding tokens' rows were written"
    for slot in (3, 5, 2, 6):
        for pool in (0, 1):
            err = rel(layer.kv_cache[pool][slot], ref_layer.kv_cache[pool][slot])
            assert err < TOL, f"slot {slot} pool {pool}: {err:.2e}"
    untouched = [0, 1, 4, 7]
    assert torch.equal(layer.pages[untouched], before[untouched]), "a slot not in the batch changed"


def test_padding_entries_change_no_bit():
    padded, plain = Layer(torch.float32), Layer(torch.float32)
    tokens = sum(MIXED["lengths"])
    qkv, b, a = inputs(tokens + 3)
    out_padded = torch.zeros(tokens + 3, HV, DV, dtype=torch.bfloat16)
    out_plain = torch.zeros(tokens, HV, DV, dtype=torch.bfloat16)
    _layer.run(padded, metadata(**MIXED, padding=3), qkv, b, a, out_padded)
    _layer.run(plain, metadata(**MIXED), qkv[:tokens], b[:tokens], a[:tokens], out_plain)
    assert torch.equal(out_padded[:tokens], out_plain)
    assert torch.equal(padded.pages, plain.pages)


def test_decode_only_batch_without_has_initial_state_matches_vllm_path():
    ref_layer = Layer(torch.float32)
    layer = ref_layer.copy(torch.float32)
    md = metadata(lengths=[1, 1, 1], slots=[7, 1, 4], has=None, decodes=3)
    qkv, b, a = inputs(3)
    ref_out = torch.zeros(3, HV, DV, dtype=torch.bfloat16)
    out = torch.zeros_like(ref_out)
    vllm_path()(ref_layer, md, qkv, b, a, ref_out)
    _layer.run(layer, md, qkv, b, a, out)
    assert rel(out, ref_out) < TOL
    for slot in (7, 1, 4):
        assert rel(layer.kv_cache[1][slot], ref_layer.kv_cache[1][slot]) < TOL


def test_float32_parameters_are_made_once_per_weight_load():
    layer = Layer(torch.float32)
    first = _layer.float32_params(layer)
    assert _layer.float32_params(layer) is first, "converted again without a weight change"
    assert first[0].dtype == torch.float32 and tuple(first[0].shape) == (D, K)
    with torch.no_grad():
        layer.dt_bias.copy_(layer.dt_bias * 2)  # a reload copies into the same parameter
    second = _layer.float32_params(layer)
    assert second is not first
    assert torch.equal(second[3], layer.dt_bias.float())


def test_repacked_conv_weight_is_read_from_the_plain_copy():
    # On avx512_bf16 hosts vLLM repacks conv1d.weight in place and keeps the plain one aside.
    layer = Layer(torch.float32)
    plain = layer.plain_conv_weight().clone()
    layer.conv1d._cpu_unpacked_conv_weight = plain
    layer.conv1d.weight = torch.zeros(D * K, dtype=torch.bfloat16)  # stands for the packed form
    assert torch.equal(_layer.float32_params(layer)[0], plain.float())


def test_vllm_pools_reach_the_step_as_they_are(monkeypatch):
    # Zero-copy: the step gets vLLM's own pool views (the pages' memory, their slot strides),
    # not copies of the batch's slots, and the state lands in the pages.
    layer = Layer(torch.float32)
    seen = []
    step = gdn.torch.fused_gdn_step

    def spy(*args, **kwargs):
        seen.append((args[6], args[7]))
        return step(*args, **kwargs)

    monkeypatch.setattr(gdn.torch, "fused_gdn_step", spy)
    before = layer.pages.clone()
    md = metadata(**MIXED)
    tokens = sum(MIXED["lengths"])
    qkv, b, a = inputs(tokens)
    _layer.run(layer, md, qkv, b, a, torch.zeros(tokens, HV, DV, dtype=torch.bfloat16))
    assert len(seen) == 1
    conv, ssm = seen[0]
    assert conv.data_ptr() == layer.kv_cache[0].data_ptr()
    assert conv.stride() == layer.kv_cache[0].stride()
    assert ssm.data_ptr() == layer.kv_cache[1].data_ptr()
    assert ssm.stride()[0] == layer.kv_cache[1].stride()[0]
    assert ssm.untyped_storage().data_ptr() == layer.pages.untyped_storage().data_ptr()
    for slot in MIXED["slots"]:
        assert not torch.equal(layer.pages[slot], before[slot]), f"slot {slot} not written"
