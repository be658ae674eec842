"""The IMPALA loss (Espeholt et al. 2018, section 4.2), with torchbeast's and moolib's terms.

All inputs are aligned, time-major ``[T, B, ...]``: row ``t`` holds the action taken
from observation ``t``, the logits of both policies at that observation, the
baseline there, and the reward and ``done`` that followed the action. From a
``[T+1, B]`` unroll in the row convention of ``actors.rollout`` (reward and done
arrive with the *next* observation) that is: logits, actions and values from rows
``:-1``, rewards and done from rows ``1:``, and the bootstrap value from row ``-1``.

    total = policy_gradient + baseline_cost * baseline + entropy_cost * entropy

    policy_gradient = sum_t -log pi(a_t | x_t) * pg_advantage_t
    baseline        = 0.5 * sum_t (v_t - V(x_t))^2
    entropy         = sum_t sum_a pi(a | x_t) log pi(a | x_t)   (minus the entropy)

with ``vs`` and ``pg_advantages`` from V-trace (constants). ``reduction="sum"``
sums over time and batch as torchbeast does; ``"mean"`` averages as moolib does.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from learners import vtrace
from learners._checks import check_float_tensor, describe
from learners.categorical import entropy
from shmpad._checks import check_number, check_threshold

__all__ = ["ImpalaLoss", "baseline_loss", "clip_rewards", "entropy_loss", "impala_loss", "policy_gradient_loss"]

Reduction = Literal["sum", "mean"]


class ImpalaLoss(NamedTuple):
    """The loss terms, each a scalar; ``total`` is the one to differentiate.

    ``baseline`` and ``entropy`` are before their costs are applied.
    """

    total: torch.Tensor
    policy_gradient: torch.Tensor
    baseline: torch.Tensor
    entropy: torch.Tensor


def clip_rewards(rewards: torch.Tensor, clip: float | None = 1.0) -> torch.Tensor:
    """``rewards`` ``[T, B, ...]`` clamped to ``[-clip, clip]``; unchanged for ``clip=None``."""
    check_float_tensor("rewards", rewards)
    check_threshold("clip", clip)
    return rewards if clip is None else rewards.clamp(-clip, clip)


def _reduce(x: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    if reduction == "sum":
        return x.sum()
    if reduction == "mean":
        return x.mean()
    raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")


def policy_gradient_loss(
    target_action_log_probs: torch.Tensor, pg_advantages: torch.Tensor, reduction: Reduction = "sum"
) -> torch.Tensor:
    """``-log pi(a_t|x_t) * pg_advantage_t`` reduced over ``[T, B, ...]``; the advantages are held constant."""
    return _reduce(-target_action_log_probs * pg_advantages.detach(), reduction)


def baseline_loss(advantages: torch.Tensor, reduction: Reduction = "sum") -> torch.Tensor:
    """``0.5 * (vs - values)^2`` reduced over ``[T, B, ...]``, given ``advantages = vs - values``."""
    return 0.5 * _reduce(advantages**2, reduction)


def entropy_loss(logits: torch.Tensor, reduction: Reduction = "sum") -> torch.Tensor:
    """Minus the entropy of the policy ``logits`` ``[T, B, ..., A]``, reduced; minimising it explores."""
    return -_reduce(entropy(logits), reduction)


def impala_loss(
    behaviour_logits: torch.Tensor,
    target_logits: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    done: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    *,
    discount: float = 0.99,
    reward_clip: float | None = 1.0,
    baseline_cost: float = 0.5,
    entropy_cost: float = 6e-4,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
    reduction: Reduction = "sum",
) -> ImpalaLoss:
    """The IMPALA loss of one batch of aligned trajectories.

    Args:
        behaviour_logits: ``[T, B, ..., A]``, the actors' logits (no gradient needed).
        target_logits: ``[T, B, ..., A]``, the learner's logits.
        actions: ``[T, B, ...]`` integer.
        rewards: ``[T, B, ...]``, clipped to ``[-reward_clip, reward_clip]`` here.
        done: ``[T, B, ...]`` bool, the episode ended after the action of step ``t``.
        values: ``[T, B, ...]``, the learner's baseline.
        bootstrap_value: ``[B, ...]``, the learner's baseline after the last step.
        discount: ``gamma`` in ``[0, 1]``.
        reward_clip: ``None`` for no clipping.
        baseline_cost, entropy_cost: the weights of those terms, ``>= 0``.
        clip_rho_threshold, clip_pg_rho_threshold, lambda_: V-trace's, see ``learners.vtrace``.
        reduction: ``"sum"`` (torchbeast) or ``"mean"`` (moolib) over time and batch.
    """
    check_float_tensor("values", values)
    if not isinstance(done, torch.Tensor) or done.dtype != torch.bool:
        raise TypeError(f"done must be a torch.bool tensor, got {describe(done)}")
    if done.shape != values.shape:
        raise ValueError(f"done must have the shape of values {tuple(values.shape)}, got {tuple(done.shape)}")
    check_threshold("reward_clip", reward_clip)
    check_number("discount", discount, 0, 1)
    check_number("baseline_cost", baseline_cost, 0)
    check_number("entropy_cost", entropy_cost, 0)
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")

    rewards = clip_rewards(rewards, reward_clip).to(values.dtype)  # [T, B, ...]
    discounts = (~done).to(values.dtype) * discount  # [T, B, ...]
    returns = vtrace.from_logits(
        behaviour_logits,
        target_logits,
        actions,
        discounts,
        rewards,
        values,
        bootstrap_value,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        lambda_=lambda_,
    )
    pg = policy_gradient_loss(returns.target_action_log_probs, returns.pg_advantages, reduction)
    baseline = baseline_loss(returns.vs - values, reduction)
    negative_entropy = entropy_loss(target_logits, reduction)
    total = pg + baseline_cost * baseline + entropy_cost * negative_entropy
    return ImpalaLoss(total, pg, baseline, negative_entropy)
