"""bench.impala.tensorboard: the IMPALA job's progress rows, as ``progress()`` makes them, become
TensorBoard scalars at their frame counts, read back from the event file."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed: pip install '.[tensorboard]'")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from bench.impala import progress  # noqa: E402
from bench.impala.tensorboard import TensorBoardLog  # noqa: E402


def _row(frames: int, steps: int, mean_return: float, t: float, last: dict) -> dict:
    learner = SimpleNamespace(
        statistics=lambda: SimpleNamespace(
            frames=frames,
            mean_return=mean_return,
            episodes=steps // 2,
            steps=steps,
            wait_seconds=t / 4,
            learning_rate=6e-4 * (1 - frames / 10_000),
            last_loss={"total": 0.5 - frames / 100_000},
            policy_lag_sum=1.5 * steps,
            policy_lag_batches=steps,
        ),
        accumulator=None,
    )
    ring = SimpleNamespace(statistics=lambda: SimpleNamespace(size=3, capacity=8))
    return progress.progress(learner, ring, last, now=t, seconds=t)


def test_progress_rows_become_scalars_at_their_frames(tmp_path):
    last = {"t": 0.0, "frames": 0, "steps": 0, "wait": 0.0}
    rows = [_row(1000, 10, math.nan, 1.0, last), _row(3000, 30, 12.5, 2.0, last)]
    assert rows[0]["mean_return"] == ""  # no episode ended yet: not a number
    with TensorBoardLog(str(tmp_path)) as log:
        for row in rows:
            log.write(row)
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert scalars["returns/mean_return"] == [(3000, 12.5)]  # the "" row is left out, not drawn as 0
    assert scalars["throughput/frames_per_s"] == [(1000, 1000.0), (3000, 2000.0)]
    assert scalars["throughput/queue_fill"] == [(1000, pytest.approx(0.375)), (3000, pytest.approx(0.375))]
    assert scalars["learning/learning_rate"] == [(1000, pytest.approx(5.4e-4)), (3000, pytest.approx(4.2e-4))]
    assert scalars["losses/total"] == [(1000, pytest.approx(0.49)), (3000, pytest.approx(0.47))]
    assert set(scalars) == {
        "returns/mean_return",
        "returns/episodes",
        "losses/total",
        "throughput/frames_per_s",
        "throughput/learner_steps_per_s",
        "throughput/queue_fill",
        "throughput/learner_wait_fraction",
        "throughput/learner_ms_per_update",
        "learning/learning_rate",
        "learning/learner_steps",
        "learning/policy_lag_updates",
        "group/size",
    }
    assert scalars["learning/policy_lag_updates"] == [(1000, 1.5), (3000, 1.5)]
    assert scalars["throughput/learner_ms_per_update"] == [
        (1000, 75.0),
        (3000, 37.5),
    ]  # busy 0.75 s over 10, 20 updates


def test_a_row_without_frames_is_refused_and_unknown_keys_keep_their_name(tmp_path):
    with TensorBoardLog(str(tmp_path)) as log:
        with pytest.raises(ValueError, match=r"^a progress row needs 'frames' \(the step of its scalars\), got keys"):
            log.write({"fps": 1.0})
        log.write({"frames": 5, "actor_restarts": 2, "note": "text"})
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert events.Tags()["scalars"] == ["progress/actor_restarts"]
