"""The causal depthwise conv1d of a GatedDeltaNet layer on gdn's C++ kernels (``gdn/conv.h``):
the custom ops ``gdn::conv_fwd`` / ``gdn::conv_bwd`` with their fake kernels and autograd
formula, ``gdn::conv_update`` (a decode step on a pool of conv states, updated in place), and
the causal-conv1d package's ``causal_conv1d_fn`` and ``causal_conv1d_update`` over them, in
that package's [B, D, T] layout (what transformers' Qwen3-Next layer calls).

conv_fwd and conv_bwd take the library's packed layout: x [T, D] (any strides), weight [D, K],
bias [D], initial_state [N, K - 1, D], cu_seqlens [N + 1]; causal_conv1d_fn turns the package's
layout into it with views (a copy only where a [B, D, T] batch cannot be seen as [B * T, D]).
conv_update takes the package's layout and checks its pool and indices when it runs; it reads
and shifts the pool's rows in place (``gdn::conv_update``), whatever their stride.
"""

from typing import Optional

import torch
from torch import Tensor

from gdn import _gdn
from gdn._options import library_names, static_int
from gdn.torch._ops import check_devices, compute_dtype, library_threads, raw

ACTIVATIONS = (None, "silu", "swish")

# The library's option names -> the ops' arguments, in its error messages (the ops' bodies
# rename, so that a compiled graph raises what eager mode does).
_OP_NAMES = {"options.threads": "threads"}


def _forward_outputs(x, weight, initial_state, cu_seqlens, want_final_state, factory):
    n = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else 1
    k = weight.shape[-1]
    out = factory(x.shape, dtype=x.dtype)
    final = factory((n, k - 1, x.shape[1]) if want_final_state else (0,),
                    dtype=compute_dtype(x.dtype))
    return out, final


@torch.library.custom_op("gdn::conv_fwd", mutates_args=(), device_types="cpu")
def conv_fwd(x: Tensor, weight: Tensor, bias: Optional[Tensor], initial_state: Optional[Tensor],
             cu_seqlens: Optional[Tensor], silu: bool, threads: int,
             want_final_state: bool) -> tuple[Tensor, Tensor]:
    """(out [T, D] in x's dtype, final_state [N, K - 1, D] in the compute dtype, or an empty
    [0] tensor when not asked for)."""
    out, final = _forward_outputs(x, weight, initial_state, cu_seqlens, want_final_state,
                                  torch.empty)
    with library_names(_OP_NAMES):
        _gdn.conv_forward(raw(x), raw(weight), raw(bias), raw(initial_state), raw(cu_seqlens),
                          raw(out), raw(final) if want_final_state else None, silu,
                          library_threads(threads), False)
    return out, final


@conv_fwd.register_fake
def _(x, weight, bias, initial_state, cu_seqlens, silu, threads, want_final_state):
    return _forward_outputs(x, weight, initial_state, cu_seqlens, want_final_state, x.new_empty)


def _backward_outputs(x, weight, bias, initial_state, factory):
    cdt = compute_dtype(x.dtype)
    return (factory(x.shape, dtype=x.dtype), factory(weight.shape, dtype=cdt),
            factory(bias.shape if bias is not None else (0,), dtype=cdt),
            factory(initial_state.shape if initial_state is not None else (0,), dtype=cdt))


