"""The serving step of a GDN layer over pools of state slots (``gdn/step.h``) for PyTorch
inference engines: the custom ops ``gdn::step`` (Tokamax's metadata) and ``gdn::fused_gdn_step``
(sglang's / vLLM's batch description: ``initial_state_indices``, ``cu_seqlens``,
``has_initial_state``), which update both pools in place (declared in ``mutates_args``, so their
schemas mark them ``Tensor(a!)``), and the function ``fused_gdn_step`` over the second.

The batch description is turned into Tokamax's metadata inside the op, when it runs: under
``torch.compile`` a wrapper's Python checks of tensor values would be traced away, and an error
raised while tracing reaches the caller as torch's own exception, not as the ValueError.
"""

from typing import Optional

import torch
from torch import Tensor

from gdn import _gdn
from gdn._options import library_names, static_int
from gdn.torch._ops import check_devices, library_threads, raw

# The library's names -> the op's arguments, in its error messages; fused_gdn_step's batch
# description adds its own.
_OP_NAMES = {"recurrent_state": "ssm_state", "options.hk": "num_k_heads",
             "options.hv": "num_v_heads", "options.dk": "head_k_dim", "options.dv": "head_v_dim",
             "options.num_spec": "num_spec", "options.threads": "threads"}
_FUSED_NAMES = {**_OP_NAMES, "query_start_loc": "cu_seqlens",
                "state_indices": "initial_state_indices"}


@torch.library.custom_op("gdn::step", mutates_args=("conv_state", "ssm_state"),
                         device_types="cpu")
def step(qkv: Tensor, a: Tensor, b: Tensor, conv_weight: Tensor, conv_bias: Optional[Tensor],
         A_log: Tensor, dt_bias: Tensor, conv_state: Tensor, ssm_state: Tensor,
         query_start_loc: Tensor, state_indices: Tensor, seq_lens: Tensor, distribution: Tensor,
         read_state_indices: Optional[Tensor], read_offsets: Optional[Tensor], num_k_heads: int,
         num_v_heads: int, head_k_dim: int, head_v_dim: int, num_spec: int,
         threads: int) -> Tensor:
    """The C++ serving step with its own batch description (gdn/step.h, Tokamax's and
    vLLM's metadata: query_start_loc, state_indices, seq_lens, distribution [decode_end,
    prefill_end, mixed_end], read_state_indices, read_offsets, num_spec speculative tokens).
    Returns out [T, Hv Dv] in qkv's dtype; conv_state [num_slots, K - 1, D] and ssm_state
    [num_slots, Hv, Dk, Dv] are updated in place (each slot dense, any slot stride).
    ``threads``: 0 = ``torch.get_num_threads()``, a larger count clamped to it. Bad input raises ValueError
    before anything is written."""
    out = torch.empty((qkv.shape[0], num_v_heads * head_v_dim), dtype=qkv.dtype)
    with library_names(_OP_NAMES):
        _gdn.step(raw(qkv), raw(a), raw(b), raw(conv_weight), raw(conv_bias), raw(A_log),
                  raw(dt_bias), raw(conv_state), raw(ssm_state), raw(query_start_loc),
                  raw(state_indices), raw(seq_lens), raw(distribution), raw(read_state_indices),
                  raw(read_offsets), None, None, raw(out), num_k_heads, num_v_heads,
                  head_k_dim, head_v_dim, num_spec, library_threads(threads), False)
    return out


@step.register_fake
def _(qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_state, ssm_state, query_start_loc,
      state_indices, seq_lens, distribution, read_state_indices, read_offsets, num_k_heads,
      num_v_heads, head_k_dim, head_v_dim, num_spec, threads):
    return qkv.new_empty((qkv.shape[0], num_v_heads * head_v_dim))


def _conv_pool(conv_state: Tensor, conv_weight: Tensor, qkv: Tensor, num_spec: int = 0) -> Tensor:
    """The conv pool as the library's [num_slots, K - 1 + num_spec, D] (num_spec only in vLLM's
    speculative layout): vLLM's [num_slots, D, K - 1 + num_spec] view of such memory is seen
    through its transpose (no copy: the slots are updated where they lie); any other such
    tensor is refused here, in the caller's layout (the library would describe the transpose).
    The slot stride is the library's to check."""
    if conv_state.dim() != 3 or conv_weight.dim() < 1 or qkv.dim() < 1:
        return conv_state  # the library names what is wrong
    slots, channels, taps = conv_state.shape[0], qkv.shape[-1], conv_weight.shape[-1]
    columns = taps - 1 + num_spec
    if tuple(conv_state.shape[1:]) != (channels, columns) or columns == channels:
        return conv_state
    library = conv_state.transpose(1, 2)
    rows_dense = (channels <= 1 or library.stride(2) == 1) and (
        columns <= 1 or library.stride(1) == channels)
    if not rows_dense:
        what = "K - 1 + num_spec" if num_spec else "K - 1"
        raise ValueError(
            f"gdn: argument 'conv_state': expected a [num_slots, {what}, D] = "
            f"[{slots}, {columns}, {channels}] pool, or vLLM's [num_slots, D, {what}] view of "
            f"one (strides [*, 1, {channels}]: each slot one dense [{what}, D] block, any slot "
            f"stride), given [{slots}, {channels}, {columns}] with strides "
            f"{list(conv_state.stride())}")
    return library


