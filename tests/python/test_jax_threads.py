"""gdn.jax's threads are XLA's: under jax.jit the handlers schedule their helper work on XLA's
intra-op pool and never start gdn's own pool (checked in fresh processes, jax_threads_child.py);
threads=0 is XLA's pool size, a count above it is lowered to it; results and gradients are
bit-identical for threads 1, 2 and 0 (their agreement with the references is
test_jax_core.py's, test_jax_layer.py's and test_jax_serving.py's, at threads=0)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn.jax
from gdn.jax import _conv

CHILD = os.path.join(os.path.dirname(__file__), "jax_threads_child.py")
CPUS = sorted(os.sched_getaffinity(0))


def run_child(cpus, *threads):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, CHILD, ",".join(map(str, cpus)), *map(str, threads)],
                         check=True, stdout=subprocess.PIPE, text=True, timeout=300, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def split_ticks(rows):
    """(ticks of the busiest thread: the one running the custom call, ticks of XLA's other
    threads (there before gdn ran anything), ticks of threads started since, rows that did
    any work) of one timed setting."""
    busiest = max(rows, key=lambda r: r[1])
    others = [r for r in rows if r is not busiest]
    helpers = sum(r[1] for r in others if r[2])
    started_since = sum(r[1] for r in others if not r[2])
    return busiest[1], helpers, started_since, [r for r in rows if r[1] > 0]


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs (XLA's pool is one thread per CPU)")
def test_two_cpus_helper_work_runs_on_xla_pool_and_gdn_pool_never_starts():
    got = run_child(CPUS[:2], 2, 0, 1)
    assert got["pool_threads_before"] == 0
    assert got["pool_threads_after"] == 0, (
        f"gdn's own pool started {got['pool_threads_after']} 'gdn-worker' thread(s) in a "
        "process that only ran gdn.jax ops")
    for threads in ("2", "0"):  # 0: XLA's pool size, 2 here
        caller, helpers, started_since, busy = split_ticks(got["thread_ticks"][threads])
        assert started_since <= 1, (threads, busy)
        # Both threads take items; a loaded host may give the helper less than half.
        assert helpers >= 2 and helpers >= 0.2 * caller, (threads, busy)
    caller, helpers, started_since, busy = split_ticks(got["thread_ticks"]["1"])
    assert helpers + started_since <= 2, ("threads=1 stays on the calling thread", busy)


def test_one_cpu_threads_above_xla_pool_run_on_calling_thread_alone():
    got = run_child(CPUS[:1], 2, 0)
    assert got["pool_threads_after"] == 0
    for threads in ("2", "0"):
        caller, helpers, started_since, busy = split_ticks(got["thread_ticks"][threads])
        assert caller > 0 and helpers + started_since <= 2, (threads, busy)


def f32(rng, *shape, lo=-1.0, hi=1.0):
    return jnp.asarray(rng.uniform(lo, hi, shape), jnp.float32)


def assert_same_bits(results, what):
    """Every thread count's leaves equal threads=1's, bit for bit."""
    first = jax.tree_util.tree_leaves(results[1])
    for threads, result in results.items():
        leaves = jax.tree_util.tree_leaves(result)
        assert len(leaves) == len(first)
        for i, (a, b) in enumerate(zip(leaves, first)):
            assert np.array_equal(np.asarray(a), np.asarray(b)), (what, i, threads)


def test_core_forward_and_grad_bit_identical_for_threads_1_2_0_under_jit():
    rng = np.random.default_rng(1)
    b, t, hk, hv, dk, dv = 2, 150, 2, 4, 32, 16
    x = (f32(rng, b, t, hk, dk), f32(rng, b, t, hk, dk), f32(rng, b, t, hv, dv),
         f32(rng, b, t, hv, lo=-1.0, hi=-0.01), f32(rng, b, t, hv, lo=0.0, hi=1.0),
         f32(rng, b, hv, dk, dv, lo=-0.5, hi=0.5))
    d_o = f32(rng, b, t, hv, dv)

    def run(threads):
        def loss(q, k, v, g, beta, h0):
            o, ht = gdn.jax.chunk_gated_delta_rule(
                q, k, v, g, beta, initial_state=h0, output_final_state=True,
                use_qk_l2norm_in_kernel=True, chunk_size=32, threads=threads)
            return jnp.sum(o * d_o) + jnp.sum(ht), (o, ht)
        return jax.jit(jax.value_and_grad(loss, argnums=range(6), has_aux=True))(*x)

    results = {t: run(t) for t in (1, 2, 0)}
    assert_same_bits(results, "core value_and_grad")
    grads = results[2][1]
    assert all(float(jnp.abs(g).max()) > 0 for g in grads)


def test_layer_forward_and_grad_bit_identical_for_threads_1_2_0_under_jit():
    rng = np.random.default_rng(2)
    hk, hv, dk, dv, taps = 2, 4, 16, 16, 4
    d = 2 * hk * dk + hv * dv
    cu = jnp.asarray([0, 1, 60, 130, 200], jnp.int32)
    t = 200
    x = (f32(rng, t, d), f32(rng, t, hv), f32(rng, t, hv), f32(rng, d, taps, lo=-0.5, hi=0.5),
         f32(rng, hv, lo=0.0, hi=2.0), f32(rng, hv, lo=-0.1, hi=0.1), f32(rng, d, lo=-0.1, hi=0.1))
    d_out = f32(rng, t, hv * dv)

    def run(threads):
        def loss(qkv, a, b_, w, a_log, dt_bias, bias):
            out = gdn.jax.fused_gdn(qkv, a, b_, w, a_log, dt_bias, conv_bias=bias,
                                    cu_seqlens=cu, num_k_heads=hk, num_v_heads=hv,
                                    head_k_dim=dk, head_v_dim=dv, chunk_size=32,
                                    threads=threads)[0]
            return jnp.sum(out * d_out), out
        return jax.jit(jax.value_and_grad(loss, argnums=range(7), has_aux=True))(*x)

    assert_same_bits({t: run(t) for t in (1, 2, 0)}, "layer value_and_grad")


def test_conv_forward_and_grad_bit_identical_for_threads_1_2_0_under_jit():
    rng = np.random.default_rng(3)
    x, w = f32(rng, 300, 96), f32(rng, 96, 4)
    cu = jnp.asarray([0, 2, 150, 300], jnp.int32)

    def run(threads):
        def loss(x, w):
            out = _conv.causal_conv1d(x, w, cu_seqlens=cu, threads=threads)[0]
            return jnp.sum(out * out), out
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(x, w)

    assert_same_bits({t: run(t) for t in (1, 2, 0)}, "conv value_and_grad")


def test_serving_step_bit_identical_for_threads_1_2_0_under_jit():
    rng = np.random.default_rng(4)
    hk, hv, dk, dv, taps, slots, t = 1, 4, 16, 16, 4, 8, 40
    d = 2 * hk * dk + hv * dv
    i32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
    # three decodes with history, a prefill and a continued prefill
    args = (f32(rng, t, d), f32(rng, t, hv), f32(rng, t, hv), f32(rng, slots, taps - 1, d),
            f32(rng, slots, hv, dk, dv, lo=-0.5, hi=0.5), f32(rng, d, 1, taps, lo=-0.5, hi=0.5),
            f32(rng, d), f32(rng, hv, lo=0.0, hi=2.0), f32(rng, hv),
            i32([0, 1, 2, 3, 20, 40]), i32([1, 2, 3, 4, 5]), i32([3, 5, 5]),
            i32([7, 4, 9, 17, 25]))

    def run(threads):
        return jax.jit(lambda *a: gdn.jax.fused_conv1d_gdn(
            *a, n_kq=hk, n_v=hv, d_k=dk, d_v=dv, kernel_size=taps, threads=threads))(*args)

    assert_same_bits({t: run(t) for t in (1, 2, 0)}, "serving step")
