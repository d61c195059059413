"""Where gdn's threads run inside vLLM's CPU worker, and what a second thread buys there.

Starts one multiprocess vLLM CPU engine (the model runs in a worker process of its own, whose
OpenMP threads vLLM binds one per CPU of VLLM_CPU_OMP_THREADS_BIND, default here "0-1": both
CPUs of a 2-CPU host to the one worker) serving a random Qwen3-Next with Qwen3-Next's GDN heads
(Hk 16, Hv 32, Dk = Dv = 128, conv 4; --hidden, --gdn-layers GDN layers and one attention layer,
one expert), and inside the worker, through vLLM's collective_rpc:
- lists the worker's threads: name, the CPUs each may run on (Cpus_allowed_list), CPU time;
- times every GDN layer call (vLLM's _cpu_gdn_attention_nonspec, wall clock, in the worker), in
  modes that alternate round by round on the same engine:
    vllm           vLLM's own path (gdn.vllm switched off);
    gdn-1          gdn on 1 thread;
    gdn-N-inherit  gdn on N = torch.get_num_threads() threads, the pool's threads pinned where
                   the worker's main thread is (what a thread it starts inherits: vLLM's OpenMP
                   runtime binds the main thread to the first CPU of the list);
    gdn-N-placed   gdn on N threads from its pool, placed on the worker's other bound CPUs
                   (the plugin's fallback, and its choice before the team);
    gdn-N          gdn on N threads as the plugin runs them: on torch's OpenMP team, vLLM's
                   own bound threads (docs/vllm.md, "Threads");
  per mode, the calls' mean time for a prefill (one prompt of --prefill tokens) and for decode
  steps (--decode-seqs sequences), the CPU time each thread spent (/proc schedstat), which says
  how many threads a call really used, and the engine's wall time for the requests (whole steps);
- then (--layer-reps) calls the plugin's layer call on the worker's first GDN layer and pools
  in a loop, the modes alternating call by call, each call after a torch matmul the size of the
  layer's input projection (its real predecessor, after which vLLM's OpenMP threads spin) and
  again without it: the GDN layer's time without the engine's steps between calls, and the CPU
  time gdn's helpers and vLLM's other OpenMP threads spent during each call (what they took of
  the helpers' cores while a GDN call ran: spinning after the matmul, nothing when asleep).

The figures of a shared host are noisy; compare only rows of one run. Run it with the vLLM
environment's interpreter (docs/vllm.md, "Install").

Examples:
  .venv-vllm/bin/python bench/vllm_threads.py --quick   # a smoke run, about 3 minutes
  .venv-vllm/bin/python bench/vllm_threads.py
  .venv-vllm/bin/python bench/vllm_threads.py --rounds 5 --prefill 2048 --decode-seqs 64
  LD_PRELOAD=.venv-vllm/lib/libiomp5.so .venv-vllm/bin/python bench/vllm_threads.py  # Intel OMP
  OMP_WAIT_POLICY=passive .venv-vllm/bin/python bench/vllm_threads.py  # OpenMP threads sleep
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

MODES = ("vllm", "gdn-1", "gdn-N-inherit", "gdn-N-placed", "gdn-N")
# (default, --quick): a quick run (2 min 49 s in all, vLLM's start included, on this project's
# 2-vCPU host at a load average of 5 to 8; the default run 5 min 48 s with --rounds 5) to see
# that everything works and where the threads run, not figures to quote
SIZES = dict(rounds=(3, 1), prefill=(512, 128), decode_seqs=(16, 8), decode_steps=(8, 4),
             layer_reps=(20, 4))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("Examples:")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bind", default="0-1",
                   help="VLLM_CPU_OMP_THREADS_BIND for the worker (default 0-1; 'auto' is vLLM's "
                        "own choice, which keeps one CPU of a 2-CPU host for its scheduler)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes, one round: " + ", ".join(
                       f"--{k.replace('_', '-')} {v[1]}" for k, v in SIZES.items())
                   + " (a smoke run, not figures)")
    p.add_argument("--rounds", type=int, help="rounds over all modes (default 3)")
    p.add_argument("--prefill", type=int, help="prefill prompt tokens (512)")
    p.add_argument("--decode-seqs", type=int, help="decoding sequences (16)")
    p.add_argument("--decode-steps", type=int, help="tokens generated per round (8)")
    p.add_argument("--hidden", type=int, default=512,
                   help="hidden size (512: the projections' cost, not the GDN layers')")
    p.add_argument("--gdn-layers", type=int, default=2, help="GDN layers (2)")
    p.add_argument("--modes", default=",".join(MODES),
                   help="comma-separated, of " + ", ".join(MODES) + " (default: all)")
    p.add_argument("--layer-reps", type=int,
                   help="reps of the in-worker layer loop per mode and case (20; 0: none)")
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    args = p.parse_args(argv)
    for name, sizes in SIZES.items():  # an explicit size wins over --quick's
        if getattr(args, name) is None:
            setattr(args, name, sizes[args.quick])
    args.modes = args.modes.split(",")
    bad = [m for m in args.modes if m not in MODES]
    if (bad or min(args.rounds, args.prefill, args.decode_seqs, args.decode_steps) < 1
            or args.layer_reps < 0):
        p.error(f"expected --modes from {MODES}, --rounds/--prefill/--decode-seqs/--decode-steps "
                f">= 1, --layer-reps >= 0; given {args.modes}, {args.rounds}, {args.prefill}, "
                f"{args.decode_seqs}, {args.decode_steps}, {args.layer_reps}")
    return args


def log(msg):
    print(f"vllm_threads: {msg}", file=sys.stderr, flush=True)


def build_model(path, hidden, gdn_layers):
    """vllm_bench.py's Qwen3-Next (Qwen3-Next's GDN heads, one expert, spread gates, bf16) with
    ``hidden`` as its hidden size."""
    from vllm_bench import build_model as build  # this script's folder is on sys.path
    build(path, "qwen3-next", gdn_layers, 8192, hidden=hidden)


# --- run in the worker (collective_rpc sends these functions by value) ---

def _threads():
    """{tid: (name, allowed CPUs, CPU ns, last CPU)} of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                cpu_ns = int(f.read().split()[0])
            with open(f"/proc/self/task/{tid}/stat") as f:
                last_cpu = int(f.read().rsplit(")", 1)[1].split()[36])
        except (OSError, ValueError, IndexError):
            continue
        out[int(tid)] = (status["Name"], status["Cpus_allowed_list"], cpu_ns, last_cpu)
    return out


