"""gdn.vllm inside vLLM's CPU engine: tiny random Qwen3-Next, Qwen3.5 and Qwen3.5 MoE models
(tests/vllm/models.py), token-id prompts of several lengths with max_num_batched_tokens = 64, so
that the engine runs fresh and chunked (continued) prefills, decodes and batches mixing them.

Bounds. vLLM's own path and gdn's differ in the GDN layers' arithmetic alone (vLLM's kernels
keep bf16 intermediates, gdn float32), and both hand bf16 activations to the next layer: the
logits of this model are below 1 in magnitude, where one bf16 rounding is up to 2^-9..2^-8, and
the prompt logprobs of the two paths were seen to differ by at most 4e-3 (mean 1e-3), so they
must agree within 2e-2 per token and 4e-3 on average. Against transformers in float32 (the same
bf16 weights) gdn's error must be no larger than vLLM's own path's plus 2e-3 (mean). Greedy
tokens must be equal until the two paths part, and they may part only where vLLM's own path
chose with a top-2 margin below 1e-2 (2.5 times the largest logprob difference seen: a closer
tie may flip on bf16 noise; after it the contexts differ and the sequences are not compared);
the tokens compared must be half of the positions at least (a random model's logits are flat:
its top-2 gaps are often a few 1e-2).

With ngram speculative decoding the reference is plain greedy decoding on vLLM's own path
(speculation changes no greedy token), under the same rule.

Engines are shared per module-scoped configuration. In-process engines (vLLM's
VLLM_ENABLE_V1_MULTIPROCESSING=0) compare both paths in one engine (gdn.vllm.set_enabled);
multiprocess ones read the counters each engine process writes to GDN_VLLM_COUNTERS; the
tensor-parallel one switches gdn off in its workers (collective_rpc) to compare both paths.
Tensor parallelism 2 reorders the all-reduce of the row-parallel projections, the same in both
paths, so the same bounds hold between them."""

import gc
import json
import os

import pytest

torch = pytest.importorskip("torch")
vllm = pytest.importorskip("vllm")

import gdn.vllm  # noqa: E402

import models  # noqa: E402

GDN_LAYERS = 3  # in both models
LOGPROB_MAX, LOGPROB_MEAN, MARGIN = 2e-2, 4e-3, 1e-2
PROMPTS = [[(7 * i + 3 + 13 * j) % models.VOCAB for i in range(n)]
           for j, n in enumerate([40, 5, 100, 17, 150, 1])]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    models.qwen3_next(root / "qwen3_next")
    models.qwen3_5(root / "qwen3_5")
    models.qwen3_5_moe(root / "qwen3_5_moe")
    return {name: str(root / name) for name in ("qwen3_next", "qwen3_5", "qwen3_5_moe")}


def make_engine(model, multiprocess, **kwargs):
    # An in-process engine caches vLLM's environment variables for the whole process while it
    # lives (vllm.envs.enable_envs_cache): without this, an engine made beside the module's
    # in-process one read its VLLM_ENABLE_V1_MULTIPROCESSING ("0": the "multiprocess" engines'
    # cores ran in this process) and VLLM_CPU_OMP_THREADS_BIND.
    vllm.envs.disable_envs_cache()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    args = dict(model=model, dtype="bfloat16", skip_tokenizer_init=True, max_model_len=512,
                seed=0, enable_prefix_caching=False, max_num_batched_tokens=64, max_num_seqs=8)
    args.update(kwargs)
    return vllm.LLM(**args)


def close_engine(llm):
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    cleanup_dist_env_and_memory()


def generate(llm):
    from vllm.inputs import TokensPrompt
    params = vllm.SamplingParams(prompt_logprobs=0, logprobs=2, temperature=0,
                                 max_tokens=MAX_TOKENS, detokenize=False, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params,
                        use_tqdm=False)
    return [dict(prompt=[next(v.logprob for t, v in d.items() if t == tok)
                         for d, tok in zip(o.prompt_logprobs[1:], p[1:])],
                 tokens=list(o.outputs[0].token_ids),
                 top2=[sorted((v.logprob for v in d.values()), reverse=True)[:2]
                       for d in o.outputs[0].logprobs])
            for o, p in zip(outs, PROMPTS)]


