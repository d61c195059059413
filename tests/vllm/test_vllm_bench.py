"""bench/vllm_bench.py (gdn's plugin against vLLM's own GDN path in one engine) stays runnable:
its smallest configuration end to end (the tests' tiny model, one round, one engine start,
about 40-60 s on a 2-core host), its float64 state check against gdn's own step, its verdicts,
and its --help."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

import gdn.torch  # noqa: E402

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "vllm_bench.py")
spec = importlib.util.spec_from_file_location("vllm_bench", BENCH)
vllm_bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vllm_bench)


def test_help_shows_the_examples():
    run = subprocess.run([sys.executable, BENCH, "--help"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert "Examples:" in run.stdout and "--quick" in run.stdout


def test_bad_option_names_the_option():
    run = subprocess.run([sys.executable, BENCH, "--prefill-batch", "16by512"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "--prefill-batch: expected BxS" in run.stderr and "16by512" in run.stderr


def fresh_prefill(tokens=40, hk=2, hv=4, dk=16, dv=16):
    """A fresh prefill through gdn's step on one slot, captured as the bench captures vLLM's."""
    g = torch.Generator().manual_seed(0)
    d = 2 * hk * dk + hv * dv
    qkv = torch.randn(tokens, d, generator=g).bfloat16()
    a = torch.randn(tokens, hv, generator=g).bfloat16()
    b = torch.randn(tokens, hv, generator=g).bfloat16()
    w = torch.randn(d, 4, generator=g) / 2
    a_log, dt_bias = torch.linspace(0.5, 16.0, hv).log(), torch.linspace(-1.0, 1.0, hv)
    conv = torch.zeros(2, 3, d, dtype=torch.bfloat16)
    ssm = torch.full((2, hv, dk, dv), float("nan"))
    gdn.torch.fused_gdn_step(qkv, a, b, w, a_log, dt_bias, conv, ssm, torch.tensor([1]),
                             torch.tensor([0, tokens]), torch.tensor([False]), num_k_heads=hk,
                             num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
    return dict(inputs=[qkv, a, b], params=[w, None, a_log, dt_bias], heads=(hk, hv, dk, dv),
                state=ssm[1].clone())


def test_state_error_of_gdns_step_is_float32_small_and_sees_a_perturbation():
    capture = fresh_prefill()
    error, reference = vllm_bench.state_error(capture)
    assert error <= 1e-5, error
    assert reference.dtype == torch.float64 and reference.abs().max() > 0
    capture["state"][1, 3, 5] += 1e-3 * reference.abs().max().item()
    perturbed, _ = vllm_bench.state_error(capture, reference)
    assert 0.9e-3 <= perturbed <= 1.1e-3 + error, perturbed


def fake_run(prefill_ratio, decode_ratio, error, pools="float32"):
    def rounds(ms):
        return [dict(tokens_per_s=100.0, gdn_ms=ms, gdn_cpu_ms=ms, cpu_wait=0.0)]
    return dict(threads=1, kinds={"prefill 1x8192": "prefill", "decode 16": "decode"},
                cases={"prefill 1x8192": dict(gdn=rounds(10.0 * prefill_ratio), vllm=rounds(10.0)),
                       "decode 16": dict(gdn=rounds(10.0 * decode_ratio), vllm=rounds(10.0))},
                accuracy=dict(gdn=dict(error=error), vllm=dict(error=3e-3)),
                ssm_pool=dict(dtype=pools))


def test_targets_prefill_half_decode_two_thirds_state_1e_5():
    passed = [t["passed"] for t in vllm_bench.summarize(fake_run(0.5, 0.66, 1e-5))["targets"]]
    assert passed == [True, True, True]
    passed = [t["passed"] for t in vllm_bench.summarize(fake_run(0.51, 0.67, 2e-5))["targets"]]
    assert passed == [False, False, False]
    # bf16 pools: no state target
    assert len(vllm_bench.summarize(fake_run(0.4, 0.4, 1e-3, "bfloat16"))["targets"]) == 2


def test_tiny_run_times_both_paths_and_passes_the_state_target(tmp_path):
    out = tmp_path / "result.json"
    env = dict(os.environ)
    env.pop("GDN_VLLM", None)
    env.pop("VLLM_PLUGINS", None)
    run = subprocess.run(
        [sys.executable, BENCH, "--shapes", "tiny", "--threads", "1", "--rounds", "1",
         "--prefill-long", "96", "--prefill-batch", "2x32", "--decode-seqs", "2,3",
         "--decode-steps", "3", "--decode-prompt", "4", "--kv-cache-gib", "1",
         "--json", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "targets:" in run.stdout and "SSM state after a 96-token prefill" in run.stdout
    result = json.loads(out.read_text())
    (one,) = result["runs"]
    assert one["threads"] == one["torch_threads"] == 1
    assert set(one["cases"]) == {"prefill 1x96", "prefill 2x32", "decode 2", "decode 3"}
    for name, paths in one["cases"].items():
        for path in ("gdn", "vllm"):
            (r,) = paths[path]
            assert r["tokens_per_s"] > 0 and r["gdn_ms"] > 0 and r["threads"] == [1], (name, r)
            # every step of the case made one call per GDN layer (3), on the path named
            assert r["gdn_calls"] >= 3 * r["steps"], (name, r)
        # the stages inside the calls: gdn's one op; vLLM's conv and delta rule
        assert paths["gdn"][0]["stages_ms"].keys() == {"gdn step"}, paths["gdn"]
        assert {"conv", "delta rule"} <= paths["vllm"][0]["stages_ms"].keys(), paths["vllm"]
    # 3 steps timed, each with all 3 sequences decoding
    assert one["cases"]["decode 3"]["gdn"][0]["steps"] == 3
    acc = one["accuracy"]
    assert acc["gdn"]["error"] <= 1e-5, acc
    # vLLM's path keeps bf16 intermediates: its state is further from float64, so the two
    # figures come from two different computations
    assert math.isfinite(acc["vllm"]["error"]) and acc["vllm"]["error"] > acc["gdn"]["error"]
    assert one["ssm_pool"]["dtype"] == "float32"