def _cpu_set(text):
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _worker_setup(worker, prefill_tokens):
    import threading

    import torch

    import gdn
    import gdn.torch
    import gdn.vllm
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention
    state = {"mode": "gdn-N", "calls": {}, "main": threading.get_native_id()}
    inner = gdn_attention._cpu_gdn_attention_nonspec
    step = gdn.torch.fused_gdn_step

    def timed(layer, metadata, *args):
        start, cpu = time.perf_counter(), time.thread_time()
        inner(layer, metadata, *args)
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
        if metadata.num_prefills == 0:
            phase = "decode"
        elif metadata.num_prefill_tokens == prefill_tokens and metadata.num_decodes == 0:
            phase = "prefill"
        else:
            return  # the decode prompts' own prefills
        state["calls"].setdefault(phase, []).append((elapsed, cpu))

    def step_with_threads(*args, **kwargs):
        if state["mode"] == "gdn-1":
            kwargs["threads"] = 1
        return step(*args, **kwargs)

    gdn_attention._cpu_gdn_attention_nonspec = timed
    gdn.torch.fused_gdn_step = step_with_threads
    worker._gdn_threads_bench = state


def _worker_info(worker):
    import torch

    import gdn
    import gdn.vllm
    state = worker._gdn_threads_bench
    env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "KMP_AFFINITY",
                                          "KMP_BLOCKTIME", "OMP_PLACES", "OMP_WAIT_POLICY",
                                          "GOMP_SPINCOUNT", "LD_PRELOAD")}
    return dict(pid=os.getpid(), main_tid=state["main"], torch_threads=torch.get_num_threads(),
                threads=_threads(),
                main_cpus=sorted(os.sched_getaffinity(0)), env=env, isa=gdn.cpu_isa(),
                plugin=gdn.vllm._state.get("threads"))


def _use_team(mode):
    """gdn-N runs gdn's calls on torch's OpenMP team (the plugin's choice); the other modes on
    gdn's pool (a gdn without run_on_torch_threads has only the pool)."""
    import gdn.torch
    if hasattr(gdn.torch, "run_on_torch_threads"):
        gdn.torch.run_on_torch_threads(mode == "gdn-N")