@torch.library.custom_op("gdn::conv_bwd", mutates_args=(), device_types="cpu")
def conv_bwd(x: Tensor, weight: Tensor, bias: Optional[Tensor], initial_state: Optional[Tensor],
             cu_seqlens: Optional[Tensor], d_out: Tensor, d_final_state: Optional[Tensor],
             silu: bool, threads: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(d_x, d_weight, d_bias, d_initial_state); the last two empty ([0]) without a bias or an
    initial state."""
    dx, dw, db, ds = _backward_outputs(x, weight, bias, initial_state, torch.empty)
    with library_names(_OP_NAMES):
        _gdn.conv_backward(raw(x), raw(weight), raw(bias), raw(initial_state), raw(cu_seqlens),
                           raw(d_out), raw(d_final_state), raw(dx), raw(dw),
                           raw(db) if bias is not None else None,
                           raw(ds) if initial_state is not None else None, silu,
                           library_threads(threads), False)
    return dx, dw, db, ds


@conv_bwd.register_fake
def _(x, weight, bias, initial_state, cu_seqlens, d_out, d_final_state, silu, threads):
    return _backward_outputs(x, weight, bias, initial_state, x.new_empty)


def _setup_context(ctx, inputs, output):
    x, weight, bias, initial_state, cu, silu, threads, want_final_state = inputs
    ctx.save_for_backward(x, weight, bias, initial_state, cu)
    ctx.options = (silu, threads, want_final_state)


def _backward(ctx, d_out, d_final):
    x, weight, bias, initial_state, cu = ctx.saved_tensors
    silu, threads, want_final_state = ctx.options
    dx, dw, db, ds = conv_bwd(x, weight, bias, initial_state, cu, d_out,
                              d_final if want_final_state else None, silu, threads)
    return (dx, dw, db if bias is not None else None, ds if initial_state is not None else None,
            None, None, None, None)


torch.library.register_autograd("gdn::conv_fwd", _backward, setup_context=_setup_context)


def reference_forward(x, weight, bias, initial_state, cu_seqlens, silu):
    """The conv op's float64 reference (gdn::ref::causal_conv1d_fwd), outputs float64."""
    out, final = _forward_outputs(x, weight, initial_state, cu_seqlens, True, torch.empty)
    out, final = out.to(torch.float64), final.to(torch.float64)
    _gdn.conv_forward(raw(x), raw(weight), raw(bias), raw(initial_state), raw(cu_seqlens),
                      raw(out), raw(final), silu, library_threads(0), True)
    return out, final


def reference_backward(x, weight, bias, initial_state, cu_seqlens, d_out, d_final_state, silu):
    """The conv op's float64 reference backward, outputs float64."""
    outs = [t.to(torch.float64) for t in _backward_outputs(x, weight, bias, initial_state,
                                                           torch.empty)]
    _gdn.conv_backward(raw(x), raw(weight), raw(bias), raw(initial_state), raw(cu_seqlens),
                       raw(d_out), raw(d_final_state), *(raw(t) for t in outs[:2]),
                       raw(outs[2]) if bias is not None else None,
                       raw(outs[3]) if initial_state is not None else None, silu,
                       library_threads(0), True)
    return tuple(outs)


# ---------------------------------------------------------------------------------------------
# The causal-conv1d package's functions.
# ---------------------------------------------------------------------------------------------

# The library's names -> causal_conv1d_update's arguments, in its error messages.
_UPDATE_NAMES = {"state_indices": "conv_state_indices", "options.threads": "threads"}


def _silu(activation) -> bool:
    if activation not in ACTIVATIONS:
        raise ValueError(f"gdn: argument 'activation': expected None, 'silu' or 'swish', given "
                         f"{activation!r}")
    return activation is not None


def _weight_2d(weight: Tensor) -> Tensor:
    if weight.dim() == 3 and weight.shape[1] == 1:  # nn.Conv1d's [D, 1, K]
        return weight.squeeze(1)
    if weight.dim() != 2:
        raise ValueError(f"gdn: argument 'weight': expected [D, K] (or [D, 1, K]), given "
                         f"{list(weight.shape)}")
    return weight


def _check_x(x: Tensor, weight: Tensor, name: str, ranks: tuple) -> None:
    if x.dim() not in ranks:
        want = " or ".join({2: "[B, D]", 3: "[B, D, T]"}[r] for r in ranks)
        raise ValueError(f"gdn: argument '{name}': expected {want}, given {list(x.shape)}")
    if x.shape[1] != weight.shape[0]:
        raise ValueError(f"gdn: argument '{name}': expected D = {weight.shape[0]} channels "
                         f"(weight is {list(weight.shape)}), given {list(x.shape)}")


def _cu_from_seq_idx(seq_idx: Tensor, batch: int, tokens: int) -> Tensor:
    """The sequence boundaries of a [B, T] seq_idx over the flattened B * T tokens: a new
    sequence at each row start and wherever the index changes."""
    if seq_idx.shape != (batch, tokens) or seq_idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"gdn: argument 'seq_idx': expected int32 or int64 [B, T] = "
                         f"[{batch}, {tokens}], "
                         f"given {seq_idx.dtype} {list(seq_idx.shape)}")
    change = torch.ones(batch, tokens, dtype=torch.bool)
    change[:, 1:] = seq_idx[:, 1:] != seq_idx[:, :-1]
    starts = change.reshape(-1).nonzero().reshape(-1)
    return torch.cat([starts, starts.new_tensor([batch * tokens])])


