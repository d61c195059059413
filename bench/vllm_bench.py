"""vLLM's CPU engine with gdn's plugin (gdn.vllm) against vLLM's own GDN path, in one engine.

A random-weight model with Qwen3-Next's GDN shapes (Hk 16, Hv 32, Dk = Dv = 128, conv width 4,
hidden 2048; 3 GDN layers and 1 full-attention layer, Qwen3-Next's 3:1 pattern; one expert;
bf16 weights) is written to a temporary directory and served by vLLM's in-process engine
(`LLM(...)` with VLLM_ENABLE_V1_MULTIPROCESSING=0, vLLM's UniProc executor, eager), token-id
prompts, no tokenizer. Rounds alternate the two paths with `gdn.vllm.set_enabled(True/False)`
(the order reversed every other round), per case:

  prefill 1xL   one L-token prompt (default 8192), one token generated: prompt tokens/s
  prefill BxS   B prompts of S tokens (default 16x512) in one step: prompt tokens/s
  decode N      N sequences (default 16 and 64) of short prompts, then --decode-steps steps
                in which every sequence decodes: generated tokens/s over those steps

and the GDN layers' own time: vLLM's call `gdn_attention._cpu_gdn_attention_nonspec` (which
the plugin rebinds to its stand-in, itself calling vLLM's original while switched off) is
wrapped with a timer, so one wrapper times both paths (wall and process CPU time of each call;
CPU ops are synchronous), and so are the functions each path calls inside it (vLLM's conv,
gates and delta-rule kernels; gdn's fused_gdn_step), to show where the time goes. A row's
figure is the median over the rounds; the ratio judged is the median of each round's gdn /
vLLM ratio (the two ran back to back, so the host's drift cancels). Each timed run checks the
plugin's counters: every GDN call ran on the path named, no fallback.

Accuracy: in the first round of the long prefill, the first GDN layer's inputs and the SSM
state the call left in its pool slot are captured on each path (outside the timed call), and
the state is recomputed in float64 with gdn's reference (gdn.torch.reference: the conv and the
token recurrence; the gates in float64 torch); the error is max |S - S64| / max |S64|.

Targets (printed PASS / FAIL; not a timed test): the GDN layers' time with the plugin at most
1/2 of vLLM's for prefill and 2/3 for decode, same run; the plugin's state error at most 1e-5
with float32 SSM pools (vLLM's default for these models). vLLM's own error is reported.

Threads: one engine per thread count, each in a process of its own. vLLM binds threads
(VLLM_CPU_OMP_THREADS_BIND, VLLM_CPU_NUM_OF_RESERVED_CPU) only for the worker processes of its
multiprocess executor; an in-process engine's worker runs in the caller's process with torch's
thread count, which torch reads from OMP_NUM_THREADS at start-up (vLLM's CPU worker then
disables torch.set_num_threads). So the bench sets OMP_NUM_THREADS=n for the engine's process;
gdn's ops follow torch.get_num_threads(), so both paths run n threads.

Cost: the model's projections dominate the engine's time. On a host without avx512_bf16 torch's
bf16 matrix products are slow (about 10 GFLOP/s a core on an AVX2 AMD EPYC), so there one
8192-token prefill takes minutes and the full run hours; --quick takes a few minutes.

Run it with the Python of vLLM's environment (scripts/setup.sh --vllm makes .venv-vllm), with
gdn installed there. Progress lines go to stderr (vLLM's log too), the table to stdout.

Examples:
  .venv-vllm/bin/python bench/vllm_bench.py             # the full run: threads 1 and 2, 3 rounds
  .venv-vllm/bin/python bench/vllm_bench.py --quick     # 1 thread, small cases
  .venv-vllm/bin/python bench/vllm_bench.py --threads 1 --cases prefill-long,decode --rounds 5
  .venv-vllm/bin/python bench/vllm_bench.py --ssm-dtype bfloat16   # bf16 SSM pools: no error target
  .venv-vllm/bin/python bench/vllm_bench.py --json result.json     # the table, and JSON in a file
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

# The models. "qwen3-next": Qwen3-Next's GDN layer shapes; its full-attention layer is kept small
# (2 heads of 128, not Qwen3-Next's 16 of 256), so that an 8192-token prefill's attention does
# not hide the GDN layers. "tiny": the tests' shapes (tests/vllm/models.py), for the smoke test.
SHAPES = {
    "qwen3-next": dict(hidden_size=2048, linear_num_key_heads=16, linear_num_value_heads=32,
                       linear_key_head_dim=128, linear_value_head_dim=128,
                       num_attention_heads=2, num_key_value_heads=2, head_dim=128,
                       moe_intermediate_size=512, shared_expert_intermediate_size=512,
                       vocab_size=1024),
    "tiny": dict(hidden_size=128, linear_num_key_heads=2, linear_num_value_heads=4,
                 linear_key_head_dim=64, linear_value_head_dim=64, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=64, moe_intermediate_size=128,
                 shared_expert_intermediate_size=128, vocab_size=256),
}
CONV_WIDTH = 4
PATHS = ("gdn", "vllm")  # gdn: the plugin on; vllm: vLLM's own path (the plugin switched off)
PREFILL_RATIO, DECODE_RATIO, STATE_ERROR = 0.5, 2 / 3, 1e-5
STOPPED_WARN = 0.05  # of a run's time the engine's thread neither ran nor waited for a CPU
QUICK = dict(threads="1", rounds=2, prefill_long=512, prefill_batch="4x128", decode_steps=4,
             decode_prompt=4)


def progress(message: str) -> None:
    print(f"vllm_bench: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The host and the model.
# ---------------------------------------------------------------------------------------------
def host_description() -> dict:
    model, flags = platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == platform.machine():
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return {"cpu": model, "cpus": len(os.sched_getaffinity(0)), "isa": isa,
            "system": f"{platform.system()} {platform.release()}"}


def build_model(path: str, shapes: str, gdn_layers: int, max_positions: int, seed: int = 0,
                hidden: int | None = None):
    """A random-weight Qwen3-Next (transformers' classes), one expert (top-1), saved in bf16. A_log
    and dt_bias are spread (transformers sets them to constants) so each head decays at its own
    rate. ``hidden``: another hidden size than the shapes' (bench/vllm_threads.py's --hidden)."""
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    shape = dict(SHAPES[shapes], **({} if hidden is None else {"hidden_size": hidden}))
    config = Qwen3NextConfig(
        **shape, intermediate_size=shape["moe_intermediate_size"],
        num_hidden_layers=gdn_layers + 1,
        layer_types=["linear_attention"] * gdn_layers + ["full_attention"],
        linear_conv_kernel_dim=CONV_WIDTH, max_position_embeddings=max_positions,
        num_experts=1, num_experts_per_tok=1, decoder_sparse_step=1, mlp_only_layers=[],
        tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.linspace(0.5, 16.0, p.numel()).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.linspace(-1.0, 1.0, p.numel()))
    model.to(torch.bfloat16).save_pretrained(path)


# ---------------------------------------------------------------------------------------------
# In the engine's process: the timer, the cases, the state's error.
# ---------------------------------------------------------------------------------------------
def schedstat(pattern: str = "*") -> tuple[int, int]:
    """(run, wait) nanoseconds summed over this process's live threads (or the one named): time
    on a CPU, and time ready to run but waiting for one (the host's other load)."""
    run = wait = 0
    for path in glob.glob(f"/proc/self/task/{pattern}/schedstat"):
        try:
            with open(path) as f:
                fields = f.read().split()
            run, wait = run + int(fields[0]), wait + int(fields[1])
        except (OSError, IndexError, ValueError):
            pass
    return run, wait


# Where a GDN call's time goes: the functions each path calls inside it, by stage. vLLM's
# (gdn_attention's module functions and its kernel ops; the conv is its torch fallback or, on
# avx512_bf16 and ARM bf16 hosts, its C++ kernel; a decode's delta rule includes its gates) and
# gdn's one op. The rest of a call is Python, slicing and copies.
STAGES = (("gdn_attention", "causal_conv1d_torch", "conv"),
          ("gdn_attention", "causal_conv1d_update_cpu", "conv"),
          ("gdn_attention", "_causal_conv1d_fwd_cpu", "conv"),
          ("gdn_attention", "_causal_conv1d_update_cpu", "conv"),
          ("ops", "fused_gdn_gating_cpu", "gates"),
          ("ops", "chunk_gated_delta_rule_cpu", "delta rule"),
          ("ops", "fused_sigmoid_gating_delta_rule_update_cpu", "delta rule"),
          ("gdn.torch", "fused_gdn_step", "gdn step"))


class GdnTimer:
    """Stands in for vLLM's `_cpu_gdn_attention_nonspec` (already the plugin's stand-in, which
    runs vLLM's original while switched off): times each call and the stages inside it, and,
    when armed, captures the first fresh single-prefill call's inputs and the SSM slot it
    leaves."""

    def __init__(self, module):
        self.module, self.inner = module, module._cpu_gdn_attention_nonspec
        if getattr(self.inner, "__module__", "") != "gdn.vllm":
            raise SystemExit("vllm_bench: gdn's plugin is not active in this engine (vLLM's GDN "
                             f"call is {self.inner.__module__}.{self.inner.__name__}): check that "
                             "gdn is installed in this Python and GDN_VLLM / VLLM_PLUGINS allow it")
        module._cpu_gdn_attention_nonspec = self
        self.calls: list[dict] = []
        self.stages: dict[str, float] = {}
        self.armed = False
        self.capture = None
        import gdn.torch
        owners = {"gdn_attention": module, "ops": module.ops, "gdn.torch": gdn.torch}
        for owner, name, stage in STAGES:
            if hasattr(owners[owner], name):
                setattr(owners[owner], name, self.stage(getattr(owners[owner], name), stage))

    def stage(self, fn, stage):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.stages[stage] = self.stages.get(stage, 0.0) + time.perf_counter() - start
        return timed

    def __call__(self, layer, metadata, mixed_qkv, b, a, core_attn_out):
        import torch
        capture = (self.armed and metadata.num_decodes == 0 and metadata.num_prefills == 1
                   and metadata.has_initial_state is not None
                   and not bool(metadata.has_initial_state[0]))
        if capture:
            self.armed = False
            tokens = metadata.num_prefill_tokens
            slot = int(metadata.non_spec_state_indices_tensor[0])
            inputs = [x[:tokens].clone() for x in (mixed_qkv, a, b)]
        self.stages = {}
        wall, cpu = time.perf_counter(), time.process_time()
        self.inner(layer, metadata, mixed_qkv, b, a, core_attn_out)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        self.calls.append(dict(wall=wall, cpu=cpu, stages=self.stages,
                               prefills=metadata.num_prefills, decodes=metadata.num_decodes,
                               threads=torch.get_num_threads()))
        if capture:
            from gdn.vllm import _layer
            pool = _layer.ssm_pool(layer)
            self.capture = dict(layer=layer.prefix, slot=slot, inputs=inputs,
                                state=pool[slot].clone(),
                                pool=dict(dtype=str(pool.dtype).replace("torch.", ""),
                                          stride=list(pool.stride())),
                                params=[None if t is None else t.detach().clone() for t in (
                                    _layer.conv_weight(layer), layer.conv1d.bias, layer.A_log,
                                    layer.dt_bias)],
                                heads=(layer.num_k_heads // layer.tp_size,
                                       layer.num_v_heads // layer.tp_size,
                                       layer.head_k_dim, layer.head_v_dim))


def state_error(capture: dict, reference=None):
    """(max |S - S64| / max |S64|, S64) for a captured fresh prefill: the conv + SiLU, the gates and
    the gated delta rule recomputed in float64 from the layer's bf16 inputs (gdn's float64
    reference for the conv and the recurrence; q and k L2-normalised, as both paths do)."""
    import torch
    import gdn.torch.reference as ref
    if reference is None:
        qkv, a, b = (x.to(torch.float64) for x in capture["inputs"])
        w, bias, a_log, dt_bias = (None if t is None else t.to(torch.float64)
                                   for t in capture["params"])
        hk, hv, dk, dv = capture["heads"]
        x, _ = ref.causal_conv1d(qkv, w, bias, activation="silu")
        t = x.shape[0]
        q = x[:, :hk * dk].reshape(1, t, hk, dk)
        k = x[:, hk * dk:2 * hk * dk].reshape(1, t, hk, dk)
        v = x[:, 2 * hk * dk:].reshape(1, t, hv, dv)
        g = -a_log.exp() * torch.nn.functional.softplus(a + dt_bias)
        _, reference = ref.chunk_gated_delta_rule(q, k, v, g[None], b.sigmoid()[None],
                                                  output_final_state=True,
                                                  use_qk_l2norm_in_kernel=True)
        reference = reference[0]
    error = (capture["state"].to(torch.float64) - reference).abs().max()
    return float(error / reference.abs().max()), reference


class Engine:
    """vLLM's in-process engine, driven step by step (LLMEngine.add_request / step)."""

    def __init__(self, config: dict):
        import vllm
        from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention
        self.llm = vllm.LLM(model=config["model_dir"], dtype="bfloat16", skip_tokenizer_init=True,
                            enforce_eager=True, seed=0, enable_prefix_caching=False,
                            max_model_len=config["max_model_len"],
                            max_num_batched_tokens=config["max_batched_tokens"],
                            max_num_seqs=config["max_seqs"],
                            mamba_ssm_cache_dtype=config["ssm_dtype"])
        self.engine = self.llm.llm_engine
        self.timer = GdnTimer(gdn_attention)
        self.requests = 0

    def run(self, prompts: list[list[int]], max_tokens: int) -> list[dict]:
        """Runs the prompts to completion; one record per engine step: wall and CPU seconds and
        the step's GDN calls."""
        import vllm
        from vllm.inputs import TokensPrompt
        params = vllm.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                                     detokenize=False)
        for p in prompts:
            self.requests += 1
            self.engine.add_request(str(self.requests), TokensPrompt(prompt_token_ids=p), params)
        steps = []
        while self.engine.has_unfinished_requests():
            first = len(self.timer.calls)
            wall, cpu = time.perf_counter(), time.process_time()
            self.engine.step()
            steps.append(dict(wall=time.perf_counter() - wall, cpu=time.process_time() - cpu,
                              calls=self.timer.calls[first:]))
        return steps


