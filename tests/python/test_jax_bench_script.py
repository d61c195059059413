"""bench/jax_bench.py runs as documented on a small problem: every row it prints has the
timings its columns read, the C++ op on 4 KiB-page inputs included (--small-pages); --runs
prints every run's overhead and whether the target holds in all of them."""

import json
import os
import subprocess
import sys

import gdn

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "jax_bench.py")


def test_jax_bench_small_pages_rows_have_every_timing():
    out = subprocess.run(
        [sys.executable, BENCH, "--seq", "96", "--threads", "1", "--repeats", "1", "--no-baseline",
         "--small-pages", "--json"],
        check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert {(r["op"], r["pass_"]) for r in rows} == {
        (op, p) for op in ("core", "layer") for p in ("fwd", "fwd+bwd")}
    for r in rows:
        for key in ("gdn_jax_ms", "cxx_ms", "cxx_small_pages_ms", "cxx_small_pages_min_ms"):
            assert 0 < r[key] < 60e3, (r["op"], r["pass_"], key, r[key])
        assert r["tokens"] == 96 and r["threads"] == "1"


def test_jax_bench_runs_print_each_runs_overhead_and_the_target():
    out = subprocess.run(
        [sys.executable, BENCH, "--seq", "64", "--threads", "1", "--ops", "core", "--passes", "fwd",
         "--repeats", "1", "--no-baseline", "--runs", "2", "--target", "1000"],
        check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300).stdout
    lines = out.splitlines()
    row = next(line for line in lines if line.startswith("core "))
    assert row.count("%") == 2 and row.split()[-1] == "yes", out  # two runs, within 1000 %
    assert lines[-1].startswith("target: the custom call adds at most 1000 %"), out
    assert lines[-1].endswith("1 of 1 rows"), out


def test_cxx_timers_take_small_pages_as_a_keyword():
    for timer in (gdn._gdn.time_core, gdn._gdn.time_layer):
        for small_pages in (False, True):
            seconds = timer(40, 2, 4, 16, 8, True, 16, 1, 2, False, small_pages=small_pages)
            assert len(seconds) == 2 and all(0 < s < 10 for s in seconds), (timer, seconds)