def causal_conv1d_fn(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    seq_idx: Optional[Tensor] = None,
    initial_states: Optional[Tensor] = None,
    return_final_states: bool = False,
    final_states_out: Optional[Tensor] = None,
    activation: Optional[str] = None,
    *,
    cu_seqlens: Optional[Tensor] = None,
    threads: int = 0,
):
    """The causal depthwise conv1d (the causal-conv1d package's ``causal_conv1d_fn``) on gdn's
    C++ CPU kernels::

        y[b, c, t] = bias[c] + sum_i weight[c, i] * x[b, c, t - K + 1 + i]
        out        = silu(y) (activation "silu" / "swish") or y (None)

    inputs before a sequence's first token coming from ``initial_states`` (or zeros).

    Args:
      x: [B, D, T], float32, bfloat16, float16 or float64, any strides (transformers passes a
        channel-last [B, T, D] tensor transposed; that layout is read in place).
      weight: [D, K] (or nn.Conv1d's [D, 1, K]), K from 1 to 8; bias: [D] or None. Cast to
        float32 (float64 for float64 x) by a differentiable cast.
      seq_idx: int32 or int64 [B, T], optional: the sequence of each token; a new sequence
        starts wherever the index changes (causal-conv1d instead masks inputs whose index
        differs from the current token's: the two agree for non-decreasing indices). Not with
        initial_states or return_final_states.
      initial_states: [B, D, K - 1], optional: the K - 1 inputs before each row (not with
        seq_idx).
      return_final_states: also return the [B, D, K - 1] last K - 1 inputs of each row, in x's
        dtype (into ``final_states_out`` when given).
      activation: None, "silu" or "swish".
      cu_seqlens: (gdn) int32 / int64 [N + 1] boundaries of a packed batch, B = 1; then
        initial_states and the final states are [N, D, K - 1], one per sequence.
      threads: CPU threads: 0 (the default) = ``torch.get_num_threads()``, read when the op
        runs; a larger count is clamped to it. Results do not depend on it.

    Returns:
      out [B, D, T] in x's dtype (a channel-last layout: out.transpose(1, 2) is contiguous), or
      (out, final_states) with return_final_states.

    Differentiable in x, weight, bias and initial_states; torch.compile(fullgraph=True) traces
    through it (with seq_idx too: the number of sequences is then a size read from the data).

    Example::

        out = gdn.torch.causal_conv1d_fn(x, weight, bias, activation="silu")
    """
    check_devices(x=x, weight=weight, bias=bias, seq_idx=seq_idx, initial_states=initial_states,
               cu_seqlens=cu_seqlens)
    silu = _silu(activation)
    threads = static_int(threads, "threads")
    weight = _weight_2d(weight)
    _check_x(x, weight, "x", (3,))
    batch, channels, tokens = x.shape
    cdt = compute_dtype(x.dtype)
    if seq_idx is not None and (cu_seqlens is not None or initial_states is not None
                                or return_final_states):
        raise ValueError("gdn: argument 'seq_idx': expected None with cu_seqlens, "
                         "initial_states or return_final_states (states are per row), given "
                         "a tensor")
    if cu_seqlens is not None:
        if batch != 1:
            raise ValueError(f"gdn: argument 'x': expected [1, D, T] with cu_seqlens (a packed "
                             f"batch), given {list(x.shape)}")
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"gdn: argument 'cu_seqlens': expected dtype int32 or int64, given "
                             f"{cu_seqlens.dtype}")
        cu = cu_seqlens
    elif seq_idx is not None:
        cu = _cu_from_seq_idx(seq_idx, batch, tokens)
    elif batch != 1:
        if batch == 0:  # no sequence: nothing to compute
            out = x.new_empty(x.shape)
            return (out, x.new_empty(0, channels, weight.shape[-1] - 1)) if return_final_states \
                else out
        cu = torch.arange(batch + 1, dtype=torch.int64) * tokens
    else:
        cu = None
    state = None
    if initial_states is not None:
        want = [cu.shape[0] - 1 if cu is not None else batch, channels, weight.shape[-1] - 1]
        if list(initial_states.shape) != want:
            raise ValueError(f"gdn: argument 'initial_states': expected [N, D, K - 1] = {want}, "
                             f"given {list(initial_states.shape)}")
        state = initial_states.to(cdt).transpose(1, 2)  # [N, K - 1, D], a view
    rows = x.transpose(1, 2).reshape(batch * tokens, channels)  # a view where strides allow
    w = weight.to(cdt)
    b = bias.to(cdt) if bias is not None else None
    want_final = bool(return_final_states)
    out, final = conv_fwd(rows, w, b, state, cu, silu, threads, want_final)
    out = out.view(batch, tokens, channels).transpose(1, 2)
    if not want_final:
        return out
    final = final.transpose(1, 2).to(x.dtype)  # [N, D, K - 1]
    if final_states_out is not None:
        final_states_out.copy_(final)
        final = final_states_out
    return out, final