def run_case(engine: Engine, case: dict, path: str, layers: int) -> dict:
    """One case on one path: its throughput and the GDN layers' time per step (all layers)."""
    import gdn.vllm
    gdn.vllm.set_enabled(path == "gdn")
    before, sched, main = gdn.vllm.counters(), schedstat(), schedstat(str(os.getpid()))
    start = time.perf_counter()
    steps = engine.run(case["prompts"], case["max_tokens"])
    elapsed = time.perf_counter() - start
    after, sched_after, main_after = (gdn.vllm.counters(), schedstat(),
                                      schedstat(str(os.getpid())))
    calls = sum(len(s["calls"]) for s in steps)
    # The plugin's own counters say which path ran every call.
    ran = (after["gdn_calls"] - before["gdn_calls"] if path == "gdn"
           else after["vllm_calls_off"] - before["vllm_calls_off"])
    if ran != calls or after["fallbacks"] != before["fallbacks"]:
        raise SystemExit(f"vllm_bench: {case['name']} on the {path} path: {calls} GDN calls timed, "
                         f"{ran} counted on that path, fallbacks {after['fallbacks']}")
    threads = {c["threads"] for s in steps for c in s["calls"]}
    if case["kind"] == "decode":
        n = len(case["prompts"])
        steps = [s for s in steps if s["calls"] and all(
            c["prefills"] == 0 and c["decodes"] == n for c in s["calls"])]
        if not steps:
            raise SystemExit(f"vllm_bench: {case['name']}: no step with all {n} sequences decoding")
        tokens = n * len(steps)
    else:
        tokens = sum(len(p) for p in case["prompts"])
    for s in steps:
        if s["calls"] and len(s["calls"]) != layers:
            raise SystemExit(f"vllm_bench: {case['name']}: a step made {len(s['calls'])} GDN "
                             f"calls, the model has {layers} GDN layers")
    wall = sum(s["wall"] for s in steps)
    names = sorted({k for s in steps for c in s["calls"] for k in c["stages"]})
    per_step = [dict(wall=sum(c["wall"] for c in s["calls"]), cpu=sum(c["cpu"] for c in s["calls"]),
                     **{k: sum(c["stages"].get(k, 0.0) for c in s["calls"]) for k in names})
                for s in steps if s["calls"]]
    # Prefill: the GDN time of the whole prefill (one step when it fits the token budget);
    # decode: the median step.
    reduce = sum if case["kind"] == "prefill" else statistics.median
    gdn_wall, gdn_cpu = reduce(x["wall"] for x in per_step), reduce(x["cpu"] for x in per_step)
    stages = {k: reduce(x[k] for x in per_step) * 1e3 for k in names}
    run, wait = sched_after[0] - sched[0], sched_after[1] - sched[1]
    # The engine's thread computes or waits for a CPU throughout a run (the model runs in it, and
    # it is one of the OpenMP team); time it spent neither way, it was stopped (SIGSTOP) or
    # asleep, and the run's wall times say nothing about the paths.
    accounted = (main_after[0] - main[0] + main_after[1] - main[1]) * 1e-9
    stopped = max(0.0, 1.0 - accounted / elapsed) if accounted else None
    return dict(tokens_per_s=tokens / wall, wall_s=wall, steps=len(steps),
                gdn_ms=gdn_wall * 1e3, gdn_cpu_ms=gdn_cpu * 1e3, stages_ms=stages,
                gdn_calls=calls,
                threads=sorted(threads), cpu_wait=wait / (run + wait) if run + wait else None,
                stopped=stopped)


