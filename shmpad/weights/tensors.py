"""The tensors of a weight store (``store.py``): where each sits in a buffer, and the
state dicts, arrays and tensors the store takes and gives, as numpy.

Metadata (segment JSON): ``{"buffer_bytes": B, "tensors": [{"name", "dtype" (numpy
dtype string, e.g. "<f4"), "shape", "offset" (inside a buffer), "nbytes"}, ...]}``.
``attach`` recomputes the offsets from names, dtypes and shapes and checks them and
the segment size against the metadata.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Mapping

import numpy as np

from shmpad.shm.arrays import place
from shmpad.shm.segment import CACHE_LINE

_NUMERIC_KINDS = "biufc"


def _torch():
    # A tensor cannot exist before torch is imported, so shmpad never imports torch itself.
    return sys.modules.get("torch")


def _as_mapping(tensors: Any, what: str) -> Mapping[str, Any]:
    torch = _torch()
    if torch is not None and isinstance(tensors, torch.nn.Module):
        return tensors.state_dict()
    if isinstance(tensors, Mapping):
        return tensors
    raise TypeError(
        f"{what} takes a dict of numpy arrays or torch tensors, or a torch nn.Module, got {type(tensors).__name__}"
    )


def _as_numpy(name: str, value: Any) -> np.ndarray:
    """A numpy view (or CPU copy) of an array or tensor, for reading."""
    if isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value)
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        try:
            return value.detach().cpu().numpy()
        except TypeError:
            raise TypeError(
                f"tensor {name!r} has dtype {value.dtype}, which numpy cannot hold; cast it (e.g. to torch.float32)"
            ) from None
    raise TypeError(f"tensor {name!r} must be a numpy array or a torch tensor, got {type(value).__name__}")


def _names_hint(names: tuple[str, ...]) -> str:
    shown = ", ".join(repr(n) for n in names[:8])
    return shown + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def _placement(tensors: list[tuple[str, np.dtype, tuple[int, ...]]]) -> dict[str, Any]:
    """The metadata placing each (name, dtype, shape) in a buffer, 64-byte aligned."""
    if not tensors:
        raise ValueError("a weight store needs at least one tensor, got an empty template")
    sizes = [(name, dtype.itemsize * math.prod(shape)) for name, dtype, shape in tensors]
    offsets, end = place(sizes)
    entries = [
        {"name": name, "dtype": dtype.str, "shape": list(shape), "offset": offsets[name], "nbytes": nbytes}
        for (name, dtype, shape), (_, nbytes) in zip(tensors, sizes)
    ]
    return {"buffer_bytes": max(end, CACHE_LINE), "tensors": entries}


def _template_tensors(template: Mapping[str, Any]) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    tensors = []
    for name, value in template.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {name!r} ({type(name).__name__})")
        arr = _as_numpy(name, value)
        if arr.dtype.kind not in _NUMERIC_KINDS:
            raise TypeError(f"tensor {name!r} has dtype {arr.dtype}; allowed: bool, integer, float and complex dtypes")
        tensors.append((name, arr.dtype, arr.shape))
    return tensors
