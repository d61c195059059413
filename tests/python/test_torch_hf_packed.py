"""gdn.torch.patch with padding-free (packed) batches, the path of transformers' own
test_padding_free_matches_padded_fast_path_regression (Qwen3-Next, Qwen3.5, Qwen3.5-MoE), run on
the CPU: transformers' DataCollatorWithFlattening packs the sequences into one row with seq_idx
and cu_seq_lens_q, and the patched model's logits of each token must be those of the same
sequences left-padded in a batch, the patched model's (tight), transformers' own (float32), and
the float64 truth (the model in float64 with a float64 token loop for its GDN core). Unpatched
transformers refuses such a batch on the CPU (it needs fla and causal-conv1d for it); the patch
also takes each keyword the model hands its functions, or refuses it."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import gdn.torch  # noqa: E402
import torch_reference as ref  # noqa: E402
from conftest import assert_close  # noqa: E402
from hf_models import qwen3_5, qwen3_5_moe, qwen3_next  # noqa: E402

MODELS = [pytest.param(qwen3_next, id="qwen3_next"), pytest.param(qwen3_5, id="qwen3_5"),
          pytest.param(qwen3_5_moe, id="qwen3_5_moe")]
# Sequences packed into one row. The first two are transformers' test's cases; the third has
# sequences shorter than the conv's K - 1 = 3 inputs of context and one across gdn's 64-token
# chunk, so that a sequence reading its predecessor's tokens shows in its first three logits.
CASES = [[[1, 2, 3], [4, 5]], [[1, 2, 3, 4, 5], [6]],
         [list(range(3, 73)), [11, 12], [13], list(range(20, 60)), [7, 8, 9, 10]]]
CASE_IDS = ["transformers_1", "transformers_2", "short_and_long"]


@pytest.fixture(autouse=True)
def _restore():
    yield
    gdn.torch.unpatch()


def _padded(features):
    """transformers' padded batch of the same sequences: left padding, attention mask, position
    ids counting from 0 at each sequence's first token."""
    width = max(len(f) for f in features)
    ids = torch.tensor([[0] * (width - len(f)) + f for f in features])
    mask = torch.tensor([[0] * (width - len(f)) + [1] * len(f) for f in features])
    position_ids = (mask.cumsum(1) - 1) * mask
    return dict(input_ids=ids, attention_mask=mask, position_ids=position_ids), mask.bool()


def _packed(features, seq_idx=True, flash_kwargs=True):
    collator = transformers.DataCollatorWithFlattening(
        return_tensors="pt", return_seq_idx=seq_idx, return_flash_attn_kwargs=flash_kwargs)
    batch = collator([{"input_ids": f} for f in features])
    batch.pop("labels")
    return batch


def _padded_logits(model, features):
    padded, mask = _padded(features)
    with torch.no_grad():
        return model(**padded, use_cache=False).logits[mask]