def prompts_for(config: dict) -> list[dict]:
    """The cases' prompts: random token ids (fixed seed), the same in every round and path."""
    import random
    rng = random.Random(1)
    vocab = SHAPES[config["shapes"]]["vocab_size"]

    def prompt(n):
        return [rng.randrange(vocab) for _ in range(n)]

    cases = []
    for name in config["cases"]:
        if name == "prefill-long":
            n = config["prefill_long"]
            cases.append(dict(key=name, name=f"prefill 1x{n}", kind="prefill",
                              prompts=[prompt(n)], max_tokens=1))
        elif name == "prefill-batch":
            b, s = config["prefill_batch"]
            cases.append(dict(key=name, name=f"prefill {b}x{s}", kind="prefill",
                              prompts=[prompt(s) for _ in range(b)], max_tokens=1))
        else:
            for n in config["decode_seqs"]:
                cases.append(dict(key=name, name=f"decode {n}", kind="decode",
                                  prompts=[prompt(config["decode_prompt"]) for _ in range(n)],
                                  max_tokens=1 + config["decode_steps"]))
    return cases


def vllm_kernel_library() -> str:
    """Which of vLLM's kernel libraries this process loaded (_C: avx512_bf16, _C_AVX512,
    _C_AVX2), from the process's memory map."""
    with open("/proc/self/maps") as f:
        names = {os.path.basename(line.split()[-1]) for line in f if "/vllm/_C" in line}
    return ",".join(sorted(n.split(".")[0] for n in names)) or "unknown"


