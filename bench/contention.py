"""Times gdn's ops with 1 and 2 threads while other multithreaded programs share the cores.

gdn is called from processes and on hosts where other programs run their own threads (a
serving engine's OpenMP threads, torch's intra-op pool). When a parallel region's calling
thread waits for helper threads that the scheduler has not run, 2 threads can be many times
slower than 1 (issue 34: decode-1 went from 0.25 ms on 1 thread to 21-24 ms on 2 beside two
OpenMP programs on a 2-core host). This script starts such neighbours itself, times `gdn bench`
with --threads 1 and --threads 2 under each load, and prints the medians, their ratio and the
targets:

  under load (omp, torch): the 2-thread median is at most 1.25x the 1-thread median;
  without load (with --baseline): the 2-thread median is no worse than the baseline binary's
  (at most --baseline-tolerance slower: alternating rounds on a shared host differ by a few %).

Loads: none; omp: two gdn_omp_neighbour processes (bench/omp_neighbour.cc, built beside the
gdn tool by CMake when the compiler has OpenMP), each an OpenMP loop of tiny parallel regions on
2 threads; torch: one process of the Python running this script, torch.set_num_threads(2), a
loop of small matrix products and element-wise ops (each a parallel region of torch's own pool).
The neighbours run in sessions of their own and are stopped when the script ends, also on
Ctrl-C, SIGTERM or an error; a neighbour whose parent dies stops by itself.

Cases (Qwen3-Next's heads, gdn bench's defaults: Hk 16, Hv 32, Dk = Dv = 128, float32):
decode-1 and decode-64 (`gdn bench --op step --preset ...`), the chunked forward of one
8192-token sequence without residuals and the backward from all residuals (`gdn bench
--cases forward-none,backward-all`; a gdn without case names runs `--cases forward`,
`backward` or `all` and the rows are picked from it). Each round runs every (binary, thread
count) pair, in reversed order every other round, so that a drifting host hits both; a row's
figure is the median over the rounds of each run's median (the spread: the rounds' smallest
and largest).

Nothing is built here: the gdn tool comes from scripts/bench.sh (build/release/gdn) or --gdn.
The figures of a shared host are noisy; compare only rows of one run.

Examples:
  python bench/contention.py                                    # build/release/gdn, all loads
  python bench/contention.py --quick                            # decode cases only, < 1 min
  python bench/contention.py --gdn build/pool/gdn --baseline build/main/gdn
  python bench/contention.py --cases decode-1 --loads none,omp --rounds 5
  python bench/contention.py --cpus 0,1 --json > contention.jsonl   # 2 cores of a big host

A baseline: the gdn tool of another commit, e.g. the one before a change:
  git worktree add ../gdn-before HEAD~1
  cmake -S ../gdn-before -B build/before -G Ninja -DCMAKE_BUILD_TYPE=Release -DGDN_BUILD_TESTS=OFF
  cmake --build build/before --target gdn_cli
  python bench/contention.py --baseline build/before/gdn
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DEFAULT_GDN = os.path.join(ROOT, "build", "release", "gdn")
NEIGHBOUR_NAME = "gdn_omp_neighbour"

# case -> the gdn bench run that times it (one run per group, thread count and binary)
CASES = {
    "decode-1": "step",
    "decode-64": "step",
    "forward": "core",
    "backward": "core",
}
LOADS = ("none", "omp", "torch")
RATIO_LIMIT = 1.25  # issue 34: 2 threads at most 1.25x 1 thread under load
READY_TIMEOUT_S = 60  # torch's import on a busy 2-core host takes a few seconds
RUN_TIMEOUT_S = 1800  # one gdn bench run; far above any case's time under load


class BenchError(RuntimeError):
    """A failure the user can act on; main prints it without a traceback."""


# ---------------------------------------------------------------------------------------------
# The neighbours.
# ---------------------------------------------------------------------------------------------
def torch_neighbour_main(threads: int) -> int:
    """The torch load (run in its own process by --neighbour-torch): torch's intra-op pool on
    `threads` threads, a loop of a 128x128 matrix product and an add of 65536 floats (two
    elements' grain of ATen's parallel_for: one tiny region per op), until SIGTERM/SIGINT or
    the parent's exit. Prints "ready", then on exit the regions run."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:  # PR_SET_PDEATHSIG = 1: SIGTERM when the parent dies
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    try:
        import torch
    except ImportError as e:
        print(f"torch neighbour: cannot import torch: {e}", file=sys.stderr, flush=True)
        return 3
    torch.set_num_threads(threads)
    a, b, c = (torch.rand(128, 128) for _ in range(3))
    x, y, z = (torch.rand(1 << 16) for _ in range(3))
    start, loops = time.monotonic(), 0
    while not stop:
        torch.mm(a, b, out=c)
        torch.add(x, y, out=z)
        loops += 1
        if loops == 1:
            print("ready", flush=True)
        if loops % 16 == 0 and os.getppid() != parent:
            break
    elapsed = max(time.monotonic() - start, 1e-9)
    print(f"regions {2 * loops} seconds {elapsed:.3f} per_second {2 * loops / elapsed:.0f} "
          f"threads {torch.get_num_threads()}", flush=True)
    return 0


