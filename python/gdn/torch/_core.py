"""fla's ``chunk_gated_delta_rule`` and ``fused_recurrent_gated_delta_rule`` on gdn's C++ CPU
kernels, differentiable through the custom ops of ``gdn.torch._ops``."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from gdn import _gdn
from gdn._options import check_choice, library_names, static_int
from gdn.torch import _ops

RESIDUALS = ("all", "t_inv", "none")
MATMUL_PRECISIONS = ("compute", "bf16")


def _spec(t: Optional[Tensor]):
    if t is None:
        return None
    return (tuple(int(d) for d in t.shape), _ops._DTYPE_NAMES.get(t.dtype, str(t.dtype)))


def _static_shapes(*tensors) -> bool:
    return all(isinstance(d, int) for t in tensors if t is not None for d in t.shape)


def _check_index(x: Optional[Tensor], name: str) -> Optional[Tensor]:
    if x is None:
        return None
    if not isinstance(x, Tensor):
        x = torch.as_tensor(x)
    if x.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"gdn: argument '{name}': expected dtype int32 or int64, given {x.dtype}")
    return x


def _as_compute(x: Optional[Tensor], dtype: torch.dtype) -> Optional[Tensor]:
    # A differentiable cast: a bf16 gate's gradient arrives in its own dtype.
    if x is None or not x.is_floating_point() or x.dtype == dtype:
        return x
    return x.to(dtype)


def _check_state_v_first(q, v, initial_state, cu) -> None:
    """The library sees the transpose of a state_v_first initial state: its shape is checked
    here, so that the message describes the caller's [N, HV, V, K] tensor, not the view."""
    if q.dim() != 4 or v.dim() != 4:
        return  # the library names q or v
    want = [cu.shape[0] - 1 if cu is not None else q.shape[0], v.shape[2], v.shape[3], q.shape[3]]
    if list(initial_state.shape) != want:
        raise ValueError(f"gdn: argument 'initial_state': expected [N, HV, V, K] = {want} "
                         f"(state_v_first), given {list(initial_state.shape)}")


def _run(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
         cu_seqlens, chunk_size, residuals, matmul_precision, threads, recurrent, state_v_first):
    _ops.check_devices(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                   cu_seqlens=cu_seqlens)
    check_choice(residuals, RESIDUALS, "residuals")
    check_choice(matmul_precision, MATMUL_PRECISIONS, "matmul_precision")
    chunk_size = static_int(chunk_size, "chunk_size")
    threads = static_int(threads, "threads")
    cdt = _ops.compute_dtype(q.dtype)
    g, beta = _as_compute(g, cdt), _as_compute(beta, cdt)
    cu = _check_index(cu_seqlens, "cu_seqlens")
    if initial_state is not None:
        initial_state = _as_compute(initial_state, cdt)
        if state_v_first:  # [N, H, V, K] -> the library's [N, H, K, V], a view
            _check_state_v_first(q, v, initial_state, cu)
            initial_state = initial_state.transpose(-1, -2)
    packed = cu is not None
    if packed:  # fla's packed layout: B = 1, passed on as [T, ...]
        for name, x, layout in (("q", q, "[1, T, H, K]"), ("k", k, "[1, T, H, K]"),
                                ("v", v, "[1, T, HV, V]"), ("g", g, "[1, T, HV]"),
                                ("beta", beta, "[1, T, HV]")):
            if x.dim() != len(layout.split(",")) or x.shape[0] != 1:
                raise ValueError(f"gdn: argument '{name}': expected {layout} with cu_seqlens "
                                 f"(a packed batch), given {list(x.shape)}")
        # The library sees [T, ...] views and would describe those: the shapes that must agree
        # are checked here, in the caller's [1, T, ...].
        for name, x, layout, want, source in (
                ("k", k, "[1, T, H, K]", list(q.shape), "that of q"),
                ("v", v, "[1, T, HV, V]", [1, q.shape[1], *v.shape[2:]], "T of q"),
                ("g", g, "[1, T, HV]", list(v.shape[:3]), "of v"),
                ("beta", beta, "[1, T, HV]", list(v.shape[:3]), "of v")):
            if list(x.shape) != want:
                raise ValueError(f"gdn: argument '{name}': expected {layout} = {want} ({source}) "
                                 f"with cu_seqlens, given {list(x.shape)}")
        q, k, v, g, beta = (x[0] for x in (q, k, v, g, beta))
    if scale is None and q.dim() >= 1 and q.shape[-1] > 0:  # Dk = 0: the library names q
        scale = float(q.shape[-1]) ** -0.5
    bf16_matmul = matmul_precision == "bf16"
    if not torch.compiler.is_compiling() and _static_shapes(q, k, v, g, beta, initial_state, cu):
        # The library's validation from shapes and dtypes: a static mistake raises here, with
        # the argument, the expected and the given value; and chunk_size 0 is resolved. (Under
        # torch.compile the op validates when it runs.)
        with library_names(_ops.OPTION_NAMES):
            shape = _gdn.core_shape(_spec(q), _spec(k), _spec(v), _spec(g), _spec(beta),
                                    _spec(initial_state), _spec(cu),
                                    None if scale is None else float(scale),
                                    bool(use_qk_l2norm_in_kernel), chunk_size, bf16_matmul,
                                    threads)
        chunk_size = shape["chunk_size"]
    elif chunk_size == 0:
        raise ValueError("gdn: argument 'chunk_size': 0 (the plan's choice) is resolved in eager "
                         "mode only; pass 16, 32 or 64 under torch.compile")
    # Residuals only where a backward can follow (no_grad and inference keep nothing).
    differentiable = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, g, beta, initial_state))
    keep_states = differentiable and residuals == "all" and not recurrent
    keep_t_inv = differentiable and residuals in ("all", "t_inv") and not recurrent
    o, ht, _, _ = _ops.chunk_fwd(q, k, v, g, beta, initial_state, cu, float(scale),
                                 bool(use_qk_l2norm_in_kernel), chunk_size, recurrent,
                                 bf16_matmul, threads, bool(output_final_state), keep_states,
                                 keep_t_inv)
    if packed:
        o = o.unsqueeze(0)
    if not output_final_state:
        return o, None
    return o, (ht.transpose(-1, -2) if state_v_first else ht)