def causal_conv1d_update(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    activation: Optional[str] = None,
    cache_seqlens: Optional[Tensor] = None,
    conv_state_indices: Optional[Tensor] = None,
    *,
    threads: int = 0,
) -> Tensor:
    """A decode step of the causal conv1d (the causal-conv1d package's
    ``causal_conv1d_update``): the new tokens x continue the sequences whose last inputs are in
    ``conv_state``, which is updated in place.

    Args:
      x: [B, D] (one token per row) or [B, D, L] (L new tokens).
      conv_state: [B_pool, D, S] with S >= K - 1, any float dtype: row b's last S raw inputs,
        oldest first (transformers keeps S = K). After the call it holds the last S inputs
        including the new tokens. Read and written where it lies, never copied: each row one
        dense block, channel-first (strides [*, S, 1], e.g. a contiguous tensor) or
        channel-last (strides [*, 1, D]: vLLM's [slots, S, D] pool seen through
        ``transpose(1, 2)``), with any row stride and storage offset (a strided view of padded
        pages).
      weight: [D, K] (or [D, 1, K]); bias: [D] or None; activation: None, "silu" or "swish".
      conv_state_indices: int32 / int64 [B], optional: the row of conv_state each batch row
        continues (default: row b); every index in [0, B_pool), no row twice.
      cache_seqlens: circular state buffers are not supported (must be None).
      threads: CPU threads: 0 (the default) = ``torch.get_num_threads()``, read when the op
        runs; a larger count is clamped to it.

    Returns:
      out, shaped like x, in x's dtype.

    One op, ``torch.ops.gdn.conv_update``: conv_state and the indices are checked when it runs,
    before anything is written (a bad index raises the same ValueError in eager mode and under
    ``torch.compile``, and leaves the pool as it was). Not differentiable (an inference step).

    Example::

        y = gdn.torch.causal_conv1d_update(x_t, conv_state, weight, bias, activation="silu")
    """
    check_devices(x=x, conv_state=conv_state, weight=weight, bias=bias,
                  conv_state_indices=conv_state_indices)
    if cache_seqlens is not None:
        raise ValueError("gdn: argument 'cache_seqlens': expected None (circular conv-state "
                         "buffers are not supported), given a tensor")
    silu = _silu(activation)
    threads = static_int(threads, "threads")
    weight = _weight_2d(weight)
    _check_x(x, weight, "x", (2, 3))
    # The op's schema takes tensors; everything else about them is checked when it runs.
    for name, t in (("conv_state", conv_state), ("conv_state_indices", conv_state_indices)):
        if not isinstance(t, Tensor) and not (t is None and name == "conv_state_indices"):
            raise ValueError(f"gdn: argument '{name}': expected a tensor, given "
                             f"{type(t).__name__}")
    one_token = x.dim() == 2
    out = conv_update(x.unsqueeze(-1) if one_token else x, conv_state, weight, bias,
                      conv_state_indices, silu, threads)
    return out.squeeze(-1) if one_token else out