def child_main(config_path: str) -> None:
    with open(config_path) as f:
        config = json.load(f)
    threads = config["threads"]

    def say(message):
        progress(f"[{threads} thread{'s' if threads > 1 else ''}] {message}")

    say("starting vLLM's in-process engine")
    import torch
    import gdn
    import gdn.vllm
    import vllm
    engine = Engine(config)
    layers = config["gdn_layers"]
    cases = prompts_for(config)
    vocab = SHAPES[config["shapes"]]["vocab_size"]

    # Warm-up: a short prefill and a few steps of the largest decode batch on each path (the
    # first calls convert gdn's float32 parameters and set up vLLM's kernels).
    for path in PATHS:
        say(f"warm-up on the {path} path")
        gdn.vllm.set_enabled(path == "gdn")
        engine.run([[(5 * i + 1) % vocab for i in range(64)]], 1)
        engine.run([[1] * config["decode_prompt"]] * max(config["decode_seqs"]), 3)

    # The state's error: captured in the first round of the long prefill on each path (outside
    # the timed call), or in runs of their own when that case is not run. The first GDN layer's
    # inputs do not depend on the path, so the float64 state is computed once when they match.
    accuracy, previous = {}, None

    def check_state(path):
        nonlocal previous
        capture, engine.timer.capture = engine.timer.capture, None
        if capture is None:
            raise SystemExit("vllm_bench: no fresh single prefill was captured")
        say(f"the {path} path's SSM state against float64 ({capture['inputs'][0].shape[0]} "
            f"tokens, {capture['layer']})")
        reference = None
        if previous is not None and all(torch.equal(x, y) for x, y in zip(
                capture["inputs"], previous[0]["inputs"])):
            reference = previous[1]
        error, reference = state_error(capture, reference)
        previous = (capture, reference)
        accuracy[path] = dict(error=error, layer=capture["layer"],
                              tokens=capture["inputs"][0].shape[0], pool=capture["pool"])
        say(f"SSM state error against float64, {path} path: {error:.2e}")

    if "prefill-long" not in config["cases"]:
        for path in PATHS:
            gdn.vllm.set_enabled(path == "gdn")
            engine.timer.armed = True
            engine.run([[(7 * i + 3) % vocab for i in range(config["prefill_long"])]], 1)
            check_state(path)

    results = {c["name"]: {p: [] for p in PATHS} for c in cases}
    for case in cases:
        for r in range(config["rounds"]):
            for path in (PATHS if r % 2 == 0 else PATHS[::-1]):
                capture = r == 0 and case["key"] == "prefill-long"
                engine.timer.armed = capture
                res = run_case(engine, case, path, layers)
                results[case["name"]][path].append(res)
                say(f"round {r + 1}/{config['rounds']} {case['name']:<16} {path:<4}: "
                    f"{res['tokens_per_s']:8.1f} tokens/s, GDN layers {res['gdn_ms']:8.2f} ms "
                    f"per step (CPU wait {100 * (res['cpu_wait'] or 0):.0f} %"
                    + (f", stopped {100 * res['stopped']:.0f} %" if res["stopped"] else "") + ")")
                if capture:
                    check_state(path)
    with open(config["result"], "w") as f:
        json.dump(dict(threads=threads, torch_threads=torch.get_num_threads(),
                       versions=dict(gdn=gdn.__version__, gdn_isa=gdn.cpu_isa(),
                                     vllm=vllm.__version__, torch=torch.__version__),
                       vllm_kernels=vllm_kernel_library(),
                       vllm_cpp_conv=bool(torch.cpu._is_avx512_bf16_supported()),
                       ssm_pool=accuracy["gdn"]["pool"],
                       kinds={c["name"]: c["kind"] for c in cases},
                       accuracy=accuracy, cases=results), f)
    engine.llm.llm_engine.engine_core.shutdown()


