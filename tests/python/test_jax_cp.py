"""Exact context parallelism (``cp_axis``) on 4 host devices: every output and gradient of a
sequence sharded with ``jax.shard_map`` against the unsharded op (rounding apart) and against
a float64 reference (pure JAX for the core and layer ops, gdn's float64 kernels for the
block), with decays slow enough that segments run alone would be far off; and the ops under
``shard_map`` without ``cp_axis`` (batch over devices, parameters replicated). The sharded
runs happen in one subprocess, cp_check.py, because the host device count is fixed when JAX
starts; its errors are checked here one case per test. Errors of the arguments:
test_jax_validation.py."""

import json
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as P

import gdn.jax

HERE = os.path.dirname(os.path.abspath(__file__))

# (vs the unsharded op, vs float64) normwise relative-error bounds per activation dtype.
# float32 sums with cancellation (the block's d_A_log and d_dt_bias, summed over tokens) reach
# a few 1e-6; the same sums in float64 reach 4e-14: the sharded algorithm is exact, its error
# rounding. bf16 outputs and gradients are rounded from float32 values that differ by float32
# rounding, so an element may land one bf16 step (2^-8 relative) away: 4e-3 normwise.
BOUNDS = {"f32": (1e-5, 2e-5), "bf16": (4e-3, 1e-2), "f64": (1e-12, 1e-12)}
CASES = {
    "core_f32_h0_l2norm_gva": "f32",
    "core_f32_no_h0_no_l2norm_chunk32": "f32",
    "core_split_calls_when_dv_plus_dk_passes_max_width": "f32",
    "core_bf16_activations": "bf16",
    "core_batch_over_dp_and_sequence_over_cp": "f32",
    "core_heads_over_tp_and_sequence_over_cp": "f32",
    "core_f64_exact": "f64",
    "core_batch_over_dp_without_cp": "f32",
    "layer_f32_states_gva_k4": "f32",
    "layer_f32_no_states_weight_d1k_k3_dk_ne_dv": "f32",
    "layer_f32_one_tap_conv": "f32",
    "layer_bf16_activations": "bf16",
    "layer_f64_exact": "f64",
    "block_batch_over_dp_and_sequence_over_cp": "f32",
    "block_f64_exact": "f64",
    "block_batch_over_dp_without_cp": "f32",
}
OUTPUTS = {"core": {"o", "final_state", "d_q", "d_k", "d_v", "d_g", "d_beta", "d_h0"},
           "layer": {"out", "conv_state_out", "recurrent_state_out", "d_qkv", "d_a", "d_b",
                     "d_conv_weight", "d_conv_bias", "d_A_log", "d_dt_bias", "d_conv_state",
                     "d_recurrent_state"},
           "block": {"y", "conv_state_out", "recurrent_state_out", "d_x", "d_A_log",
                     "d_conv1d.weight", "d_out_proj.weight"}}


class ShardedRun:
    """cp_check.py over every case, in its own process, its output in temporary files (a pipe
    left unread could fill and stall it). About a minute, mostly compiling: conftest.py starts
    it when the collection selects a test that needs it and moves those tests to the end of
    the session, so that it runs beside the rest of the suite."""

    def __init__(self):
        self.out, self.err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "cp_check.py"), *CASES], cwd=HERE,
            stdout=self.out, stderr=self.err, text=True)

    def result(self, timeout=900):
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.out.seek(0)
        self.err.seek(0)
        return self.process.returncode, self.out.read(), self.err.read()


@pytest.fixture(scope="module")
def sharded_errors(request):
    run = getattr(request.config, "gdn_sharded_run", None) or ShardedRun()
    returncode, stdout, stderr = run.result()
    assert returncode == 0, (f"cp_check.py exited with {returncode}: " + stdout[-2000:]
                             + stderr[-4000:])
    lines = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
    return {**{x["case"]: x["errors"] for x in lines},
            **{x["case"] + ":carried": x["carried"] for x in lines}}


@pytest.mark.parametrize("case", list(CASES))
def test_sharded_equals_unsharded_and_float64(sharded_errors, case):
    errors = sharded_errors[case]
    vs_single, vs_f64 = BOUNDS[CASES[case]]
    assert OUTPUTS[case.split("_")[0]] <= set(errors)
    carried = sharded_errors[case + ":carried"]
    if carried is not None:  # segments run alone are far off: the passed state matters
        assert carried > 0.05, f"{case}: segments alone are only {carried:.2e} off"
    for what, (e_single, e_f64, e_unsharded_f64) in errors.items():
        assert e_single <= vs_single, f"{case} {what}: {e_single:.2e} from the unsharded op"
        assert e_f64 <= vs_f64, f"{case} {what}: {e_f64:.2e} from float64"
        assert e_unsharded_f64 <= vs_f64, f"{case} {what}: unsharded {e_unsharded_f64:.2e}"


def _inputs(tokens=16):
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((1, tokens, 1, 8)), jnp.float32)
               for _ in range(3))
    g = jnp.asarray(-rng.random((1, tokens, 1)), jnp.float32)
    beta = jnp.asarray(rng.random((1, tokens, 1)), jnp.float32)
    return q, k, v, g, beta


def _one_device_cp(fn):
    mesh = jax.make_mesh((1,), ("cp",), axis_types=(AxisType.Auto,))
    spec = P(None, "cp")
    return jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * 5, out_specs=spec)


def test_cp_on_one_device_equals_plain_call():
    args = _inputs(40)
    o_cp = jax.jit(_one_device_cp(
        lambda *a: gdn.jax.chunk_gated_delta_rule(*a, cp_axis="cp", chunk_size=16)[0]))(*args)
    o = gdn.jax.chunk_gated_delta_rule(*args, chunk_size=16)[0]
    np.testing.assert_allclose(np.asarray(o_cp), np.asarray(o), rtol=1e-5, atol=1e-6)


def test_docs_jax_md_context_parallel_snippet_runs():
    """docs/jax.md's snippet, as written, on 4 host devices: sharded equals unsharded."""
    text = open(os.path.join(HERE, "..", "..", "docs", "jax.md")).read()
    section = text[text.index("## Context parallelism"):]
    start = section.index("```python\n") + len("```python\n")
    code = section[start:section.index("\n```", start)]
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    d_o, d_ht = (float(x) for x in run.stdout.split())
    assert d_o < 1e-5 and d_ht < 1e-4, run.stdout
