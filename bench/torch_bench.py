"""Times transformers' Qwen3-Next GatedDeltaNet layer patched with gdn.torch.patch against the
same layer unpatched (transformers' own PyTorch functions), forward and forward + backward, and a
small Qwen3-Next model's prefill, in one run, and prints the ratios.

The layer is Qwen3-Next-80B-A3B's (hidden 2048, Hk 16, Hv 32, Dk = Dv = 128, conv K 4) with
random weights; its input is [1, T, 2048] float32. The "core" rows time the function the patch
swaps alone, on the layer's shapes: transformers' torch_chunk_gated_delta_rule against
gdn.torch.chunk_gated_delta_rule (L2 norm in the kernel, as the layer calls it); the "conv" rows
transformers' causal_conv1d_fn against gdn.torch.causal_conv1d_fn on the layer's [1, 8192, T]
channel-last input, SiLU. The layer rows include what the patch leaves to transformers (the
projections and the gated norm), the same in both. Patched and unpatched alternate within each
repeat, so that the shared host's drift falls on both; medians are printed. Before timing, the
patched forward is checked against the unpatched one (relative error).

Examples:
  .venv/bin/python bench/torch_bench.py                      # 8192 tokens, all threads
  .venv/bin/python bench/torch_bench.py --seq 2048 --threads 1
  .venv/bin/python bench/torch_bench.py --json               # one JSON line per row
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("Examples:")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=8192, help="tokens (default 8192)")
    p.add_argument("--threads", type=int, default=0, help="torch and gdn threads, 0 = all")
    p.add_argument("--repeats", type=int, default=3, help="timed alternations (default 3)")
    p.add_argument("--model-seq", type=int, default=None,
                   help="tokens of the small model's prefill (default: --seq)")
    p.add_argument("--json", action="store_true", help="print one JSON object per row")
    args = p.parse_args(argv)
    if args.seq < 1 or args.repeats < 1 or args.threads < 0:
        p.error(f"expected --seq >= 1, --repeats >= 1, --threads >= 0; given {args.seq}, "
                f"{args.repeats}, {args.threads}")
    return args


def log(msg):
    print(f"torch_bench: {msg}", file=sys.stderr, flush=True)


def main(argv=None):
    args = parse_args(argv)
    import torch
    import transformers
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    import gdn
    import gdn.torch

    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    t = args.seq
    log(f"gdn {gdn.__version__} ({gdn.cpu_isa()}), torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {threads} thread(s), {t} tokens")

    layer_config = Qwen3NextConfig(
        hidden_size=2048, linear_num_key_heads=16, linear_num_value_heads=32,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        num_hidden_layers=1, layer_types=["linear_attention"])
    torch.manual_seed(0)
    layer = Qwen3NextGatedDeltaNet(layer_config, layer_idx=0)
    x = torch.randn(1, t, 2048) * 0.5
    d_out = torch.randn(1, t, 2048)

    model_config = Qwen3NextConfig(
        vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"], num_attention_heads=4,
        num_key_value_heads=2, head_dim=128, linear_num_key_heads=4, linear_num_value_heads=8,
        linear_key_head_dim=128, linear_value_head_dim=128, mlp_only_layers=[0, 1, 2, 3],
        max_position_embeddings=max(t, args.model_seq or t) + 1)
    model = Qwen3NextForCausalLM(model_config).eval()
    ids = torch.randint(0, 4096, (1, args.model_seq or t),
                        generator=torch.Generator().manual_seed(1))

    def layer_fwd():
        with torch.no_grad():
            return layer(x)

    def layer_fwd_bwd():
        xg = x.clone().requires_grad_(True)
        layer.zero_grad(set_to_none=True)
        layer(xg).backward(d_out)

    hk, hv, dk, dv = 16, 32, 128, 128
    q, k = torch.randn(2, 1, t, hk, dk)
    v = torch.randn(1, t, hv, dv)
    g = -torch.nn.functional.softplus(torch.randn(1, t, hv))
    beta = torch.rand(1, t, hv)
    d_o = torch.randn(1, t, hv, dv)
    import transformers.models.qwen3_next.modeling_qwen3_next as modeling

    def core(fwd_only):
        def run():
            fn = modeling.torch_chunk_gated_delta_rule
            if fwd_only:
                with torch.no_grad():
                    fn(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
                return
            xs = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta)]
            o, _ = fn(*xs[:3], g=xs[3], beta=xs[4], use_qk_l2norm_in_kernel=True)
            o.backward(d_o)
        return run

    channels = 2 * hk * dk + hv * dv
    mixed = torch.randn(1, t, channels).transpose(1, 2)  # the layer's [B, D, T] view
    conv_w = torch.randn(channels, 4) * 0.5
    conv_b = torch.randn(channels) * 0.1
    d_mixed = torch.randn(1, channels, t)

    def conv(fwd_only):
        def run():
            fn = modeling.causal_conv1d_fn
            if fwd_only:
                with torch.no_grad():
                    fn(mixed, conv_w, conv_b, activation="silu")
                return
            xs = [x.clone().requires_grad_(True) for x in (mixed, conv_w, conv_b)]
            fn(*xs, activation="silu").backward(d_mixed)
        return run

    def prefill():
        with torch.no_grad():
            return model(ids, use_cache=True).logits

    with torch.no_grad():
        want = layer(x)
        gdn.torch.patch(model)  # the modeling module of the model's layers is the layer's
        got = layer(x)
        gdn.torch.unpatch()
    err = float((got - want).norm() / want.norm())
    log(f"check: patched layer forward vs unpatched: relative error {err:.2e} "
        f"(tolerance 1e-4) {'PASS' if err <= 1e-4 else 'FAIL'}")
    if err > 1e-4:
        return 1

    rows = []
    for name, fn, tokens in (("core fwd", core(True), t), ("core fwd+bwd", core(False), t),
                             ("conv fwd", conv(True), t), ("conv fwd+bwd", conv(False), t),
                             ("layer fwd", layer_fwd, t), ("layer fwd+bwd", layer_fwd_bwd, t),
                             ("model prefill", prefill, ids.shape[1])):
        times = {"transformers": [], "gdn": []}
        for patched in (False, True):  # warm-up
            if patched:
                gdn.torch.patch(model)
            fn()
            gdn.torch.unpatch()
        for r in range(args.repeats):
            for patched in (False, True):
                if patched:
                    gdn.torch.patch(model)
                start = time.perf_counter()
                fn()
                times["gdn" if patched else "transformers"].append(time.perf_counter() - start)
                gdn.torch.unpatch()
            log(f"{name}: repeat {r + 1}/{args.repeats}: transformers "
                f"{1e3 * times['transformers'][-1]:.0f} ms, gdn {1e3 * times['gdn'][-1]:.0f} ms")
        hf, ours = (statistics.median(times[k]) * 1e3 for k in ("transformers", "gdn"))
        rows.append(dict(case=name, tokens=tokens, threads=threads, transformers_ms=hf,
                         gdn_ms=ours, speedup=hf / ours))

    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print(f"{'case':14} {'tokens':>6} {'threads':>7} {'transformers ms':>15} {'gdn ms':>9} "
          f"{'speed-up':>8}")
    for r in rows:
        print(f"{r['case']:14} {r['tokens']:6d} {r['threads']:7d} {r['transformers_ms']:15.1f} "
              f"{r['gdn_ms']:9.1f} {r['speedup']:7.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
