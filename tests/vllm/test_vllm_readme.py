"""The README's vLLM example is examples/vllm_serve.py verbatim, and it runs: on a tiny local
Qwen3-Next, in its own process, with gdn.vllm's startup line in the log."""

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

import models  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_readme_vllm_example_is_the_example_file_and_runs(tmp_path):
    with open(os.path.join(ROOT, "examples", "vllm_serve.py")) as f:
        example = f.read()
    with open(os.path.join(ROOT, "README.md")) as f:
        assert example in re.findall(r"```python\n(.*?)```", f.read(), re.S)
    models.qwen3_next(tmp_path / "model")
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    env.pop("GDN_VLLM", None)
    run = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "vllm_serve.py"),
                          str(tmp_path / "model")], env=env, capture_output=True, text=True,
                         timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    assert re.search(r"generated \[(\d+, ){7}\d+\]", run.stdout), log[-3000:]
    assert "gdn.vllm: active: vLLM's CPU GDN layers run on gdn" in log, log[-3000:]