# ---------------------------------------------------------------------------------------------
# The summary: medians, ratios, targets, the table.
# ---------------------------------------------------------------------------------------------
def summarize(run: dict) -> dict:
    """Medians over the rounds per case and path, the median per-round gdn / vLLM ratio of the
    GDN time, and the targets."""
    rows, targets = [], []
    for name, paths in run["cases"].items():
        kind = run["kinds"][name]
        row = dict(case=name, kind=kind)
        for p in PATHS:
            rounds = paths[p]
            row[p] = {k: statistics.median(r[k] for r in rounds)
                      for k in ("tokens_per_s", "gdn_ms", "gdn_cpu_ms")}
            row[p]["gdn_ms_range"] = [min(r["gdn_ms"] for r in rounds),
                                      max(r["gdn_ms"] for r in rounds)]
            row[p]["cpu_wait"] = statistics.median(r["cpu_wait"] or 0 for r in rounds)
            row[p]["stopped_max"] = max(r.get("stopped") or 0 for r in rounds)
            stages = sorted({k for r in rounds for k in r.get("stages_ms", {})})
            row[p]["stages_ms"] = {k: statistics.median(r["stages_ms"].get(k, 0.0)
                                                        for r in rounds) for k in stages}
        ratios = sorted(g["gdn_ms"] / v["gdn_ms"] for g, v in zip(paths["gdn"], paths["vllm"]))
        row["gdn_ratio"] = statistics.median(ratios)
        row["gdn_ratio_range"] = [ratios[0], ratios[-1]]
        row["gdn_cpu_ratio"] = row["gdn"]["gdn_cpu_ms"] / row["vllm"]["gdn_cpu_ms"]
        row["throughput_ratio"] = row["gdn"]["tokens_per_s"] / row["vllm"]["tokens_per_s"]
        limit = PREFILL_RATIO if kind == "prefill" else DECODE_RATIO
        row["target"] = limit
        targets.append(dict(what=f"GDN time gdn / vLLM, {name}, {run['threads']} thread(s)",
                            value=row["gdn_ratio"], limit=limit,
                            passed=row["gdn_ratio"] <= limit))
        rows.append(row)
    acc = run["accuracy"]
    if run["ssm_pool"]["dtype"] == "float32":
        targets.append(dict(what=f"SSM state error of gdn, {run['threads']} thread(s), "
                                 f"float32 pools", value=acc["gdn"]["error"], limit=STATE_ERROR,
                            passed=acc["gdn"]["error"] <= STATE_ERROR))
    return dict(rows=rows, targets=targets)


