"""The plain-JAX chunked baseline of bench/jax_bench.py answers to the token recurrence too, so
that the benchmark's ratios compare gdn.jax with a correct implementation."""

import os
import sys

import jax
import jax.numpy as jnp
import pytest

import jax_reference as ref
from conftest import Problem, assert_close

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import jax_chunked  # noqa: E402


@pytest.mark.parametrize("tokens,chunk", [(50, 16), (64, 64), (70, 32)], ids=["t50_c16", "t64_c64", "t70_c32"])
def test_chunked_baseline_matches_scan_reference_forward_and_gradients(tokens, chunk):
    p = Problem(5, 2, tokens, 2, 4, 16, 8, h0=True)
    args = p.args()
    h0 = jnp.asarray(p.h0)

    def loss(fn, **kw):
        def f(q, k, v, g, beta, h0):
            o, ht = fn(q, k, v, g, beta, initial_state=h0, use_qk_l2norm_in_kernel=True, **kw)
            return jnp.sum(o * p.d_o) + jnp.sum(ht * p.d_ht)
        return f

    o, ht = jax_chunked.chunk_gated_delta_rule(*args, chunk_size=chunk, initial_state=h0,
                                               use_qk_l2norm_in_kernel=True)
    f64 = [jnp.asarray(x, jnp.float64) for x in (*args, h0)]
    o_ref, ht_ref = ref.chunk_gated_delta_rule(*f64[:5], initial_state=f64[5],
                                               use_qk_l2norm_in_kernel=True)
    assert_close(o, o_ref, 1e-4, "o")
    assert_close(ht, ht_ref, 1e-4, "final_state")
    grads = jax.grad(loss(jax_chunked.chunk_gated_delta_rule, chunk_size=chunk),
                     argnums=tuple(range(6)))(*args, h0)
    grads_ref = jax.grad(loss(ref.chunk_gated_delta_rule), argnums=tuple(range(6)))(*f64)
    for name, x, r in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads, grads_ref):
        assert_close(x, r, 1e-4, name)
