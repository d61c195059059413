"""The torch.library custom ops over the C++ core op: ``gdn::chunk_fwd`` and ``gdn::chunk_bwd``,
their fake (meta) kernels for ``torch.compile``, and the autograd formula that joins them.

The ops take and return plain tensors in the packed ([T, H, D]) or batched ([B, T, H, D])
layout of the C++ library; ``gdn.torch.chunk_gated_delta_rule`` (fla's signature) is the entry
point. Each call hands the library the tensors' addresses, sizes and strides
(``gdn._gdn.core_forward``), which validates everything and writes outputs allocated here.
"""

# No `from __future__ import annotations` in the files that define custom ops: torch 2.4's
# torch.library.custom_op reads the annotations as objects and rejects them as strings.
from typing import Optional

import torch
from torch import Tensor

from gdn import _gdn
from gdn._options import library_names

# The library's option names -> the ops' arguments, in its error messages.
OPTION_NAMES = {"options.scale": "scale", "options.chunk_size": "chunk_size",
                "options.threads": "threads"}

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
                torch.float16: "float16", torch.int32: "int32", torch.int64: "int64"}


# The library's own bound on a call's threads (options.threads, 0 to 1024): a request outside
# it is handed on unchanged, so that the library's message names it, in eager and compiled mode.
_LIBRARY_MAX_THREADS = 1024


def run_on_torch_threads(enabled: bool = True) -> bool:
    """Whether gdn.torch's ops take their helper threads from torch's own OpenMP team (ATen's
    intra-op threads, in torch's builds on PyPI) instead of gdn's pool; returns whether they now
    do (False where this torch's ATen does not run on OpenMP: the pool stays).

    The default is gdn's pool, whose calls never wait for a helper the scheduler has not run
    (an OpenMP region ends at a barrier that does: under load from other programs that made
    2-thread calls up to 91x slower, docs/architecture.md "Threads"). Torch's team is the
    choice where torch's threads own the cores: in vLLM's CPU worker (gdn.vllm turns it on)
    vLLM binds one OpenMP thread per core and they spin between its ops, holding the cores a
    pool's helpers would need. Results are the same bits either way.

    Example::

        import gdn.torch
        gdn.torch.run_on_torch_threads(True)   # helpers: torch's OpenMP threads
        gdn.torch.run_on_torch_threads(False)  # back to gdn's pool
    """
    if enabled and "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        enabled = False
    return bool(_gdn.set_openmp_team(bool(enabled)))


def library_threads(requested: int) -> int:
    """The threads a call hands the library: torch's intra-op setting, ``torch.get_num_threads()``,
    for ``requested`` = 0, and at most that for an explicit count, so that gdn never runs more
    threads than torch would (one where torch says one: ``torch.set_num_threads(1)``, a
    DataLoader worker). Called in the ops' bodies, when they run: a compiled graph follows a
    ``torch.set_num_threads`` made after it was traced."""
    if requested < 0 or requested > _LIBRARY_MAX_THREADS:
        return requested
    limit = min(max(torch.get_num_threads(), 1), _LIBRARY_MAX_THREADS)
    return limit if requested == 0 else min(requested, limit)


def raw(t: Optional[Tensor]):
    """(address, sizes, strides, dtype name) of a CPU tensor for the library, None for None."""
    if t is None:
        return None
    if t.device.type != "cpu":
        raise ValueError(f"gdn: expected CPU tensors, given a tensor on {t.device}")
    name = _DTYPE_NAMES.get(t.dtype)
    if name is None:
        name = str(t.dtype).removeprefix("torch.")  # the library names the argument and dtype
    return (t.data_ptr(), list(t.shape), list(t.stride()), name)


def check_devices(**tensors):
    """Every tensor on the CPU (or all on the meta device, for shape inference): one tensor
    elsewhere would route the call to the fake kernel and return uninitialised memory."""
    devices = {name: t.device.type for name, t in tensors.items() if isinstance(t, Tensor)}
    want = "meta" if devices and all(d == "meta" for d in devices.values()) else "cpu"
    for name, device in devices.items():
        if device != want:
            raise ValueError(f"gdn: argument '{name}': expected a tensor on the CPU (gdn's "
                             f"kernels run there), given one on {device}")


