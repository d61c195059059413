#!/usr/bin/env python3
"""NumPy interoperability of `gdn forward`, checked against an independent NumPy recurrence.

Writes inputs with np.save exactly as a framework dump would, runs the gdn tool, reads its
outputs with np.load, and compares them with the gated delta rule written here in float64
NumPy straight from docs/math.md (a second, independent implementation of the definition):

    alpha = exp(g);  u = beta (v - alpha S^T k);  S = alpha S + k u^T;  o = scale S^T q

Usage: numpy_interop_test.py PATH/TO/gdn
"""
import os
import subprocess
import sys
import tempfile

import numpy as np


def recurrence(q, k, v, g, beta, cu_seqlens, h0, l2norm, scale):
    """The token recurrence in float64 NumPy: o [T, Hv, Dv], ht [N, Hv, Dk, Dv]."""
    q, k, v, g, beta = (x.astype(np.float64) for x in (q, k, v, g, beta))
    T, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    if l2norm:
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    o = np.zeros((T, hv, dv))
    ht = h0.astype(np.float64).copy()
    for s in range(len(cu_seqlens) - 1):
        for h in range(hv):
            kh = h // (hv // hk)
            S = ht[s, h]
            for t in range(cu_seqlens[s], cu_seqlens[s + 1]):
                alpha = np.exp(g[t, h])
                u = beta[t, h] * (v[t, h] - alpha * (S.T @ k[t, kh]))
                S = alpha * S + np.outer(k[t, kh], u)
                o[t, h] = scale * (S.T @ q[t, kh])
            ht[s, h] = S
    return o, ht


def normalized_error(x, ref):
    return float(np.abs(x.astype(np.float64) - ref).max() / np.sqrt((ref * ref).mean()))


def run(gdn, *args):
    result = subprocess.run([gdn, *args], capture_output=True, text=True)
    return result.returncode, result.stdout + result.stderr


def main():
    gdn = sys.argv[1]
    rng = np.random.default_rng(2026)
    cu = np.array([0, 57, 57, 140], dtype=np.int64)  # a zero-length sequence in the middle
    T, hk, hv, dk, dv = int(cu[-1]), 2, 4, 24, 20
    inputs = {
        "q": rng.standard_normal((T, hk, dk), dtype=np.float32),
        "k": rng.standard_normal((T, hk, dk), dtype=np.float32),
        "v": rng.standard_normal((T, hv, dv), dtype=np.float32),
        "g": -rng.uniform(0, 2, (T, hv)).astype(np.float32),
        "beta": rng.uniform(0, 1, (T, hv)).astype(np.float32),
        "h0": 0.5 * rng.standard_normal((3, hv, dk, dv), dtype=np.float32),
        "cu_seqlens": cu,
    }
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "in")
        os.makedirs(src)
        for name, array in inputs.items():
            np.save(os.path.join(src, name + ".npy"), array)
        ref_o, ref_ht = recurrence(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"],
                                   cu, inputs["h0"], True, 0.7)

        # The float32 CPU kernels: within the float32 tolerance of docs/numerics.md's bench check.
        code, out = run(gdn, "forward", "--in", src, "--out", os.path.join(tmp, "fast"), "--l2norm", "--scale", "0.7")
        if code != 0:
            failures.append("gdn forward failed: " + out)
        else:
            o = np.load(os.path.join(tmp, "fast", "o.npy"))
            ht = np.load(os.path.join(tmp, "fast", "ht.npy"))
            if o.dtype != np.float32 or o.shape != (T, hv, dv) or ht.shape != (3, hv, dk, dv):
                failures.append(f"unexpected outputs {o.dtype} {o.shape} {ht.shape}")
            for name, x, ref in (("o", o, ref_o), ("ht", ht, ref_ht)):
                err = normalized_error(x, ref)
                print(f"float32 kernels vs NumPy float64 recurrence, {name}: error {err:.2e}")
                if not err <= 1e-4:
                    failures.append(f"{name}: error {err:.3g} > 1e-4")

        # The C++ float64 reference: the same function as the NumPy one, to float64 rounding.
        code, out = run(gdn, "forward", "--in", src, "--out", os.path.join(tmp, "ref"), "--l2norm", "--scale", "0.7",
                        "--reference", "--residuals", "--chunk-size", "32")
        if code != 0:
            failures.append("gdn forward --reference failed: " + out)
        else:
            for name, ref in (("o", ref_o), ("ht", ref_ht)):
                x = np.load(os.path.join(tmp, "ref", name + ".npy"))
                err = normalized_error(x, ref)
                print(f"C++ float64 reference vs NumPy float64 recurrence, {name}: error {err:.2e}")
                if x.dtype != np.float64 or not err <= 1e-12:
                    failures.append(f"reference {name}: {x.dtype}, error {err:.3g} > 1e-12")
            chunk_states = np.load(os.path.join(tmp, "ref", "chunk_states.npy"))
            t_inv = np.load(os.path.join(tmp, "ref", "t_inv.npy"))
            if chunk_states.shape != (2 + 0 + 3, hv, dk, dv) or t_inv.shape != (5, hv, 32, 32):
                failures.append(f"residual shapes {chunk_states.shape} {t_inv.shape}")
            if not np.array_equal(chunk_states[0], inputs["h0"][0]):
                failures.append("chunk_states[0] is not h0 of sequence 0")

        # A Fortran-ordered array (what np.save writes for a transposed view) is refused with
        # the fix in the message, not misread.
        np.save(os.path.join(src, "v.npy"), np.asfortranarray(inputs["v"]))
        code, out = run(gdn, "forward", "--in", src, "--out", os.path.join(tmp, "bad"))
        print("Fortran-order v.npy:", out.strip().splitlines()[-1] if out.strip() else "(no output)")
        if code != 1 or "v.npy" not in out or "ascontiguousarray" not in out:
            failures.append(f"Fortran-order v.npy: exit {code}, output {out!r}")

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