def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads), from /proc; None where there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Neighbour:
    """One neighbour process, in a session of its own (a terminal's Ctrl-C reaches this script,
    which stops it, not the neighbour directly)."""

    def __init__(self, name: str, argv: list[str]):
        self.name, self.argv = name, argv
        self.proc: subprocess.Popen | None = None
        self.summary = ""
        self.cpus: float | None = None  # its average CPUs in use while it ran

    def start(self) -> None:
        # stderr to a file: a pipe nobody reads while the load runs could fill and stall it.
        self.errors = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.errors, start_new_session=True, bufsize=0)
        self._started = time.monotonic()
        _LIVE.add(self)

    def wait_ready(self, timeout: float) -> None:
        """Until the neighbour prints "ready" (its first parallel region ran)."""
        assert self.proc is not None
        out, deadline = b"", time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in out:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"neighbour {self.name} ({' '.join(self.argv)}) did not say "
                                     f"ready within {timeout:.0f} s")
                if sel.select(left):
                    chunk = os.read(self.proc.stdout.fileno(), 4096)
                    if not chunk:
                        break
                    out += chunk
        if out.split(b"\n")[0].strip() != b"ready":
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            self.errors.seek(0)
            err = self.errors.read().decode(errors="replace").strip()
            self.stop()
            said = out.decode(errors="replace").strip()
            raise BenchError(f"neighbour {self.name} ({' '.join(self.argv)}) " + (
                f"exited with {code} before it was ready: {err or said}" if code is not None
                else f"printed '{said}' where 'ready' was expected"))
        self._cpu0, self._t0 = _cpu_seconds(self.proc.pid), time.monotonic()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; reaps the process. Safe to call twice."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        cpu1, t1 = _cpu_seconds(proc.pid), time.monotonic()
        if getattr(self, "_cpu0", None) is not None and cpu1 is not None and t1 > self._t0:
            self.cpus = (cpu1 - self._cpu0) / (t1 - self._t0)
        for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 30)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        proc.wait()
        try:
            self.summary = proc.stdout.read().decode(errors="replace").strip().splitlines()[-1]
        except (OSError, ValueError, IndexError):
            self.summary = ""
        proc.stdout.close()
        self.errors.close()


_LIVE: set[Neighbour] = set()


def stop_all_neighbours() -> None:
    for n in list(_LIVE):
        n.stop()


