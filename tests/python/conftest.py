"""Shared set-up of the Python tests: float64 on (the references run in float64; gdn's ops
get float32 unless a test asks otherwise), a deterministic problem maker and the error
measure every comparison uses."""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


def as_float64(x):
    """A NumPy float64 copy of a JAX or NumPy array or a torch tensor (bf16 included)."""
    if hasattr(x, "detach"):  # torch
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, np.float64)


def rel_error(x, ref):
    """Normwise relative error ||x - ref|| / ||ref|| in float64 (0 when both are zero)."""
    x, ref = as_float64(x), as_float64(ref)
    assert x.shape == ref.shape, (x.shape, ref.shape)
    denom = np.linalg.norm(ref)
    diff = np.linalg.norm(x - ref)
    return float(diff / denom) if denom > 0 else float(diff)


def assert_close(x, ref, tol, what=""):
    err = rel_error(x, ref)
    x, ref = as_float64(x), as_float64(ref)
    worst = np.unravel_index(np.argmax(np.abs(x - ref)), ref.shape) if ref.size else ()
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e} (worst at {worst})"


def results_asked(lowered_text, target, letters):
    """What each call of FFI target `target` in a lowered program asks for, sorted: per call
    the letters whose attribute is true (letters: {letter: attribute}), "-" for none."""
    calls = []
    for line in lowered_text.splitlines():
        if f"custom_call @{target}(" in line:
            calls.append("".join(letter for letter, attr in letters.items()
                                 if f"{attr} = true" in line) or "-")
    return sorted(calls)


class Problem:
    """Random inputs of the core op in fla's layout, float32 (g in a realistic decay range)."""

    def __init__(self, seed, batch, tokens, hk, hv, dk, dv, num_seqs=None, h0=False):
        rng = np.random.default_rng(seed)
        self.q = rng.standard_normal((batch, tokens, hk, dk)).astype(np.float32)
        self.k = rng.standard_normal((batch, tokens, hk, dk)).astype(np.float32)
        self.v = rng.standard_normal((batch, tokens, hv, dv)).astype(np.float32)
        self.g = -rng.uniform(0.01, 1.0, (batch, tokens, hv)).astype(np.float32)
        self.beta = rng.uniform(0.05, 1.0, (batch, tokens, hv)).astype(np.float32)
        n = batch if num_seqs is None else num_seqs
        self.h0 = (0.5 * rng.standard_normal((n, hv, dk, dv))).astype(np.float32) if h0 else None
        self.d_o = rng.standard_normal((batch, tokens, hv, dv)).astype(np.float32)
        self.d_ht = rng.standard_normal((n, hv, dk, dv)).astype(np.float32)

    def args(self, dtype=np.float32):
        return tuple(jnp.asarray(x, dtype) for x in (self.q, self.k, self.v, self.g, self.beta))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def pytest_collection_modifyitems(session, config, items):
    """test_jax_cp.py's sharded checks wait on a subprocess (cp_check.py, about a minute of
    mostly single-threaded compiling): start it now, if any of them was selected, and run
    them last, so that it overlaps the rest of the suite on the other core."""
    sharded = [item for item in items if "sharded_errors" in getattr(item, "fixturenames", ())]
    if not sharded:
        return
    items[:] = [item for item in items if item not in sharded] + sharded
    config.gdn_sharded_run = sharded[0].module.ShardedRun()