def _worker_mode(worker, mode):
    import gdn
    import gdn.vllm
    state = worker._gdn_threads_bench
    state["mode"], state["calls"] = mode, {}
    gdn.vllm.set_enabled(mode != "vllm")
    _use_team(mode)
    main_cpus = os.sched_getaffinity(0)
    if hasattr(gdn, "set_pool_cpus"):
        if mode == "gdn-N-inherit":
            gdn.set_pool_cpus(sorted(main_cpus))
        else:
            from gdn.vllm import _threads as placement
            placement.place_pool()
    else:  # a gdn without set_pool_cpus: its pool threads are placed from here
        threads = _threads()
        bound = set()
        for name, cpus, _, _ in threads.values():
            bound |= _cpu_set(cpus)
        other = bound - main_cpus
        for tid, (name, *_rest) in threads.items():
            if name == "gdn-worker":
                os.sched_setaffinity(tid, main_cpus if mode == "gdn-N-inherit" or not other
                                     else other)
    state["before"] = _threads()
    return None


def _worker_result(worker):
    state = worker._gdn_threads_bench
    after = _threads()
    before = state["before"]
    used = {tid: (name, cpus, (ns - before[tid][2]) / 1e6 if tid in before else ns / 1e6, last)
            for tid, (name, cpus, ns, last) in after.items()}
    return dict(calls=state["calls"], threads=used, main=state["main"])


def _worker_layer_loop(worker, modes, reps, prefill_tokens, decode_seqs, matmul):
    """The plugin's layer call on the worker's first GDN layer and pools, in a loop inside the
    worker (no engine step between calls): per rep and case, one call per mode in turn, each
    after a torch matmul the size of the layer's input projection when `matmul` (the layer's
    real predecessor: the worker's OpenMP threads have just run a parallel region and spin)."""
    import types

    import torch

    import gdn
    import gdn.vllm
    from gdn.vllm import _layer
    from gdn.vllm import _threads as placement
    layer = next(m for m in worker.model_runner.model.modules()
                 if type(m).__name__ == "QwenGatedDeltaNetAttention")
    hk, hv = layer.num_k_heads // layer.tp_size, layer.num_v_heads // layer.tp_size
    dk, dv = layer.head_k_dim, layer.head_v_dim
    width = 2 * hk * dk + hv * dv
    g = torch.Generator().manual_seed(0)
    # float32: what matters is the OpenMP region before the call, not the projection's dtype
    weight = torch.randn(layer.hidden_size, width + hv * dv, generator=g)
    worker._gdn_threads_bench["mode"] = "layer-loop"  # its step wrapper leaves threads alone
    cases = {}
    for case, lengths in (("prefill", [prefill_tokens]), ("decode", [1] * decode_seqs)):
        n, tokens = len(lengths), sum(lengths)
        cu = [0]
        for length in lengths:
            cu.append(cu[-1] + length)
        decodes = n if case == "decode" else 0
        md = types.SimpleNamespace(
            num_decodes=decodes, num_decode_tokens=tokens if decodes else 0,
            num_prefills=n - decodes, num_prefill_tokens=0 if decodes else tokens,
            non_spec_state_indices_tensor=torch.arange(1, n + 1, dtype=torch.int32),
            non_spec_query_start_loc=torch.tensor(cu, dtype=torch.int32),
            has_initial_state=None if decodes else torch.zeros(n, dtype=torch.bool),
            spec_sequence_masks=None, num_accepted_tokens=None)
        x = torch.randn(tokens, weight.shape[0], generator=g)
        qkv = (torch.randn(tokens, width, generator=g) * 0.5).bfloat16()
        b, a = (torch.randn(tokens, hv, generator=g).bfloat16() for _ in range(2))
        out = torch.empty(tokens, hv, dv, dtype=torch.bfloat16)
        cases[case] = (md, x, qkv, b, a, out)
    main_cpus = sorted(os.sched_getaffinity(0))
    times = {(m, c): [] for m in modes for c in cases}
    helper_ms = {}

    # the pool's threads, started by the engine's rounds (2-thread calls) before this loop, and
    # vLLM's other OpenMP threads (named as the main thread, which is OpenMP's thread 0): the CPU
    # time each group spends during a GDN call says whether they shared the helper's core then
    threads_now = _threads()
    main = worker._gdn_threads_bench["main"]
    helpers = [tid for tid, t in threads_now.items() if t[0] == "gdn-worker"]
    omp = [tid for tid, t in threads_now.items()
           if t[0] == threads_now[main][0] and tid != main]

    def cpu_ns(tids):
        total = 0
        for tid in tids:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total
    for rep in range(reps):
        for mode in (modes if rep % 2 == 0 else modes[::-1]):
            _use_team(mode)
            if mode == "gdn-N-inherit":
                gdn.set_pool_cpus(main_cpus)
            else:
                placement.place_pool()
            threads = 1 if mode == "gdn-1" else torch.get_num_threads()
            for case, (md, x, qkv, b, a, out) in cases.items():
                if matmul:
                    torch.mm(x, weight)
                h0, o0 = cpu_ns(helpers), cpu_ns(omp)
                start, cpu = time.perf_counter(), time.thread_time()
                _layer_run_with_threads(_layer, gdn, layer, md, qkv, b, a, out, threads)
                times[(mode, case)].append((time.perf_counter() - start,
                                            time.thread_time() - cpu))
                h, o = helper_ms.get((mode, case), (0.0, 0.0))
                helper_ms[(mode, case)] = (h + (cpu_ns(helpers) - h0) / 1e6,
                                           o + (cpu_ns(omp) - o0) / 1e6)
    return {f"{m}|{c}": dict(wall=[t[0] for t in v], cpu=[t[1] for t in v],
                             helper_ms=helper_ms[(m, c)][0] / len(v),
                             omp_ms=helper_ms[(m, c)][1] / len(v))
            for (m, c), v in times.items()}