def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    *,
    state_v_first: bool = False,
    chunk_size: int = 64,
    residuals: str = "all",
    matmul_precision: str = "compute",
    threads: int = 0,
) -> tuple[Tensor, Optional[Tensor]]:
    """The gated delta rule (fla's ``chunk_gated_delta_rule``), on gdn's C++ CPU kernels.

    Per token t and value head h, with a state S of [K, V] and alpha_t = exp(g_t)::

        u_t = beta_t * (v_t - alpha_t * S_{t-1}^T k_t)
        S_t = alpha_t * S_{t-1} + k_t u_t^T
        o_t = scale * S_t^T q_t

    Value head h reads query/key head ``h // (HV // H)`` (grouped value attention).

    Args:
      q, k: [B, T, H, K], float32, bfloat16, float16 or float64, any strides, on the CPU.
      v: [B, T, HV, V], the dtype of q. HV a multiple of H; 1 <= K, V <= 256.
      g: [B, T, HV], the log decay (alpha = exp(g)); widened to float32 (float64 for float64
        activations) by a differentiable cast.
      beta: [B, T, HV], the delta rule's step (after its sigmoid); widened like g.
      scale: multiplies q; default K ** -0.5. Must be finite.
      initial_state: [N, HV, K, V] (or [N, HV, V, K] with ``state_v_first``); N = B, or the
        number of sequences with ``cu_seqlens``; None means zeros.
      output_final_state: also return the [N, HV, K, V] final states (float32; float64 for
        float64 activations); else None.
      use_qk_l2norm_in_kernel: normalise q and k per token and head, x / sqrt(sum x^2 + 1e-6);
        gradients flow to the unnormalised q and k.
      cu_seqlens: int32 or int64 [N + 1] boundaries of a packed batch (B must be 1);
        cu_seqlens[0] = 0, non-decreasing, cu_seqlens[N] = T; zero-length sequences allowed.
      state_v_first: the states are [N, HV, V, K] (fla's option), given and returned as
        transposed views.
      chunk_size: tokens per chunk, 1 to 256, or 0 for the tiling plan's choice (static shapes).
      residuals: what the forward keeps for the backward: "all" (every chunk's entry state and
        T^-1), "t_inv" (T^-1 only: the backward rebuilds the states) or "none" (the backward
        rebuilds both). The gradients are the same bit for bit; memory and time differ.
      matmul_precision: "compute" or "bf16" (the chunked products' operands rounded to bf16,
        sums in float32; docs/numerics.md).
      threads: CPU threads. 0 (the default) is torch's intra-op thread count,
        ``torch.get_num_threads()``; a larger count is clamped to it, so the op runs on one
        thread where torch does (``torch.set_num_threads(1)``, a DataLoader worker). Read when
        the op runs, also in a compiled graph and in the backward. Results do not depend on it.

    Returns:
      (o, final_state): o [B, T, HV, V] in q's dtype; final_state or None.

    Differentiable in q, k, v, g, beta and initial_state (a gradient of the final state is
    honoured); ``torch.compile(fullgraph=True)`` traces through it. Bad shapes, dtypes and
    options raise ValueError with the library's message, which names the argument, the
    expected and the given value; bad cu_seqlens values raise when the op runs.

    Example::

        o, ht = gdn.torch.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True)

        torch.set_num_threads(1)  # gdn's ops follow torch: one thread from here on
        o, _ = gdn.torch.chunk_gated_delta_rule(q, k, v, g, beta, threads=4)  # still one
    """
    return _run(q, k, v, g, beta, scale, initial_state, output_final_state,
                use_qk_l2norm_in_kernel, cu_seqlens, chunk_size, residuals, matmul_precision,
                threads, False, state_v_first)