def compute_dtype(activations: torch.dtype) -> torch.dtype:
    """float64 for float64 activations, else float32 (state, gates, residuals)."""
    return torch.float64 if activations == torch.float64 else torch.float32


def _cdiv(a, b):
    return (a + b - 1) // b


def residual_rows(q: Tensor, cu_seqlens: Optional[Tensor], chunk_size: int):
    """Rows of a residual buffer: the batch's chunks when shapes alone give them, else the most
    N sequences over T tokens can have (each adds at most one partial chunk, none is empty).
    Shape arithmetic only, so that fake tensors with symbolic sizes go through it."""
    if q.dim() == 4:
        return q.shape[0] * _cdiv(q.shape[1], chunk_size)
    tokens = q.shape[0]
    if cu_seqlens is None:
        return _cdiv(tokens, chunk_size)
    return torch.sym_min(tokens, _cdiv(tokens, chunk_size) + cu_seqlens.shape[0] - 2)


def _forward_outputs(q, v, cu_seqlens, chunk_size, want_final_state, keep_chunk_states,
                     keep_t_inv, factory):
    cdt = compute_dtype(q.dtype)
    hv, dk, dv = v.shape[-2], q.shape[-1], v.shape[-1]
    num_seqs = (cu_seqlens.shape[0] - 1 if cu_seqlens is not None
                else (q.shape[0] if q.dim() == 4 else 1))
    rows = residual_rows(q, cu_seqlens, chunk_size)
    o = factory(v.shape, dtype=q.dtype)
    ht = factory((num_seqs, hv, dk, dv) if want_final_state else (0,), dtype=cdt)
    states = factory((rows, hv, dk, dv) if keep_chunk_states else (0,), dtype=cdt)
    t_inv = factory((rows, hv, chunk_size, chunk_size) if keep_t_inv else (0,), dtype=cdt)
    return o, ht, states, t_inv


@torch.library.custom_op("gdn::chunk_fwd", mutates_args=(), device_types="cpu")
def chunk_fwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
              initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], scale: float,
              use_qk_l2norm: bool, chunk_size: int, recurrent: bool, bf16_matmul: bool,
              threads: int, want_final_state: bool, keep_chunk_states: bool,
              keep_t_inv: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The forward: (o, final_state, chunk_states, t_inv); an output not asked for is an empty
    tensor of shape [0]. Residual rows past the batch's chunks are zero."""
    o, ht, states, t_inv = _forward_outputs(q, v, cu_seqlens, chunk_size, want_final_state,
                                            keep_chunk_states, keep_t_inv, torch.empty)
    with library_names(OPTION_NAMES):
        _gdn.core_forward(
            raw(q), raw(k), raw(v), raw(g), raw(beta), raw(initial_state), raw(cu_seqlens),
            raw(o), raw(ht) if want_final_state else None,
            raw(states) if keep_chunk_states else None, raw(t_inv) if keep_t_inv else None,
            scale, use_qk_l2norm, chunk_size, recurrent, bf16_matmul, library_threads(threads),
            False)
    return o, ht, states, t_inv


@chunk_fwd.register_fake
def _(q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm, chunk_size, recurrent,
      bf16_matmul, threads, want_final_state, keep_chunk_states, keep_t_inv):
    return _forward_outputs(q, v, cu_seqlens, chunk_size, want_final_state, keep_chunk_states,
                            keep_t_inv, q.new_empty)


def _backward_outputs(q, k, v, g, beta, initial_state, factory):
    cdt = compute_dtype(q.dtype)
    return (factory(q.shape, dtype=q.dtype), factory(k.shape, dtype=k.dtype),
            factory(v.shape, dtype=v.dtype), factory(g.shape, dtype=cdt),
            factory(beta.shape, dtype=cdt),
            factory(initial_state.shape if initial_state is not None else (0,), dtype=cdt))