def _layer_run_with_threads(_layer, gdn, layer, md, qkv, b, a, out, threads):
    step = gdn.torch.fused_gdn_step
    try:
        gdn.torch.fused_gdn_step = lambda *args, **kw: step(*args, **dict(kw, threads=threads))
        _layer.run(layer, md, qkv, b, a, out)
    finally:
        gdn.torch.fused_gdn_step = step


# --- the driver ---

def _threads_table(threads):
    """[(name, allowed CPUs, last CPU, count)] of a _threads() result."""
    rows = {}
    for name, cpus, _, last in threads.values():
        key = (name, cpus, last)
        rows[key] = rows.get(key, 0) + 1
    return sorted((*k, n) for k, n in rows.items())


def run_round(llm, args, prompts_prefill, prompts_decode):
    """The engine's wall seconds for the prefill request and for the decode requests (whole
    steps: projections, attention, MoE and vLLM's scheduling with the GDN calls)."""
    import vllm
    params = vllm.SamplingParams(temperature=0, max_tokens=1, detokenize=False, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts_prefill, params, use_tqdm=False)
    prefill = time.perf_counter() - start
    params = vllm.SamplingParams(temperature=0, max_tokens=args.decode_steps, detokenize=False,
                                 ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts_decode, params, use_tqdm=False)
    return prefill, time.perf_counter() - start


