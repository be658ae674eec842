"""Log-probabilities and entropy of categorical policies given by logits.

Logits carry the actions in their last dimension; every leading dimension
(``[T, B]``, ``[T, B, N]``, ...) is a batch dimension.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from learners._checks import check_float_tensor, check_int_tensor

__all__ = ["action_log_probs", "entropy"]


def action_log_probs(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``log pi(actions)`` under the softmax of ``logits``.

    Args:
        logits: ``[..., A]`` floating point, unnormalised log-probabilities.
        actions: ``[...]`` integer, each in ``[0, A)``; torch's ``gather`` raises on
            an out-of-range action.

    Returns:
        ``[...]``, differentiable with respect to ``logits``.
    """
    _check_logits(logits)
    check_int_tensor("actions", actions)
    if actions.shape != logits.shape[:-1]:
        raise ValueError(
            f"actions must have the shape of logits without its last dimension, {tuple(logits.shape[:-1])}, got {tuple(actions.shape)}"
        )
    log_probs = F.log_softmax(logits, dim=-1)  # [..., A]
    return log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)  # [...]


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy ``-sum_a pi(a) log pi(a)`` of the softmax of ``logits`` ``[..., A]``; returns ``[...]``.

    Logits of ``-inf`` (masked actions) contribute zero, not NaN.
    """
    _check_logits(logits)
    log_probs = F.log_softmax(logits, dim=-1)  # [..., A]
    # 0 * -inf is NaN; clamping to the most negative finite value makes it 0 (as torch.distributions does).
    log_probs = log_probs.clamp(min=torch.finfo(log_probs.dtype).min)
    return -(log_probs.exp() * log_probs).sum(-1)  # [...]


def _check_logits(logits: torch.Tensor) -> None:
    check_float_tensor("logits", logits)
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(
            f"logits must have at least one action in their last dimension, got shape {tuple(logits.shape)}"
        )
