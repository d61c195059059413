"""Run by test_jax_threads.py in a fresh process, so that nothing else has started gdn's own
thread pool: ``python jax_threads_child.py CPUS THREADS...`` pins itself to CPUS (a comma
list; XLA sizes its intra-op pool from them), calls every gdn.jax handler under jax.jit with
each THREADS value (forward and gradient of the core, layer and conv ops, the serving step),
then times a core forward per THREADS value. Prints one JSON line: how many threads named
"gdn-worker" (the name gdn's own pool gives its threads) the process had before and after,
and per THREADS value the CPU time (clock ticks) each thread spent in the timed calls, and
whether the thread was there before the first gdn call (XLA's own threads were)."""

import glob
import json
import os
import sys

os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(",")])  # before XLA starts its pool
THREADS = [int(t) for t in sys.argv[2:]]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gdn.jax  # noqa: E402
from gdn.jax import _conv  # noqa: E402  (the conv op's handlers: context parallelism's)


def thread_times():
    """{tid: (name, user + system clock ticks)} of this process's threads."""
    out = {}
    for task in glob.glob("/proc/self/task/*"):
        try:
            with open(task + "/comm") as f:
                name = f.read().strip()
            with open(task + "/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        out[int(os.path.basename(task))] = (name, int(fields[11]) + int(fields[12]))
    return out


def pool_threads():
    return sum(1 for name, _ in thread_times().values() if name == "gdn-worker")


rng = np.random.default_rng(0)


def f32(*shape, lo=-1.0, hi=1.0):
    return jnp.asarray(rng.uniform(lo, hi, shape), jnp.float32)


def core_inputs(batch, tokens, hk, hv, dk, dv):
    return (f32(batch, tokens, hk, dk), f32(batch, tokens, hk, dk), f32(batch, tokens, hv, dv),
            f32(batch, tokens, hv, lo=-1.0, hi=-0.01), f32(batch, tokens, hv, lo=0.0, hi=1.0))


def every_handler(threads):
    """Runs each of the seven FFI targets once under jit."""
    core = core_inputs(2, 96, 1, 2, 16, 16)

    def core_loss(*x):
        return jnp.sum(gdn.jax.chunk_gated_delta_rule(*x, use_qk_l2norm_in_kernel=True,
                                                      chunk_size=32, threads=threads)[0])

    jax.block_until_ready(jax.jit(jax.value_and_grad(core_loss, argnums=(0, 1, 2)))(*core))
    hk, hv, dk, dv, taps, tokens = 1, 2, 16, 16, 4, 80
    d = 2 * hk * dk + hv * dv
    layer = (f32(tokens, d), f32(tokens, hv), f32(tokens, hv), f32(d, taps, lo=-0.5, hi=0.5),
             f32(hv, lo=0.0, hi=2.0), f32(hv, lo=-0.1, hi=0.1))

    def layer_loss(*x):
        return jnp.sum(gdn.jax.fused_gdn(*x, num_k_heads=hk, num_v_heads=hv, head_k_dim=dk,
                                         head_v_dim=dv, chunk_size=32, threads=threads)[0])

    jax.block_until_ready(jax.jit(jax.value_and_grad(layer_loss, argnums=(0, 3)))(*layer))

    def conv_loss(x, w):
        return jnp.sum(_conv.causal_conv1d(x, w, threads=threads)[0])

    jax.block_until_ready(jax.jit(jax.value_and_grad(conv_loss, argnums=(0, 1)))(
        layer[0], layer[3]))
    slots = 4
    step = jax.jit(lambda *x: gdn.jax.fused_conv1d_gdn(
        *x, n_kq=hk, n_v=hv, d_k=dk, d_v=dv, kernel_size=taps, threads=threads))
    i32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
    # two decodes (slots 1 and 2, with history) and a 6-token prefill into slot 3
    jax.block_until_ready(step(
        f32(8, d), f32(8, hv), f32(8, hv), f32(slots, taps - 1, d), f32(slots, hv, dk, dv),
        f32(d, 1, taps), f32(d), f32(hv, lo=0.0, hi=2.0), f32(hv), i32([0, 1, 2, 8]),
        i32([1, 2, 3]), i32([2, 3, 3]), i32([5, 9, 6])))


def timed_forward(threads, calls=12):
    """[name, CPU ticks, started before any gdn call] per thread over `calls` jitted core
    forwards (the call compiled first)."""
    x = core_inputs(2, 2048, 2, 4, 128, 128)
    fn = jax.jit(lambda *x: gdn.jax.chunk_gated_delta_rule(*x, threads=threads)[0])
    jax.block_until_ready(fn(*x))
    before = thread_times()
    for _ in range(calls):
        jax.block_until_ready(fn(*x))
    after = thread_times()
    return [[name, ticks - before.get(tid, (name, 0))[1], tid in STARTUP]
            for tid, (name, ticks) in after.items()]


jax.block_until_ready(jnp.zeros(4) + 1)  # XLA's client and its intra-op pool start here
STARTUP = set(thread_times())  # the threads there were before gdn ran anything
pool_before = pool_threads()
for t in THREADS:
    every_handler(t)
times = {str(t): timed_forward(t) for t in THREADS}
print(json.dumps(dict(pool_threads_before=pool_before, pool_threads_after=pool_threads(),
                      thread_ticks=times)))
