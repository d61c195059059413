"""gdn.jax against Tokamax's and MaxText's own JAX implementations, where they are installed.

Neither is part of the test environment: Tokamax's GDN op (tokamax >= 0.0.17) needs Python >=
3.12, and PyPI offers only tokamax 0.0.12 (no GDN op) to Python 3.11; MaxText's wheel pulls in
torch, datasets and google-cloud packages. Each test skips with that reason when its peer is
missing (pytest -rs prints it), so the report says what was not compared."""

import importlib
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import gdn.jax
from conftest import Problem, assert_close


def _import_or_skip(module, why):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.skip(f"{module} is not importable ({e.__class__.__name__}: {e}); {why}; "
                    f"Python {sys.version_info.major}.{sys.version_info.minor}: not compared")


def test_core_op_matches_maxtext_jax_chunk_gated_delta_rule():
    qwen3 = _import_or_skip("maxtext.models.qwen3",
                            "MaxText is not installed in the test environment")
    p = Problem(11, 2, 130, 2, 4, 64, 64, h0=True)
    q, k, v, g, beta = p.args()
    h0 = jnp.asarray(p.h0)
    o, ht = gdn.jax.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                           output_final_state=True, use_qk_l2norm_in_kernel=True)
    # MaxText takes q and k repeated to the value heads (value head h reads key head h // 2).
    rep = lambda x: jnp.repeat(x, 2, axis=2)  # noqa: E731
    o_mt, ht_mt = qwen3.jax_chunk_gated_delta_rule(
        rep(q), rep(k), v, g, beta, chunk_size=64, initial_state=h0, use_qk_norm_in_gdn=True,
        compute_dtype=jnp.float32)
    assert_close(o, o_mt, 1e-4, "o vs MaxText")
    assert_close(ht, ht_mt, 1e-4, "final_state vs MaxText")


def test_serving_call_matches_tokamax_fused_conv1d_gdn():
    wrapper = _import_or_skip("tokamax._src.ops.causal_conv1d_gated_delta_rule.wrapper",
                              "Tokamax's GDN op needs tokamax >= 0.0.17, which needs Python >= 3.12")
    rng = np.random.default_rng(3)
    hk, hv, dk, dv, taps, slots = 1, 2, 16, 8, 4, 8
    d = 2 * hk * dk + hv * dv
    f32 = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    qkv, b, a = f32(12, d), f32(12, hv), f32(12, hv)
    conv_pool, rec_pool = f32(slots, taps - 1, d), 0.5 * f32(slots, hv, dk, dv)
    weight, bias = 0.5 * f32(d, 1, taps), 0.1 * f32(d)
    a_log = jnp.log(jnp.asarray(rng.uniform(1, 16, hv), jnp.float32))
    dt_bias = 0.1 * f32(hv)
    meta = [jnp.asarray(x, jnp.int32) for x in ([0, 1, 2, 12], [3, 5, 2], [2, 3, 3], [9, 1, 10])]
    static = dict(n_kq=hk, n_v=hv, d_k=dk, d_v=dv, kernel_size=taps)
    (conv, rec), out = gdn.jax.fused_conv1d_gdn(qkv, b, a, jnp.array(conv_pool),
                                                jnp.array(rec_pool), weight, bias, a_log,
                                                dt_bias, *meta, **static)
    (conv_tk, rec_tk), out_tk = wrapper.fused_conv1d_gdn(qkv, b, a, jnp.array(conv_pool),
                                                         jnp.array(rec_pool), weight, bias,
                                                         a_log, dt_bias, *meta, **static)
    assert_close(out, out_tk, 1e-4, "out vs Tokamax")
    for slot in (2, 3, 5):
        assert_close(conv[slot], conv_tk[slot], 1e-4, f"conv slot {slot} vs Tokamax")
        assert_close(rec[slot], rec_tk[slot], 1e-4, f"recurrent slot {slot} vs Tokamax")
