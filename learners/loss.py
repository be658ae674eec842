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

APPO (``appo_loss``) reuses each batch for several gradient steps, as PPO does (Schulman
et al. 2017, eq. 7 and 9), on V-trace's targets as Sample Factory's APPO does:

    policy   = -sum_t min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t),  r_t = pi(a_t|x_t) / pi_prox(a_t|x_t)
    baseline = 0.5 * sum_t max((v_t - V(x_t))^2, (v_t - V_clip(x_t))^2),
               V_clip = V_old + clamp(V - V_old, -value_clip, value_clip)

``A_t`` is V-trace's ``pg_advantage`` (normalised to mean 0 and standard deviation 1 over
the minibatch when asked), ``v_t`` V-trace's ``vs``, both computed once per batch with the
learner's weights before the batch's first step (``pi_prox``, ``V_old``). The ratio is
taken against that proximal policy, not the actors' behaviour policy: V-trace's clipped
``rho`` already corrects for the actors' lag, so the ratio starts at 1 on every batch
however stale the actors were, and the clip bounds only what this batch's own steps
move the policy (Hilton et al. 2021, "Batch size-invariance for policy optimization",
call this decoupling the proximal from the behaviour policy).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from learners import vtrace
from learners._checks import check_float_tensor, describe
from learners.categorical import action_log_probs, entropy
from shmpad._checks import check_number, check_threshold

__all__ = [
    "ImpalaLoss",
    "appo_loss",
    "baseline_loss",
    "clip_rewards",
    "clipped_baseline_loss",
    "clipped_policy_loss",
    "entropy_loss",
    "impala_loss",
    "normalize_advantages",
    "policy_gradient_loss",
]

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


def clipped_policy_loss(
    log_ratio: torch.Tensor, advantages: torch.Tensor, clip: float, reduction: Reduction = "mean"
) -> torch.Tensor:
    """PPO's clipped surrogate, ``-min(r A, clip(r, 1 - clip, 1 + clip) A)`` with ``r = exp(log_ratio)``,
    reduced over ``[T, B, ...]``; the advantages are held constant."""
    check_number("clip", clip, 0)
    advantages = advantages.detach()
    ratio = log_ratio.exp()
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1.0 - clip, 1.0 + clip) * advantages)
    return -_reduce(surrogate, reduction)


def clipped_baseline_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    targets: torch.Tensor,
    clip: float | None,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    """``0.5 * max((targets - values)^2, (targets - clipped)^2)`` reduced, where ``clipped`` moves
    from ``old_values`` by at most ``clip``; for ``clip=None`` the plain ``baseline_loss``."""
    check_threshold("clip", clip)
    targets = targets.detach()
    if clip is None:
        return baseline_loss(targets - values, reduction)
    old_values = old_values.detach()
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * _reduce(torch.maximum((targets - values) ** 2, (targets - clipped) ** 2), reduction)


def normalize_advantages(advantages: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``advantages`` shifted and scaled to mean 0 and standard deviation 1 over all their elements."""
    return (advantages - advantages.mean()) / (advantages.std(unbiased=False) + eps)


def appo_loss(
    target_logits: torch.Tensor,
    proximal_log_probs: torch.Tensor,
    actions: torch.Tensor,
    advantages: torch.Tensor,
    values: torch.Tensor,
    old_values: torch.Tensor,
    vs: torch.Tensor,
    *,
    clip: float = 0.1,
    value_clip: float | None = None,
    baseline_cost: float = 0.5,
    entropy_cost: float = 0.01,
    normalize: bool = True,
    reduction: Reduction = "mean",
    log_probs: torch.Tensor | None = None,
) -> ImpalaLoss:
    """The APPO loss of one minibatch (see the module's docstring), as ``ImpalaLoss`` terms.

    Args:
        target_logits: ``[T, B, ..., A]``, the learner's logits now.
        proximal_log_probs: ``[T, B, ...]``, ``log pi_prox(a_t|x_t)``: the learner's before this batch's first step.
        actions: ``[T, B, ...]`` integer.
        advantages: ``[T, B, ...]``, V-trace's ``pg_advantages`` (constants).
        values: ``[T, B, ...]``, the learner's baseline now.
        old_values: ``[T, B, ...]``, the baseline before this batch's first step (for ``value_clip``).
        vs: ``[T, B, ...]``, V-trace's value targets (constants).
        clip: PPO's ``epsilon``, ``>= 0``.
        value_clip: how far the baseline may move from ``old_values`` before its loss stops
            pulling it further (``None``: no clipping).
        baseline_cost, entropy_cost: the weights of those terms, ``>= 0``.
        normalize: normalise the advantages over the minibatch first.
        reduction: ``"mean"`` or ``"sum"`` over time and batch.
        log_probs: ``[T, B, ...]``, ``log pi(a_t|x_t)`` of ``target_logits``, for a caller
            that has them already (the learner reports the log-ratio too); None: computed here.
    """
    check_float_tensor("values", values)
    check_number("baseline_cost", baseline_cost, 0)
    check_number("entropy_cost", entropy_cost, 0)
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    for name, x in (("proximal_log_probs", proximal_log_probs), ("advantages", advantages), ("vs", vs)):
        check_float_tensor(name, x)
        if x.shape != values.shape:
            raise ValueError(f"{name} must have the shape of values {tuple(values.shape)}, got {tuple(x.shape)}")
    if log_probs is None:
        log_probs = action_log_probs(target_logits, actions)  # [T, B, ...]
    elif log_probs.shape != values.shape:
        raise ValueError(f"log_probs must have the shape of values {tuple(values.shape)}, got {tuple(log_probs.shape)}")
    advantages = normalize_advantages(advantages) if normalize else advantages
    pg = clipped_policy_loss(log_probs - proximal_log_probs.detach(), advantages, clip, reduction)
    baseline = clipped_baseline_loss(values, old_values, vs, value_clip, reduction)
    negative_entropy = entropy_loss(target_logits, reduction)
    total = pg + baseline_cost * baseline + entropy_cost * negative_entropy
    return ImpalaLoss(total, pg, baseline, negative_entropy)