class Load:
    """The neighbours of one load, started on entry (each one ready) and stopped on exit,
    whatever ends the block."""

    def __init__(self, name: str, neighbour_path: str | None, threads: int = 2,
                 omp_neighbours: int = 2):
        self.name = name
        if name == "none":
            self.neighbours = []
        elif name == "omp":
            self.neighbours = [Neighbour(f"omp#{i + 1}", [neighbour_path, "--threads",
                                                          str(threads)])
                               for i in range(omp_neighbours)]
        elif name == "torch":
            self.neighbours = [Neighbour("torch", [sys.executable, os.path.abspath(__file__),
                                                   "--neighbour-torch", str(threads)])]
        else:
            raise BenchError(f"--loads: expected none, omp or torch; given '{name}'")

    def __enter__(self) -> "Load":
        try:
            for n in self.neighbours:
                n.start()
            for n in self.neighbours:
                n.wait_ready(READY_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        for n in self.neighbours:
            n.stop()

    def check_running(self) -> None:
        """A neighbour that has exited would leave the load lighter than it says."""
        for n in self.neighbours:
            if n.proc is not None and n.proc.poll() is not None:
                raise BenchError(f"neighbour {n.name} ({' '.join(n.argv)}) exited during the "
                                 f"load (exit status {n.proc.returncode})")

    def describe(self) -> str:
        """What the neighbours did: the CPUs each kept busy on average while the load ran
        (2.00: both its threads all the time) and the parallel regions it ran per second."""
        parts = []
        for n in self.neighbours:
            words = n.summary.split()
            said = dict(zip(words[::2], words[1::2]))
            rate = f"{said['per_second']} regions/s" if "per_second" in said else "no summary"
            cpus = f"{n.cpus:.2f} CPUs" if n.cpus is not None else "CPUs unknown"
            parts.append(f"{n.name} {cpus}, {rate}")
        return "; ".join(parts)


# ---------------------------------------------------------------------------------------------
# Running gdn bench.
# ---------------------------------------------------------------------------------------------
class Gdn:
    """One gdn binary: its path, `gdn version`, and whether `gdn bench --cases` takes case
    names (older binaries take all, forward or backward only)."""

    def __init__(self, label: str, path: str):
        self.label, self.path = label, os.path.abspath(path)
        if not os.access(self.path, os.X_OK):
            raise BenchError(f"--{'gdn' if label == 'new' else 'baseline'}: no gdn executable at "
                             f"'{path}' (build it with scripts/bench.sh, or cmake --build "
                             "<build dir> --target gdn_cli, and give its path)")
        self.version = self._output("version")
        self.case_names = "backward-all" in self._output("bench", "--help")

    def _output(self, *args: str) -> str:
        r = subprocess.run([self.path, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=60)
        if r.returncode != 0:
            raise BenchError(f"'{self.path} {' '.join(args)}' failed ({r.returncode}): "
                             f"{r.stdout.strip()[-500:]}")
        return r.stdout

    def command(self, group: str, cases: list[str], threads: int, cfg) -> list[str]:
        if group == "step":
            presets = ",".join(c for c in cases if CASES[c] == "step")
            return [self.path, "bench", "--op", "step", "--preset", presets, "--threads",
                    str(threads), "--repeats", str(cfg.step_repeats), "--json"]
        core = [c for c in cases if CASES[c] == "core"]
        if self.case_names:
            which = ",".join({"forward": "forward-none", "backward": "backward-all"}[c]
                             for c in core)
        else:  # the group of the case, or all for both (3 or 6 cases timed, 1 or 2 kept)
            which = core[0] if len(core) == 1 else "all"
        return [self.path, "bench", "--cases", which,
                "--tokens", str(cfg.tokens), "--threads", str(threads), "--repeats",
                str(cfg.core_repeats), "--json"]


def pick_rows(group: str, cases: list[str], rows: list[dict]) -> dict[str, float]:
    """case -> median_ms of the JSON rows of one gdn bench run."""
    found = {}
    for r in rows:
        if group == "step" and r.get("preset") in cases:
            found[r["preset"]] = r["median_ms"]
        elif group == "core" and r.get("impl") == "chunked":
            if r.get("op") == "forward" and r.get("residuals") == "none" and "forward" in cases:
                found["forward"] = r["median_ms"]
            elif r.get("op") == "backward-all" and "backward" in cases:
                found["backward"] = r["median_ms"]
    return found


def run_bench(argv: list[str]) -> list[dict]:
    try:
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BenchError(f"'{' '.join(argv)}' ran past {RUN_TIMEOUT_S} s") from None
    if r.returncode != 0:
        raise BenchError(f"'{' '.join(argv)}' failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def measure(binaries: list[Gdn], cfg, progress=print) -> tuple[dict, dict]:
    """Runs the rounds under each load. Returns ({(label, case, load, threads): [ms per round]},
    {load: what its neighbours did})."""
    groups = [g for g in ("step", "core") if any(CASES[c] == g for c in cfg.cases)]
    times: dict[tuple, list[float]] = {}
    loads_done = {}
    for load_name in cfg.loads:
        with Load(load_name, cfg.neighbour, cfg.neighbour_threads, cfg.omp_neighbours) as load:
            pids = " ".join(str(n.pid) for n in load.neighbours)
            progress(f"load {load_name}: " + (f"neighbours ready: pids {pids}" if pids else
                                              "no neighbours"))
            for rnd in range(cfg.rounds):
                order = [(b, t) for b in binaries for t in (1, 2)]
                if rnd % 2:
                    order.reverse()
                for group in groups:
                    for b, threads in order:
                        found = pick_rows(group, cfg.cases, run_bench(
                            b.command(group, cfg.cases, threads, cfg)))
                        load.check_running()
                        for case in (c for c in cfg.cases if CASES[c] == group):
                            if case not in found:
                                raise BenchError(f"{b.path}: gdn bench gave no row for {case}")
                            times.setdefault((b.label, case, load_name, threads), []).append(
                                found[case])
                        progress(f"load {load_name} round {rnd + 1}/{cfg.rounds} {group} "
                                 f"{b.label} {threads}t: " + ", ".join(
                                     f"{c} {found[c]:.3f} ms" for c in cfg.cases if c in found))
        loads_done[load_name] = load.describe()
    return times, loads_done


# ---------------------------------------------------------------------------------------------
# The table.
# ---------------------------------------------------------------------------------------------
def summarize(times: dict, cases: list[str], loads: list[str], baseline: bool,
              tolerance: float) -> list[dict]:
    """One row per (case, load): medians over the rounds, spreads, ratios and the targets."""
    rows = []
    for case in cases:
        for load in loads:
            row = {"case": case, "load": load}
            for label in ("new", "baseline") if baseline else ("new",):
                prefix = "" if label == "new" else "baseline_"
                for threads in (1, 2):
                    ms = times[(label, case, load, threads)]
                    row[f"{prefix}median_{threads}t_ms"] = statistics.median(ms)
                    row[f"{prefix}spread_{threads}t_ms"] = [min(ms), max(ms)]
                row[f"{prefix}ratio_2t_1t"] = (row[f"{prefix}median_2t_ms"] /
                                               row[f"{prefix}median_1t_ms"])
            if load != "none":
                row["target"] = f"2t/1t <= {RATIO_LIMIT}"
                row["pass"] = row["ratio_2t_1t"] <= RATIO_LIMIT
            elif baseline:
                row["new_over_baseline_2t"] = row["median_2t_ms"] / row["baseline_median_2t_ms"]
                row["target"] = f"2t new/baseline <= {1 + tolerance:.2f}"
                row["pass"] = row["new_over_baseline_2t"] <= 1 + tolerance
            else:
                row["target"], row["pass"] = None, None
            rows.append(row)
    return rows


def fmt_ms(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 1 else \
        f"{x:.3f}"


def format_table(rows: list[dict], baseline: bool) -> str:
    def cell(row, prefix, threads):
        lo, hi = row[f"{prefix}spread_{threads}t_ms"]
        return f"{fmt_ms(row[f'{prefix}median_{threads}t_ms'])} ({fmt_ms(lo)}-{fmt_ms(hi)})"

    head = f"{'case':<10} {'load':<6} {'1 thread ms':>22} {'2 threads ms':>22} {'2t/1t':>7}"
    if baseline:
        head += f" | {'baseline 1t ms':>15} {'baseline 2t ms':>15} {'2t/1t':>7} {'2t new/base':>11}"
    lines = [head + "  target", "-" * (len(head) + 26)]
    for r in rows:
        line = (f"{r['case']:<10} {r['load']:<6} {cell(r, '', 1):>22} {cell(r, '', 2):>22} "
                f"{r['ratio_2t_1t']:>7.2f}")
        if baseline:
            nb = r.get("new_over_baseline_2t")
            line += (f" | {fmt_ms(r['baseline_median_1t_ms']):>15} "
                     f"{fmt_ms(r['baseline_median_2t_ms']):>15} {r['baseline_ratio_2t_1t']:>7.2f} "
                     f"{(f'{nb:.3f}' if nb is not None else '-'):>11}")
        if r["pass"] is not None:
            line += f"  {'PASS' if r['pass'] else 'FAIL'} ({r['target']})"
        lines.append(line)
    judged = [r for r in rows if r["pass"] is not None]
    lines.append(f"targets: {sum(r['pass'] for r in judged)} of {len(judged)} PASS"
                 + ("" if baseline else " (no baseline: the no-load rows are not judged)"))
    return "\n".join(lines)


def host_description() -> dict:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": model, "cpus": cpus, "system": f"{platform.system()} {platform.release()}",
            "loadavg": list(load) if load else None}


# ---------------------------------------------------------------------------------------------
# The command line.
# ---------------------------------------------------------------------------------------------
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gdn", default=DEFAULT_GDN, metavar="PATH",
                   help="the gdn tool to time (default: build/release/gdn, scripts/bench.sh's)")
    p.add_argument("--baseline", metavar="PATH",
                   help="a second gdn tool (e.g. a build of the commit before a change), timed "
                        "in the same rounds, alternating")
    p.add_argument("--neighbour", metavar="PATH",
                   help=f"the omp load's program (default: {NEIGHBOUR_NAME} beside --gdn)")
    p.add_argument("--cases", default="all", metavar="LIST",
                   help="all or cases, comma separated: decode-1, decode-64, forward, backward "
                        "(default all; --quick: decode-1,decode-64)")
    p.add_argument("--loads", default="none,omp,torch", metavar="LIST",
                   help="loads, comma separated: none, omp, torch (default all three)")
    p.add_argument("--rounds", type=int, metavar="N",
                   help="rounds per load (default 3; --quick: 2)")
    p.add_argument("--step-repeats", type=int, metavar="N",
                   help="timed steps per decode run (default 20; --quick: 10)")
    p.add_argument("--core-repeats", type=int, metavar="N", default=2,
                   help="timed runs per forward/backward run (default 2)")
    p.add_argument("--tokens", type=int, default=8192, metavar="T",
                   help="tokens of the forward and backward cases (default 8192)")
    p.add_argument("--neighbour-threads", type=int, metavar="N", default=2,
                   help="threads of each neighbour (default 2)")
    p.add_argument("--omp-neighbours", type=int, metavar="N", default=2,
                   help="processes of the omp load (default 2)")
    p.add_argument("--baseline-tolerance", type=float, default=0.05, metavar="X",
                   help="how much slower than the baseline the no-load 2-thread median may be "
                        "and still PASS (default 0.05: 5 %%, the noise of alternating rounds)")
    p.add_argument("--cpus", metavar="LIST",
                   help="run everything (gdn and the neighbours) on these CPUs, e.g. 0,1: a "
                        "2-core host's sharing on a larger one")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test: decode-1 and decode-64, 2 rounds, 10 steps (under a "
                        "minute on 2 cores)")
    p.add_argument("--check", action="store_true", help="exit 1 when a target FAILs")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per row on stdout, and nothing else (progress: stderr)")
    p.add_argument("--neighbour-torch", type=int, metavar="THREADS", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    def positive(name, value):
        if value is not None and value < 1:
            p.error(f"argument --{name}: expected a positive integer, given {value}")

    for name in ("rounds", "step_repeats", "core_repeats", "tokens", "neighbour_threads",
                 "omp_neighbours"):
        positive(name.replace("_", "-"), getattr(args, name))
    if args.baseline_tolerance < 0:
        p.error(f"argument --baseline-tolerance: expected >= 0, given {args.baseline_tolerance}")
    if args.quick and args.cases == "all":
        args.cases = "decode-1,decode-64"
    args.cases = list(CASES) if args.cases == "all" else args.cases.split(",")
    for c in args.cases:
        if c not in CASES:
            p.error(f"argument --cases: expected all or cases of {', '.join(CASES)}; given "
                    f"'{c}'")
    args.loads = args.loads.split(",")
    for name in args.loads:
        if name not in LOADS:
            p.error(f"argument --loads: expected loads of {', '.join(LOADS)}; given '{name}'")
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.step_repeats = args.step_repeats or (10 if args.quick else 20)
    if args.cpus:
        try:
            args.cpus = sorted({int(c) for c in args.cpus.split(",")})
        except ValueError:
            p.error(f"argument --cpus: expected CPU numbers, comma separated; given '{args.cpus}'")
    return args


def check_environment(args) -> None:
    """Everything a load needs, before anything starts."""
    if "omp" in args.loads:
        args.neighbour = args.neighbour or os.path.join(os.path.dirname(os.path.abspath(
            args.gdn)), NEIGHBOUR_NAME)
        if not os.access(args.neighbour, os.X_OK):
            raise BenchError(
                f"--loads omp needs {NEIGHBOUR_NAME} (bench/omp_neighbour.cc); none at "
                f"'{args.neighbour}'. CMake builds it beside gdn when the compiler has OpenMP "
                f"(cmake --build <build dir> --target {NEIGHBOUR_NAME}); or give --neighbour "
                "PATH, or leave the load out (--loads none,torch)")
    if "torch" in args.loads and importlib.util.find_spec("torch") is None:
        raise BenchError(f"--loads torch needs torch in the Python that runs this script "
                         f"({sys.executable}), which has none; run the script with a Python that "
                         "has torch, or leave the load out (--loads none,omp)")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.neighbour_torch is not None:
        return torch_neighbour_main(args.neighbour_torch)
    # SIGTERM and SIGHUP end the run as Ctrl-C does: through the blocks that stop neighbours.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _: sys.exit(128 + signum))
    log = (lambda text: print(text, file=sys.stderr, flush=True))
    try:
        if args.cpus:
            try:
                os.sched_setaffinity(0, args.cpus)
            except (OSError, ValueError) as e:
                raise BenchError(f"--cpus {','.join(map(str, args.cpus))}: {e}") from None
        binaries = [Gdn("new", args.gdn)]
        if args.baseline:
            binaries.append(Gdn("baseline", args.baseline))
        check_environment(args)
        host = host_description()
        times, loads_done = measure(binaries, args, progress=log)
    except BenchError as e:
        print(f"contention.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("contention.py: interrupted; neighbours stopped", file=sys.stderr)
        return 130
    finally:
        stop_all_neighbours()
    rows = summarize(times, args.cases, args.loads, bool(args.baseline), args.baseline_tolerance)
    if args.json:
        for r in rows:
            r.update(cpu=host["cpu"], cpus=host["cpus"], gdn=binaries[0].path,
                     baseline=binaries[1].path if args.baseline else None,
                     rounds=args.rounds, load_neighbours=loads_done[r["load"]])
            print(json.dumps(r))
    else:
        print("gdn under load: 1 and 2 threads while other programs share the cores "
              "(bench/contention.py)")
        print(f"host: {host['cpu']}, {host['cpus']} CPUs{' ' + str(args.cpus) if args.cpus else ''}"
              f", {host['system']}; load average at the start "
              + (" ".join(f"{x:.2f}" for x in host["loadavg"]) if host["loadavg"] else "unknown"))
        for b in binaries:
            about = "; ".join(line.strip() for line in b.version.splitlines()
                              if line.startswith(("gdn ", "OpenMP", "threads")))
            print(f"{b.label + ':':<9} {b.path} ({about})")
        tuning = [f"{k}={v}" for k, v in sorted(os.environ.items())
                  if k.startswith(("OMP_", "GOMP_", "KMP_"))]
        if tuning:
            print("environment (gdn and the neighbours): " + " ".join(tuning))
        print(f"rounds {args.rounds}; repeats per run: decode {args.step_repeats}, forward/"
              f"backward {args.core_repeats}; {args.tokens} tokens; figures: median of the "
              "rounds' medians (the rounds' min-max)")
        print()
        print(format_table(rows, bool(args.baseline)))
        for name, what in loads_done.items():
            if what:
                print(f"load {name}: {what}")
    failed = any(r["pass"] is False for r in rows)
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