def table(result: dict) -> str:
    host, first = result["host"], result["runs"][0]
    v = first["versions"]
    rounds = result["rounds"]
    lines = [
        f"vLLM {v['vllm']} (CPU, kernel library {first['vllm_kernels']}), torch {v['torch']}, "
        f"gdn {v['gdn']} (CPU variant {v['gdn_isa']}); vLLM's in-process engine (UniProc "
        f"executor), eager",
        f"host: {host['cpu']}, {host['cpus']} CPUs, {' '.join(host['isa']) or 'no AVX2'}; load "
        f"average {result['load'][0]:.1f} before, {result['load'][1]:.1f} after",
    ]
    if not first["vllm_cpp_conv"]:
        lines.append("  no avx512_bf16 (nor ARM bf16): vLLM's GDN conv runs its torch fallback "
                     "(F.conv1d per sequence); its delta rule runs the kernel library above")
    lines += [
        f"model: {result['model']}; SSM pools {first['ssm_pool']['dtype']}",
        f"{rounds} round{'s' if rounds > 1 else ''} per case, the paths alternating; medians "
        f"(GDN ms: min-max over the rounds); ratio: the median of the rounds' gdn / vLLM",
        "",
        f"{'':>7}  {'':<15} {'tokens/s':^24}   {'GDN layers, ms per step':^51}  "
        f"{'CPU time':>8}  {'CPU wait':>8}",
        f"{'threads':>7}  {'case':<15} {'gdn':>8} {'vLLM':>8} {'ratio':>6}   {'gdn':>20} "
        f"{'vLLM':>22} {'ratio':>6} {'target':>11}  {'ratio':>8}  {'gdn/vLLM':>8}",
    ]

    def ms(x):
        lo, hi = x["gdn_ms_range"]
        return f"{x['gdn_ms']:.1f}" + (f" ({lo:.1f}-{hi:.1f})" if rounds > 1 else "")

    for run in result["runs"]:
        for row in run["summary"]["rows"]:
            g, vl = row["gdn"], row["vllm"]
            verdict = "PASS" if row["gdn_ratio"] <= row["target"] else "FAIL"
            lines.append(
                f"{run['threads']:>7}  {row['case']:<15} {g['tokens_per_s']:>8.1f} "
                f"{vl['tokens_per_s']:>8.1f} {row['throughput_ratio']:>6.2f}   {ms(g):>20} "
                f"{ms(vl):>22} {row['gdn_ratio']:>6.3f} <={row['target']:.2f} {verdict}  "
                f"{row['gdn_cpu_ratio']:>8.3f}  {100 * g['cpu_wait']:>3.0f}/"
                f"{100 * vl['cpu_wait']:.0f} %")
            stopped = max(g["stopped_max"], vl["stopped_max"])
            if stopped > STOPPED_WARN:
                lines.append(f"{'':>9}WARN: in a round of this case the engine's thread was "
                             f"stopped or asleep {100 * stopped:.0f} % of the time: its wall "
                             f"times are not the paths'; the CPU-time ratio still is")
    lines += ["", "where the GDN layers' time goes (ms per step, medians; the rest: Python, "
                  "slicing, copies):"]
    for run in result["runs"]:
        for row in run["summary"]["rows"]:
            parts = []
            for p in PATHS:
                st = row[p]["stages_ms"]
                parts.append(f"{p} " + ", ".join(f"{k} {x:.1f}" for k, x in st.items())
                             + f" of {row[p]['gdn_ms']:.1f}")
            lines.append(f"  {run['threads']} thread(s), {row['case']}: " + "; ".join(parts))
    lines.append("")
    for run in result["runs"]:
        acc = run["accuracy"]
        if run["ssm_pool"]["dtype"] == "float32":
            passed = acc["gdn"]["error"] <= STATE_ERROR
            verdict = f" (<= {STATE_ERROR:.0e}: {'PASS' if passed else 'FAIL'})"
        else:
            verdict = " (no target: bf16 pools)"
        lines.append(f"SSM state after a {acc['gdn']['tokens']}-token prefill "
                     f"({acc['gdn']['layer']}, {run['threads']} thread(s)), "
                     f"max |S - S64| / max |S64|: gdn "
                     f"{acc['gdn']['error']:.1e}{verdict}, vLLM {acc['vllm']['error']:.1e}")
    targets = [t for r in result["runs"] for t in r["summary"]["targets"]]
    failed = [t for t in targets if not t["passed"]]
    lines.append(f"targets: {len(targets) - len(failed)} PASS, {len(failed)} FAIL"
                 + "".join(f"\n  FAIL {t['what']}: {t['value']:.3g} > {t['limit']:.3g}"
                           for t in failed))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The command line.