def main(argv=None):
    args = parse_args(argv)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc of the functions above
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.bind
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the results
    import vllm
    from vllm.inputs import TokensPrompt

    with tempfile.TemporaryDirectory() as tmp:
        log(f"building the model (hidden {args.hidden}, {args.gdn_layers} GDN layers)")
        build_model(tmp, args.hidden, args.gdn_layers)
        batched = max(args.prefill, args.decode_seqs)
        llm = vllm.LLM(model=tmp, dtype="bfloat16", skip_tokenizer_init=True, seed=0,
                       max_model_len=args.prefill + args.decode_steps + 8,
                       max_num_batched_tokens=batched, max_num_seqs=max(args.decode_seqs, 1),
                       enable_prefix_caching=False, enforce_eager=True)
        try:
            llm.collective_rpc(_worker_setup, args=(args.prefill,))
            prefill = [TokensPrompt(prompt_token_ids=[(7 * i + 3) % 256
                                                      for i in range(args.prefill)])]
            decode = [TokensPrompt(prompt_token_ids=[(5 * i + j) % 256 for i in range(4)])
                      for j in range(args.decode_seqs)]
            start = time.perf_counter()
            run_round(llm, args, prefill, decode)  # warm-up
            log(f"warm-up round: {time.perf_counter() - start:.1f} s")
            info = llm.collective_rpc(_worker_info)[0]
            log("worker: " + json.dumps(info))
            log("threads after the warm-up: " + json.dumps(_threads_table(info["threads"])))
            rows = {m: {"prefill": [], "decode": [], "prefill_cpu": [], "decode_cpu": [],
                        "threads": [], "engine": []} for m in args.modes}
            for r in range(args.rounds):
                order = args.modes if r % 2 == 0 else args.modes[::-1]
                for mode in order:
                    llm.collective_rpc(_worker_mode, args=(mode,))
                    rows[mode]["engine"].append(run_round(llm, args, prefill, decode))
                    res = llm.collective_rpc(_worker_result)[0]
                    for phase in ("prefill", "decode"):
                        calls = res["calls"].get(phase, [])
                        if calls:
                            rows[mode][phase].append(1e3 * statistics.mean(c[0] for c in calls))
                            rows[mode][phase + "_cpu"].append(
                                1e3 * statistics.mean(c[1] for c in calls))
                    rows[mode]["threads"].append(res["threads"])
                    log(f"round {r} {mode}: " + ", ".join(
                        f"{p} {rows[mode][p][-1]:.3f} ms" for p in ("prefill", "decode")
                        if rows[mode][p]))
            layer_rows = {}
            if args.layer_reps:
                modes = [m for m in args.modes if m != "vllm"]
                for matmul in (True, False):
                    log(f"layer loop, after a matmul: {matmul}")
                    layer_rows[matmul] = llm.collective_rpc(
                        _worker_layer_loop, args=(modes, args.layer_reps, args.prefill,
                                                  args.decode_seqs, matmul))[0]
        finally:
            llm.llm_engine.engine_core.shutdown()

    host = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                host = line.split(":", 1)[1].strip()
                break
    print(f"host: {host}, {os.cpu_count()} CPUs; load average {os.getloadavg()}")
    print(f"worker: torch threads {info['torch_threads']}, main thread's CPUs "
          f"{info['main_cpus']}, env {info['env']}, gdn variant {info['isa']}")
    print(f"GDN layer call (median of {args.rounds} rounds' means, min-max), wall ms and the "
          f"calling thread's CPU ms; prefill: one prompt of {args.prefill} tokens, decode: "
          f"{args.decode_seqs} sequences; engine: the requests' wall time (median); threads: "
          f"CPU ms per round by thread name and CPUs")
    for mode in args.modes:
        row = {"mode": mode}
        for phase in ("prefill", "decode"):
            v, c = rows[mode][phase], rows[mode][phase + "_cpu"]
            row[phase] = (statistics.median(v), min(v), max(v), statistics.median(c)) if v else None
        groups = {}
        for used in rows[mode]["threads"]:
            per_round = {}
            for name, cpus, ms, _ in used.values():
                if name.startswith(("gloo", "pt_gloo")):
                    name = "gloo"
                per_round[(name, cpus)] = per_round.get((name, cpus), 0.0) + ms
            for key, ms in per_round.items():
                groups.setdefault(key, []).append(ms)
        row["engine_s"] = [statistics.median(r[i] for r in rows[mode]["engine"])
                           for i in (0, 1)]
        row["threads"] = {f"{name} on {cpus}": round(statistics.median(ms), 1)
                          for (name, cpus), ms in sorted(groups.items())
                          if statistics.median(ms) >= 1.0}
        if args.json:
            print(json.dumps(row))
            continue
        cells = [f"{p} {row[p][0]:8.2f} ({row[p][1]:.2f}-{row[p][2]:.2f}) cpu {row[p][3]:.2f}"
                 for p in ("prefill", "decode") if row[p]]
        print(f"  {mode:14s} " + "  ".join(cells))
        print(f"  {'':14s} engine: prefill request {row['engine_s'][0]:.3f} s, decode requests "
              f"{row['engine_s'][1]:.3f} s")
        print(f"  {'':14s} threads: " + ", ".join(f"{k} {v}" for k, v in row["threads"].items()))
    for matmul, result in layer_rows.items():
        print(f"The plugin's layer call in a loop inside the worker, "
              f"{'each after' if matmul else 'without'} a torch matmul the size of the input "
              f"projection; {args.layer_reps} reps, modes alternating; median (min) wall ms, "
              f"median calling thread's CPU ms; CPU ms per call of gdn's helpers and of vLLM's "
              f"other OpenMP threads")
        for key, r in result.items():
            mode, case = key.split("|")
            row = dict(loop="after matmul" if matmul else "alone", mode=mode, case=case,
                       wall_ms=1e3 * statistics.median(r["wall"]), min_ms=1e3 * min(r["wall"]),
                       cpu_ms=1e3 * statistics.median(r["cpu"]), helper_ms=r["helper_ms"],
                       omp_ms=r["omp_ms"])
            if args.json:
                print(json.dumps(row))
            else:
                print(f"  {mode:14s} {case:8s} {row['wall_ms']:8.2f} ({row['min_ms']:.2f})  "
                      f"cpu {row['cpu_ms']:.2f}  helpers {row['helper_ms']:.2f}  "
                      f"omp {row['omp_ms']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
