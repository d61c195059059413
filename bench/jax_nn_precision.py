"""Measures gdn.jax.nn's GatedDeltaNet block in hybrid precision (bf16 activations and matmul
operands, float32 parameters, state and gates) and in float32 against the same block in float64:
the output's and the A_log / dt_bias gradients' cosine and normwise relative error.

The block has Qwen3-Next's layer shape (hidden 2048, Hk 16, Hv 32, Dk = Dv = 128, conv K 4) and
gdn.jax.nn.init_params' weights (A = exp(A_log) uniform in [1, 16]: strong decay, as HF's
initialisation); one sequence of T tokens, x ~ N(0, 1), loss = <y, W> for a random W.

Examples:
  .venv/bin/python bench/jax_nn_precision.py                 # 8192 tokens
  .venv/bin/python bench/jax_nn_precision.py --seq 1024 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("Examples:")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=8192, help="tokens (default 8192)")
    parser.add_argument("--hidden", type=int, default=2048, help="hidden size (default 2048)")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    args = parser.parse_args(argv)

    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np

    from gdn.jax import nn

    cfg = nn.GatedDeltaNetConfig(hidden_size=args.hidden, num_k_heads=16, num_v_heads=32,
                                 head_k_dim=128, head_v_dim=128)
    params = nn.init_params(jax.random.PRNGKey(0), cfg)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, args.seq, args.hidden)).astype(np.float32)
    w = rng.standard_normal((1, args.seq, args.hidden)).astype(np.float32)

    def run(param_dtype, dtype):
        p = {k: v.astype(param_dtype) for k, v in params.items()}

        def loss(p, x, w):  # x and w as arguments: XLA would fold constants for minutes
            y = nn.gated_delta_net(p, x, cfg, dtype=dtype)
            return jnp.sum(y.astype(param_dtype) * w), y

        start = time.perf_counter()
        (_, y), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(
            p, jnp.asarray(x, param_dtype), jnp.asarray(w, param_dtype))
        jax.block_until_ready(g)
        print(f"jax_nn_precision: {jnp.dtype(dtype or param_dtype).name}: "
              f"{time.perf_counter() - start:.1f} s", file=sys.stderr)
        return np.asarray(y, np.float64), {k: np.asarray(v, np.float64) for k, v in g.items()}

    y64, g64 = run(jnp.float64, None)
    rows = []
    for name, (pd, dt) in (("float32", (jnp.float32, None)),
                           ("hybrid bf16", (jnp.float32, jnp.bfloat16))):
        y, g = run(pd, dt)
        for what, a, b in (("y", y, y64), ("d A_log", g["A_log"], g64["A_log"]),
                           ("d dt_bias", g["dt_bias"], g64["dt_bias"]),
                           ("d conv1d.weight", g["conv1d.weight"], g64["conv1d.weight"]),
                           ("d in_proj_qkvz.weight", g["in_proj_qkvz.weight"],
                            g64["in_proj_qkvz.weight"])):
            a, b = a.ravel(), b.ravel()
            cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
            rel = float(np.linalg.norm(a - b) / np.linalg.norm(b))
            rows.append(dict(precision=name, tokens=args.seq, value=what, cosine=cos,
                             relative_error=rel))
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print(f"{'precision':12} {'tokens':>6} {'value':22} {'cosine':>12} {'rel. error':>10}")
    for r in rows:
        print(f"{r['precision']:12} {r['tokens']:6d} {r['value']:22} {r['cosine']:12.8f} "
              f"{r['relative_error']:10.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
