"""examples/jax_recall.py, shortened: the model of gdn.jax.nn blocks learns associative recall
(its loss falls well below the start), and its first training steps on gdn's kernels give the
losses of the same model on the pure-JAX chunked op (bench/jax_chunked.py)."""

import io
import os
import subprocess
import sys

import pytest

optax = pytest.importorskip("optax")

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples")
sys.path.insert(0, EXAMPLES)

import jax_recall  # noqa: E402


def test_first_steps_losses_equal_pure_jax_reference_op():
    cfg = jax_recall.Config(pairs=4, batch=8)
    kw = dict(target=None, log_every=100, out=io.StringIO())
    _, gdn_losses, _ = jax_recall.train(cfg, 4, **kw)
    _, ref_losses, _ = jax_recall.train(cfg, 4, block=jax_recall.reference_block, **kw)
    for step, (a, b) in enumerate(zip(gdn_losses, ref_losses), 1):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: gdn {a:.8f}, pure JAX {b:.8f}"


def test_model_gradients_equal_pure_jax_reference_op():
    """Every parameter's gradient of the model's loss, gdn's block against the same block on
    the pure-JAX op (Adam's first steps see little more than the gradients' signs)."""
    import jax
    import numpy as np

    cfg = jax_recall.Config(pairs=4, batch=8)
    params = jax_recall.init_params(jax.random.PRNGKey(0), cfg)
    batch = jax_recall.make_batch(np.random.default_rng(0), cfg)

    def grads(block):
        return jax.grad(lambda p: jax_recall.loss_and_accuracy(p, batch, cfg, block)[0])(params)

    got, want = grads(jax_recall.nn.gated_delta_net), grads(jax_recall.reference_block)
    for path, g in jax.tree_util.tree_leaves_with_path(got):
        w = np.asarray(dict(jax.tree_util.tree_leaves_with_path(want))[path])
        err = np.linalg.norm(np.asarray(g) - w) / max(np.linalg.norm(w), 1e-30)
        assert err < 1e-4, f"{jax.tree_util.keystr(path)}: relative error {err:.2e}"


def test_loss_falls_well_below_start_and_recall_passes_chance():
    cfg = jax_recall.Config(pairs=8)
    out = io.StringIO()
    # the first 600 steps of the example's 8000-step schedule
    _, losses, accs = jax_recall.train(cfg, 600, target=None, log_every=100, out=out,
                                       schedule_steps=8000)
    start, end = sum(losses[:20]) / 20, sum(losses[-50:]) / 50
    recall = sum(accs[-50:]) / 50
    assert end < 0.7 * start, out.getvalue()
    assert recall > 10 / (cfg.vocab // 2), out.getvalue()  # ten times chance
    assert "recall" in out.getvalue() and "step   600" in out.getvalue()


def test_example_command_line_reports_progress_and_rejects_bad_arguments():
    script = os.path.join(EXAMPLES, "jax_recall.py")
    run = subprocess.run([sys.executable, script, "--steps", "20", "--log-every", "10",
                          "--target", "0.99"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stderr[-2000:]  # ran, did not reach 99 %
    assert "step    10" in run.stdout and "step    20" in run.stdout, run.stdout
    bad = subprocess.run([sys.executable, script, "--pairs", "100"], capture_output=True,
                         text=True, timeout=600)
    assert bad.returncode == 2 and "--pairs: expected at most 64" in bad.stderr, bad.stderr
