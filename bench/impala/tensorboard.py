"""TensorBoard scalars from the IMPALA job's progress rows (``bench.impala.progress.progress``).

``TensorBoardLog(folder).write(row)`` adds each number of the row as a scalar at step
``row["frames"]`` (environment frames, the x axis every curve of the job uses), under a
tag that groups it with its kind: ``returns/``, ``losses/``, ``throughput/``,
``learning/``, ``group/``; a key it does not know goes under ``progress/``. Values that
are not numbers yet (the mean return before the first episode ends is ``""``) or are NaN
are left out rather than drawn as zeros. Open the curves with
``tensorboard --logdir runs`` (the ``tensorboard`` extra: ``pip install "shmpad[tensorboard]"``).

It writes with torch's ``SummaryWriter``, which needs the ``tensorboard`` package.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

__all__ = ["TensorBoardLog", "TAGS"]

STEP_KEY = "frames"
TAGS = {
    "mean_return": "returns/mean_return",
    "episodes": "returns/episodes",
    "loss": "losses/total",
    "fps": "throughput/frames_per_s",
    "steps_per_s": "throughput/learner_steps_per_s",
    "queue_fill": "throughput/queue_fill",
    "wait_fraction": "throughput/learner_wait_fraction",
    "env_busy": "throughput/env_workers_busy",
    "inference_ms": "throughput/inference_ms_per_batch",
    "inference_share": "throughput/actor_inference_share",
    "learner_ms": "throughput/learner_ms_per_update",
    "learning_rate": "learning/learning_rate",
    "learner_steps": "learning/learner_steps",
    "group_size": "group/size",
    "policy_lag": "learning/policy_lag_updates",
    "entropy": "learning/policy_entropy",
    "clip_fraction": "learning/appo_clip_fraction",
    "approx_kl": "learning/appo_approx_kl",
    "loss_total": "losses/total",
    "loss_policy_gradient": "losses/policy_gradient",
    "loss_baseline": "losses/baseline",
    "loss_entropy": "losses/entropy",
}
"""progress row key -> TensorBoard tag; other numeric keys go to ``progress/<key>``"""
_SKIPPED = {STEP_KEY, "seconds"}  # the step itself, and wall time (TensorBoard keeps its own)


def _number(value: Any) -> float | None:
    """``value`` as a float, or None when it is not a finite-or-infinite number ("" or NaN)."""
    if isinstance(value, bool):
        return float(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


class TensorBoardLog:
    """Writes progress rows as TensorBoard scalars into ``log_dir`` (an event file per writer)."""

    def __init__(self, log_dir: str, flush_secs: float = 10.0):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(
                f"TensorBoard logging needs the tensorboard package ({e}): pip install 'shmpad[tensorboard]'"
            ) from None
        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=log_dir, flush_secs=flush_secs)

    def write(self, row: Mapping[str, Any]) -> None:
        """Add every number of ``row`` at step ``row["frames"]``."""
        if STEP_KEY not in row:
            raise ValueError(f"a progress row needs {STEP_KEY!r} (the step of its scalars), got keys {sorted(row)}")
        step = int(row[STEP_KEY])
        for key, value in row.items():
            number = None if key in _SKIPPED else _number(value)
            if number is not None:
                self._writer.add_scalar(TAGS.get(key, f"progress/{key}"), number, global_step=step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file. Idempotent."""
        self._writer.close()

    def __enter__(self) -> "TensorBoardLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
