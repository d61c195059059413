#!/usr/bin/env python3
"""operand_study.py: what bf16 matrix operands cost a training step, measured with the gdn tool.

Makes one layer's inputs (Qwen3-Next-like gates: A_log = log U(1, 16), dt_bias the inverse
softplus of U(0.001, 0.1)), runs `gdn layer-forward` / `gdn layer-backward` with
--matmul compute and --matmul bf16 and with --reference (float64), and prints, per output,
the error against the reference (max |x - ref| / rms(ref), docs/numerics.md) and the cosine of
the A_log and dt_bias gradients with the reference's (the bound for bf16 operands: >= 0.999).

usage: bench/operand_study.py --gdn build/test/gdn [--tokens 4096] [--hk 4] [--hv 8]
           [--dk 128] [--dv 128] [--chunk-size 64] [--seed 1] [--work DIR]
needs numpy (scripts/setup.sh --tests installs it into .venv).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--gdn", required=True, help="path of the gdn tool")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hk", type=int, default=4)
    ap.add_argument("--hv", type=int, default=8)
    ap.add_argument("--dk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", help="directory for the .npy files (default: a temporary one)")
    a = ap.parse_args()

    rng = np.random.default_rng(a.seed)
    t, hk, hv, dk, dv, taps = a.tokens, a.hk, a.hv, a.dk, a.dv, 4
    d = 2 * hk * dk + hv * dv
    work = a.work or tempfile.mkdtemp(prefix="gdn-operands-")
    inp = os.path.join(work, "in")
    os.makedirs(inp, exist_ok=True)
    f32 = np.float32
    dt = rng.uniform(0.001, 0.1, hv)
    arrays = {
        "qkv": rng.standard_normal((t, d)).astype(f32),
        "a": rng.standard_normal((t, hv)).astype(f32),
        "b": rng.standard_normal((t, hv)).astype(f32),
        "conv_weight": (rng.standard_normal((d, taps)) / np.sqrt(taps)).astype(f32),
        "A_log": np.log(rng.uniform(1, 16, hv)).astype(f32),
        "dt_bias": (dt + np.log(-np.expm1(-dt))).astype(f32),
        "d_out": rng.standard_normal((t, hv * dv)).astype(f32),
    }
    for name, x in arrays.items():
        np.save(os.path.join(inp, name + ".npy"), x)

    heads = ["--hk", str(hk), "--hv", str(hv), "--dk", str(dk), "--dv", str(dv),
             "--chunk-size", str(a.chunk_size), "--quiet"]
    runs = {"compute": ["--matmul", "compute"], "bf16": ["--matmul", "bf16"],
            "reference": ["--reference"]}
    for name, extra in runs.items():
        out = os.path.join(work, name)
        print(f"running {name}...", file=sys.stderr, flush=True)
        for command in ("layer-forward", "layer-backward"):
            subprocess.run([a.gdn, command, "--in", inp, "--out", out] + heads + extra, check=True)

    def load(run, name):
        return np.load(os.path.join(work, run, name + ".npy")).astype(np.float64)

    def error(x, ref):
        rms = np.sqrt(np.mean(ref * ref))
        return np.max(np.abs(x - ref)) / rms if rms > 0 else np.max(np.abs(x - ref))

    def cosine(x, ref):
        return float(np.dot(x.ravel(), ref.ravel()) / (np.linalg.norm(x) * np.linalg.norm(ref)))

    print(f"layer: T = {t}, Hk = {hk}, Hv = {hv}, Dk = {dk}, Dv = {dv}, C = {a.chunk_size}, "
          f"seed {a.seed}; error = max |x - ref| / rms(ref) against the float64 reference")
    print(f"{'output':<22}{'compute':>12}{'bf16':>12}{'ref rounded to bf16':>22}")
    for name in ("out", "recurrent_state_out", "d_qkv", "d_a", "d_b", "d_conv_weight",
                 "d_A_log", "d_dt_bias", "d_recurrent_state"):
        ref = load("reference", name)
        rounded = ref.astype(f32).view(np.uint32)
        rounded = ((rounded + 0x7FFF + ((rounded >> 16) & 1)) & 0xFFFF0000).view(f32)
        print(f"{name:<22}{error(load('compute', name), ref):>12.3g}"
              f"{error(load('bf16', name), ref):>12.3g}{error(rounded.astype(np.float64), ref):>22.3g}")
    for name in ("d_A_log", "d_dt_bias"):
        ref = load("reference", name)
        print(f"cosine {name:<15}{cosine(load('compute', name), ref):>12.7f}"
              f"{cosine(load('bf16', name), ref):>12.7f}")


if __name__ == "__main__":
    main()
