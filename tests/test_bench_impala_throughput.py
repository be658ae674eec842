"""``python -m bench.impala.throughput`` with tiny settings: the report's
sections, target lines and machine-readable line are there (timings are not checked:
a benchmark is never a timed unit test)."""

from __future__ import annotations

import json
import re

import pytest
from test_bench_impala import run_bench_status

TINY = "--env ALE/Pong-v5 --num-workers 2 --envs-per-worker 2 --batch-size 4 --unroll-length 5 --total-frames 1600 --compile off --learner-threads 1".split()


@pytest.mark.slow
def test_report_throughput_prints_both_measurements_and_the_targets():
    status, text = run_bench_status(*TINY, "--rounds", "1", timeout=400, module="bench.impala.throughput")
    lines = text.splitlines()
    assert status == (1 if any(line.startswith("FAIL ") for line in lines) else 0), text[
        -3000:
    ]  # a missed target fails
    assert lines[0].startswith("# bench.impala.throughput")
    assert len([line for line in lines if re.match(r"  round 1: bare loop .* updates/s; Learner.step\(\)", line)]) == 1
    assert (
        len([line for line in lines if re.match(r"  round 1: pipeline .* frames/s .* ceiling .* frames/s", line)]) == 1
    )
    for section in ("1. Learner framework cost", "2. Whole pipeline", "where the time goes:", "bottleneck: the "):
        assert any(section in line for line in lines), section
    assert any(re.match(r"(PASS|FAIL) learner from the ring at [\d.]+ x the bare torch loop", line) for line in lines)
    assert any(re.match(r"(PASS|FAIL|N/A) env workers \d+% busy", line) for line in lines)
    assert not any("[learner/0]" in line or "[actor/0]" in line for line in lines)  # the program's lines stay out

    assert lines[-1].startswith("report: ")
    report = json.loads(lines[-1][len("report: ") :])
    assert report["env"] == "ALE/Pong-v5" and report["rounds"] == 1
    assert set(report["learner"]) == {"bare_updates_per_s", "ring_updates_per_s", "ring_wait_share", "ratio", "seconds"}
    assert report["learner"]["bare_updates_per_s"] > 0 and report["learner"]["ring_updates_per_s"] > 0
    assert set(report["pipeline"]) == {
        "frames_per_s",
        "seconds",
        "learner_frames_per_s",
        "learner_updates_per_s",
        "learner_wait_share",
        "learner_ms_per_update",
        "inference_ms_per_batch",
        "actor_inference_share",
        "actor_wait_share",
        "actor_rollout_share",
        "worker_busy",
        "ceiling_frames_per_s",
        "ratio_to_ceiling",
        "bottleneck",
    }
    p = report["pipeline"]
    assert p["frames_per_s"] > 0 and p["ceiling_frames_per_s"] > 0 and p["ratio_to_ceiling"] > 0
    assert 0 <= p["worker_busy"] <= 1 and 0 <= p["learner_wait_share"] <= 1
    assert p["bottleneck"] in ("learner", "actors")
    assert report["targets"]["learner_ratio"] in ("PASS", "FAIL")
    assert report["targets"]["worker_busy"] in ("PASS", "FAIL", "N/A")


@pytest.mark.parametrize("rounds", ["0", "-2"])
def test_rounds_below_one_is_refused_before_anything_runs(rounds):
    from bench.impala import throughput

    with pytest.raises(SystemExit, match=f"--rounds must be >= 1, got {rounds}"):
        throughput.main(["--rounds", rounds, "--env", "CartPole-v1"])


def test_run_refuses_rounds_that_are_not_a_positive_int():
    from bench.impala import throughput, train

    args = train.parse_args(["--env", "CartPole-v1"], defaults=throughput.DEFAULTS)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="rounds must be an int >= 1"):
            throughput.run(args, bad)
