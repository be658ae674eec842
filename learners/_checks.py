"""Argument checks shared by the learner modules; messages name the argument, what was seen and what is allowed."""

from __future__ import annotations

import torch

__all__ = ["check_float_tensor", "check_int_tensor", "check_number", "check_threshold", "describe"]


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


def check_number(name: str, value: float, low: float, high: float | None = None) -> None:
    """``value`` is a number in ``[low, high]`` (``high=None``: no upper bound)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if high is None and not value >= low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if high is not None and not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


def check_threshold(name: str, value: float | None) -> None:
    """A clipping threshold is ``None`` (no clipping) or a positive number."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number or None, got {type(value).__name__}")
    if not value > 0:
        raise ValueError(f"{name} must be > 0 or None, got {value}")
