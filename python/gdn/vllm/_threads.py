"""gdn's pool threads in vLLM's CPU worker: on the CPUs vLLM bound the worker to, one per CPU.

The plugin runs gdn's calls on torch's OpenMP team, vLLM's bound threads themselves
(``gdn.torch.run_on_torch_threads``); this placement is its fallback where that team is not
available (a torch whose ATen does not run on OpenMP), and gdn's pool then gives the helpers.

vLLM 0.32 hands each CPU worker process a CPU list through its OpenMP runtime's settings
(``OMP_NUM_THREADS`` and ``GOMP_CPU_AFFINITY``, ``KMP_AFFINITY`` or ``OMP_PLACES``, from
``VLLM_CPU_OMP_THREADS_BIND``); the runtime binds OpenMP thread i, the main thread first, to the
list's i-th CPU, and torch's intra-op count is the list's length, which gdn's ops take as their
thread count. gdn's pool threads are started by the main thread, so each would inherit its one
CPU: all of a call's helpers on the caller's core while the list's other cores idle
(docs/vllm.md, "Threads", has the measurements). ``place_pool`` moves them to the list's other
CPUs.
"""

from __future__ import annotations

import ctypes
import os


def bound_cpus() -> list[int]:
    """The CPUs of the OpenMP runtime's places in this process (vLLM's binding of the worker), in
    place order; [] where no OpenMP runtime is loaded for the whole process (vLLM preloads the
    one it binds with) or it has no places (no binding: ``VLLM_CPU_OMP_THREADS_BIND=nobind``, an
    in-process engine)."""
    try:
        process = ctypes.CDLL(None)
        num_places = process.omp_get_num_places
        place_num_procs = process.omp_get_place_num_procs
        place_proc_ids = process.omp_get_place_proc_ids
    except (OSError, AttributeError):
        return []
    cpus: list[int] = []
    for place in range(num_places()):
        ids = (ctypes.c_int * max(place_num_procs(place), 0))()
        place_proc_ids(place, ids)
        cpus.extend(cpu for cpu in ids if cpu not in cpus)
    return cpus


def place_pool() -> dict:
    """Puts gdn's pool threads on the bound CPUs other than the calling thread's (all bound CPUs
    when the caller may run on each of them) and says what it did: ``bound`` (vLLM's CPUs),
    ``caller`` (the calling thread's), ``pool`` (the pool threads', [] when left alone: no
    binding, or one CPU, where a call runs on its caller alone)."""
    import gdn
    bound = bound_cpus()
    caller = sorted(os.sched_getaffinity(0))
    pool = [cpu for cpu in bound if cpu not in caller] or bound
    if len(bound) < 2:
        pool = []
    if pool:
        gdn.set_pool_cpus(pool)
    return dict(bound=bound, caller=caller, pool=pool)
