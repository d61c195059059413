"""What context parallelism costs one device: gdn.jax's core op and layer op on one segment
(Qwen3-Next shape) with ``cp_axis`` against the same calls without it, forward and
forward + backward, in one run, interleaved. The segment runs inside ``jax.shard_map`` on a
one-device mesh: a device's local work (the widened call, the output correction, a fold of
one segment, and their backward) without the collectives. What P devices add is printed from
its formula, not timed: P - 1 more fold steps (forward FLOPs; the backward's as many again)
and the bytes of the all-gather.

Examples:
  .venv/bin/python bench/jax_cp_bench.py                     # 2048-token segment, all threads
  .venv/bin/python bench/jax_cp_bench.py --seq 4096 --threads 1 --devices 8

Times are medians over --repeats runs after a warm-up. --threads 1 runs XLA's CPU client on
one thread and sets OMP_NUM_THREADS=1 (pass it on the command line: it must be set before
JAX starts, so this script re-runs itself).
"""

from __future__ import annotations

import argparse
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
    p.add_argument("--seq", type=int, default=2048, help="tokens of one device's segment (2048)")
    p.add_argument("--devices", type=int, default=4,
                   help="P, for the printed fold FLOPs and all-gather bytes (4)")
    p.add_argument("--threads", default="all", help="1 or 'all' (default all)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs of each (5)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.seq < 1 or args.repeats < 1 or args.devices < 1:
        p.error("--seq, --devices and --repeats must be positive")
    if args.threads not in ("1", "all"):
        p.error(f"--threads: expected 1 or 'all', given {args.threads!r}")
    return args


def run(args):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, PartitionSpec as P

    import gdn.jax
    from gdn.jax import _cp

    hk, hv, dk, dv, t = SHAPE["hk"], SHAPE["hv"], SHAPE["dk"], SHAPE["dv"], args.seq
    rng = np.random.default_rng(0)
    f32 = lambda *s, scale=1.0: jnp.asarray(scale * rng.standard_normal(s), jnp.float32)  # noqa
    q, k, v = f32(1, t, hk, dk), f32(1, t, hk, dk), f32(1, t, hv, dv)
    g = jnp.asarray(-rng.uniform(0.01, 1.0, (1, t, hv)), jnp.float32)
    beta = jnp.asarray(rng.uniform(0.05, 1.0, (1, t, hv)), jnp.float32)
    channels = 2 * hk * dk + hv * dv
    qkv, a, b = f32(t, channels), f32(t, hv), f32(t, hv)
    w, A_log, dt_bias = f32(channels, 4, scale=0.5), f32(hv, scale=0.5), f32(hv, scale=0.5)
    heads = dict(num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
    mesh = jax.make_mesh((1,), ("cp",), axis_types=(AxisType.Auto,))

    def core(cp):
        def fn(q, k, v, g, beta):
            return gdn.jax.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,
                                                  use_qk_l2norm_in_kernel=True,
                                                  cp_axis="cp" if cp else None)
        spec = P(None, "cp")
        return jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * 5,
                             out_specs=(spec, P())) if cp else fn

    def layer(cp):
        def fn(qkv, a, b):
            return gdn.jax.fused_gdn(qkv, a, b, w, A_log, dt_bias, cp_axis="cp" if cp else None,
                                     **heads)
        return jax.shard_map(fn, mesh=mesh, in_specs=(P("cp"),) * 3,
                             out_specs=(P("cp"), P(), P())) if cp else fn

    def timed(fn, inputs, backward):
        if backward:
            loss = lambda *x: sum(jnp.sum(o) for o in fn(*x))  # noqa: E731
            call = jax.jit(jax.grad(loss, tuple(range(len(inputs)))))
        else:
            call = jax.jit(fn)
        return lambda: jax.block_until_ready(call(*inputs))

    rows = []
    for op, make, inputs in (("core", core, (q, k, v, g, beta)), ("layer", layer, (qkv, a, b))):
        for backward in (False, True):
            calls = {cp: timed(make(cp), inputs, backward) for cp in (False, True)}
            for c in calls.values():
                c()  # compile and warm up
            times = {False: [], True: []}
            for _ in range(args.repeats):  # interleaved: both see the same machine
                for cp, c in calls.items():
                    t0 = time.perf_counter()
                    c()
                    times[cp].append(time.perf_counter() - t0)
            plain, cp = (statistics.median(times[x]) for x in (False, True))
            rows.append((op, "fwd+bwd" if backward else "fwd", plain, cp))
    pdev = args.devices
    gathered = pdev * hv * dk * (dk + dv) * 4
    fold = (pdev - 1) * 2 * hv * dk * dk * dv
    print(f"segment {t} tokens, Hk {hk}, Hv {hv}, Dk {dk}, Dv {dv}, threads {args.threads}; "
          f"with P = {pdev} devices each also folds P - 1 more segments ({fold / 1e9:.2f} "
          f"GFLOP forward) and its all-gather brings {gathered / 2 ** 20:.1f} MiB ((M, E) of P "
          f"segments, float32; the backward's reduce-scatter as much)")
    print(f"{'op':6} {'pass':8} {'plain ms':>10} {'cp ms':>10} {'cp / plain':>11}")
    for op, kind, plain, cp in rows:
        print(f"{op:6} {kind:8} {plain * 1e3:10.1f} {cp * 1e3:10.1f} {cp / plain:11.2f}")
    return 0


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return run(args)
    env = dict(os.environ)
    if args.threads == "1":
        env["OMP_NUM_THREADS"] = "1"
        env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
    return subprocess.call([sys.executable, os.path.abspath(__file__), "--worker",
                            *(argv if argv is not None else sys.argv[1:])], env=env)


if __name__ == "__main__":
    sys.exit(main())
