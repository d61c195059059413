"""gdn.vllm's speculative-aware layer call against vLLM's own (``_cpu_gdn_attention_spec_aware``)
and against a float64 reference written here in PyTorch, without an engine: vLLM's paged pools
(test_vllm_layer.py's Layer, the conv pool a rolling buffer of K - 1 + n columns), the metadata
as vLLM 0.32's GDN metadata builder (gdn_attn.py) makes it for a speculative batch: windows of
1 to 1 + n tokens with their block-table rows and accepted counts, prefills, one-token prompt
chunks and padding entries, in the engine's batch order (short sequences first, so a one-token
chunk sits among the windows and the tokens have to be regrouped).

Where the two paths agree: everything but the conv buffer of a window shorter than 1 + n tokens.
For such a window vLLM 0.32's CPU torch path keeps K - 1 + n - q old columns before the new
inputs, so that the next step's history does not end at the accepted token (and it fails when
more tokens were accepted than the window has); gdn keeps vLLM's GPU kernel's buffer
(docs/vllm.md, "Speculative decoding"), which the reference below defines: there, the
windows are checked against the reference alone, over two steps in a row. Bounds as in
test_vllm_layer.py (2e-2 against vLLM's bf16 kernels); against float64: the bf16 output's
rounding (1e-2), the float32 state's (1e-4); the conv buffers hold raw bf16 inputs, so they must
be equal bit for bit."""

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

import gdn.vllm  # noqa: E402
from test_vllm_layer import D, DK, DV, HK, HV, K, TOL, Layer, inputs, rel  # noqa: E402

NUM_SPEC = 2
COLUMNS = K - 1 + NUM_SPEC
SLOTS = 24


def window(q, accepted, row):
    """A decode window of q tokens (1 + its drafts), accepted tokens of the window before, its
    block-table row (the conv buffer in row[0]'s slot, the SSM state after token t in row[t]'s)."""
    return dict(spec=True, length=q, accepted=accepted, row=row)


def seq(length, slot, has=True):
    """A sequence outside the windows: a prefill, a chunked continuation (has) or a one-token
    prompt chunk."""
    return dict(spec=False, length=length, slot=slot, has=has)