def _index(x: Tensor, name: str) -> None:
    if x.dim() != 1 or x.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"gdn: argument '{name}': expected a rank-1 int32 or int64 tensor, given "
                         f"{x.dtype} {list(x.shape)}")


def _batch(initial_state_indices: Tensor, cu_seqlens: Tensor,
           has_initial_state: Optional[Tensor], tokens: int, windows: Optional[int] = None):
    """Tokamax's metadata (gdn/step.h) for sglang's / vLLM's batch description: (seq_lens,
    distribution). Its own rules are checked here, in its names: padding after every live
    sequence, and the live sequences' boundaries (from 0, each at least one token, at most T),
    which the library would describe with its distribution."""
    _index(initial_state_indices, "initial_state_indices")
    _index(cu_seqlens, "cu_seqlens")
    n = initial_state_indices.shape[0]
    if cu_seqlens.shape[0] != n + 1:
        raise ValueError(f"gdn: argument 'cu_seqlens': expected [N + 1] = [{n + 1}] entries "
                         f"(N = {n} initial_state_indices), given {list(cu_seqlens.shape)}")
    if has_initial_state is not None and tuple(has_initial_state.shape) != (n,):
        raise ValueError(f"gdn: argument 'has_initial_state': expected a bool tensor [N] = [{n}], "
                         f"given {list(has_initial_state.shape)}")
    slots, cu = initial_state_indices.tolist(), cu_seqlens.tolist()
    has = [True] * n if has_initial_state is None else has_initial_state.bool().tolist()
    live = next((s for s, slot in enumerate(slots) if slot < 0), n)
    if any(slot >= 0 for slot in slots[live:]):
        raise ValueError(f"gdn: argument 'initial_state_indices': expected padding (negative) "
                         f"slots after every live one, given {slots}")
    if cu[0] != 0:
        raise ValueError(f"gdn: argument 'cu_seqlens': expected cu_seqlens[0] = 0, given "
                         f"{cu[0]}")
    for s in range(live):
        if cu[s + 1] < cu[s]:
            raise ValueError(f"gdn: argument 'cu_seqlens': expected non-decreasing values, given "
                             f"cu_seqlens[{s + 1}] = {cu[s + 1]} < cu_seqlens[{s}] = {cu[s]}")
        if cu[s + 1] == cu[s]:
            raise ValueError(f"gdn: argument 'cu_seqlens': expected at least one token for each "
                             f"live sequence, given cu_seqlens[{s}] = cu_seqlens[{s + 1}] = "
                             f"{cu[s]} (sequence {s}, slot {slots[s]})")
        if cu[s + 1] > tokens:
            raise ValueError(f"gdn: argument 'cu_seqlens': expected values at most T = {tokens} "
                             f"(the tokens of qkv), given cu_seqlens[{s + 1}] = {cu[s + 1]}")
    lengths = [cu[s + 1] - cu[s] for s in range(live)]
    # Leading one-token continuations are labelled decodes; the library runs every one-token
    # sequence through the decode kernel whatever its label, so the label changes no bit. In
    # the speculative layout the decodes are the windows, the block table's rows.
    decode_end = next((s for s in range(live) if lengths[s] != 1 or not has[s]), live)
    if windows is not None:
        if windows > live:
            raise ValueError(f"gdn: argument 'spec_state_indices': expected a row for each "
                             f"speculative window, the first R of the N = {n} sequences, at "
                             f"most the {live} live ones, given {windows} rows")
        decode_end = windows
    # A sequence has history when its total length exceeds its new tokens; padding entries are
    # never read.
    seq_lens = [length + int(h) for length, h in zip(lengths, has)] + [0] * (n - live)
    return (torch.tensor(seq_lens, dtype=torch.int64),
            torch.tensor([decode_end, live, live], dtype=torch.int64))


@torch.library.custom_op("gdn::fused_gdn_step", mutates_args=("conv_state", "ssm_state"),
                         device_types="cpu")
