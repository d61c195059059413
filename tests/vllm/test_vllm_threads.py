"""gdn's pool threads in a process bound the way vLLM binds its CPU worker, without an engine:
the OpenMP runtime vLLM preloads (torch's libgomp, or Intel's libiomp5 when the user preloads
it) told to bind its threads to two CPUs (GOMP_CPU_AFFINITY / KMP_AFFINITY, OMP_NUM_THREADS, as
vllm/utils/ompmultiprocessing.py sets them), which pins the main thread to the first. Without
the plugin's placement every gdn helper inherits that one CPU (the measurement is in
docs/vllm.md, "Threads"); with it, the helpers run on the other bound CPU. Each case runs in a
fresh interpreter (the runtime binds at load time); a few seconds each. The last test runs the
threads benchmark's argument parsing alone."""

import glob
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

CPUS = sorted(os.sched_getaffinity(0))[:2]
needs_two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs")

# A torch parallel region first (a vLLM worker has run many before its first GDN call), then the
# plugin's placement, then gdn calls on 2 threads; prints the placement and every thread's CPUs.
PROBE = """
import json, os, sys, torch
import gdn.torch
from gdn.vllm import _threads
team = sys.argv[1] == "team"
assert gdn.torch.run_on_torch_threads(team) == team
torch.ones(256, 256) @ torch.ones(256, 256)
placement = _threads.place_pool()
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 256, 4, 32, generator=g) for _ in range(3))
gates, beta = -torch.rand(1, 256, 4, generator=g), torch.rand(1, 256, 4, generator=g)
for _ in range(20):
    gdn.torch.chunk_gated_delta_rule(q, k, v, gates, beta, threads=2)
threads = []
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/status") as f:
        status = dict(line.rstrip("\\n").split(":\\t", 1) for line in f if ":\\t" in line)
    threads.append((int(tid) == os.getpid(), status["Name"], status["Cpus_allowed_list"]))
from gdn import _gdn
print("RESULT", json.dumps(dict(placement=placement, threads=threads,
                                joined=_gdn.team_helpers_joined())))
"""


def probe_threads(env, threads="pool"):
    """Runs PROBE with gdn's calls on its pool ("pool") or on torch's OpenMP team ("team"):
    the placement, and (is the main thread, name, CPUs) of every thread."""
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("LD_PRELOAD", "GOMP_CPU_AFFINITY", "KMP_AFFINITY", "OMP_PLACES",
                                "OMP_PROC_BIND", "OMP_NUM_THREADS")}
    environment.update(env)
    result = subprocess.run([sys.executable, "-c", PROBE, threads], env=environment,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT"))
    out = json.loads(line.split(" ", 1)[1])
    return out["placement"], out["threads"], out["joined"]


def run_probe(env):
    """The pool's placement (the fallback where torch's ATen does not run on OpenMP)."""
    placement, threads, _ = probe_threads(env, "pool")
    out = dict(threads=threads)
    main = [cpus for is_main, _, cpus in out["threads"] if is_main]
    helpers = [cpus for _, name, cpus in out["threads"] if name == "gdn-worker"]
    assert helpers, "no gdn-worker thread: the calls ran on one thread"
    return placement, main[0], helpers


def libgomp():
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    if not os.path.exists(lib):
        pytest.skip(f"torch's libgomp is not at {lib}")
    return lib


def libiomp():
    libs = glob.glob(os.path.join(sys.prefix, "lib", "libiomp5.so"))
    if not libs:
        pytest.skip("Intel's OpenMP runtime (intel-openmp) is not installed here")
    return libs[0]


def bound_env(runtime, a, b):
    """The environment vLLM gives a worker bound to CPUs a and b, with that OpenMP runtime."""
    if runtime == "libgomp":
        return dict(LD_PRELOAD=libgomp(), GOMP_CPU_AFFINITY=f"{a} {b}")
    return dict(LD_PRELOAD=libiomp(), KMP_AFFINITY=f"granularity=fine,explicit,proclist=[{a},{b}]")


@needs_two_cpus
@pytest.mark.parametrize("runtime", ["libgomp", "libiomp5"])
def test_helpers_run_beside_the_main_thread_in_a_process_bound_as_vllm_binds_its_worker(
        runtime):
    a, b = CPUS
    env = bound_env(runtime, a, b)
    placement, main, helpers = run_probe(dict(env, OMP_NUM_THREADS="2"))
    assert main == str(a), main  # the runtime pinned the main thread to the first CPU
    assert placement == dict(bound=[a, b], caller=[a], pool=[b]), placement
    assert helpers == [str(b)] * len(helpers), helpers


@needs_two_cpus
@pytest.mark.parametrize("runtime", ["libgomp", "libiomp5"])
def test_calls_run_on_torchs_openmp_team_and_start_no_pool_thread_in_a_bound_process(runtime):
    """The plugin's choice (gdn.torch.run_on_torch_threads(True)): the calls' helpers are the
    OpenMP team's threads vLLM bound (one per CPU), which take part in every call, and no gdn
    thread is added to those CPUs."""
    a, b = CPUS
    env = bound_env(runtime, a, b)
    _, threads, joined = probe_threads(dict(env, OMP_NUM_THREADS="2"), "team")
    assert joined >= 20, joined  # the team's other thread ran a part of each of the 20 calls
    names = [name for _, name, _ in threads]
    assert "gdn-worker" not in names, threads
    cpus = sorted(cpus for _, _, cpus in threads if cpus in (str(a), str(b)))
    assert str(a) in cpus and str(b) in cpus, threads  # the team: one thread on each CPU


def test_pool_is_left_alone_in_a_process_without_a_binding():
    placement, main, helpers = run_probe({})
    assert placement["bound"] == [] and placement["pool"] == [], placement
    assert helpers == [main] * len(helpers), (helpers, main)


def test_threads_benchmark_prints_its_help_and_refuses_an_unknown_mode():
    """bench/vllm_threads.py (the measurement behind docs/vllm.md, "Threads") parses its
    arguments before it imports vLLM: --help and a bad --modes cost no engine start."""
    script = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "vllm_threads.py")
    result = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and "--quick" in result.stdout, result.stderr
    result = subprocess.run([sys.executable, script, "--modes", "gdn-1,gdn-3"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--modes" in result.stderr, result.stderr
    assert "'gdn-1', 'gdn-3'" in result.stderr, result.stderr  # what was given
