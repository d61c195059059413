"""The C++ check mode (GDN_CHECK_FINITE=1, docs/numerics.md "Non-finite values") reaches
Python: a NaN in an input of gdn.jax's and gdn.torch's ops raises with the library's message
naming the argument and its position. The variable is read once per process, so each case
runs in a child process."""

import os
import subprocess
import sys

import pytest

_JAX = """
import numpy as np, jax.numpy as jnp, gdn.jax
rng = np.random.default_rng(0)
q = jnp.asarray(rng.standard_normal((1, 20, 1, 8)), jnp.float32)
v = jnp.asarray(rng.standard_normal((1, 20, 2, 8)), jnp.float32)
g = np.full((1, 20, 2), -0.1, np.float32); g[0, 13, 1] = np.nan
beta = jnp.full((1, 20, 2), 0.5, jnp.float32)
try:
    o, _ = gdn.jax.chunk_gated_delta_rule(q, q, v, jnp.asarray(g), beta)
    o.block_until_ready()
    print("no error")
except Exception as e:
    print(type(e).__name__, str(e))
"""

_TORCH = """
import torch, gdn.torch
torch.manual_seed(0)
q = torch.randn(1, 20, 1, 8)
v = torch.randn(1, 20, 2, 8)
g = torch.full((1, 20, 2), -0.1); g[0, 13, 1] = float("nan")
beta = torch.full((1, 20, 2), 0.5)
try:
    gdn.torch.chunk_gated_delta_rule(q, q, v, g, beta)
    print("no error")
except Exception as e:
    print(type(e).__name__, str(e))
"""

# A serving step whose out overflows float32 from finite inputs (a v channel with conv weight 1
# on every tap fed 3e38 by the token and its history): check mode raises, and both pools are
# as before the call (the step's slots put back); without it the step runs and writes them.
_TORCH_STEP = """
import torch, gdn.torch
torch.manual_seed(0)
hk, hv, dk, dv, k = 1, 2, 8, 8, 4
d = 2 * hk * dk + hv * dv
c = 2 * hk * dk + 1
qkv = torch.randn(1, d); a = torch.randn(1, hv); b = torch.randn(1, hv)
w = torch.randn(d, k); w[c] = 1.0
qkv[0, c] = 3e38
conv = torch.randn(3, k - 1, d); conv[1, :, c] = 3e38
ssm = torch.randn(3, hv, dk, dv)
conv0, ssm0 = conv.clone(), ssm.clone()
try:
    gdn.torch.fused_gdn_step(qkv, a, b, w, torch.zeros(hv), torch.zeros(hv), conv, ssm,
                             torch.tensor([1]), torch.tensor([0, 1]), torch.tensor([True]),
                             num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
    print("no error")
except Exception as e:
    print(type(e).__name__, str(e))
print("pools unchanged:", torch.equal(conv, conv0) and torch.equal(ssm, ssm0))
"""

# The same step through gdn.jax's fused_conv1d_gdn, which donates both pools: in check mode it
# does not donate them (a step that raises would otherwise take them), so the caller's arrays
# are still valid and as before the call.
_JAX_STEP = """
import numpy as np, jax.numpy as jnp, gdn.jax
rng = np.random.default_rng(0)
hk, hv, dk, dv, k = 1, 2, 8, 8, 4
d = 2 * hk * dk + hv * dv
c = 2 * hk * dk + 1
qkv = rng.standard_normal((1, d)).astype(np.float32); qkv[0, c] = 3e38
w = rng.standard_normal((d, k)).astype(np.float32); w[c] = 1.0
conv = rng.standard_normal((3, k - 1, d)).astype(np.float32); conv[1, :, c] = 3e38
ssm = rng.standard_normal((3, hv, dk, dv)).astype(np.float32)
conv_pool, ssm_pool = jnp.asarray(conv), jnp.asarray(ssm)
i32 = lambda x: np.asarray(x, np.int32)
try:
    (new_conv, new_ssm), out = gdn.jax.fused_conv1d_gdn(
        jnp.asarray(qkv), jnp.asarray(rng.standard_normal((1, hv)), jnp.float32),
        jnp.asarray(rng.standard_normal((1, hv)), jnp.float32), conv_pool, ssm_pool,
        jnp.asarray(w), None, jnp.zeros(hv), jnp.zeros(hv), i32([0, 1]), i32([1]),
        i32([1, 1, 1]), i32([2]), n_kq=hk, n_v=hv, d_k=dk, d_v=dv, kernel_size=k)
    out.block_until_ready()
    print("no error")
    print("pools advanced:", not np.array_equal(np.asarray(new_conv), conv)
          and not np.array_equal(np.asarray(new_ssm), ssm))
except Exception as e:
    print(type(e).__name__, str(e))
    print("pools unchanged:", np.array_equal(np.asarray(conv_pool), conv)
          and np.array_equal(np.asarray(ssm_pool), ssm))
"""


def _run(code, check):
    env = dict(os.environ)
    env.pop("GDN_CHECK_FINITE", None)
    if check:
        env["GDN_CHECK_FINITE"] = "1"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("code", [_JAX, _TORCH], ids=["jax", "torch"])
def test_check_mode_names_the_nan_input_and_is_off_by_default(code):
    if code is _TORCH:
        pytest.importorskip("torch")
    assert "input 'g' holds nan at [0, 13, 1] (nothing was written)" in _run(code, True)
    assert "no error" in _run(code, False)


def test_check_mode_step_that_raises_leaves_both_pools():
    pytest.importorskip("torch")
    checked = _run(_TORCH_STEP, True)
    assert "output 'out' holds" in checked, checked
    assert "(out is written; every pool slot is as before the call)" in checked, checked
    assert "pools unchanged: True" in checked, checked
    unchecked = _run(_TORCH_STEP, False)
    assert "no error" in unchecked and "pools unchanged: False" in unchecked, unchecked


def test_check_mode_jax_step_that_raises_keeps_the_pools_it_would_donate():
    checked = _run(_JAX_STEP, True)
    assert "output 'out' holds" in checked, checked
    assert "pools unchanged: True" in checked, checked
    unchecked = _run(_JAX_STEP, False)
    assert "no error" in unchecked and "pools advanced: True" in unchecked, unchecked
