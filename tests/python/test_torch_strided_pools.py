"""gdn.torch's serving ops over strided state pools, the way vLLM's hybrid allocator hands them
over: each slot's conv state and SSM state share one padded page of a single buffer, so both
pools are views with a page-sized slot stride and the SSM pool has a storage offset. The ops must
update those views in place (no copy of a slot, nothing lost), give the bytes the same step gives
over contiguous pools (and answer to the float64 torch layer), leave every byte outside the slots
alone, and refuse overlapping or non-dense pools with the library's message, in eager mode and
under torch.compile."""

import pytest

torch = pytest.importorskip("torch")

import gdn.torch  # noqa: E402
from test_torch_step import (D, HEADS, HV, K, SLOTS, Layer,  # noqa: E402
                             _check_against_reference)

CANARY = 0x5A


def _up8(n):
    return (n + 7) // 8 * 8


class Pages:
    """Both pools carved from one buffer of SLOTS pages: slot x's conv state at byte ``lead`` of
    page x, its SSM state ``gap`` bytes after it (a storage offset), ``pad`` bytes of padding
    after; every other byte the canary. The buffer has the pools' dtype when they share one
    (torch.compile cannot yet take views of another dtype as mutated inputs), else uint8."""

    def __init__(self, conv_pool, ssm_pool, lead=0, gap=0, pad=200):
        cb = conv_pool[0].numel() * conv_pool.element_size()
        sb = ssm_pool[0].numel() * ssm_pool.element_size()
        self.conv_at, self.ssm_at = lead, _up8(lead + cb + gap)
        page = _up8(self.ssm_at + sb + pad)
        dtype = conv_pool.dtype if conv_pool.dtype == ssm_pool.dtype else torch.uint8
        size = torch.tensor([], dtype=dtype).element_size()
        self.buffer = torch.empty((conv_pool.shape[0], page // size), dtype=dtype)
        self.bytes = self.buffer.view(torch.uint8)
        self.bytes.fill_(CANARY)

        def carve(at, n, pool):
            view = self.buffer[:, at // size:(at + n) // size]
            return (view if dtype == pool.dtype else view.view(pool.dtype)).view(pool.shape)

        self.conv = carve(lead, cb, conv_pool)
        self.ssm = carve(self.ssm_at, sb, ssm_pool)
        self.conv.copy_(conv_pool)
        self.ssm.copy_(ssm_pool)
        self.outside = torch.ones_like(self.bytes, dtype=torch.bool)
        self.outside[:, lead:lead + cb] = False
        self.outside[:, self.ssm_at:self.ssm_at + sb] = False

    def canaries_intact(self):
        return bool((self.bytes[self.outside] == CANARY).all())


BATCH = dict(slots=torch.tensor([5, 2, 7, 1, 3, -1], dtype=torch.int32),
             cu=torch.tensor([0, 1, 2, 12, 14, 36, 40], dtype=torch.int32),
             has=torch.tensor([True, True, True, False, False, False]))


def _pools(conv_dtype, ssm_dtype):
    layer = Layer(tokens=40)
    return layer, layer.conv_pool.to(conv_dtype), layer.ssm_pool.to(ssm_dtype)


POOL_DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
               (torch.bfloat16, torch.bfloat16)]


@pytest.mark.parametrize("conv_dtype, ssm_dtype", POOL_DTYPES,
                         ids=["f32-f32", "bf16-f32", "bf16-bf16"])
@pytest.mark.parametrize("vllm_view", [False, True], ids=["sd", "vllm_ds_view"])
def test_fused_gdn_step_updates_page_views_in_place_as_contiguous_pools(conv_dtype, ssm_dtype,
                                                                        vllm_view):
    layer, conv0, ssm0 = _pools(conv_dtype, ssm_dtype)
    want = Layer(tokens=40)
    want.conv_pool, want.ssm_pool = conv0.clone(), ssm0.clone()
    want_out = want.step(BATCH["slots"], BATCH["cu"], BATCH["has"])
    pages = Pages(conv0, ssm0, lead=16, gap=24)
    assert pages.ssm.storage_offset() > 0 and not pages.conv.is_contiguous()
    layer.conv_pool = pages.conv.transpose(1, 2) if vllm_view else pages.conv
    layer.ssm_pool = pages.ssm
    pointers = (pages.conv.data_ptr(), pages.ssm.data_ptr())
    out = layer.step(BATCH["slots"], BATCH["cu"], BATCH["has"])
    assert torch.equal(out, want_out)
    assert torch.equal(pages.conv, want.conv_pool) and torch.equal(pages.ssm, want.ssm_pool)
    assert not torch.equal(pages.ssm, ssm0)  # written in place, in the caller's buffer
    assert (pages.conv.data_ptr(), pages.ssm.data_ptr()) == pointers
    assert pages.canaries_intact()


def test_fused_gdn_step_on_pages_answers_to_the_float64_torch_layer():
    layer, conv0, ssm0 = _pools(torch.float32, torch.float32)
    pages = Pages(conv0, ssm0, lead=8, gap=8)
    layer.conv_pool, layer.ssm_pool = pages.conv, pages.ssm
    out = layer.step(BATCH["slots"], BATCH["cu"], BATCH["has"])
    _check_against_reference(layer, conv0, ssm0, BATCH["slots"], BATCH["cu"], BATCH["has"], out)
    assert pages.canaries_intact()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_fused_gdn_step_compiled_updates_page_views_as_eager(dtype):
    layer, conv0, ssm0 = _pools(dtype, dtype)
    eager, compiled = Pages(conv0, ssm0, lead=16), Pages(conv0, ssm0, lead=16)
    slots, cu, has = BATCH["slots"], BATCH["cu"], BATCH["has"]

    def run(qkv, a, b, conv_pool, ssm_pool):
        return gdn.torch.fused_gdn_step(qkv, a, b, layer.w, layer.A_log, layer.dt_bias,
                                        conv_pool, ssm_pool, slots, cu, has,
                                        conv_bias=layer.bias, **HEADS)

    want = run(layer.qkv, layer.a, layer.b, eager.conv, eager.ssm)
    got = torch.compile(run, fullgraph=True, backend="aot_eager")(
        layer.qkv, layer.a, layer.b, compiled.conv.transpose(1, 2), compiled.ssm)
    assert torch.equal(got, want)
    assert torch.equal(compiled.buffer, eager.buffer) and not torch.equal(eager.ssm, ssm0)
    assert compiled.canaries_intact()


# The conv update op: vLLM's [slots, K - 1, D] conv pool on pages, handed over as the package's
# [slots, D, K - 1] (its transpose), against a contiguous channel-first pool of the same values.
B_ROWS = torch.tensor([6, 0, 3], dtype=torch.int32)


def _update(pool, x, layer, idx=B_ROWS):
    return gdn.torch.causal_conv1d_update(x, pool, layer.w, layer.bias, "silu",
                                          conv_state_indices=idx)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("tokens", [1, 2], ids=["one_token", "two_tokens"])
def test_causal_conv1d_update_shifts_page_views_in_place_as_a_contiguous_pool(dtype, tokens):
    layer, conv0, ssm0 = _pools(dtype, dtype)
    x = torch.randn(3, D, tokens, generator=torch.Generator().manual_seed(3)).squeeze(-1)
    dense = conv0.transpose(1, 2).contiguous()  # the package's usual [B_pool, D, S] pool
    want = _update(dense, x, layer)
    pages = Pages(conv0, ssm0, lead=16, gap=8)
    pool = pages.conv.transpose(1, 2)
    got = _update(pool, x, layer)
    assert torch.equal(got, want)
    assert torch.equal(pool, dense) and not torch.equal(pages.conv, conv0)
    assert torch.equal(pages.ssm, ssm0) and pages.canaries_intact()
    compiled_pages = Pages(conv0, ssm0, lead=16, gap=8)
    got = torch.compile(_update, fullgraph=True, backend="aot_eager")(
        compiled_pages.conv.transpose(1, 2), x, layer)
    assert torch.equal(got, want) and torch.equal(compiled_pages.buffer, pages.buffer)


# Refusals: the library's message, in eager mode and compiled, every pool byte unchanged.

def _overlapping_slots(pages):
    """The SSM pool's slot stride one element short of a slot: slots overlap."""
    s = pages.ssm
    return pages.conv, torch.as_strided(s, s.shape, (s[0].numel() - 1,) + s.stride()[1:])


def _ssm_inner_transposed(pages):
    """Each SSM slot's [Dk, Dv] matrices stored column-major: the slot is not row-major."""
    s = pages.ssm
    dk = s.shape[2]
    return pages.conv, torch.as_strided(s, s.shape, s.stride()[:2] + (1, dk))


def _ssm_page_over_the_conv_slot(pages):
    """The SSM views start 8 bytes before the conv slot ends: the two pools share bytes."""
    s = pages.ssm
    start = (pages.ssm_at - 8) // s.element_size() - pages.ssm_at // s.element_size()
    return pages.conv, torch.as_strided(s, s.shape, s.stride(), s.storage_offset() + start)


STEP_RULES = [
    ("ssm_slots_overlap", _overlapping_slots, "ssm_state",
     ["a slot stride (dim 0) of at least one slot"]),
    ("ssm_slot_not_dense", _ssm_inner_transposed, "ssm_state",
     ["each slot contiguous (row-major inner dimensions)"]),
    ("pools_share_bytes", _ssm_page_over_the_conv_slot, "conv_state",
     ["does not overlap 'ssm_state'"]),
]


@pytest.mark.parametrize("views, argument, words",
                         [pytest.param(*r[1:], id=r[0]) for r in STEP_RULES])
def test_fused_gdn_step_refuses_bad_page_views_eager_and_compiled(views, argument, words):
    layer, conv0, ssm0 = _pools(torch.float32, torch.float32)

    def run(conv_pool, ssm_pool):
        return gdn.torch.fused_gdn_step(layer.qkv, layer.a, layer.b, layer.w, layer.A_log,
                                        layer.dt_bias, conv_pool, ssm_pool, BATCH["slots"],
                                        BATCH["cu"], BATCH["has"], conv_bias=layer.bias,
                                        **HEADS)

    texts = []
    for fn in (run, torch.compile(run, fullgraph=True, backend="aot_eager")):
        pages = Pages(conv0, ssm0, lead=16)
        before = pages.buffer.clone()
        with pytest.raises(ValueError) as info:
            fn(*views(pages))
        assert torch.equal(pages.buffer, before)
        texts.append(str(info.value))
    assert texts[0] == texts[1], texts
    assert f"argument '{argument}'" in texts[0] and "given" in texts[0], texts[0]
    for word in words:
        assert word in texts[0], (word, texts[0])


def test_causal_conv1d_update_refuses_overlapping_rows_eager_and_compiled():
    layer, conv0, ssm0 = _pools(torch.float32, torch.float32)
    x = torch.randn(3, D)
    texts = []
    for fn in (_update, torch.compile(_update, fullgraph=True, backend="aot_eager")):
        pages = Pages(conv0, ssm0)
        c = pages.conv
        # rows one element closer than a row: [B_pool, D, S] over [B_pool, S, D] memory
        pool = torch.as_strided(c, c.shape, (c[0].numel() - 1,) + c.stride()[1:]).transpose(1, 2)
        before = pages.buffer.clone()
        with pytest.raises(ValueError) as info:
            fn(pool, x, layer)
        assert torch.equal(pages.buffer, before)
        texts.append(str(info.value))
    assert texts[0] == texts[1], texts
    assert "argument 'conv_state'" in texts[0] and "slot stride (dim 0)" in texts[0], texts[0]

