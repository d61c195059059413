"""The plugin's off switches, each in a fresh interpreter (vLLM loads plugins once per process):
``GDN_VLLM=0`` and a ``VLLM_PLUGINS`` list without ``gdn`` leave vLLM's own GDN call in place.
The probe's check is live: without either switch the same probe finds gdn's stand-in (the
engine tests count gdn's calls, so the default is covered there). No engine starts."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

# Loads the general plugins as each vLLM process does, then prints whether vLLM's
# non-speculative CPU GDN call is gdn's stand-in.
PROBE = """
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention
print("GDN_CALL_IS", gdn_attention._cpu_gdn_attention_nonspec.__module__)
"""


def probe(**env):
    environment = dict(os.environ)
    environment.pop("VLLM_PLUGINS", None)
    environment.pop("GDN_VLLM", None)
    environment.update(env)
    result = subprocess.run([sys.executable, "-c", PROBE], env=environment, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("GDN_CALL_IS")]
    assert len(lines) == 1, result.stdout
    return lines[0].split()[1], result.stderr


def test_gdn_vllm_0_leaves_vllms_path():
    module, _ = probe(GDN_VLLM="0")
    assert module.startswith("vllm."), module


def test_vllm_plugins_list_without_gdn_leaves_vllms_path():
    module, _ = probe(VLLM_PLUGINS="lora_filesystem_resolver")
    assert module.startswith("vllm."), module