def _float64_token_loop(query, key, value, g, beta, chunk_size=64, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False, **_):
    o, ht = ref.chunk_gated_delta_rule(query.double(), key.double(), value.double(), g.double(),
                                       beta.double(), initial_state=initial_state,
                                       use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    return o.to(query.dtype), (ht if output_final_state else None)


def _float64_truth(make, features):
    """The padded batch through the model in float64, its GDN core the float64 token loop and
    its conv transformers' own (F.conv1d in float64)."""
    model = make().double()
    mod = __import__(type(model).__module__, fromlist=["x"])
    original = mod.torch_chunk_gated_delta_rule
    mod.torch_chunk_gated_delta_rule = _float64_token_loop
    try:
        return _padded_logits(model, features)
    finally:
        mod.torch_chunk_gated_delta_rule = original


@pytest.mark.parametrize("features", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("make", MODELS)
def test_padding_free_batch_matches_the_padded_batch(make, features):
    model = make()
    transformers_padded = _padded_logits(model, features)
    gdn.torch.patch(model)
    padded = _padded_logits(model, features)
    with torch.no_grad():
        packed = model(**_packed(features), use_cache=False).logits[0]
    # transformers' test's tolerance: the same sequences, the same arithmetic but for the order
    # of sums
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
    assert_close(packed, transformers_padded, 1e-4, "packed vs transformers' own, padded")


@pytest.mark.parametrize("make", [pytest.param(qwen3_next, id="qwen3_next"),
                                  pytest.param(qwen3_5, id="qwen3_5")])
def test_padding_free_batch_matches_the_float64_truth(make):
    # the patched model packed, in float32 and in float64 (gdn's float64 kernels)
    features = CASES[2]
    truth = _float64_truth(make, features)
    model = make()
    gdn.torch.patch(model)
    for dtype, tol in ((torch.float32, 1e-4), (torch.float64, 1e-10)):
        with torch.no_grad():
            packed = model.to(dtype)(**_packed(features), use_cache=False).logits[0]
        assert_close(packed, truth, tol, f"packed {dtype} vs float64")


@pytest.mark.parametrize("seq_idx, flash_kwargs", [(True, False), (False, True)],
                         ids=["seq_idx_alone", "cu_seq_lens_alone"])
def test_either_description_of_the_boundaries_is_enough(seq_idx, flash_kwargs):
    # seq_idx alone (the conv's description) or cu_seq_lens_q alone (the delta rule's): both
    # layers take their boundaries from whichever is given
    features = CASES[2]
    model = qwen3_next()
    gdn.torch.patch(model)
    padded = _padded_logits(model, features)
    with torch.no_grad():
        packed = model(**_packed(features, seq_idx, flash_kwargs), use_cache=False).logits[0]
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)


def test_a_packed_batch_with_a_cache_is_refused():
    # use_cache left on: transformers asks the delta rule for final states (one per batch row in
    # its cache) and its attention mask does not keep packed sequences apart, so the logits
    # would be wrong (0.2 off on this model): refused, naming use_cache=False, which runs.
    model = qwen3_next()
    gdn.torch.patch(model)
    batch = _packed([[1, 2], [3]])
    with torch.no_grad():
        with pytest.raises(ValueError, match="argument 'output_final_state'.*use_cache=False"):
            model(**batch)
        model(**batch, use_cache=False)
        # one sequence in the row is an ordinary batch row: the cache serves it
        single = _packed([[1, 2, 3]])
        cached = model(**single).logits
        torch.testing.assert_close(cached, model(**single, use_cache=False).logits,
                                   atol=1e-6, rtol=1e-6)


def test_packed_sequences_continuing_a_cached_state_are_refused():
    mod = _patched_module()
    q = torch.randn(1, 5, 2, 16)
    v, g = torch.randn(1, 5, 4, 16), -torch.rand(1, 5, 4)
    state = torch.zeros(1, 4, 16, 16)
    with pytest.raises(ValueError, match="argument 'initial_state'.*use_cache=False"):
        mod.torch_chunk_gated_delta_rule(q, q, v, g=g, beta=g.exp(), initial_state=state,
                                         cu_seqlens=torch.tensor([0, 2, 5]))


def _patched_module():
    model = qwen3_next()
    gdn.torch.patch(model)
    return __import__(type(model).__module__, fromlist=["x"])


@pytest.mark.parametrize("name, value, words", [
    ("packed_seq_params", object(), ["'packed_seq_params'", "does not know"]),
    ("is_causal", False, ["'is_causal'", "causal"]),
], ids=["unknown_keyword", "is_causal_false"])
def test_the_patch_refuses_a_keyword_it_cannot_honour(name, value, words):
    mod = _patched_module()
    q = torch.randn(1, 5, 2, 16)
    v, g = torch.randn(1, 5, 4, 16), -torch.rand(1, 5, 4)
    for call in (lambda: mod.torch_chunk_gated_delta_rule(q, q, v, g=g, beta=g.exp(),
                                                          **{name: value}),
                 lambda: mod.torch_recurrent_gated_delta_rule(q, q, v, g=g, beta=g.exp(),
                                                              **{name: value}),
                 lambda: mod.causal_conv1d_fn(torch.randn(1, 8, 5), torch.randn(8, 4),
                                              activation="silu", **{name: value})):
        with pytest.raises(ValueError) as info:
            call()
        assert all(w in str(info.value) for w in words), str(info.value)


def test_the_keywords_a_patched_model_passes_are_all_known():
    # what transformers hands the patched functions in a packed forward, a training step and a
    # cached generation: each is honoured or on the patch's list of keywords that are none of
    # the ops' business (else the calls above would raise)
    model = qwen3_next()
    gdn.torch.patch(model)
    mod = __import__(type(model).__module__, fromlist=["x"])
    seen = set()
    for n in ("causal_conv1d_fn", "torch_chunk_gated_delta_rule"):
        f = getattr(mod, n)

        def spy(*a, _f=f, **k):
            seen.update(k)
            return _f(*a, **k)
        setattr(mod, n, spy)
    batch = _packed(CASES[0])
    with torch.no_grad():
        model(**batch, use_cache=False)
        model.generate(batch["input_ids"][:, :4], max_new_tokens=2, do_sample=False,
                       pad_token_id=0)
    model.train()
    model(**batch, labels=batch["input_ids"], use_cache=False).loss.backward()
    assert {"seq_idx", "cu_seq_lens_q", "cu_seqlens"} <= seen
    honoured = {"activation", "g", "beta", "initial_state", "output_final_state",
                "use_qk_l2norm_in_kernel", "cu_seqlens", "seq_idx", "cu_seq_lens_q"}
    assert seen - honoured <= gdn.torch._patch._NOT_THE_OPS, seen - honoured