# ---------------------------------------------------------------------------------------------
def positive_list(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{name}: expected positive integers separated by "
                                         f"commas, given {text!r}")
    return values


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a couple of minutes: " + ", ".join(
                       f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
                   + " (options given explicitly win)")
    p.add_argument("--threads", help="thread counts, one engine each (default 1,2)")
    p.add_argument("--rounds", type=int, help="rounds per case, alternating paths (default 3)")
    p.add_argument("--cases", default="prefill-long,prefill-batch,decode",
                   help="any of prefill-long, prefill-batch, decode (default all)")
    p.add_argument("--prefill-long", type=int, help="tokens of the long prompt (default 8192)")
    p.add_argument("--prefill-batch", help="BxS: B prompts of S tokens (default 16x512)")
    p.add_argument("--decode-seqs", default="16,64", help="decode batch sizes (default 16,64)")
    p.add_argument("--decode-steps", type=int,
                   help="decode steps timed per run (default 32)")
    p.add_argument("--decode-prompt", type=int,
                   help="prompt tokens of each decoding sequence (default 16)")
    p.add_argument("--gdn-layers", type=int, default=3, help="GDN layers (default 3, plus one "
                   "full-attention layer)")
    p.add_argument("--shapes", choices=sorted(SHAPES), default="qwen3-next",
                   help="the model's shapes: qwen3-next (default) or tiny (the tests' model, for "
                        "the smoke test)")
    p.add_argument("--ssm-dtype", choices=["float32", "bfloat16"], default="float32",
                   help="SSM pool dtype (vLLM's mamba_ssm_cache_dtype; default float32)")
    p.add_argument("--kv-cache-gib", type=int, default=2,
                   help="VLLM_CPU_KVCACHE_SPACE for the engine, GiB (default 2)")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON to PATH "
                   "('-': JSON on stdout instead of the table)")
    p.add_argument("--verbose", action="store_true", help="vLLM's INFO log lines too")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return args
    defaults = dict(threads="1,2", rounds=3, prefill_long=8192, prefill_batch="16x512",
                    decode_steps=32, decode_prompt=16)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, QUICK[key] if args.quick else value)
    try:
        args.threads = positive_list(args.threads, "--threads")
        args.decode_seqs = positive_list(args.decode_seqs, "--decode-seqs")
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    try:
        b, s = positive_list(args.prefill_batch.replace("x", ","), "--prefill-batch")
        args.prefill_batch = (b, s)
    except (argparse.ArgumentTypeError, ValueError):
        p.error(f"--prefill-batch: expected BxS, two positive integers (e.g. 16x512), given "
                f"{args.prefill_batch!r}")
    args.cases = args.cases.split(",")
    unknown = set(args.cases) - {"prefill-long", "prefill-batch", "decode"}
    if unknown:
        p.error(f"--cases: expected prefill-long, prefill-batch or decode, given {sorted(unknown)}")
    for name in ("rounds", "prefill_long", "decode_steps", "decode_prompt", "gdn_layers",
                 "kv_cache_gib"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected a positive integer, given "
                    f"{getattr(args, name)}")
    return args