def fused_recurrent_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Optional[Tensor] = None,
    gk: Optional[Tensor] = None,
    gv: Optional[Tensor] = None,
    beta: Optional[Tensor] = None,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    *,
    threads: int = 0,
) -> tuple[Tensor, Optional[Tensor]]:
    """The gated delta rule as a token recurrence (fla's ``fused_recurrent_gated_delta_rule``,
    the decode path): the same op as ``chunk_gated_delta_rule`` run token by token, which is
    faster for a few tokens per sequence.

    Arguments as ``chunk_gated_delta_rule``, with fla's extras: g None means no decay, beta None
    means 1; ``use_gate_in_kernel`` takes g as the raw gate input and forms
    ``-exp(A_log) * softplus(g + dt_bias)`` (A_log, dt_bias [HV]); ``use_beta_sigmoid_in_kernel``
    applies the sigmoid to beta; ``allow_neg_eigval`` doubles beta (fla's 2 sigmoid); ``threads``
    as there (torch's thread count by default, at most that). Per-key
    and per-value gates (gk, gv) are not supported. Differentiable; the backward rebuilds what
    it needs (nothing is kept).

    Example::

        o, ht = gdn.torch.fused_recurrent_gated_delta_rule(
            q, k, v, g=g, beta=beta, initial_state=h, output_final_state=True,
            use_qk_l2norm_in_kernel=True)
    """
    for name, x in (("gk", gk), ("gv", gv)):
        if x is not None:
            raise ValueError(f"gdn: argument '{name}': expected None (per-key or per-value "
                             f"gates are not part of the gated delta rule here), given a tensor")
    cdt = _ops.compute_dtype(q.dtype)
    if use_gate_in_kernel:
        for name, x in (("g", g), ("A_log", A_log), ("dt_bias", dt_bias)):
            if x is None:
                raise ValueError(f"gdn: argument '{name}': expected a tensor with "
                                 f"use_gate_in_kernel=True, given None")
        heads = [v.shape[-2]] if v.dim() >= 2 else None
        for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
            if heads is not None and list(x.shape) != heads:
                raise ValueError(f"gdn: argument '{name}': expected [HV] = {heads} "
                                 f"(use_gate_in_kernel), given {list(x.shape)}")
        g = -A_log.to(cdt).exp() * torch.nn.functional.softplus(g.to(cdt) + dt_bias.to(cdt))
    if g is None:
        g = v.new_zeros(v.shape[:-1], dtype=cdt)
    if beta is None:
        beta = v.new_ones(v.shape[:-1], dtype=cdt)
    if use_beta_sigmoid_in_kernel:
        beta = beta.to(cdt).sigmoid()
    if allow_neg_eigval:
        beta = beta * 2
    return _run(q, k, v, g, beta, scale, initial_state, output_final_state,
                use_qk_l2norm_in_kernel, cu_seqlens, 64, "none", "compute", threads, True,
                state_v_first)