def fused_step(qkv: Tensor, a: Tensor, b: Tensor, conv_weight: Tensor, conv_bias: Optional[Tensor],
               A_log: Tensor, dt_bias: Tensor, conv_state: Tensor, ssm_state: Tensor,
               initial_state_indices: Tensor, cu_seqlens: Tensor,
               has_initial_state: Optional[Tensor], spec_state_indices: Optional[Tensor],
               num_accepted_tokens: Optional[Tensor], num_k_heads: int, num_v_heads: int,
               head_k_dim: int, head_v_dim: int, threads: int) -> Tensor:
    """The serving step with sglang's / vLLM's batch description (``fused_gdn_step``'s): the
    description is read and checked and the C++ step called when the op runs, in eager mode and
    in a compiled graph alike, so that every error is the same ValueError in both."""
    out = torch.empty((qkv.shape[0], num_v_heads * head_v_dim), dtype=qkv.dtype)
    # vLLM's speculative layout: the block table's rows are the windows, its width 1 + num_spec
    # (the library checks the rest, in its names: both given, shapes, slots, counts).
    table = spec_state_indices
    if table is not None and table.dim() == 2 and table.dtype == torch.int32:
        table = table.to(torch.int64)
    spec = table is not None and table.dim() == 2
    num_spec = table.shape[1] - 1 if spec and table.shape[1] > 0 else 0
    seq_lens, distribution = _batch(initial_state_indices, cu_seqlens, has_initial_state,
                                    qkv.shape[0], table.shape[0] if spec else None)
    pool = _conv_pool(conv_state, conv_weight, qkv, num_spec)
    with library_names(_FUSED_NAMES):
        _gdn.step(raw(qkv), raw(a), raw(b), raw(conv_weight), raw(conv_bias), raw(A_log),
                  raw(dt_bias), raw(pool), raw(ssm_state), raw(cu_seqlens),
                  raw(initial_state_indices), raw(seq_lens), raw(distribution), None, None,
                  raw(table), raw(num_accepted_tokens), raw(out), num_k_heads, num_v_heads,
                  head_k_dim, head_v_dim, num_spec, library_threads(threads), False)
    return out


@fused_step.register_fake
def _(qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_state, ssm_state,
      initial_state_indices, cu_seqlens, has_initial_state, spec_state_indices,
      num_accepted_tokens, num_k_heads, num_v_heads, head_k_dim, head_v_dim, threads):
    return qkv.new_empty((qkv.shape[0], num_v_heads * head_v_dim))


