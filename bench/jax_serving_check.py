"""Times what gdn.jax.fused_conv1d_gdn's host check of its index values costs a serving step:
the serving call as it is (the check on the host, then the jitted, donating step) against the
jitted step alone (the call before the check existed), alternating in the same run, on decode
batches at the Qwen3-Next shape (n_kq 16, n_v 32, d_k = d_v 128, K 4, float32 pools).

Examples:
  .venv/bin/python bench/jax_serving_check.py                  # decode-1 and decode-64
  .venv/bin/python bench/jax_serving_check.py --batch 1 8 --rounds 400 --index numpy
  .venv/bin/python bench/jax_serving_check.py --threads 1           # steadier on a busy host

Each round times one call of each (in alternating order), each call waited for
(block_until_ready), the pools donated and fed back as an engine does. --index says where the
index arrays live: "jax" (device arrays made once, the check reads them back) or "numpy" (host
arrays, as an engine builds them; the jitted step copies them in). Prints the median and
spread of each and the median of the per-round differences.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import gdn.jax
from gdn.jax import _serving

SHAPE = dict(n_kq=16, n_v=32, d_k=128, d_v=128, kernel_size=4)


def make_step(n: int, slots: int, index: str):
    hk, hv, dk, dv, k = (SHAPE[x] for x in ("n_kq", "n_v", "d_k", "d_v", "kernel_size"))
    d = 2 * hk * dk + hv * dv
    rng = np.random.default_rng(0)
    f32 = lambda *s, scale=1.0: jnp.asarray(scale * rng.standard_normal(s), jnp.float32)  # noqa
    args = dict(qkv=f32(n, d), b=f32(n, hv), a=f32(n, hv), conv_weight=f32(d, 1, k, scale=0.3),
                conv_bias=None, a_log=f32(hv, scale=0.5), dt_bias=f32(hv, scale=0.1))
    host = dict(query_start_loc=np.arange(n + 1), state_indices=np.arange(1, n + 1),
                distribution=np.array([n, n, n]), seq_lens=np.full(n, 100))
    conv = jnp.zeros((slots, k - 1, d), jnp.float32)
    rec = jnp.zeros((slots, hv, dk, dv), jnp.float32)
    wrap = (lambda x: jnp.asarray(x, jnp.int32)) if index == "jax" else (
        lambda x: x.astype(np.int32))
    args.update({name: wrap(x) for name, x in host.items()})
    return args, [conv, rec]


def call(fn, args, pools, threads):
    (conv, rec), out = fn(args["qkv"], args["b"], args["a"], pools[0], pools[1],
                          args["conv_weight"], args["conv_bias"], args["a_log"],
                          args["dt_bias"], args["query_start_loc"], args["state_indices"],
                          args["distribution"], args["seq_lens"], threads=threads, **SHAPE)
    jax.block_until_ready(out)
    pools[:] = [conv, rec]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64], help="decodes per step")
    p.add_argument("--rounds", type=int, default=300, help="timed rounds (300)")
    p.add_argument("--threads", type=int, default=0,
                   help="the step's threads (0 = all; 1 is steadier on a busy host)")
    p.add_argument("--index", choices=("jax", "numpy"), default="jax",
                   help="index arrays as JAX device arrays or NumPy host arrays (jax)")
    args = p.parse_args(argv)
    fns = {"jit alone": _serving._step, "check + jit": gdn.jax.fused_conv1d_gdn}
    for n in args.batch:
        step_args, pools = make_step(n, n + 1, args.index)
        for fn in fns.values():
            for _ in range(20):
                call(fn, step_args, pools, args.threads)
        times = {name: [] for name in fns}
        order = list(fns.items())
        for r in range(args.rounds):
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                start = time.perf_counter()
                call(fn, step_args, pools, args.threads)
                times[name].append(time.perf_counter() - start)
        diffs = [a - b for a, b in zip(times["check + jit"], times["jit alone"])]
        print(f"decode-{n} ({args.index} index arrays, threads {args.threads}, "
              f"{args.rounds} rounds):")
        for name, t in times.items():
            q = statistics.quantiles(t, n=10)
            print(f"  {name:12s} median {1e6 * statistics.median(t):8.1f} us  "
                  f"(p10 {1e6 * q[0]:8.1f}, p90 {1e6 * q[-1]:8.1f})")
        print(f"  added by the check: median {1e6 * statistics.median(diffs):6.1f} us per step "
              f"({100 * statistics.median(diffs) / statistics.median(times['jit alone']):.1f} %)")


if __name__ == "__main__":
    main()
