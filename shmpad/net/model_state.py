"""What a state sync hands from a group's leader to every member: the model (parameters and
buffers), the optimiser's and scheduler's state and the version, as bytes a joiner loads, and
an 8-byte digest of the model the members compare (``shmpad.net.accumulator``)."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import torch

__all__ = ["digest", "dump_state", "load_state"]


def digest(model: torch.nn.Module) -> int:
    """A signed 64-bit hash of every tensor of ``model``'s state dict, bit for bit."""
    h = hashlib.blake2b(digest_size=8)
    for t in model.state_dict().values():
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return int.from_bytes(h.digest(), "little", signed=True)


def dump_state(version: int, model: torch.nn.Module, optimizer: Any = None, scheduler: Any = None) -> bytes:
    """The model, optimiser and scheduler state and ``version``, as ``torch.save`` bytes."""
    state = {"version": version, "model": model.state_dict()}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def load_state(data: bytes, model: torch.nn.Module, optimizer: Any = None, scheduler: Any = None) -> int:
    """Load what ``dump_state`` made into ``model`` (and the optimiser and scheduler
    given); returns its version."""
    # weights_only: tensors and plain containers only, even from an authenticated peer
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    with torch.no_grad():
        model.load_state_dict(state["model"])
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and "scheduler" in state:
        scheduler.load_state_dict(state["scheduler"])
    return int(state["version"])