@torch.library.custom_op("gdn::chunk_bwd", mutates_args=(), device_types="cpu")
def chunk_bwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
              initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], d_o: Tensor,
              d_final_state: Optional[Tensor], chunk_states: Optional[Tensor],
              t_inv: Optional[Tensor], scale: float, use_qk_l2norm: bool, chunk_size: int,
              bf16_matmul: bool, threads: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor,
                                                        Tensor]:
    """The backward: (dq, dk, dv, dg, dbeta, d_initial_state), the last empty ([0]) without an
    initial state. Absent residuals are rebuilt by the library (its t_inv / none policies)."""
    outs = _backward_outputs(q, k, v, g, beta, initial_state, torch.empty)
    with library_names(OPTION_NAMES):
        _gdn.core_backward(
            raw(q), raw(k), raw(v), raw(g), raw(beta), raw(initial_state), raw(cu_seqlens),
            raw(d_o), raw(d_final_state), raw(chunk_states), raw(t_inv),
            *(raw(x) for x in outs[:5]), raw(outs[5]) if initial_state is not None else None,
            scale, use_qk_l2norm, chunk_size, bf16_matmul, library_threads(threads), False)
    return outs


@chunk_bwd.register_fake
def _(q, k, v, g, beta, initial_state, cu_seqlens, d_o, d_final_state, chunk_states, t_inv,
      scale, use_qk_l2norm, chunk_size, bf16_matmul, threads):
    return _backward_outputs(q, k, v, g, beta, initial_state, q.new_empty)


def _setup_context(ctx, inputs, output):
    (q, k, v, g, beta, h0, cu, scale, l2norm, chunk_size, _recurrent, bf16_matmul, threads,
     want_final_state, keep_chunk_states, keep_t_inv) = inputs
    _, _, states, t_inv = output
    ctx.save_for_backward(q, k, v, g, beta, h0, cu, states if keep_chunk_states else None,
                          t_inv if keep_t_inv else None)
    ctx.options = (scale, l2norm, chunk_size, bf16_matmul, threads)
    ctx.want_final_state = want_final_state
    ctx.mark_non_differentiable(states, t_inv)


def _backward(ctx, d_o, d_ht, _d_states, _d_t_inv):
    q, k, v, g, beta, h0, cu, states, t_inv = ctx.saved_tensors
    scale, l2norm, chunk_size, bf16_matmul, threads = ctx.options
    d_ht = d_ht if ctx.want_final_state else None
    dq, dk, dv, dg, dbeta, dh0 = chunk_bwd(q, k, v, g, beta, h0, cu, d_o, d_ht, states, t_inv,
                                           scale, l2norm, chunk_size, bf16_matmul, threads)
    return (dq, dk, dv, dg, dbeta, dh0 if h0 is not None else None, None, None, None, None, None,
            None, None, None, None, None)


torch.library.register_autograd("gdn::chunk_fwd", _backward, setup_context=_setup_context)


def reference_forward(q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm,
                      chunk_size, want_final_state, keep_chunk_states):
    """gdn::ref's float64 token recurrence (the definition), outputs float64."""
    o, ht, states, _ = _forward_outputs(q, v, cu_seqlens, chunk_size, want_final_state,
                                        keep_chunk_states, False, torch.empty)
    o, ht, states = (x.to(torch.float64) for x in (o, ht, states))
    _gdn.core_forward(
        raw(q), raw(k), raw(v), raw(g), raw(beta), raw(initial_state), raw(cu_seqlens), raw(o),
        raw(ht) if want_final_state else None, raw(states) if keep_chunk_states else None, None,
        scale, use_qk_l2norm, chunk_size, True, False, library_threads(0), True)
    return o, (ht if want_final_state else None), (states if keep_chunk_states else None)


def reference_backward(q, k, v, g, beta, initial_state, cu_seqlens, d_o, d_final_state, scale,
                       use_qk_l2norm):
    """gdn::ref's float64 reverse mode of the token recurrence, outputs float64."""
    outs = [x.to(torch.float64) for x in _backward_outputs(q, k, v, g, beta, initial_state,
                                                            torch.empty)]
    _gdn.core_backward(
        raw(q), raw(k), raw(v), raw(g), raw(beta), raw(initial_state), raw(cu_seqlens), raw(d_o),
        raw(d_final_state), None, None, *(raw(x) for x in outs[:5]),
        raw(outs[5]) if initial_state is not None else None, scale, use_qk_l2norm, 64, False,
        library_threads(0), True)
    return tuple(outs[:5]) + ((outs[5] if initial_state is not None else None),)
