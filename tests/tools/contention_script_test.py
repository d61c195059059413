#!/usr/bin/env python3
"""bench/contention.py (gdn under load): its targets, its neighbours' start and stop, and a
short run end to end. A few seconds; not a timing test (the figures are not judged here).

Usage: contention_script_test.py PATH/TO/gdn PATH/TO/gdn_omp_neighbour
"""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import types

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                      "contention.py")
spec = importlib.util.spec_from_file_location("contention", SCRIPT)
contention = importlib.util.module_from_spec(spec)
spec.loader.exec_module(contention)


def gone(pid):
    """True when the process has exited (reaped, or a zombie left to init)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pids, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if not gone(p)]


def test_targets_pass_and_fail_at_their_limits(_gdn, _neighbour):
    ms = lambda x: [x, x, x]  # noqa: E731
    times = {}
    for label, load, one, two in [
            ("new", "none", [1.0, 1.2, 1.1], [0.6, 0.7, 0.8]),
            ("new", "omp", ms(1.0), ms(1.3)),      # 1.30x: FAIL
            ("new", "torch", ms(2.0), ms(2.5)),    # 1.25x exactly: PASS
            ("baseline", "none", ms(1.0), ms(0.66)),
            ("baseline", "omp", ms(1.0), ms(90.0)),
            ("baseline", "torch", ms(1.0), ms(40.0))]:
        times[(label, "decode-1", load, 1)], times[(label, "decode-1", load, 2)] = one, two
    rows = contention.summarize(times, ["decode-1"], ["none", "omp", "torch"], True, 0.05)
    by_load = {r["load"]: r for r in rows}
    none, omp, torch = by_load["none"], by_load["omp"], by_load["torch"]
    assert none["median_1t_ms"] == 1.1 and none["spread_1t_ms"] == [1.0, 1.2], none
    assert abs(none["ratio_2t_1t"] - 0.7 / 1.1) < 1e-12, none
    assert abs(none["new_over_baseline_2t"] - 0.7 / 0.66) < 1e-12, none
    assert none["pass"] is False, none  # 6 % slower than the baseline, tolerance 5 %
    assert omp["pass"] is False and torch["pass"] is True, (omp, torch)
    assert omp["baseline_ratio_2t_1t"] == 90.0, omp

    table = contention.format_table(rows, baseline=True).splitlines()
    line = {r.split()[1]: r for r in table if r.startswith("decode-1")}
    assert "FAIL (2t new/baseline <= 1.05)" in line["none"], line["none"]
    assert "FAIL (2t/1t <= 1.25)" in line["omp"] and "1.30" in line["omp"], line["omp"]
    assert "PASS (2t/1t <= 1.25)" in line["torch"], line["torch"]
    assert "targets: 1 of 3 PASS" in table[-1], table[-1]

    # Within the tolerance the no-load row passes; without a baseline it is not judged.
    times[("baseline", "decode-1", "none", 2)] = ms(0.69)
    rows = contention.summarize(times, ["decode-1"], ["none"], True, 0.05)
    assert rows[0]["pass"] is True, rows
    rows = contention.summarize(times, ["decode-1"], ["none"], False, 0.05)
    assert rows[0]["pass"] is None and "baseline_median_2t_ms" not in rows[0], rows
    table = contention.format_table(rows, baseline=False)
    assert "PASS" not in table.splitlines()[2] and "FAIL" not in table, table


def test_omp_neighbours_run_and_stop_when_the_block_ends(_gdn, neighbour):
    pids = []
    try:
        with contention.Load("omp", neighbour) as load:
            pids = [n.pid for n in load.neighbours]
            assert len(pids) == 2 and not any(gone(p) for p in pids), pids
            time.sleep(0.3)
            raise RuntimeError("the block fails")
    except RuntimeError as e:
        assert str(e) == "the block fails"
    assert not wait_gone(pids, 0), pids  # stopped and reaped before the exception went on
    assert "regions/s" in load.describe() and "CPUs" in load.describe(), load.describe()


def test_torch_neighbour_runs_and_stops(_gdn, _neighbour):
    if importlib.util.find_spec("torch") is None:
        print("  (skipped: no torch in this Python)")
        return
    with contention.Load("torch", None) as load:
        pid = load.neighbours[0].pid
        assert not gone(pid)
    assert gone(pid), pid
    assert "regions/s" in load.describe(), load.describe()


def start_script(gdn, neighbour):
    """The script on a run that would last hours, once its omp neighbours are up: (process,
    neighbour pids)."""
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, "--gdn", gdn, "--neighbour", neighbour, "--cases", "decode-1",
         "--loads", "omp", "--rounds", "100000", "--step-repeats", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if "neighbours ready: pids" in line:
            pids = [int(p) for p in line.split("pids")[1].split()]
            time.sleep(0.3)  # into the rounds
            return proc, pids
    raise AssertionError(f"the script ended ({proc.wait()}) before its neighbours were ready")


def test_stopped_script_leaves_no_neighbours(gdn, neighbour):
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)):
        proc, pids = start_script(gdn, neighbour)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == code, (sig, proc.returncode)
        assert not wait_gone(pids, 0), (sig, pids)  # the script stopped them before it exited
    # Killed outright, the script stops nothing: the neighbours see their parent go.
    proc, pids = start_script(gdn, neighbour)
    proc.kill()
    proc.wait()
    assert not wait_gone(pids, 10), pids


def test_short_run_gives_every_row(gdn, neighbour):
    out = subprocess.run(
        [sys.executable, SCRIPT, "--gdn", gdn, "--neighbour", neighbour, "--cases",
         "decode-1,forward", "--tokens", "64", "--loads", "none,omp", "--rounds", "1",
         "--step-repeats", "2", "--core-repeats", "1", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["case"], r["load"]) for r in rows] == [
        ("decode-1", "none"), ("decode-1", "omp"), ("forward", "none"), ("forward", "omp")], rows
    for r in rows:
        assert r["median_1t_ms"] > 0 and r["median_2t_ms"] > 0, r
        assert (r["pass"] is None) == (r["load"] == "none"), r
        assert r["cpu"] and r["gdn"] == os.path.abspath(gdn), r


def test_rows_are_picked_from_every_case_of_a_run(_gdn, _neighbour):
    rows = [{"op": op, "impl": impl, "residuals": res, "median_ms": ms} for op, impl, res, ms in (
        ("forward", "chunked", "none", 1.0), ("forward", "chunked", "all", 2.0),
        ("forward", "recurrent", "none", 3.0), ("backward-all", "chunked", "all", 4.0),
        ("backward-t_inv", "chunked", "t_inv", 5.0), ("backward-none", "chunked", "none", 6.0))]
    assert contention.pick_rows("core", ["forward", "backward"], rows) == {
        "forward": 1.0, "backward": 4.0}
    assert contention.pick_rows("core", ["backward"], rows) == {"backward": 4.0}
    steps = [{"preset": "decode-1", "median_ms": 0.2}, {"preset": "decode-64", "median_ms": 9.0}]
    assert contention.pick_rows("step", ["decode-64"], steps) == {"decode-64": 9.0}


def test_older_gdn_runs_the_case_group(gdn, _neighbour):
    new = contention.Gdn("new", gdn)
    cfg = types.SimpleNamespace(tokens=64, core_repeats=1, step_repeats=1)
    cases_of = lambda command: command[command.index("--cases") + 1]  # noqa: E731
    assert new.case_names
    assert cases_of(new.command("core", ["forward", "backward"], 2, cfg)) == \
        "forward-none,backward-all"
    new.case_names = False  # as a gdn whose --cases takes all, forward or backward only
    assert cases_of(new.command("core", ["backward"], 2, cfg)) == "backward"
    assert cases_of(new.command("core", ["forward", "backward"], 2, cfg)) == "all"


def test_bad_arguments_and_failed_neighbours_are_said(gdn, _neighbour):
    for args, text in ((["--gdn", "/nonexistent/gdn"], "--gdn: no gdn executable at"),
                       (["--gdn", gdn, "--neighbour", "/nonexistent/nb", "--loads", "omp"],
                        "--loads omp needs gdn_omp_neighbour"),
                       (["--gdn", gdn, "--loads", "busy"], "argument --loads: expected loads"),
                       (["--gdn", gdn, "--neighbour", "/bin/false", "--loads", "omp"],
                        "(/bin/false --threads 2) exited with 1 before it was ready")):
        r = subprocess.run([sys.executable, SCRIPT, *args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=60)
        assert r.returncode == 2 and text in r.stderr, (args, r.returncode, r.stderr)


def main():
    gdn, neighbour = sys.argv[1], sys.argv[2]
    for name, test in list(globals().items()):
        if name.startswith("test_"):
            start = time.monotonic()
            test(gdn, neighbour)
            print(f"ok {name} ({time.monotonic() - start:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
