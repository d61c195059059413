"""gdn.torch.fused_gdn_step: a sequence's result does not depend on where it stands in the
batch. A one-token decode behind a prefill is a prefill to the wrapper's distribution (only the
leading one-token sequences with a state are decodes); the library runs every one-token
sequence through the decode kernel, so it gives the bytes it gives stepped alone (gdn/step.h).
Dv = 20 leaves a tail of value columns past the last whole vector, where the layer op's token
recurrence and the decode kernel used to round differently (3e-8 in the state)."""

import pytest

torch = pytest.importorskip("torch")
import gdn.torch  # noqa: E402


def test_decode_behind_a_prefill_is_bit_identical_to_the_decode_alone():
    torch.manual_seed(0)
    hk, hv, dk, dv, k = 2, 4, 16, 20, 4
    d = 2 * hk * dk + hv * dv
    w, a_log, dt_bias = torch.randn(d, k), 0.5 * torch.randn(hv), torch.randn(hv)
    prefill, decode = torch.randn(9, d), torch.randn(1, d)
    pa, pb, da, db = torch.randn(9, hv), torch.randn(9, hv), torch.randn(1, hv), torch.randn(1, hv)
    conv, ssm = torch.randn(4, k - 1, d), 0.3 * torch.randn(4, hv, dk, dv)
    heads = dict(num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
    for threads in (1, 2):
        conv1, ssm1 = conv.clone(), ssm.clone()
        alone = gdn.torch.fused_gdn_step(decode, da, db, w, a_log, dt_bias, conv1, ssm1,
                                         torch.tensor([2]), torch.tensor([0, 1]),
                                         torch.tensor([True]), threads=threads, **heads)
        for slots, order in (([1, 2], "prefill first"), ([2, 1], "decode first")):
            conv2, ssm2 = conv.clone(), ssm.clone()
            conv2[slots[1]], ssm2[slots[1]] = conv[2], ssm[2]  # the decode's state in its slot
            if order == "prefill first":
                out = gdn.torch.fused_gdn_step(
                    torch.cat([prefill, decode]), torch.cat([pa, da]), torch.cat([pb, db]), w,
                    a_log, dt_bias, conv2, ssm2, torch.tensor(slots), torch.tensor([0, 9, 10]),
                    torch.tensor([False, True]), threads=threads, **heads)[9:]
            else:
                out = gdn.torch.fused_gdn_step(
                    torch.cat([decode, prefill]), torch.cat([da, pa]), torch.cat([db, pb]), w,
                    a_log, dt_bias, conv2, ssm2, torch.tensor(slots[::-1]),
                    torch.tensor([0, 1, 10]), torch.tensor([True, False]), threads=threads,
                    **heads)[:1]
            assert torch.equal(out, alone), (order, threads, (out - alone).abs().max())
            assert torch.equal(ssm2[slots[1]], ssm1[2]), (order, threads)
            assert torch.equal(conv2[slots[1]], conv1[2]), (order, threads)
