"""Times gdn.jax under jax.jit against the same C++ op called directly (what the custom call
adds) and against the chunked gated delta rule in plain JAX (bench/jax_chunked.py), at the
Qwen3-Next shape: the core op and the layer op, forward and forward + backward, on one thread
and on all, in one run. Checks gdn.jax's forward against the JAX baseline first.

Examples:
  .venv/bin/python bench/jax_bench.py                    # 8192 tokens, 1 thread and all
  .venv/bin/python bench/jax_bench.py --seq 2048 --threads 1 --ops core
  .venv/bin/python bench/jax_bench.py --no-baseline      # gdn.jax and C++ only (fast)
  .venv/bin/python bench/jax_bench.py --no-baseline --small-pages --threads 1 --ops core
  .venv/bin/python bench/jax_bench.py --no-baseline --threads 1,2 --runs 3   # the 3 % target

The C++ op's inputs are the library's own tensors, which get transparent huge pages; XLA's
input buffers are in 4 KiB pages where THP is `madvise`. --small-pages also times the C++ op on
copies of its inputs in 4 KiB pages, in the same alternating rounds, and prints the custom
call's overhead against both (docs/perf_frameworks.md).

Each thread setting runs in its own process, pinned to that many CPUs (XLA sizes its intra-op
pool from the CPUs a process may run on, when its client starts): gdn.jax's calls take their
helpers from XLA's pool (docs/jax.md, "Threads"), the C++ op called directly from gdn's own
pool (OMP_NUM_THREADS set to the count). One thread also turns XLA's multi-threaded Eigen off;
"all" is the defaults, unpinned. Times are medians over --repeats runs after a warm-up (the JAX
baseline's forward + backward at 8k takes about 20 s a run on one core: --baseline-repeats).

"FFI +%" is the fastest gdn.jax round against the fastest C++ round of the same process (the
rounds alternate, so the host's noise falls on both alike). --runs N repeats every thread
setting's process N times, one run after the other, and prints each run's figure and whether
every run is within --target (the custom call adds at most 3 % by default).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SHAPE = dict(hk=16, hv=32, dk=128, dv=128)  # Qwen3-Next's GDN layer


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--seq", type=int, default=8192, help="tokens (default 8192)")
    p.add_argument("--threads", default="1,all", help="comma list of 1..N or 'all' (default 1,all)")
    p.add_argument("--ops", default="core,layer", help="comma list of core, layer")
    p.add_argument("--passes", default="fwd,fwd+bwd", help="comma list of fwd, fwd+bwd")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of gdn.jax and C++ (3)")
    p.add_argument("--baseline-repeats", type=int, default=1, help="timed runs of the JAX baseline (1)")
    p.add_argument("--no-baseline", action="store_true", help="skip the plain-JAX baseline")
    p.add_argument("--chunk-size", type=int, default=64, help="chunk size of all three (64)")
    p.add_argument("--small-pages", action="store_true",
                   help="also time the C++ op on inputs in 4 KiB pages, as XLA's are")
    p.add_argument("--runs", type=int, default=1,
                   help="processes per thread setting, one after the other (1)")
    p.add_argument("--target", type=float, default=3.0,
                   help="the custom call's overhead target in %% (3): each row says if every "
                        "run's \"FFI +%%\" is within it")
    p.add_argument("--json", action="store_true", help="print one JSON line per row instead")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, allowed in (("ops", {"core", "layer"}), ("passes", {"fwd", "fwd+bwd"})):
        values = getattr(args, name).split(",")
        if not values or not set(values) <= allowed:
            p.error(f"--{name}: expected a comma list of {sorted(allowed)}, given {getattr(args, name)!r}")
        setattr(args, name, values)
    for t in args.threads.split(","):
        if t != "all" and not (t.isdigit() and int(t) >= 1):
            p.error(f"--threads: expected a comma list of positive counts or 'all', given {args.threads!r}")
    if args.seq < 1 or args.repeats < 1 or args.baseline_repeats < 1 or args.runs < 1:
        p.error("--seq, --repeats, --baseline-repeats and --runs must be positive")
    return args


def median_seconds(fn, repeats):
    fn()  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def worker(args, threads):
    """One thread setting: prints a JSON line per (op, pass)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jax_chunked
    import gdn
    import gdn.jax

    t, c = args.seq, args.chunk_size
    hk, hv, dk, dv = SHAPE["hk"], SHAPE["hv"], SHAPE["dk"], SHAPE["dv"]
    d = 2 * hk * dk + hv * dv
    rng = np.random.default_rng(0)
    f32 = lambda *s, lo=-1.0, hi=1.0: jnp.asarray(rng.uniform(lo, hi, s), jnp.float32)  # noqa: E731
    core_in = (f32(1, t, hk, dk), f32(1, t, hk, dk), f32(1, t, hv, dv),
               f32(1, t, hv, lo=-1.0, hi=-0.01), f32(1, t, hv, lo=0.0, hi=1.0))
    layer_in = (f32(t, d), f32(t, hv), f32(t, hv), f32(d, 4, lo=-0.5, hi=0.5),
                f32(hv, lo=0.0, hi=2.7), f32(hv, lo=-0.1, hi=0.1))
    heads = dict(num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
    n_threads = 0 if threads == "all" else int(threads)

    def gdn_core(*x):
        return gdn.jax.chunk_gated_delta_rule(*x, use_qk_l2norm_in_kernel=True, chunk_size=c,
                                              threads=n_threads)[0]

    def base_core(*x):
        return jax_chunked.chunk_gated_delta_rule(*x, use_qk_l2norm_in_kernel=True,
                                                  chunk_size=c)[0]

    def gdn_layer(*x):
        return gdn.jax.fused_gdn(*x, **heads, chunk_size=c, threads=n_threads)[0]

    def base_layer(*x):
        return jax_chunked.fused_gdn(*x, **heads, chunk_size=c)

    ops = {"core": (gdn_core, base_core, core_in, gdn._gdn.time_core),
           "layer": (gdn_layer, base_layer, layer_in, gdn._gdn.time_layer)}
    for op in args.ops:
        fn, base, inputs, time_cxx = ops[op]
        if not args.no_baseline:  # validate before timing: the two forwards agree
            got, want = jax.jit(fn)(*inputs), jax.jit(base)(*inputs)
            err = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
            status = "PASS" if err < 1e-4 else "FAIL"
            print(f"check: {op} forward, gdn.jax vs plain JAX chunked: relative error {err:.2e} "
                  f"(tolerance 1e-04) {status}", file=sys.stderr, flush=True)
            if status == "FAIL":
                sys.exit(1)
        for pss in args.passes:
            backward = pss == "fwd+bwd"
            if backward:  # the forward keeping residuals, then the backward from a given d_o
                d_out = jnp.ones_like(jax.eval_shape(fn, *inputs))
                vjp = lambda f: jax.jit(  # noqa: E731
                    lambda d, *x: jax.vjp(f, *x)[1](d))
                run_gdn_vjp, run_base_vjp = vjp(fn), vjp(base)
                run_gdn = lambda *x: run_gdn_vjp(d_out, *x)  # noqa: E731
                run_base = lambda *x: run_base_vjp(d_out, *x)  # noqa: E731
            else:
                run_gdn, run_base = jax.jit(fn), jax.jit(base)
            row = dict(op=op, pass_=pss, threads=threads, tokens=t, **SHAPE, chunk=c)
            # gdn.jax and the C++ op alone in alternating rounds, so that the host's noise
            # falls on both alike; the minimum of each is the overhead's measure.
            jax.block_until_ready(run_gdn(*inputs))
            jax_s, cxx_s, small_s = [], [], []
            for _ in range(args.repeats):
                start = time.perf_counter()
                jax.block_until_ready(run_gdn(*inputs))
                jax_s.append(time.perf_counter() - start)
                # each round warms the C++ op up first, as the JAX call is warm: its memory
                # comes back from the allocator already faulted in
                cxx_s += time_cxx(t, hk, hv, dk, dv, backward, c, n_threads, 1, True)
                if args.small_pages:
                    small_s += time_cxx(t, hk, hv, dk, dv, backward, c, n_threads, 1, True,
                                        small_pages=True)
            row["gdn_jax_ms"] = 1e3 * statistics.median(jax_s)
            row["cxx_ms"] = 1e3 * statistics.median(cxx_s)
            row["gdn_jax_min_ms"] = 1e3 * min(jax_s)
            row["cxx_min_ms"] = 1e3 * min(cxx_s)
            if small_s:
                row["cxx_small_pages_ms"] = 1e3 * statistics.median(small_s)
                row["cxx_small_pages_min_ms"] = 1e3 * min(small_s)
            if not args.no_baseline:
                row["jax_chunked_ms"] = 1e3 * median_seconds(
                    lambda: jax.block_until_ready(run_base(*inputs)), args.baseline_repeats)
            print(json.dumps(row), flush=True)


def run_setting(args, argv, threads):
    """One worker process for one thread setting: its rows."""
    env = dict(os.environ)
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--worker", threads]
    if threads != "all":
        n = int(threads)
        env["OMP_NUM_THREADS"] = str(n)
        if n == 1:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                                " --xla_cpu_multi_thread_eigen=false").strip()
        cores = sorted(os.sched_getaffinity(0))[:n]
        cmd = ["taskset", "-c", ",".join(map(str, cores)), *cmd]
    print(f"jax_bench: {threads} thread(s), {args.seq} tokens, Hk={SHAPE['hk']} "
          f"Hv={SHAPE['hv']} Dk={SHAPE['dk']} Dv={SHAPE['dv']}, float32 ...",
          file=sys.stderr, flush=True)
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def overhead(r, cxx_key="cxx_min_ms"):
    """What the custom call adds, in %: the fastest gdn.jax round against the fastest C++ one."""
    return 100 * (r["gdn_jax_min_ms"] / r[cxx_key] - 1)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        worker(args, args.worker)
        return
    rows = []
    for run in range(1, args.runs + 1):
        for threads in args.threads.split(","):
            rows += [dict(r, run=run) for r in run_setting(args, argv, threads)]
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    # One line per (op, pass, threads): ms are the median over runs of each run's median;
    # "FFI +%" each run's figure; "4K": the same against the C++ op on inputs in 4 KiB pages.
    groups = {}
    for r in rows:
        groups.setdefault((r["op"], r["pass_"], r["threads"]), []).append(r)
    small = args.small_pages
    ffi_width = max(7, 8 * args.runs - 1)
    print(f"{'op':6} {'pass':8} {'threads':>7} {'gdn.jax ms':>11} {'C++ ms':>9} "
          f"{'FFI +%':>{ffi_width}} {'<= ' + format(args.target, 'g') + ' %':>8}"
          + (f" {'C++ 4K ms':>10} {'FFI +% 4K':>{ffi_width}}" if small else "")
          + ("" if args.no_baseline else f" {'JAX chunked ms':>15} {'x gdn.jax':>10}"))
    met = 0
    for (op, pss, threads), runs in groups.items():
        med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
        figures = [overhead(r) for r in runs]
        within = all(f <= args.target for f in figures)
        met += within
        line = (f"{op:6} {pss:8} {threads:>7} {med('gdn_jax_ms'):11.1f} {med('cxx_ms'):9.1f} "
                f"{' '.join(f'{f:+6.1f}%' for f in figures):>{ffi_width}} "
                f"{'yes' if within else 'NO':>8}")
        if small:
            small_figures = " ".join(f"{overhead(r, 'cxx_small_pages_min_ms'):+6.1f}%"
                                     for r in runs)
            line += f" {med('cxx_small_pages_ms'):10.1f} {small_figures:>{ffi_width}}"
        if "jax_chunked_ms" in runs[0]:
            base = med("jax_chunked_ms")
            line += f" {base:15.1f} {base / med('gdn_jax_ms'):9.1f}x"
        print(line)
    print(f"target: the custom call adds at most {args.target:g} % (fastest rounds) in every run: "
          f"{met} of {len(groups)} rows")


if __name__ == "__main__":
    main()