def check_plugin_allowed() -> None:
    if os.environ.get("GDN_VLLM", "1").strip().lower() in ("0", "off", "false", "no"):
        raise SystemExit(f"vllm_bench: GDN_VLLM={os.environ['GDN_VLLM']} keeps gdn's plugin off; "
                         "the bench switches it itself (unset GDN_VLLM)")
    plugins = os.environ.get("VLLM_PLUGINS")
    if plugins is not None and "gdn" not in plugins.split(","):
        raise SystemExit(f"vllm_bench: VLLM_PLUGINS={plugins!r} leaves gdn's plugin out; add gdn "
                         "or unset it")


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        child_main(args.child)
        return 0
    check_plugin_allowed()
    host = host_description()
    load_before = os.getloadavg()[0]
    longest = max(args.prefill_long, args.prefill_batch[1],
                  args.decode_prompt + args.decode_steps + 4)
    config = dict(shapes=args.shapes, gdn_layers=args.gdn_layers, ssm_dtype=args.ssm_dtype,
                  cases=args.cases, rounds=args.rounds, prefill_long=args.prefill_long,
                  prefill_batch=list(args.prefill_batch), decode_seqs=args.decode_seqs,
                  decode_steps=args.decode_steps, decode_prompt=args.decode_prompt,
                  max_model_len=longest + 16,
                  max_batched_tokens=max(args.prefill_long,
                                         args.prefill_batch[0] * args.prefill_batch[1],
                                         max(args.decode_seqs) * args.decode_prompt, longest + 16),
                  max_seqs=max(max(args.decode_seqs), args.prefill_batch[0]))
    sh = SHAPES[args.shapes]
    model = (f"random Qwen3-Next, {args.gdn_layers} GDN layers (Hk {sh['linear_num_key_heads']}, "
             f"Hv {sh['linear_num_value_heads']}, Dk {sh['linear_key_head_dim']}, Dv "
             f"{sh['linear_value_head_dim']}, K {CONV_WIDTH}, hidden {sh['hidden_size']}) + 1 "
             f"full-attention layer, one expert, bf16 weights")
    runs = []
    with tempfile.TemporaryDirectory(prefix="vllm_bench_") as tmp:
        config["model_dir"] = os.path.join(tmp, "model")
        progress(f"building the model in {config['model_dir']}: {model}")
        build_model(config["model_dir"], args.shapes, args.gdn_layers, 2 * config["max_model_len"])
        for threads in args.threads:
            config.update(threads=threads, result=os.path.join(tmp, f"result-{threads}.json"))
            config_path = os.path.join(tmp, f"config-{threads}.json")
            with open(config_path, "w") as f:
                json.dump(config, f)
            env = dict(os.environ, OMP_NUM_THREADS=str(threads),
                       VLLM_ENABLE_V1_MULTIPROCESSING="0",
                       VLLM_CPU_KVCACHE_SPACE=str(args.kv_cache_gib))
            if not args.verbose:
                env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
            # The engine's process writes vLLM's log to its stdout: to our stderr, so that our
            # stdout is the table (or the JSON) alone.
            child = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                                    config_path], env=env, stdout=sys.stderr)
            if child.returncode != 0:
                progress(f"the engine's process with {threads} thread(s) failed "
                         f"(exit status {child.returncode}); its log is above")
                return 1
            with open(config["result"]) as f:
                run = json.load(f)
            run["summary"] = summarize(run)
            runs.append(run)
    result = dict(host=host, load=[load_before, os.getloadavg()[0]], model=model,
                  rounds=args.rounds, config={k: v for k, v in config.items()
                                              if k not in ("model_dir", "result", "threads")},
                  runs=runs)
    if args.json and args.json != "-":
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.json == "-":
        json.dump(result, sys.stdout, indent=1)
        print()
    else:
        print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
