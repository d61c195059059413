"""The README's examples are examples/jax_minimal.py and examples/torch_patch.py, word for word,
and they run."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _run_readme_example(name):
    """Checks that README.md has examples/<name> as a ```python block; returns its stdout."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    path = os.path.join(ROOT, "examples", name)
    with open(path) as f:
        example = f.read()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert example in blocks, f"README.md's ```python block differs from examples/{name}"
    run = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_readme_jax_example_is_the_example_file_and_runs():
    out = _run_readme_example("jax_minimal.py")
    assert re.search(r"dq \(1, 300, 2, 64\) d_beta\[0, 0, 0\] = -?\d", out), out


def test_readme_torch_example_is_the_example_file_and_runs():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = _run_readme_example("torch_patch.py")
    m = re.search(r"logits error (\S+) generated torch.Size\(\[1, 208\]\)", out)
    assert m and float(m.group(1)) < 1e-4, out