def fused_gdn_step(
    qkv: Tensor,
    a: Tensor,
    b: Tensor,
    conv_weight: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    conv_state: Tensor,
    ssm_state: Tensor,
    initial_state_indices: Tensor,
    cu_seqlens: Tensor,
    has_initial_state: Optional[Tensor] = None,
    *,
    conv_bias: Optional[Tensor] = None,
    spec_state_indices: Optional[Tensor] = None,
    num_accepted_tokens: Optional[Tensor] = None,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    threads: int = 0,
) -> Tensor:
    """One serving step of a GDN layer (conv1d + SiLU, gates, gated delta rule) for a batch of
    decodes and prefills over pools of state slots, the pools updated in place: the call an
    inference engine makes per GDN layer and step, with sglang's and vLLM's batch description.

    Sequence s has the packed tokens ``[cu_seqlens[s], cu_seqlens[s + 1])`` of qkv, a and b; it
    starts from the conv and recurrent state in slot ``initial_state_indices[s]`` when
    ``has_initial_state[s]`` (a decode, or a continued chunked prefill), else from zeros (a
    fresh prefill), and writes its new states to the same slot. Sequences with a negative
    index (vLLM's PAD_SLOT_ID) are padding: they must come after every live one, write
    nothing, and their tokens' output rows are zero. Every one-token sequence takes the decode
    kernel wherever it stands, so a sequence's result does not depend on its place in the batch
    or on the other sequences, bit for bit.

    Args:
      qkv: [T, D] projected channels before the conv, D = 2 Hk Dk + Hv Dv ([q | k | v]);
        float32, bfloat16 or float16 (or float64 with float64 everything).
      a, b: [T, Hv] gate logits (g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)),
        qkv's dtype.
      conv_weight: [D, K] or [D, 1, K], K from 1 to 8; A_log, dt_bias: [Hv]; conv_bias: [D] or
        None. float32 (float64 with float64 qkv).
      conv_state: [num_slots, K - 1, D] (or vLLM's [num_slots, D, K - 1] view of that memory),
        float32 or bfloat16: each slot's last K - 1 raw inputs, oldest first.
      ssm_state: [num_slots, Hv, Dk, Dv], float32 or bfloat16.
        Both pools are read and written where they lie (never copied): each slot must be one
        dense row-major block, but the slot stride (dim 0) and the storage offset are free, so
        strided views of one buffer work, e.g. vLLM's pools that share padded pages
        (``page[:, :n].view(...)``); pools that overlap each other or an input are refused.
      initial_state_indices: int32 / int64 [N]: the slot of each sequence; live slots in
        [1, num_slots) (slot 0 is the null slot), no slot written by two sequences.
      cu_seqlens: int32 / int64 [N + 1]: the sequences' token boundaries, from 0, at most T.
      has_initial_state: bool [N], or None (every sequence continues from its slot).
      num_k_heads, num_v_heads, head_k_dim, head_v_dim: the head layout (Hv a multiple of Hk).
      threads: CPU threads: 0 (the default) = ``torch.get_num_threads()``, read when the op
        runs; a larger count is clamped to it. Results do not depend on it.
      spec_state_indices, num_accepted_tokens: vLLM's speculative layout (gdn/step.h), both or
        neither: int32 / int64 [R, 1 + n] and [R]. The first R sequences are decode windows of
        1 to 1 + n tokens (their initial_state_indices entries are not read); window s starts
        from the recurrent state in slot ``spec_state_indices[s, a - 1]``, a =
        ``num_accepted_tokens[s]`` in [1, 1 + n], and from columns [a - 1, a + K - 2) of its
        conv buffer, slot ``spec_state_indices[s, 0]`` of a conv_state of K - 1 + n columns;
        it writes the recurrent state after token t to ``spec_state_indices[s, t]`` and the
        conv state after token t to columns [t, t + K - 1). The other sequences use columns
        [0, K - 1) of their conv slot, as vLLM's spec-aware path does.

    Returns:
      out [T, Hv Dv] in qkv's dtype (q and k L2-normalised, scale Dk ** -0.5).

    Bad input raises ValueError naming the argument, and leaves both pools as they were. The
    batch description is read and checked when the op (``torch.ops.gdn.fused_gdn_step``) runs,
    so under ``torch.compile(fullgraph=True)`` a bad slot or boundary raises the same ValueError
    as in eager mode. For Tokamax's speculative windows (consecutive slots), prefix caching
    (read one slot, write another) and Tokamax's metadata, call ``torch.ops.gdn.step`` directly.

    vLLM's speculative layout (two windows of n = 2 drafts, then a prefill)::

        out = gdn.torch.fused_gdn_step(qkv, a, b, conv_weight, A_log, dt_bias, conv_buffers,
                                       ssm_pool, slots, cu_seqlens, has_initial_state,
                                       spec_state_indices=torch.tensor([[3, 4, 5], [6, 7, 8]]),
                                       num_accepted_tokens=torch.tensor([1, 3]),
                                       num_k_heads=16, num_v_heads=32, head_k_dim=128,
                                       head_v_dim=128)

    Example::

        out = gdn.torch.fused_gdn_step(qkv, a, b, conv_weight, A_log, dt_bias, conv_pool,
                                       ssm_pool, slots, cu_seqlens, has_initial_state,
                                       num_k_heads=16, num_v_heads=32, head_k_dim=128,
                                       head_v_dim=128)
    """
    check_devices(qkv=qkv, a=a, b=b, conv_weight=conv_weight, A_log=A_log, dt_bias=dt_bias,
                  conv_state=conv_state, ssm_state=ssm_state,
                  initial_state_indices=initial_state_indices, cu_seqlens=cu_seqlens,
                  has_initial_state=has_initial_state, conv_bias=conv_bias,
                  spec_state_indices=spec_state_indices, num_accepted_tokens=num_accepted_tokens)
    threads = static_int(threads, "threads")
    heads = tuple(static_int(x, name) for x, name in (
        (num_k_heads, "num_k_heads"), (num_v_heads, "num_v_heads"), (head_k_dim, "head_k_dim"),
        (head_v_dim, "head_v_dim")))
    # The op's schema takes tensors; everything else about them is checked when it runs.
    for name, x in (("initial_state_indices", initial_state_indices), ("cu_seqlens", cu_seqlens)):
        if not isinstance(x, Tensor):
            raise ValueError(f"gdn: argument '{name}': expected a rank-1 int32 or int64 tensor, "
                             f"given {type(x).__name__}")
    if has_initial_state is not None and not isinstance(has_initial_state, Tensor):
        raise ValueError(f"gdn: argument 'has_initial_state': expected a bool tensor [N] = "
                         f"[{initial_state_indices.shape[0]}] or None, given "
                         f"{type(has_initial_state).__name__}")
    for name, x in (("spec_state_indices", spec_state_indices),
                    ("num_accepted_tokens", num_accepted_tokens)):
        if x is not None and not isinstance(x, Tensor):
            raise ValueError(f"gdn: argument '{name}': expected an int32 or int64 tensor or None, "
                             f"given {type(x).__name__}")
    return fused_step(qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_state, ssm_state,
                      initial_state_indices, cu_seqlens, has_initial_state, spec_state_indices,
                      num_accepted_tokens, *heads, threads)