def _update_rows(x: Tensor, conv_state: Tensor, taps: int,
                 conv_state_indices: Optional[Tensor]) -> None:
    """Checks, in the package's layout and names, the conv state's shape and dtype and the
    indices' dtype, length, range and distinctness (two batch rows on one pool row would each
    write it, and one update would be lost); the library checks them again, with the pool's
    strides."""
    batch, channels = x.shape[0], x.shape[1]
    if (conv_state.dim() != 3 or conv_state.shape[1] != channels
            or conv_state.shape[2] < taps - 1):
        raise ValueError(f"gdn: argument 'conv_state': expected [B_pool, D, S] with D = "
                         f"{channels} and S >= K - 1 = {taps - 1}, given "
                         f"{list(conv_state.shape)}")
    if not conv_state.is_floating_point():
        raise ValueError(f"gdn: argument 'conv_state': expected a floating-point dtype, given "
                         f"{conv_state.dtype}")
    if conv_state_indices is None:
        if conv_state.shape[0] != batch:
            raise ValueError(f"gdn: argument 'conv_state': expected {batch} rows (one per row "
                             f"of x) without conv_state_indices, given {list(conv_state.shape)}")
        return
    idx = conv_state_indices
    if idx.dim() != 1 or idx.shape[0] != batch or idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"gdn: argument 'conv_state_indices': expected int32 or int64 "
                         f"[B] = [{batch}], given {idx.dtype} {list(idx.shape)}")
    rows = idx.tolist()
    pool = conv_state.shape[0]
    if any(r < 0 or r >= pool for r in rows):
        raise ValueError(f"gdn: argument 'conv_state_indices': expected values in [0, "
                         f"{pool}), given {rows}")
    first = {}
    for b, r in enumerate(rows):
        if r in first:
            raise ValueError(f"gdn: argument 'conv_state_indices': expected distinct rows (each "
                             f"pool row continued by one batch row), given {rows} (batch rows "
                             f"{first[r]} and {b} both continue row {r})")
        first[r] = b


@torch.library.custom_op("gdn::conv_update", mutates_args=("conv_state",), device_types="cpu")
def conv_update(x: Tensor, conv_state: Tensor, weight: Tensor, bias: Optional[Tensor],
                conv_state_indices: Optional[Tensor], silu: bool, threads: int) -> Tensor:
    """``causal_conv1d_update`` as one op, in the package's layout: x [B, D, L], the pool
    conv_state [B_pool, D, S] updated in place, weight [D, K] (or [D, 1, K]), bias [D],
    conv_state_indices [B] (None: row b). Returns out [B, D, L] in x's dtype (channel-last
    strides). The pool and its indices are checked when the op runs, before anything is
    written, so a compiled graph raises the same ValueError as eager mode."""
    if x.dim() != 3:
        raise ValueError(f"gdn: argument 'x': expected [B, D, L], given {list(x.shape)}")
    batch, channels, tokens = x.shape
    _update_rows(x, conv_state, weight.shape[-1], conv_state_indices)
    cdt = compute_dtype(x.dtype)
    out = torch.empty((batch, tokens, channels), dtype=x.dtype)
    if batch > 0:
        # The pool is handed over as it is (the library's [B_pool, S, D] view of it: any slot
        # stride, each row dense): its rows are read and shifted in place, never copied.
        # Every tensor handed over by address is held by a name until the call returns.
        flat = x.transpose(1, 2).reshape(batch * tokens, channels)
        w = weight.to(cdt)
        b = bias.to(cdt) if bias is not None else None
        cu = torch.arange(batch + 1, dtype=torch.int64) * tokens
        with library_names(_UPDATE_NAMES):
            _gdn.conv_update(raw(flat), raw(w), raw(b), raw(cu), raw(conv_state_indices),
                             raw(conv_state.transpose(1, 2)),
                             raw(out.view(batch * tokens, channels)), silu,
                             library_threads(threads))
    return out.transpose(1, 2)


@conv_update.register_fake
def _(x, conv_state, weight, bias, conv_state_indices, silu, threads):
    return x.new_empty((x.shape[0], x.shape[2], x.shape[1])).transpose(1, 2)
