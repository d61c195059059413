"""The seed's latency and memory table for gdn.jax.nn's GatedDeltaNet block (Qwen3-Next layer
shape: hidden 2048, Hk 16, Hv 32, Dk = Dv = 128, K = 4) at 8192 and 65536 tokens: forward, and
forward + backward under each residual choice (all residuals saved, T^-1 only, full remat),
beside the same block on the pure-JAX chunked op (bench/jax_chunked.py, JAX's autodiff for its
backward) where it fits.

Examples:
  .venv/bin/python bench/jax_nn_bench.py                       # 8192 and 65536 tokens
  .venv/bin/python bench/jax_nn_bench.py --seq 8192 --repeats 3
  .venv/bin/python bench/jax_nn_bench.py --seq 65536 --passes fwd+bwd --residuals none --no-baseline
  .venv/bin/python bench/jax_nn_bench.py --svg docs/img/jax_nn_bench.svg

Each row runs in two processes. Latency: the median of --repeats runs after a warm-up
(compile). Peak memory, measured: the call compiled ahead, then run once with glibc's mmap
threshold at 64 KiB (MALLOC_MMAP_THRESHOLD_), so every large buffer, XLA's and the C++ op's,
is mapped when allocated and unmapped when freed; the rise of the process's peak resident set
(VmHWM, reset through /proc/self/clear_refs) over its resident set before the run counts
what the call allocates (activations, residuals, temporaries, outputs), not the inputs,
parameters or compiled code.
"kept" is what the forward holds for the backward (the bytes of the distinct residual arrays
of ``jax.vjp`` of the forward, the inputs and parameters themselves excepted; with --dtype
bfloat16 their bf16 copies count): what the remat choice changes, and
what each further layer of a deep model adds to its peak, while one block's own peak is its
backward's working set.
A row runs only where its peak, extrapolated linearly in T from the same row at the smallest
--seq, fits in --budget (gdn) or --baseline-budget (pure JAX) GiB, 14 each by default; the
table names the rows that would not fit and what they would need. gdn's 65536-token forward +
backward rows peak at about 19 GiB: --budget 22 runs them on a 24 GiB machine.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

SHAPE = dict(hidden_size=2048, num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128)
# The remat choices of a training step: every activation and both gdn residuals saved; T^-1
# only (the C++ backward rebuilds the chunk states); full remat (jax.checkpoint of the block
# with nothing saveable: the backward re-runs the block's forward, gdn's op keeping nothing).
RESIDUALS = {"all": "all saved", "t_inv": "T^-1 only", "none": "full remat"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--seq", default="8192,65536", help="comma list of token counts (8192,65536)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per row (3)")
    p.add_argument("--passes", default="fwd,fwd+bwd", help="comma list of fwd, fwd+bwd")
    p.add_argument("--residuals", default="all,t_inv,none",
                   help="comma list of the forward + backward rows' residual choices: all (all "
                        "saved), t_inv (T^-1 only), none (full remat) (all,t_inv,none)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the block's dtype: float32, or bfloat16 (hybrid precision) (float32)")
    p.add_argument("--no-baseline", action="store_true", help="skip the pure-JAX block")
    p.add_argument("--budget", type=float, default=14.0,
                   help="GiB a gdn row may take (14): rows predicted above it are not run")
    p.add_argument("--baseline-budget", type=float, default=14.0,
                   help="GiB the pure-JAX block may take (14)")
    p.add_argument("--svg", help="also write a plot of the table to this file")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        args.seq = [int(s) for s in args.seq.split(",")]
    except ValueError:
        p.error(f"--seq: expected a comma list of token counts, given {args.seq!r}")
    if not args.seq or min(args.seq) < 1 or args.repeats < 1:
        p.error("--seq and --repeats must be positive")
    args.residuals = args.residuals.split(",")
    if not args.residuals or not set(args.residuals) <= set(RESIDUALS):
        p.error(f"--residuals: expected a comma list of {', '.join(RESIDUALS)}, given "
                f"{','.join(args.residuals)!r}")
    args.passes = args.passes.split(",")
    if not args.passes or not set(args.passes) <= {"fwd", "fwd+bwd"}:
        p.error(f"--passes: expected a comma list of fwd, fwd+bwd, given {','.join(args.passes)!r}")
    return args


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak():
    """Frees what malloc holds, then makes VmHWM restart from the current resident set."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def worker(cfg):
    """One row: prints {"ms": ..., "peak_bytes": ...} as JSON."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import jax_chunked
    from gdn.jax import nn

    bcfg = nn.GatedDeltaNetConfig(**SHAPE)
    params = nn.init_params(jax.random.PRNGKey(0), bcfg)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, cfg["seq"], SHAPE["hidden_size"])),
                    jnp.float32)
    dtype = jnp.bfloat16 if cfg["dtype"] == "bfloat16" else None
    block = nn.gated_delta_net if cfg["impl"] == "gdn" else jax_chunked.reference_block
    kw = dict(dtype=dtype) if cfg["impl"] != "gdn" else dict(dtype=dtype,
                                                              residuals=cfg["residuals"])

    def forward(p, x):
        return block(p, x, bcfg, **kw)

    if cfg["residuals"] == "none":
        forward = jax.checkpoint(forward, policy=jax.checkpoint_policies.nothing_saveable)

    if cfg["pass"] == "fwd":
        fn = jax.jit(forward)
    else:
        fn = jax.jit(jax.grad(lambda p, x: jnp.sum(forward(p, x).astype(jnp.float32) ** 2),
                              argnums=(0, 1)))
    if cfg["measure"] == "memory":
        # Compiled ahead, then one run: with glibc's mmap threshold at 64 KiB (set by
        # run_row) every large buffer is mapped when allocated and unmapped when freed, so the
        # peak resident set counts exactly what was live at once.
        compiled = fn.lower(params, x).compile()
        _reset_peak()
        before = _status("VmRSS")
        jax.block_until_ready(compiled(params, x))
        result = {"peak_bytes": _status("VmHWM") - before}
        if cfg["pass"] != "fwd":
            # What the forward keeps for the backward: the residual arrays of a VJP of the
            # forward (inputs and parameters excepted), what each further layer adds.
            _, vjp_fn = jax.vjp(jax.jit(forward), params, x)
            inputs = {id(a) for a in jax.tree_util.tree_leaves((params, x))}
            kept = {id(a): a for a in jax.tree_util.tree_leaves(vjp_fn)
                    if hasattr(a, "nbytes") and id(a) not in inputs}
            result["kept_bytes"] = sum(a.nbytes for a in kept.values())
    else:
        jax.block_until_ready(fn(params, x))  # compile and warm up
        times = []
        for _ in range(cfg["repeats"]):
            start = time.perf_counter()
            jax.block_until_ready(fn(params, x))
            times.append(time.perf_counter() - start)
        result = {"ms": 1e3 * statistics.median(times)}
    print(json.dumps(result), flush=True)


def run_row(cfg):
    """Latency (default allocator) and memory (mmap threshold 64 KiB), each in its own
    process."""
    result = {}
    for measure, env in (("latency", {}), ("memory", {"MALLOC_MMAP_THRESHOLD_": "65536"})):
        got = _run_worker(dict(cfg, measure=measure), env)
        if "error" in got:
            return got
        result.update(got)
    return result


def _run_worker(cfg, env):
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cfg)],
                          capture_output=True, text=True, env=dict(os.environ, **env))
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["killed"])[-1][:200]}
    return json.loads(lines[-1])


def svg_plot(rows, path):
    """Grouped bars: latency (left) and peak memory (right) per row, gdn and pure JAX."""
    shown = [r for r in rows if "ms" in r]
    width, bar, gap, height = 960, 14, 10, 300
    top, left = 40, 250
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{top + len(shown) * (bar + gap) + 40}" font-family="sans-serif" '
           f'font-size="12">',
           f'<text x="10" y="20" font-size="14">gdn.jax.nn block, Qwen3-Next shape: latency '
           f'(s) and peak memory (GiB) beyond inputs</text>']
    max_s = max(r["ms"] for r in shown) / 1e3
    max_g = max(r["peak_bytes"] for r in shown) / 2 ** 30
    half = (width - left - 40) / 2
    for i, r in enumerate(shown):
        y = top + i * (bar + gap)
        colour = "#1f77b4" if r["impl"] == "gdn" else "#d62728"
        label = f'{r["seq"]} {r["pass"]} {r["label"]}'
        s, g = r["ms"] / 1e3, r["peak_bytes"] / 2 ** 30
        out += [f'<text x="10" y="{y + bar - 2}">{label}</text>',
                f'<rect x="{left}" y="{y}" width="{max(1, s / max_s * (half - 60)):.1f}" '
                f'height="{bar}" fill="{colour}"/>',
                f'<text x="{left + s / max_s * (half - 60) + 4:.1f}" y="{y + bar - 2}">'
                f'{s:.1f} s</text>',
                f'<rect x="{left + half}" y="{y}" width="{max(1, g / max_g * (half - 60)):.1f}" '
                f'height="{bar}" fill="{colour}" opacity="0.6"/>',
                f'<text x="{left + half + g / max_g * (half - 60) + 4:.1f}" y="{y + bar - 2}">'
                f'{g:.2f} GiB</text>']
    y = top + len(shown) * (bar + gap) + 20
    out += [f'<rect x="{left}" y="{y - 10}" width="12" height="12" fill="#1f77b4"/>',
            f'<text x="{left + 16}" y="{y}">gdn (C++ kernels)</text>',
            f'<rect x="{left + 160}" y="{y - 10}" width="12" height="12" fill="#d62728"/>',
            f'<text x="{left + 176}" y="{y}">pure-JAX chunked op</text>', "</svg>"]
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    rows = []
    base_bytes_per_token = {}
    print(f"gdn.jax.nn block, hidden {SHAPE['hidden_size']}, Hk {SHAPE['num_k_heads']}, "
          f"Hv {SHAPE['num_v_heads']}, Dk {SHAPE['head_k_dim']}, Dv {SHAPE['head_v_dim']}, "
          f"{args.dtype}; latency median of {args.repeats}, peak memory beyond inputs",
          flush=True)
    print(f"{'tokens':>7} {'pass':8} {'op':6} {'residuals':16} {'latency s':>10} "
          f"{'peak GiB':>9} {'kept GiB':>9}", flush=True)
    plans = []
    for seq in sorted(args.seq):
        for pss in args.passes:
            for res in (("all",) if pss == "fwd" else tuple(args.residuals)):
                plans.append(dict(seq=seq, impl="gdn", residuals=res, label=RESIDUALS[res]
                                  if pss != "fwd" else "", **{"pass": pss}))
            if not args.no_baseline:
                for res in (("all",) if pss == "fwd" else
                            tuple(r for r in ("all", "none") if r in args.residuals)):
                    plans.append(dict(seq=seq, impl="jax", residuals=res,
                                      label=RESIDUALS[res] if pss != "fwd" else "",
                                      **{"pass": pss}))
    for plan in plans:
        cfg = dict(plan, repeats=args.repeats, dtype=args.dtype)
        key = (plan["impl"], plan["pass"], plan["residuals"])
        budget = args.budget if plan["impl"] == "gdn" else args.baseline_budget
        if key in base_bytes_per_token:
            predicted = base_bytes_per_token[key] * plan["seq"] / 2 ** 30
            if predicted > budget:
                row = dict(plan, skipped=f"needs about {predicted:.1f} GiB (linear in T from "
                                         f"{min(args.seq)} tokens) > {budget:g}")
                rows.append(row)
                print(f"{plan['seq']:7d} {plan['pass']:8} {plan['impl']:6} "
                      f"{plan['label']:16}   not run: {row['skipped']}", flush=True)
                continue
        result = run_row(cfg)
        row = dict(plan, **result)
        rows.append(row)
        if "error" in row:
            print(f"{plan['seq']:7d} {plan['pass']:8} {plan['impl']:6} {plan['label']:16} "
                  f"  failed: {row['error']}", flush=True)
            continue
        base_bytes_per_token.setdefault(key, row["peak_bytes"] / plan["seq"])
        kept = f"{row['kept_bytes'] / 2 ** 30:9.2f}" if "kept_bytes" in row else f"{'':9}"
        print(f"{plan['seq']:7d} {plan['pass']:8} {plan['impl']:6} {plan['label']:16} "
              f"{row['ms'] / 1e3:10.2f} {row['peak_bytes'] / 2 ** 30:9.2f} {kept}", flush=True)
    if args.svg:
        svg_plot(rows, args.svg)
        print(f"wrote {args.svg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
