"""A decode step over strided state pools against the same step over contiguous pools
(gdn.torch.fused_gdn_step, issue 35's zero-copy pools): the strided pools are carved from one
buffer of padded pages the way vLLM's hybrid allocator carves them (slot x's conv state and SSM
state in page x, the SSM state at a storage offset), so both have a page-sized slot stride.

Rounds alternate between the two layouts (a noisy host drifts; alternating keeps the
comparison fair); each round times `--repeats` steps of each layout back to back. Reported: each
layout's median and spread over rounds, and the strided / contiguous ratio of the medians, of the
minima and of each round's pair. Before timing, one step on each layout is checked to give the
same bytes.

  python bench/strided_pools_bench.py --seqs 16,64 --threads 1 --rounds 9
"""

import argparse
import statistics
import time

import torch

import gdn.torch

HK, HV, DK, DV, K = 16, 32, 128, 128, 4  # Qwen3-Next's GDN heads
D = 2 * HK * DK + HV * DV
HEADS = dict(num_k_heads=HK, num_v_heads=HV, head_k_dim=DK, head_v_dim=DV)


def pools(slots, conv_dtype, ssm_dtype, paged):
    conv_shape, ssm_shape = (slots, K - 1, D), (slots, HV, DK, DV)
    if not paged:
        return torch.zeros(conv_shape, dtype=conv_dtype), torch.zeros(ssm_shape, dtype=ssm_dtype)
    cb = (K - 1) * D * torch.tensor([], dtype=conv_dtype).element_size()
    sb = HV * DK * DV * torch.tensor([], dtype=ssm_dtype).element_size()
    page = (cb + sb + 4095) // 4096 * 4096 + 4096  # padded, as vLLM pads a page
    buffer = torch.zeros((slots, page), dtype=torch.uint8)
    conv = buffer[:, :cb].view(conv_dtype).view(conv_shape)
    ssm = buffer[:, cb:cb + sb].view(ssm_dtype).view(ssm_shape)
    return conv, ssm


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqs", default="16,64", help="decode batch sizes (comma separated)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=20, help="steps per round")
    parser.add_argument("--ssm-dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ssm_dtype = getattr(torch, args.ssm_dtype)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(D, K, generator=g) / K ** 0.5
    A_log, dt_bias = torch.linspace(-1, 1, HV), torch.randn(HV, generator=g) * 0.5
    print(f"gdn {gdn.__version__}, torch {torch.__version__}, {args.threads} thread(s), "
          f"bf16 activations, bf16 conv pool, {args.ssm_dtype} SSM pool")
    for n in (int(s) for s in args.seqs.split(",")):
        qkv = torch.randn(n, D, generator=g).bfloat16()
        a = torch.randn(n, HV, generator=g).bfloat16()
        b = torch.randn(n, HV, generator=g).bfloat16()
        slots = torch.arange(1, n + 1)
        cu = torch.arange(n + 1)
        layouts = {name: pools(n + 1, torch.bfloat16, ssm_dtype, name == "strided")
                   for name in ("contiguous", "strided")}

        def step(name):
            conv, ssm = layouts[name]
            return gdn.torch.fused_gdn_step(qkv, a, b, w, A_log, dt_bias, conv, ssm, slots, cu,
                                            None, **HEADS)

        outs = {name: step(name) for name in layouts}
        assert torch.equal(outs["contiguous"], outs["strided"])
        assert all(torch.equal(x, y) for x, y in zip(*layouts.values()))
        times = {name: [] for name in layouts}
        for r in range(args.rounds):
            for name in (("contiguous", "strided") if r % 2 == 0 else ("strided", "contiguous")):
                start = time.perf_counter()
                for _ in range(args.repeats):
                    step(name)
                times[name].append((time.perf_counter() - start) / args.repeats * 1e3)
        med = {name: statistics.median(t) for name, t in times.items()}
        for name, t in times.items():
            print(f"decode-{n:<3} {name:>10}: median {med[name]:.3f} ms/step "
                  f"(min {min(t):.3f}, max {max(t):.3f}, {args.rounds} rounds)")
        # Each round's two timings ran back to back: their ratio cancels the host's drift.
        ratios = sorted(s / c for s, c in zip(times["strided"], times["contiguous"]))
        print(f"decode-{n:<3} strided / contiguous: medians "
              f"{med['strided'] / med['contiguous']:.3f}"
              f", minima {min(times['strided']) / min(times['contiguous']):.3f}, per round "
              f"median {statistics.median(ratios):.3f} ({ratios[0]:.2f} to {ratios[-1]:.2f})")


if __name__ == "__main__":
    main()
