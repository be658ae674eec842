"""The learner modules' tensor checks (the generic ones, numbers and thresholds, are
``shmpad._checks``'); messages name the argument, what was seen and what is allowed."""

from __future__ import annotations

import torch

__all__ = ["check_float_tensor", "check_int_tensor", "describe"]


def describe(value: object) -> str:
    """``a torch.float32 tensor`` for tensors, the type name otherwise."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor"
    return type(value).__name__


def check_float_tensor(name: str, value: object) -> torch.Tensor:
    """``value`` if it is a floating point tensor, else ``TypeError``."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        raise TypeError(f"{name} must be a floating point tensor, got {describe(value)}")
    return value


def check_int_tensor(name: str, value: object) -> torch.Tensor:
    """``value`` if it is an integer (not bool) tensor, else ``TypeError``."""
    if (
        not isinstance(value, torch.Tensor)
        or value.is_floating_point()
        or value.is_complex()
        or value.dtype == torch.bool
    ):
        raise TypeError(f"{name} must be an integer tensor, got {describe(value)}")
    return value
