"""The README's JAX example is examples/jax_minimal.py, word for word, and it runs."""

import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_readme_jax_example_is_the_example_file_and_runs():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    path = os.path.join(ROOT, "examples", "jax_minimal.py")
    with open(path) as f:
        example = f.read()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert example in blocks, "README.md's ```python block differs from examples/jax_minimal.py"
    run = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert re.search(r"dq \(1, 300, 2, 64\) d_beta\[0, 0, 0\] = -?\d", run.stdout), run.stdout