def spec_metadata(entries, padding=0):
    """vLLM 0.32's GDNAttentionMetadata for a batch with speculation configured (gdn_attn.py's
    build): ``entries`` in batch order, then ``padding`` empty requests in the null slot."""
    entries = entries + [seq(0, 0, has=False)] * padding
    lengths = torch.tensor([e["length"] for e in entries])
    masks = torch.tensor([e["spec"] for e in entries])
    cu = torch.zeros(len(entries) + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    wins = [e for e in entries if e["spec"]]
    others = [e for e in entries if not e["spec"]]
    other_lengths = torch.tensor([e["length"] for e in others], dtype=torch.int64)
    decodes = int((other_lengths == 1).sum())
    prefills = len(others) - decodes - int((other_lengths == 0).sum())
    decode_tokens, prefill_tokens = decodes, int(other_lengths.sum()) - decodes
    md = types.SimpleNamespace(num_spec_decodes=len(wins), checkpoint=None)
    has = torch.tensor([e["has"] for e in others], dtype=torch.bool)
    other_slots = torch.tensor([e["slot"] for e in others], dtype=torch.int32)
    if not wins:  # the builder's non-speculative branch: decodes first
        md.__dict__.update(
            spec_sequence_masks=None, num_decodes=decodes, num_decode_tokens=decode_tokens,
            num_prefills=prefills, num_prefill_tokens=prefill_tokens, num_spec_decode_tokens=0,
            spec_token_indx=None, non_spec_token_indx=None, spec_state_indices_tensor=None,
            non_spec_state_indices_tensor=other_slots, spec_query_start_loc=None,
            non_spec_query_start_loc=cu, num_accepted_tokens=None,
            has_initial_state=has if prefills else None)
        return md
    if decodes:  # beside windows, one-token sequences are prefills
        prefills, prefill_tokens, decodes, decode_tokens = (
            prefills + decodes, prefill_tokens + decode_tokens, 0, 0)
    table = torch.tensor([e["row"] for e in wins], dtype=torch.int32)
    accepted = torch.tensor([e["accepted"] for e in wins], dtype=torch.int32)
    spec_cu = torch.zeros(len(wins) + 1, dtype=torch.int32)
    spec_cu[1:] = torch.tensor([e["length"] for e in wins]).cumsum(0)
    total = int(cu[-1])
    md.__dict__.update(
        spec_sequence_masks=masks, num_decodes=0, num_decode_tokens=0, num_prefills=prefills,
        num_prefill_tokens=prefill_tokens, num_spec_decode_tokens=int(spec_cu[-1]),
        spec_state_indices_tensor=table, num_accepted_tokens=accepted,
        spec_query_start_loc=spec_cu)
    if not prefills:  # windows alone (padding trails them)
        md.__dict__.update(
            spec_token_indx=torch.arange(min(len(wins) * (1 + NUM_SPEC), total),
                                         dtype=torch.int32),
            non_spec_token_indx=torch.empty(0, dtype=torch.int32),
            non_spec_state_indices_tensor=None, non_spec_query_start_loc=None,
            has_initial_state=None, prefill_state_indices=None, prefill_query_start_loc=None)
        return md
    index = torch.argsort(torch.repeat_interleave(masks, lengths).int(), stable=True)
    other_cu = torch.zeros(len(others) + 1, dtype=torch.int32)
    other_cu[1:] = other_lengths.cumsum(0)
    md.__dict__.update(
        spec_token_indx=index[prefill_tokens:], non_spec_token_indx=index[:prefill_tokens],
        non_spec_state_indices_tensor=other_slots, non_spec_query_start_loc=other_cu,
        has_initial_state=has, prefill_state_indices=other_slots,
        prefill_query_start_loc=other_cu)
    return md


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """vLLM's spec-aware CPU path convolves each window with torch's grouped conv1d in bf16,
    whose OpenMP threads took 0.1 to 7 s per call on this 2-core host under load, 5 ms with one
    thread; nothing here depends on the thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def vllm_spec_path(layer, md, qkv, b, a, out):
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention
    original = gdn.vllm._state["original_spec"] or gdn_attention._cpu_gdn_attention_spec_aware
    original(layer, md, qkv, b, a, out, K, COLUMNS)


@pytest.fixture
def plugin_path(monkeypatch):
    """The plugin's stand-in for vLLM's spec-aware call, as vLLM calls it once the plugin is
    registered; its counters start from zero."""
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention
    if gdn.vllm._state["original_spec"] is None:  # not registered in this process
        monkeypatch.setitem(gdn.vllm._state, "original_spec",
                            gdn_attention._cpu_gdn_attention_spec_aware)
    monkeypatch.setitem(gdn.vllm._state, "enabled", True)
    gdn.vllm.reset_counters()

    def call(layer, md, qkv, b, a, out):
        gdn.vllm._spec_aware(layer, md, qkv, b, a, out, K, COLUMNS)
    return call


def tokens_of(entries):
    return sum(e["length"] for e in entries)


def written_slots(entries):
    """(conv slots, SSM slots) a step writes."""
    conv, ssm = set(), set()
    for e in entries:
        if e["spec"]:
            conv.add(e["row"][0])
            ssm.update(e["row"][:e["length"]])
        else:
            conv.add(e["slot"])
            ssm.add(e["slot"])
    return conv, ssm


def compare_with_vllm(layer, ref_layer, entries, out, ref_out):
    tokens = tokens_of(entries)
    assert rel(out[:tokens], ref_out[:tokens]) < TOL
    conv, ssm = written_slots(entries)
    for slot in sorted(conv):  # raw bf16 inputs on both paths: bit for bit
        assert torch.equal(layer.kv_cache[0][slot], ref_layer.kv_cache[0][slot]), f"conv {slot}"
    for slot in sorted(ssm):
        err = rel(layer.kv_cache[1][slot], ref_layer.kv_cache[1][slot])
        assert err < TOL, f"SSM slot {slot}: {err:.2e}"


def check_untouched(layer, before, entries):
    conv, ssm = written_slots(entries)
    for slot in range(SLOTS):
        if slot not in conv:
            assert torch.equal(layer.kv_cache[0][slot], before[0][slot]), f"conv slot {slot}"
        if slot not in ssm:
            assert torch.equal(layer.kv_cache[1][slot], before[1][slot]), f"SSM slot {slot}"


def pools_of(layer):
    return layer.kv_cache[0].clone(), layer.kv_cache[1].clone()


# The engine's order: short sequences first (windows and a one-token prompt chunk of slot 10
# among them), then a continued prefill and a fresh one whose slot's old contents must be
# ignored; full windows (3 tokens) resuming after 2, 3 and 1 accepted tokens.
MIXED = [window(3, 2, [3, 4, 5]), seq(1, 10), window(3, 3, [7, 8, 9]),
         window(3, 1, [11, 12, 13]), seq(6, 6), seq(5, 14, has=False)]


@pytest.mark.parametrize("ssm_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_windows_with_prefills_and_padding_match_vllm_spec_path(ssm_dtype, plugin_path):
    ref_layer = Layer(ssm_dtype, num_spec=NUM_SPEC, slots=SLOTS)
    layer = ref_layer.copy(ssm_dtype)
    before = pools_of(layer)
    md = spec_metadata(MIXED, padding=2)
    tokens = tokens_of(MIXED)
    qkv, b, a = inputs(tokens + 3)  # 3 padding tokens past the live ones
    ref_out = torch.zeros(tokens + 3, HV, DV, dtype=torch.bfloat16)
    out = torch.zeros_like(ref_out)
    vllm_spec_path(ref_layer, md, qkv, b, a, ref_out)
    plugin_path(layer, md, qkv, b, a, out)

    compare_with_vllm(layer, ref_layer, MIXED, out, ref_out)
    assert torch.count_nonzero(out[tokens:]) == 0, "padding tokens' rows were written"
    check_untouched(layer, before, MIXED)
    c = gdn.vllm.counters()
    assert c["gdn_calls"] == 1 and c["fallbacks"] == {}, c
    assert (c["spec_decode"], c["spec_mixed"], c["spec_accepted"], c["spec_short"]) == (1, 1, 1, 0)
    assert c["mixed"] == 1 and c["continued_prefill"] == 1 and c["padded"] == 1, c


def test_steps_in_a_row_of_full_windows_match_vllm_spec_path(plugin_path):
    # Each step's windows resume from the states the previous one left after the accepted
    # token; windows alone, so their tokens are the batch's first ones (no regrouping).
    ref_layer = Layer(torch.float32, num_spec=NUM_SPEC, slots=SLOTS)
    layer = ref_layer.copy(torch.float32)
    rows = [[3, 4, 5], [7, 8, 9], [11, 12, 13]]
    for step, accepted in enumerate([[1, 2, 3], [3, 1, 2], [2, 3, 1]]):
        entries = [window(3, n, row) for n, row in zip(accepted, rows)]
        before = pools_of(layer)
        qkv, b, a = inputs(9, seed=10 + step)
        ref_out = torch.zeros(9, HV, DV, dtype=torch.bfloat16)
        out = torch.zeros_like(ref_out)
        vllm_spec_path(ref_layer, spec_metadata(entries), qkv, b, a, ref_out)
        plugin_path(layer, spec_metadata(entries), qkv, b, a, out)
        compare_with_vllm(layer, ref_layer, entries, out, ref_out)
        check_untouched(layer, before, entries)
    c = gdn.vllm.counters()
    assert c["spec_decode"] == c["decode_only"] == c["gdn_calls"] == 3, c


def test_prompt_step_without_windows_matches_vllm_and_keeps_the_buffers_rolling_part(
        plugin_path):
    # Speculation configured, no window in the batch (vLLM's prompt steps): a one-token prompt
    # chunk (a decode here), a continued prefill and a fresh one use columns [0, K - 1) of
    # their buffers; the other columns stay as they were.
    entries = [seq(1, 10), seq(6, 6), seq(5, 14, has=False)]
    ref_layer = Layer(torch.float32, num_spec=NUM_SPEC, slots=SLOTS)
    layer = ref_layer.copy(torch.float32)
    before = pools_of(layer)
    md = spec_metadata(entries)
    qkv, b, a = inputs(tokens_of(entries))
    ref_out = torch.zeros(12, HV, DV, dtype=torch.bfloat16)
    out = torch.zeros_like(ref_out)
    vllm_spec_path(ref_layer, md, qkv, b, a, ref_out)
    plugin_path(layer, md, qkv, b, a, out)
    compare_with_vllm(layer, ref_layer, entries, out, ref_out)
    check_untouched(layer, before, entries)
    for slot in (10, 6, 14):
        assert torch.equal(layer.kv_cache[0][slot, K - 1:], before[0][slot, K - 1:]), slot
    c = gdn.vllm.counters()
    assert c["gdn_calls"] == 1 and c["spec_decode"] == 0 and c["mixed"] == 1, c


# Float64 reference of the layer call (docs/math.md, sections 6 and 7), one token at a time.

def _l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def reference_token(layer, x, a, b, history, state):
    """One token through the layer in float64: raw input x [D], its K - 1 predecessors history
    [K - 1, D], the SSM state [Hv, Dk, Dv] before it. Returns (out [Hv, Dv], state after)."""
    w = layer.plain_conv_weight().double()
    window_ = torch.cat([history.double(), x.double()[None]])  # [K, D]
    y = torch.nn.functional.silu((window_.T * w).sum(-1))
    q = y[:HK * DK].reshape(HK, DK).repeat_interleave(HV // HK, 0)
    k = y[HK * DK:2 * HK * DK].reshape(HK, DK).repeat_interleave(HV // HK, 0)
    v = y[2 * HK * DK:].reshape(HV, DV)
    q, k = _l2norm(q) * DK ** -0.5, _l2norm(k)
    g = -layer.A_log.double().exp() * torch.nn.functional.softplus(
        a.double() + layer.dt_bias.double())
    alpha, beta = g.exp()[:, None, None], b.double().sigmoid()[:, None]
    state = alpha * state.double()
    u = beta * (v - torch.einsum("hkv,hk->hv", state, k))
    state = state + k[:, :, None] * u[:, None, :]
    return torch.einsum("hkv,hk->hv", state, q), state


def reference_step(layer, entries, qkv, b, a):
    """(out, conv pool, SSM pool) after a speculative step, from the layer's pools before it
    (unchanged): the windows' buffers rolled as vLLM's GPU kernel rolls them, the state after
    window token t in row[t]; the other sequences on columns [0, K - 1) of their slot."""
    conv0, ssm0 = layer.kv_cache[0], layer.kv_cache[1].view(SLOTS, HV, DK, DV)
    conv, ssm = conv0.clone(), ssm0.double().clone()
    out = torch.zeros(qkv.shape[0], HV, DV, dtype=torch.float64)
    windows = [e for e in entries if e["spec"]]
    order = windows + [e for e in entries if not e["spec"]]
    starts = {}
    at = 0
    for e in entries:  # the batch's tokens, in batch order
        starts[id(e)] = at
        at += e["length"]
    for e in order:
        lo, n = starts[id(e)], e["length"]
        if e["spec"]:
            row, acc = e["row"], e["accepted"]
            inputs_ = torch.cat([conv0[row[0], acc - 1:acc - 1 + K - 1], qkv[lo:lo + n]])
            state = ssm0[row[acc - 1]]
        else:
            history = conv0[e["slot"], :K - 1] if e["has"] else torch.zeros(K - 1, D)
            inputs_ = torch.cat([history.to(qkv.dtype), qkv[lo:lo + n]])
            state = ssm0[e["slot"]] if e["has"] else torch.zeros(HV, DK, DV)
        for t in range(n):
            out[lo + t], state = reference_token(layer, qkv[lo + t], a[lo + t], b[lo + t],
                                                 inputs_[t:t + K - 1], state)
            if e["spec"]:
                ssm[row[t]] = state
        if e["spec"]:
            conv[row[0], :K - 2 + n] = inputs_[1:]
        else:
            conv[e["slot"], :K - 1] = inputs_[n:]
            ssm[e["slot"]] = state
    return out, conv, ssm


# Windows shorter than 1 + n tokens, one resuming after more accepted tokens than it has
# (3 > 2), two steps in a row (the second reads the buffers the first rolled), beside a
# continued prefill.
SHORT_STEPS = [
    [window(1, 1, [3, 4, 5]), window(2, 3, [7, 8, 9]), window(3, 2, [11, 12, 13]), seq(4, 6)],
    [window(3, 1, [3, 4, 5]), window(1, 2, [7, 8, 9]), window(2, 3, [11, 12, 13]), seq(2, 6)],
]


def test_short_windows_two_steps_in_a_row_match_the_float64_reference(plugin_path):
    layer = Layer(torch.float32, num_spec=NUM_SPEC, slots=SLOTS)
    for step, entries in enumerate(SHORT_STEPS):
        before = pools_of(layer)
        tokens = tokens_of(entries)
        qkv, b, a = inputs(tokens, seed=20 + step)
        want, want_conv, want_ssm = reference_step(layer, entries, qkv, b, a)
        out = torch.zeros(tokens, HV, DV, dtype=torch.bfloat16)
        plugin_path(layer, spec_metadata(entries), qkv, b, a, out)
        assert rel(out, want) < 1e-2, f"step {step}: {rel(out, want):.2e}"
        assert torch.equal(layer.kv_cache[0], want_conv), f"step {step}: conv buffers"
        conv, ssm = written_slots(entries)
        for slot in sorted(ssm):
            err = rel(layer.kv_cache[1].view(SLOTS, HV, DK, DV)[slot], want_ssm[slot])
            assert err < 1e-4, f"step {step}, SSM slot {slot}: {err:.2e}"
        check_untouched(layer, before, entries)
    c = gdn.vllm.counters()
    assert c["spec_short"] == 2 and c["spec_mixed"] == 2, c


def test_short_windows_outputs_and_states_match_vllm_spec_path(plugin_path):
    # Where vLLM's CPU path and gdn agree on short windows: the step's outputs and SSM states
    # (both read the history ending at the accepted token); the buffers they leave differ.
    entries = [window(1, 1, [3, 4, 5]), window(2, 2, [7, 8, 9]), seq(4, 6)]
    ref_layer = Layer(torch.float32, num_spec=NUM_SPEC, slots=SLOTS)
    layer = ref_layer.copy(torch.float32)
    tokens = tokens_of(entries)
    qkv, b, a = inputs(tokens, seed=30)
    ref_out = torch.zeros(tokens, HV, DV, dtype=torch.bfloat16)
    out = torch.zeros_like(ref_out)
    vllm_spec_path(ref_layer, spec_metadata(entries), qkv, b, a, ref_out)
    plugin_path(layer, spec_metadata(entries), qkv, b, a, out)
    assert rel(out, ref_out) < TOL
    for slot in sorted(written_slots(entries)[1]):
        assert rel(layer.kv_cache[1][slot], ref_layer.kv_cache[1][slot]) < TOL, slot
    assert torch.equal(layer.kv_cache[0][6], ref_layer.kv_cache[0][6])  # the prefill's


def test_spec_step_is_one_library_call_on_vllm_pools(plugin_path, monkeypatch):
    # Windows and prefills in one fused_gdn_step, on vLLM's own pool views (no copy), with the
    # windows' block-table rows and accepted counts as vLLM hands them over.
    layer = Layer(torch.float32, num_spec=NUM_SPEC, slots=SLOTS)
    seen = []
    step = gdn.torch.fused_gdn_step

    def spy(*args, **kwargs):
        seen.append((args, kwargs))
        return step(*args, **kwargs)

    monkeypatch.setattr(gdn.torch, "fused_gdn_step", spy)
    md = spec_metadata(MIXED, padding=1)
    tokens = tokens_of(MIXED)
    qkv, b, a = inputs(tokens)
    plugin_path(layer, md, qkv, b, a, torch.zeros(tokens, HV, DV, dtype=torch.bfloat16))
    assert len(seen) == 1
    args, kwargs = seen[0]
    conv, ssm = args[6], args[7]
    assert conv.data_ptr() == layer.kv_cache[0].data_ptr()
    assert conv.stride() == layer.kv_cache[0].stride() and conv.shape[1] == COLUMNS
    assert ssm.data_ptr() == layer.kv_cache[1].data_ptr()
    assert torch.equal(kwargs["spec_state_indices"], md.spec_state_indices_tensor)
    assert torch.equal(kwargs["num_accepted_tokens"], md.num_accepted_tokens)
    assert args[8].tolist() == [3, 7, 11, 10, 6, 14]  # windows first, then the others' slots


def test_what_gdn_cannot_take_falls_back_to_vllm_spec_path_with_one_logged_line(
        plugin_path, monkeypatch):
    # A conv without activation: vLLM's own spec-aware path runs (its result, bit for
    # bit), counted, and said once in the log however many calls fall back.
    import logging
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("vllm.gdn").addHandler(handler)
    monkeypatch.setitem(gdn.vllm._state, "logged", set())
    try:
        ref_layer = Layer(torch.float32, num_spec=NUM_SPEC, slots=SLOTS)
        layer = ref_layer.copy(torch.float32)
        ref_layer.activation = layer.activation = None
        md = spec_metadata(MIXED)
        tokens = tokens_of(MIXED)
        qkv, b, a = inputs(tokens)
        ref_out = torch.zeros(tokens, HV, DV, dtype=torch.bfloat16)
        out = torch.zeros_like(ref_out)
        for _ in range(2):
            plugin_path(layer, md, qkv, b, a, out)
            vllm_spec_path(ref_layer, md, qkv, b, a, ref_out)
    finally:
        logging.getLogger("vllm.gdn").removeHandler(handler)
    assert torch.equal(out, ref_out) and torch.equal(layer.pages, ref_layer.pages)
    lines = [r.getMessage() for r in records]
    assert lines == ["gdn.vllm: this GDN layer call runs on vLLM's own path: conv activation "
                     "None; gdn's conv applies SiLU"], lines
    c = gdn.vllm.counters()
    assert c["gdn_calls"] == 0 and list(c["fallbacks"].values()) == [2], c
