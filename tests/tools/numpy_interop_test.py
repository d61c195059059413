#!/usr/bin/env python3
"""NumPy interoperability of `gdn forward`, `gdn layer-forward` and `gdn step`, checked against
an independent NumPy implementation.

Writes inputs with np.save exactly as a framework dump would, runs the gdn tool, reads its
outputs with np.load, and compares them with the gated delta rule written here in float64
NumPy straight from docs/math.md (a second, independent implementation of the definition):

    alpha = exp(g);  u = beta (v - alpha S^T k);  S = alpha S + k u^T;  o = scale S^T q

and, for the layer op (docs/math.md section 6), the causal conv1d + SiLU, the split into
q | k | v heads and the gates beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias) before it;
for a serving step (docs/math.md section 7), the slots each sequence reads and writes.

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


def layer(qkv, a, b, w, bias, A_log, dt_bias, conv_state, h0, cu_seqlens, hk, hv, dk, dv):
    """The fused layer op in float64 NumPy: out [T, Hv Dv], conv_state_out, recurrent_state_out."""
    qkv, a, b, w, bias, A_log, dt_bias, conv_state = (
        x.astype(np.float64) for x in (qkv, a, b, w, bias, A_log, dt_bias, conv_state))
    T, D = qkv.shape
    K = w.shape[-1]
    w = w.reshape(D, K)
    xh = np.zeros((T, D))
    state_out = np.zeros_like(conv_state)
    for s in range(len(cu_seqlens) - 1):
        lo, hi = cu_seqlens[s], cu_seqlens[s + 1]
        x = np.concatenate([conv_state[s], qkv[lo:hi]])  # the K - 1 inputs before, then the sequence
        for t in range(hi - lo):
            y = (w * x[t:t + K].T).sum(-1) + bias
            xh[lo + t] = y / (1 + np.exp(-y))
        state_out[s] = x[len(x) - (K - 1):]
    q = xh[:, :hk * dk].reshape(T, hk, dk)
    k = xh[:, hk * dk:2 * hk * dk].reshape(T, hk, dk)
    v = xh[:, 2 * hk * dk:].reshape(T, hv, dv)
    z = a + dt_bias
    g = -np.exp(A_log) * np.logaddexp(0, z)
    beta = 1 / (1 + np.exp(-b))
    o, ht = recurrence(q, k, v, g, beta, cu_seqlens, h0, True, dk ** -0.5)
    return o.reshape(T, hv * dv), state_out, ht


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

        failures += check_layer(gdn, rng, tmp)
        failures += check_step(gdn, rng, tmp)

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


def check_layer(gdn, rng, tmp):
    """`gdn layer-forward` (float32 kernels and the float64 reference) against layer()."""
    failures = []
    cu = np.array([0, 2, 40, 71], dtype=np.int32)  # int32 boundaries; a sequence shorter than K - 1
    T, hk, hv, dk, dv, K = int(cu[-1]), 2, 4, 16, 12, 4
    D = 2 * hk * dk + hv * dv
    inputs = {
        "qkv": rng.standard_normal((T, D), dtype=np.float32),
        "a": rng.standard_normal((T, hv), dtype=np.float32),
        "b": rng.standard_normal((T, hv), dtype=np.float32),
        "conv_weight": (0.5 * rng.standard_normal((D, 1, K))).astype(np.float32),
        "conv_bias": (0.2 * rng.standard_normal(D)).astype(np.float32),
        "A_log": rng.uniform(-2, 1, hv).astype(np.float32),
        "dt_bias": rng.uniform(-1, 1, hv).astype(np.float32),
        "conv_state": rng.standard_normal((3, K - 1, D), dtype=np.float32),
        "recurrent_state": 0.5 * rng.standard_normal((3, hv, dk, dv), dtype=np.float32),
        "cu_seqlens": cu,
    }
    src = os.path.join(tmp, "layer_in")
    os.makedirs(src)
    for name, array in inputs.items():
        np.save(os.path.join(src, name + ".npy"), array)
    want = layer(inputs["qkv"], inputs["a"], inputs["b"], inputs["conv_weight"], inputs["conv_bias"],
                 inputs["A_log"], inputs["dt_bias"], inputs["conv_state"], inputs["recurrent_state"],
                 cu.astype(np.int64), hk, hv, dk, dv)
    heads = ["--hk", str(hk), "--hv", str(hv), "--dk", str(dk), "--dv", str(dv)]
    names = ("out", "conv_state_out", "recurrent_state_out")
    for engine, extra, tolerance in (("float32 kernels", [], 1e-4), ("C++ float64 reference", ["--reference"], 1e-12)):
        out_dir = os.path.join(tmp, "layer_" + ("ref" if extra else "fast"))
        code, out = run(gdn, "layer-forward", "--in", src, "--out", out_dir, *heads, *extra)
        if code != 0:
            failures.append(f"gdn layer-forward {' '.join(extra)} failed: {out}")
            continue
        for name, ref in zip(names, want):
            x = np.load(os.path.join(out_dir, name + ".npy"))
            err = normalized_error(x, ref)
            print(f"layer-forward, {engine} vs NumPy float64, {name}: error {err:.2e}")
            if x.shape != ref.shape or not err <= tolerance:
                failures.append(f"layer {engine} {name}: shape {x.shape}, error {err:.3g} > {tolerance}")
    # The conv state is raw inputs: copied exactly.
    state = np.load(os.path.join(tmp, "layer_fast", "conv_state_out.npy"))
    if not np.array_equal(state, want[1].astype(np.float32)):
        failures.append("conv_state_out is not the last K - 1 raw inputs")
    return failures


def step(inputs, hk, hv, dk, dv):
    """A serving step in float64 NumPy (include/gdn/step.h), every live sequence through layer()
    on its own, a decode window token by token: out and the two pools after the step."""
    qsl, slots, lens = inputs["query_start_loc"], inputs["state_indices"], inputs["seq_lens"]
    decode_end, _, mixed_end = (int(x) for x in inputs["distribution"])
    offsets = inputs.get("read_offsets", np.zeros_like(slots))
    conv = inputs["conv_state"].astype(np.float64)
    rec = inputs["recurrent_state"].astype(np.float64)
    T = inputs["qkv"].shape[0]
    out = np.zeros((T, hv * dv))
    params = [inputs[n] for n in ("conv_weight", "conv_bias", "A_log", "dt_bias")]
    for s in range(mixed_end):
        lo, hi = int(qsl[s]), int(qsl[s + 1])
        read = int(slots[s] + offsets[s]) if lens[s] > hi - lo else -1
        pieces = [(t, t + 1) for t in range(lo, hi)] if s < decode_end else [(lo, hi)]
        for i, (a, b) in enumerate(pieces):
            c0 = conv[read:read + 1].copy() if read >= 0 else np.zeros((1,) + conv.shape[1:])
            h0 = rec[read:read + 1].copy() if read >= 0 else np.zeros((1,) + rec.shape[1:])
            o, c1, h1 = layer(inputs["qkv"][a:b], inputs["a"][a:b], inputs["b"][a:b], params[0],
                              params[1], params[2], params[3], c0, h0, np.array([0, b - a]),
                              hk, hv, dk, dv)
            out[a:b] = o
            write = int(slots[s]) + i
            conv[write], rec[write] = c1[0], h1[0]
            read = write
    return out, conv, rec


def check_step(gdn, rng, tmp):
    """`gdn step` (float32 kernels and the float64 reference) against step(): 2 decodes (one a
    window of 3 tokens reading its second slot), a fresh and a continued prefill, 1 padding
    sequence and padding rows, 12 slots."""
    failures = []
    hk, hv, dk, dv, K, slots_n = 2, 4, 16, 12, 4, 12
    D = 2 * hk * dk + hv * dv
    lengths = [1, 3, 20, 33, 0]
    qsl = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    T = int(qsl[-1]) + 2
    inputs = {
        "qkv": rng.standard_normal((T, D), dtype=np.float32),
        "a": rng.standard_normal((T, hv), dtype=np.float32),
        "b": rng.standard_normal((T, hv), dtype=np.float32),
        "conv_weight": (0.5 * rng.standard_normal((D, K))).astype(np.float32),
        "conv_bias": (0.2 * rng.standard_normal(D)).astype(np.float32),
        "A_log": rng.uniform(-2, 1, hv).astype(np.float32),
        "dt_bias": rng.uniform(-1, 1, hv).astype(np.float32),
        "conv_state": rng.standard_normal((slots_n, K - 1, D), dtype=np.float32),
        "recurrent_state": 0.5 * rng.standard_normal((slots_n, hv, dk, dv), dtype=np.float32),
        "query_start_loc": qsl,
        "state_indices": np.array([2, 4, 8, 10, 0], dtype=np.int64),
        "seq_lens": np.array([9, 40, 20, 70, 0], dtype=np.int64),
        "distribution": np.array([2, 3, 4], dtype=np.int64),
        "read_offsets": np.array([0, 1, 0, -1, 0], dtype=np.int64),
    }
    src = os.path.join(tmp, "step_in")
    os.makedirs(src)
    for name, array in inputs.items():
        np.save(os.path.join(src, name + ".npy"), array)
    want = step(inputs, hk, hv, dk, dv)
    heads = ["--hk", str(hk), "--hv", str(hv), "--dk", str(dk), "--dv", str(dv), "--num-spec", "2"]
    names = ("out", "conv_state", "recurrent_state")
    for engine, extra, tolerance in (("float32 kernels", [], 1e-4), ("C++ float64 reference", ["--reference"], 1e-12)):
        out_dir = os.path.join(tmp, "step_" + ("ref" if extra else "fast"))
        code, out = run(gdn, "step", "--in", src, "--out", out_dir, *heads, *extra)
        if code != 0:
            failures.append(f"gdn step {' '.join(extra)} failed: {out}")
            continue
        for name, ref in zip(names, want):
            x = np.load(os.path.join(out_dir, name + ".npy"))
            err = normalized_error(x, ref)
            print(f"step, {engine} vs NumPy float64, {name}: error {err:.2e}")
            if x.shape != ref.shape or not err <= tolerance:
                failures.append(f"step {engine} {name}: shape {x.shape}, error {err:.3g} > {tolerance}")
    # Slots no live sequence writes keep their bytes; padding rows are zero.
    fast = os.path.join(tmp, "step_fast")
    for name in ("conv_state", "recurrent_state"):
        x = np.load(os.path.join(fast, name + ".npy"))
        for slot in (0, 1, 3, 7, 9, 11):
            if not np.array_equal(x[slot], inputs[name][slot]):
                failures.append(f"step changed {name} slot {slot}, which no live sequence writes")
    if np.any(np.load(os.path.join(fast, "out.npy"))[int(qsl[4]):] != 0):
        failures.append("step: padding rows of out are not zero")
    return failures


if __name__ == "__main__":
    sys.exit(main())