# Prompts that repeat a pattern (ngram drafts from the prompt), of lengths that make the engine
# prefill some of them in chunks beside the others' speculative windows; long enough outputs
# that the model's greedy tokens fall into loops, whose drafts it accepts.
SPEC_PROMPTS = [([(31 * j + 7 * i * i + 3 * i) % models.VOCAB for i in range(period)]
                 * (n // period + 1))[:n]
                for j, (period, n) in enumerate([(5, 60), (7, 20), (4, 130), (6, 9), (3, 90),
                                                 (8, 33)], start=1)]
SPEC_MAX_TOKENS = 32


def greedy(llm, prompts, max_tokens):
    from vllm.inputs import TokensPrompt
    params = vllm.SamplingParams(logprobs=2, temperature=0, max_tokens=max_tokens,
                                 detokenize=False, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                        use_tqdm=False)
    return [dict(tokens=list(o.outputs[0].token_ids),
                 top2=[sorted((v.logprob for v in d.values()), reverse=True)[:2]
                       for d in o.outputs[0].logprobs])
            for o in outs]


@pytest.fixture(scope="module")
def float32_logprobs(model_dirs):
    """transformers in float32, teacher-forced on the prompts: the prompt logprobs."""
    from transformers import AutoModelForCausalLM
    result = {}
    for name, path in model_dirs.items():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        result[name] = []
        with torch.no_grad():
            for p in PROMPTS:
                ids = torch.tensor([p])
                lp = torch.log_softmax(model(ids).logits[0].double(), -1)
                result[name].append([float(lp[t, p[t + 1]]) for t in range(len(p) - 1)])
    return result


def logprob_diffs(a, b):
    d = [abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return max(d), sum(d) / len(d)


def check_against_vllm_path(ours, theirs):
    for o, t in zip(ours, theirs):
        assert len(o["prompt"]) == len(t["prompt"])
    worst, mean = logprob_diffs([o["prompt"] for o in ours], [t["prompt"] for t in theirs])
    assert worst <= LOGPROB_MAX and mean <= LOGPROB_MEAN, (worst, mean)
    check_greedy_tokens(ours, theirs)


def check_greedy_tokens(ours, theirs):
    """ours' greedy tokens equal theirs until the two part, which they may do only at a
    near-tie of theirs (top-2 margin below MARGIN: bf16 noise may pick either); the tokens
    before that (or all) are at least half of the positions."""
    compared = positions = 0
    for o, t in zip(ours, theirs):
        positions += len(t["tokens"])
        for i, (a, b) in enumerate(zip(o["tokens"], t["tokens"])):
            if a != b:
                top = t["top2"][i]
                assert len(top) == 2 and top[0] - top[1] < MARGIN, (
                    f"greedy token {i} differs at a top-2 margin of {top[0] - top[1]:.3g}: "
                    f"{o['tokens']} vs {t['tokens']}")
                break  # the contexts differ from here on
            compared += 1
    assert compared >= 0.5 * positions, f"only {compared} of {positions} tokens compared"


def check_against_float32(ours, theirs, ref):
    ours_err = logprob_diffs([o["prompt"] for o in ours], ref)
    theirs_err = logprob_diffs([t["prompt"] for t in theirs], ref)
    assert ours_err[1] <= theirs_err[1] + 2e-3, (ours_err, theirs_err)
    assert ours_err[0] <= max(theirs_err[0], LOGPROB_MAX), (ours_err, theirs_err)


def check_counters(c, expect_padding=False):
    assert c["fallbacks"] == {} and c["vllm_calls_off"] == 0, c
    assert c["gdn_calls"] > 0 and c["gdn_calls"] % GDN_LAYERS == 0, c
    assert c["decode_only"] and c["prefill_only"] + c["mixed"], c
    assert c["mixed"] > 0 and c["continued_prefill"] > 0, c  # mixed batches, chunked prefill


def both_paths(llm):
    gdn.vllm.set_enabled(True)
    gdn.vllm.reset_counters()
    ours = generate(llm)
    counts = gdn.vllm.counters()
    gdn.vllm.set_enabled(False)
    try:
        theirs = generate(llm)
    finally:
        gdn.vllm.set_enabled(True)
    return ours, counts, theirs


@pytest.fixture(scope="module")
def eager_qwen3_next_runs(model_dirs):
    """Everything the in-process eager Qwen3-Next engine runs, run at once: closing another
    engine tears down the process's parallel groups, which an in-process engine needs."""
    llm = make_engine(model_dirs["qwen3_next"], multiprocess=False, enforce_eager=True)
    runs = dict(both_paths=both_paths(llm))
    gdn.vllm.set_enabled(False)  # the reference of the speculative test
    try:
        runs["plain_greedy_spec_prompts"] = greedy(llm, SPEC_PROMPTS, SPEC_MAX_TOKENS)
    finally:
        gdn.vllm.set_enabled(True)
    yield runs
    close_engine(llm)


@pytest.fixture(scope="module")
def eager_qwen3_next(eager_qwen3_next_runs):
    return eager_qwen3_next_runs["both_paths"]


@pytest.fixture(scope="module")
def compiled_qwen3_5(model_dirs, eager_qwen3_next):
    llm = make_engine(model_dirs["qwen3_5"], multiprocess=False, enforce_eager=False)
    yield both_paths(llm)
    close_engine(llm)


@pytest.fixture(scope="module")
def eager_qwen3_5_moe(model_dirs, compiled_qwen3_5):
    # after the other in-process engines: all of them run before a test closes an engine
    llm = make_engine(model_dirs["qwen3_5_moe"], multiprocess=False, enforce_eager=True)
    yield both_paths(llm)
    close_engine(llm)


def test_in_process_eager_qwen3_next_matches_vllm_path(eager_qwen3_next, float32_logprobs):
    ours, counts, theirs = eager_qwen3_next
    check_against_vllm_path(ours, theirs)
    check_against_float32(ours, theirs, float32_logprobs["qwen3_next"])
    check_counters(counts)


def test_in_process_compiled_qwen3_5_matches_vllm_path(compiled_qwen3_5, float32_logprobs):
    ours, counts, theirs = compiled_qwen3_5
    check_against_vllm_path(ours, theirs)
    check_against_float32(ours, theirs, float32_logprobs["qwen3_5"])
    check_counters(counts)


def test_in_process_eager_qwen3_5_moe_matches_vllm_path(eager_qwen3_5_moe, float32_logprobs):
    """Qwen3.5 MoE (vLLM's Qwen3_5MoeForCausalLM): its GDN layers are Qwen3.5's, reached through
    the same call, with an MoE block (one expert) after each."""
    ours, counts, theirs = eager_qwen3_5_moe
    check_against_vllm_path(ours, theirs)
    check_against_float32(ours, theirs, float32_logprobs["qwen3_5_moe"])
    check_counters(counts)


def counters_of(directory):
    total = {"fallbacks": {}}
    for name in os.listdir(directory):
        if name.endswith(".json"):
            with open(os.path.join(directory, name)) as f:
                c = json.load(f)
            for k, v in c.items():
                if k == "fallbacks":
                    for reason, n in v.items():
                        total["fallbacks"][reason] = total["fallbacks"].get(reason, 0) + n
                else:
                    total[k] = total.get(k, 0) + v
    return total


@pytest.fixture
def counters_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GDN_VLLM_COUNTERS", str(tmp_path))
    return tmp_path


def thread_cpus(pid):
    """{tid: (name, CPUs it may run on)} of a process's threads."""
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        except OSError:
            continue
        cpus = set()
        for part in status["Cpus_allowed_list"].split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
        threads[int(tid)] = (status["Name"], cpus)
    return threads


def check_gdn_calls_on_vllms_threads(directory, bound):
    """In the process that ran the GDN layers (it wrote counters with gdn calls), every gdn call
    ran on torch's OpenMP team with 2 threads or more, vLLM's other thread taking part in each
    (the plugin's counts), and gdn started no thread of its own: the calls' helpers are vLLM's OpenMP threads, one bound to each CPU, the
    main thread (the caller) pinned to the first."""
    pids = [int(p.stem) for p in directory.iterdir() if p.suffix == ".json"
            and json.loads(p.read_text())["gdn_calls"] > 0]
    assert len(pids) == 1, pids
    counts = json.loads((directory / f"{pids[0]}.json").read_text())
    assert counts["team_calls"] == counts["gdn_calls"], counts
    # vLLM's second OpenMP thread ran a part of every call (a step is two parallel regions)
    assert counts["team_helpers"] >= counts["gdn_calls"], counts
    threads = thread_cpus(pids[0])
    _, caller = threads[pids[0]]
    assert caller == {bound[0]}, (caller, bound)
    assert "gdn-worker" not in [name for name, _ in threads.values()], threads
    pinned = {next(iter(cpus)) for _, cpus in threads.values() if len(cpus) == 1}
    assert pinned >= set(bound), (pinned, bound)  # vLLM's team: a thread on each bound CPU


def test_multiprocess_compiled_bf16_pools_qwen3_next(model_dirs, eager_qwen3_next,
                                                     float32_logprobs, counters_dir,
                                                     monkeypatch):
    """The engine core in its own process, compiled, bf16 SSM pools; against the in-process
    engine's vLLM path (float32 pools): bf16 pools round the state once per step, which the
    same bounds cover on these short sequences. Its worker is bound to every CPU this test may
    use (vLLM's own choice keeps one of 2 CPUs for its scheduler), so gdn runs its calls on
    2 threads or more, on vLLM's OpenMP threads."""
    bound = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, bound)))
    llm = make_engine(model_dirs["qwen3_next"], multiprocess=True, enforce_eager=False,
                      mamba_ssm_cache_dtype="bfloat16")
    try:
        ours = generate(llm)
        if len(bound) >= 2:
            check_gdn_calls_on_vllms_threads(counters_dir, bound)
    finally:
        close_engine(llm)
    _, _, theirs = eager_qwen3_next
    check_against_vllm_path(ours, theirs)
    check_against_float32(ours, theirs, float32_logprobs["qwen3_next"])
    files = [p.name for p in counters_dir.iterdir()]
    assert files and f"{os.getpid()}.json" not in files, files  # written by the engine process
    check_counters(counters_of(counters_dir))


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_ngram_speculative_decoding_runs_on_gdn_with_plain_decodings_tokens(
        model_dirs, eager_qwen3_next_runs, counters_dir, mode):
    """Greedy speculative decoding changes no token: with ngram drafts (n = 2) on gdn, the
    tokens are plain (non-speculative) greedy decoding's on vLLM's own path, under the margin
    rule of check_against_vllm_path. vLLM's own speculative path is not the reference: for a
    window shorter than 1 + n tokens its CPU torch path (hosts without AMX) rolls the conv
    buffer so that the next step reads a stale history (docs/vllm.md, "Speculative
    decoding"). The engine process counts: every GDN call on gdn, speculative windows beside
    prefill chunks, windows resuming after accepted drafts and short windows. Eager, and
    compiled (vLLM's torch.compile of the model, the GDN call a custom op in its graph)."""
    llm = make_engine(model_dirs["qwen3_next"], multiprocess=True,
                      enforce_eager=mode == "eager",
                      speculative_config=dict(method="ngram", num_speculative_tokens=2,
                                              prompt_lookup_max=3, prompt_lookup_min=2))
    try:
        ours = greedy(llm, SPEC_PROMPTS, SPEC_MAX_TOKENS)
    finally:
        close_engine(llm)
    assert all(len(o["tokens"]) == SPEC_MAX_TOKENS for o in ours)
    check_greedy_tokens(ours, eager_qwen3_next_runs["plain_greedy_spec_prompts"])
    c = counters_of(counters_dir)
    assert c["fallbacks"] == {} and c["vllm_calls_off"] == 0, c
    assert c["gdn_calls"] > 0 and c["gdn_calls"] % GDN_LAYERS == 0, c
    assert c["spec_decode"] > 0 and c["spec_mixed"] > 0, c
    assert c["spec_accepted"] > 0 and c["spec_short"] > 0, c


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU per rank: needs 2 CPUs")
def test_tensor_parallel_2_qwen3_5_matches_vllm_path_on_every_rank(
        model_dirs, float32_logprobs, counters_dir, monkeypatch):
    """Tensor parallelism 2 (each rank a process with half the heads, one CPU each): gdn's path
    against vLLM's own in the same engine (switched off in the workers after the first run),
    and against float32; each rank's counters show every GDN call on gdn, no fallback. The
    dense Qwen3.5: vLLM refuses the one-expert Qwen3-Next at TP 2 ("Tensor parallel size 2 is
    greater than the number of experts 1"), and more experts bring routing near-ties."""

    def switch_gdn_off(worker):
        # Runs in each worker (collective_rpc); a local function travels by value.
        import gdn.vllm
        gdn.vllm.set_enabled(False)

    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", f"{cpus[0]}|{cpus[1]}")
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # a function to collective_rpc
    llm = make_engine(model_dirs["qwen3_5"], multiprocess=True, enforce_eager=True,
                      tensor_parallel_size=2)
    try:
        ours = generate(llm)
        ranks = [json.loads(p.read_text()) for p in counters_dir.iterdir() if p.suffix == ".json"]
        llm.collective_rpc(switch_gdn_off)
        theirs = generate(llm)
    finally:
        close_engine(llm)
    check_against_vllm_path(ours, theirs)
    check_against_float32(ours, theirs, float32_logprobs["qwen3_5"])
    ranks = [c for c in ranks if c["gdn_calls"] > 0]
    assert len(ranks) == 2, ranks  # each rank ran its half of the heads on gdn
    for c in ranks:
        check_counters(c)
