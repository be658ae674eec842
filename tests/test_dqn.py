"""bench.dqn, the DQN example that uses a batched policy server and a prioritized replay
node: it learns CartPole (mean greedy return >= 195 over 20 fresh episodes) within 90 s
of wall time on this 2-core machine, command start to exit."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from helpers import run_command

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.usefixtures("shm_leak_check")
def test_dqn_learns_cartpole_in_90_seconds(tmp_path):
    out = tmp_path / "dqn.json"
    start = time.monotonic()
    status, text, _ = run_command(
        [sys.executable, "-m", "bench.dqn", "--max-seconds", "85", "--out", str(out)], 150, "bench.dqn", cwd=ROOT
    )
    wall = time.monotonic() - start
    assert status == 0, text[-3000:]
    result = json.loads(out.read_text())
    assert result["solved"] and result["final_mean_return"] >= 195.0, result
    assert len(result["final_returns"]) == 20
    assert "final evaluation: mean return" in text
    assert wall < 90.0, f"took {wall:.1f} s: {result}"
