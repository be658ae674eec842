"""The learning-rate schedules, each one small object: the factor of the base rate at an
update, given to ``torch.optim.lr_scheduler.LambdaLR``. A callable object's attributes are
in the scheduler's ``state_dict`` (a function's are not), so a checkpoint, and a group's state
sync (``shmpad.net``), carry ``KLAdaptive``'s state with the scheduler.

- ``linear_decay``: from the base rate to 0 over a number of updates (IMPALA's, PPO's).
- ``KLAdaptive``: rl_games' adaptive rate for APPO. After every minibatch step the rate is
  multiplied by ``KL_STEP`` when that step's KL to the batch's first policy was under half
  the target, divided by it when over twice the target, and kept within ``KL_BOUNDS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = ["KL_BOUNDS", "KL_STEP", "KLAdaptive", "linear_decay", "make_schedule"]

KL_STEP = 1.5
"""``KLAdaptive``: the factor by which one minibatch step's KL raises or lowers the learning rate"""
KL_BOUNDS = (1e-6, 1e-2)
"""``KLAdaptive``: the learning rate stays within these"""


def linear_decay(updates: int) -> Callable[[int], float]:
    """The factor ``1 - update / updates``, never below 0; 1 throughout when ``updates`` is 0.
    A function, so that the scheduler's state keeps none of it: a run resumed with another
    horizon (``--lr-decay-frames``, or ``--total-frames`` standing in for it) decays over the new one."""
    return lambda update: max(0.0, 1.0 - update / updates) if updates else 1.0


class KLAdaptive:
    """The factor that ``observe`` has set from the KL of each minibatch step (1 at first). Its
    one attribute is its state, which the scheduler's ``state_dict`` carries; the target is
    the learner's setting, given to each ``observe``."""

    def __init__(self) -> None:
        self.factor = 1.0

    def __call__(self, update: int) -> float:
        return self.factor

    def observe(self, kl: float, target: float, optimizer: torch.optim.Optimizer, base_rate: float) -> None:
        """The rule after one minibatch step whose KL estimate was ``kl``; the optimiser's
        rate becomes ``base_rate`` (the scheduler's, a checkpoint's on resume) x the factor."""
        if kl > 2 * target:
            self.factor = max(self.factor / KL_STEP, KL_BOUNDS[0] / base_rate)
        elif kl < target / 2:
            self.factor = min(self.factor * KL_STEP, KL_BOUNDS[1] / base_rate)
        for group in optimizer.param_groups:
            group["lr"] = base_rate * self.factor


def make_schedule(kl_target: float, lr_decay_frames: int, frames_per_update: int) -> Callable[[int], float]:
    """``KLAdaptive()`` where a KL target is set, else the linear decay over ``lr_decay_frames``."""
    if kl_target:
        return KLAdaptive()
    return linear_decay(math.ceil(lr_decay_frames / frames_per_update) if lr_decay_frames else 0)
