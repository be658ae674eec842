"""``python -m bench.elastic``'s mechanics, not its speed: the figures it derives from
the learners' events, and one tiny run of two learners through a stop and a kill."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.elastic.group import Arm, Fault
from bench.elastic.report import figures, table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step(t: float, v: int, n: int, d: int = 7, r: int = 0) -> dict:
    return {"e": "step", "t": t, "v": v, "n": n, "d": d, "r": r}


def test_the_figures_of_a_stop_and_a_kill():
    arm = Arm("shmpad", True, 3, batch=10, started=100.0, ended=120.0)
    arm.events = {
        "a": [step(100.0, 1, 3), step(101.0, 2, 3), {"e": "abandoned", "t": 102.3, "v": 2}, step(102.6, 3, 2)]
        + [step(104.0, 4, 3), {"e": "abandoned", "t": 110.1, "v": 4}, step(110.5, 5, 2), step(115.0, 6, 3)],
        "b": [step(100.0, 1, 3), step(101.0, 2, 3), step(102.4, 3, 2), step(104.0, 4, 3)]
        + [step(110.2, 5, 2), step(115.0, 6, 3, d=8)],
        "c": [step(100.0, 1, 3), step(101.0, 2, 3), {"e": "abandoned", "t": 103.1, "v": 2}, step(104.0, 4, 3, r=1)]
        + [{"e": "up", "t": 112.0}, step(115.0, 6, 3, d=8, r=0)],
    }
    arm.faults = [Fault("stop", "c", 102.0, restarted=103.0), Fault("kill", "c", 110.0, restarted=110.0)]
    fig = figures(arm, warmup=1.0)
    assert fig.steps_per_s == pytest.approx(5 / 19, abs=1e-3)  # versions 2..6 first seen in [101, 120]
    assert fig.samples_per_s == pytest.approx((3 + 2 + 3 + 2 + 3) * 10 / 19, abs=0.1)
    assert (fig.versions_compared, fig.versions_differing) == (6, 1)  # version 6: a says 7, b and c 8
    stop, kill = fig.faults
    assert (stop.kind, stop.at_s, stop.detected_s, stop.survived_s, stop.rejoined_s) == ("stop", 2.0, 0.4, 0.6, 1.0)
    assert stop.stale == 2  # one abandoned after it woke, one refused
    assert (kill.detected_s, kill.survived_s, kill.rejoined_s, kill.started_s, kill.stale) == (0.2, 0.5, 5.0, 2.0, None)
    lines = table(figures(Arm("shmpad", False, 3, 10, 100.0, 120.0, {"a": [step(101.0, 2, 3)]}), 1.0), fig)
    assert "NO (1 differ)" in lines[1] and "rejoined 5.00 s (the new process up after 2.00 s)" in lines[3]


@pytest.mark.slow
def test_a_tiny_run_goes_through_a_stop_and_a_kill():
    argv = ["--peers", "2", "--seconds", "14", "--interval", "3", "--faults", "stop,kill", "--stop-seconds", "1.5"]
    argv += ["--width", "16", "--backends", "shmpad", "--warmup", "1", "--json"]
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-m", "bench.elastic", *argv], capture_output=True, text=True, timeout=400, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    clean, faulty = (json.loads(line) for line in done.stdout.splitlines())
    assert (clean["faults_on"], clean["faults"], faulty["faults_on"]) == (False, [], True)
    # the mechanics: every arm compares the learners' digests version by version and counts what differs.
    # Whether the weights stay identical is asserted by tests/test_net_accumulator.py's group tests; this
    # run's count is the benchmark's figure (one CI run of this test counted 1 of 6751 versions differing,
    # not yet explained: docs/results/elastic says so).
    for arm in (clean, faulty):
        assert arm["steps_per_s"] > 0 and arm["versions_compared"] > 0
        assert 0 <= arm["versions_differing"] <= arm["versions_compared"]
    stop = faulty["faults"][0]
    assert stop["kind"] == "stop" and stop["rejoined_s"] is not None and stop["stale"] >= 0
    assert all(f["detected_s"] is not None and f["survived_s"] is not None for f in faulty["faults"])
