"""Times jax.value_and_grad of a scan over gdn.jax.chunk_gated_delta_rule layers (MaxText's
scan_layers layout) under jax.checkpoint policies, with gdn's dead-code rule for its FFI calls
on and off (python/gdn/jax/_ffi.py: a replay computes only the results the backward reads),
at the Qwen3-Next shape, in one process, the timed runs interleaved.

Examples:
  .venv/bin/python bench/jax_remat_bench.py                     # 8192 tokens, 2 layers
  .venv/bin/python bench/jax_remat_bench.py --seq 2048 --layers 4 --repeats 3
  .venv/bin/python bench/jax_remat_bench.py --loop             # layers unrolled, no lax.scan

Each layer's output is the next layer's v (o feeds the model, as in a real stack); the loss
is the sum of the last output. Before timing, the gradients with the rule on and off are
checked to be the same bit for bit. Printed per policy and rule setting: what each gdn_forward call
of the compiled program asks for (o; S, the chunk states; T, T^-1), the median and minimum
time, and the rule's gain; then one forward call alone, asked for everything, for the
residuals only and for o only. The op runs on --threads threads (XLA's own ops on its
default pool). The compiled programs of a policy differ only in the calls' attributes; the
machine's noise shows in the no_checkpoint pair, the very same program twice.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

SHAPE = dict(hk=16, hv=32, dk=128, dv=128)  # Qwen3-Next's GDN layer


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--seq", type=int, default=8192, help="tokens (default 8192)")
    p.add_argument("--layers", type=int, default=2, help="layers in the scan (default 2)")
    p.add_argument("--threads", type=int, default=1, help="the op's threads, 0 = all (default 1)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs of each program (5)")
    p.add_argument("--loop", action="store_true",
                   help="unroll the layers in Python instead of lax.scan")
    args = p.parse_args(argv)
    for name in ("seq", "layers", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name}: expected an integer >= 1, given {getattr(args, name)}")
    if args.threads < 0:
        p.error(f"--threads: expected an integer >= 0, given {args.threads}")
    return args


def main(argv=None):
    args = parse_args(argv)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import checkpoint_policies

    import gdn.jax
    from gdn.jax import _ffi

    t, hk, hv, dk, dv = args.seq, SHAPE["hk"], SHAPE["hv"], SHAPE["dk"], SHAPE["dv"]
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((1, t, hk, dk), np.float32))
    k = jnp.asarray(rng.standard_normal((1, t, hk, dk), np.float32))
    v = jnp.asarray(0.5 * rng.standard_normal((1, t, hv, dv), np.float32))
    g = jnp.asarray(-0.1 * np.log1p(np.exp(rng.standard_normal((1, t, hv)))), jnp.float32)
    beta = jnp.asarray(1 / (1 + np.exp(-rng.standard_normal((1, t, hv)))), jnp.float32)
    scales = jnp.linspace(0.5, 1.5, args.layers, dtype=jnp.float32)
    policies = {
        "no_checkpoint": None,
        "output_kept": checkpoint_policies.save_only_these_names(gdn.jax.OUTPUT_NAME),
        "full_remat": checkpoint_policies.nothing_saveable,
    }
    rule = _ffi.pe.dce_rules[_ffi.FFI_CALL]
    programs = {}  # (policy, rule on) -> (compiled, calls); (call, None) -> (compiled, operands)
    try:
        for on in (True, False):
            _ffi.pe.dce_rules[_ffi.FFI_CALL] = rule if on else _ffi.default_dce_rule
            jax.clear_caches()  # traces and dead-code results are cached per function
            for name, policy in policies.items():
                def layer(x, s):
                    o, _ = gdn.jax.chunk_gated_delta_rule(
                        q, k, x * s, g, beta, use_qk_l2norm_in_kernel=True,
                        threads=args.threads)
                    return o, None

                body = layer if policy is None else jax.checkpoint(layer, policy=policy)

                def loss(x, s, body=body):
                    if args.loop:
                        for i in range(args.layers):
                            x = body(x, s[i])[0]
                        return jnp.sum(x)
                    return jnp.sum(jax.lax.scan(body, x, s)[0])

                print(f"compiling {name}, rule {'on' if on else 'off'}", file=sys.stderr)
                compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(
                    v, scales).compile()
                asked = sorted(
                    "".join(letter for letter, attr in (("o", "want_o"), ("S", "want_chunk_states"),
                                                        ("T", "want_t_inv"))
                            if f"{attr} = true" in line) or "-"
                    for line in compiled.as_text().splitlines()
                    if 'custom_call_target="gdn_forward"' in line)
                programs[(name, on)] = (compiled, asked)
    finally:
        _ffi.pe.dce_rules[_ffi.FFI_CALL] = rule
    # The forward call alone, asked for everything, for the residuals only (a replay when o is
    # saved or unread) and for o only (the forward pass of a policy that keeps no residual).
    from gdn.jax import _core
    static = _core._Static(
        scale=dk ** -0.5, l2norm=True, chunk_size=64, bf16_matmul=False, threads=args.threads,
        has_h0=False, want_final_state=False, keep_states=True, keep_t_inv=True, num_seqs=1,
        max_chunks=-(-t // 64), compute_dtype="float32")

    def forward(*a):
        return _core._forward_call(static, *a, None, None, residuals=True)

    for name, pick in (("call oST", lambda r: (r[0], r[2], r[3])), ("call ST", lambda r: r[2:]),
                       ("call o", lambda r: r[0])):
        print(f"compiling {name}", file=sys.stderr)
        compiled = jax.jit(lambda *a, pick=pick: pick(forward(*a))).lower(
            q, k, v, g, beta).compile()
        programs[(name, None)] = (compiled, (q, k, v, g, beta))
    for name in policies:  # the rule changes what is computed, never the result
        (value_on, grads_on), (value_off, grads_off) = (
            programs[(name, on)][0](v, scales) for on in (True, False))
        np.testing.assert_allclose(np.asarray(value_on), np.asarray(value_off), rtol=1e-6)
        for x, y in zip(grads_on, grads_off):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)
    times = {key: [] for key in programs}
    for r in range(args.repeats):
        print(f"run {r + 1}/{args.repeats}", file=sys.stderr)
        for key, (compiled, extra) in programs.items():
            operands = extra if key[1] is None else (v, scales)
            start = time.perf_counter()
            jax.block_until_ready(compiled(*operands))
            times[key].append((time.perf_counter() - start) * 1e3)
    layout = "unrolled" if args.loop else "in lax.scan"
    print(f"{args.layers} layers of chunk_gated_delta_rule {layout}, {t} tokens, Hk {hk} "
          f"Hv {hv} Dk {dk} Dv {dv}, op threads {args.threads or 'all'}; value_and_grad, ms "
          f"over {args.repeats} runs")
    print(f"{'policy':14s} {'rule':4s} {'forward calls':22s} {'median':>9s} {'min':>9s}  gain")
    for name in policies:
        medians = {}
        for on in (True, False):
            ts = times[(name, on)]
            medians[on] = statistics.median(ts)
            gain = "" if on else f"  on {medians[True] / medians[False]:.2f}x the time of off"
            print(f"{name:14s} {'on' if on else 'off':4s} {str(programs[(name, on)][1]):22s} "
                  f"{medians[on]:9.1f} {min(ts):9.1f}{gain}")
    print(f"one forward call, {t} tokens (jax.jit, results read: o, S, T)")
    full = statistics.median(times[("call oST", None)])
    for name in ("call oST", "call ST", "call o"):
        ts = times[(name, None)]
        print(f"{name:14s} {'':4s} {'':22s} {statistics.median(ts):9.1f} {min(ts):9.1f}  "
              f"{statistics.median(ts) / full:.2f}x the time of oST")


if __name__ == "__main__":
    main()
