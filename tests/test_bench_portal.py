"""python -m bench.portal: its ratios and verdicts, and its calls run the same on both
implementations (portal itself when the bench extra is installed)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


def test_report_ratios_and_verdicts():
    from bench.portal.__main__ import report

    rounds = [
        {"peer": "shmpad.portal", "pattern": "roundtrip", "us_per_call": 20.0},
        {"peer": "portal", "pattern": "roundtrip", "us_per_call": 300.0},
        {"peer": "shmpad.portal", "pattern": "actor", "steps_per_s": 4000.0},
        {"peer": "portal", "pattern": "actor", "steps_per_s": 1000.0},
    ]
    rep = report(rounds, ["shmpad.portal", "portal"])
    assert rep["ratios"]["roundtrip"]["ratio"] == pytest.approx(20 / 300) and rep["ratios"]["roundtrip"]["pass"]
    assert rep["ratios"]["actor"]["ratio"] == 4.0 and not rep["ratios"]["actor"]["pass"]  # 4x < the 5x target
    assert report(rounds[:1], ["shmpad.portal"])["ratios"] == {}


@pytest.mark.slow
@pytest.mark.parametrize("peer", ["shmpad.portal", "portal"])
def test_actor_pattern_runs_on_both(peer):
    if peer == "portal":
        pytest.importorskip("portal", reason="portal comes with the bench extra")
    out = _run("bench.portal.subjects", "--peer", peer, "--pattern", "actor", "--envs", "3", "--batch", "3")
    # a batch of 3 is served only when all 3 environments asked: each stepped in the window,
    # and each answer was the asking environment's own
    assert out["peer"] == peer and out["env_steps"] >= 3
    assert out["envs_stepping"] == 3 and out["wrong_answers"] == 0


@pytest.mark.slow
def test_bench_portal_json_and_save(tmp_path: pathlib.Path):
    out = _run(
        "bench.portal",
        "--rounds",
        "1",
        "--seconds",
        "0.2",
        "--patterns",
        "roundtrip",
        "--json",
        "--save",
        str(tmp_path),
    )
    assert out["medians"]["roundtrip"]["shmpad.portal"] > 0
    assert json.loads((tmp_path / "report.json").read_text())["medians"] == out["medians"]
    assert "roundtrip" in (tmp_path / "report.txt").read_text()
