"""Checkpoints of a replay table: a ``Snapshot`` (its configuration, every ready item and
the counters) written to one ``.npz``, and read back.

A checkpoint holds ``config`` (the table's name, spec, max_size, selectors, rate limiter
and max_times_sampled, as JSON), ``keys``, ``times`` and ``priorities`` of the ready items
in insertion order, ``counters`` (inserts, samples, deletes, the next key) and one
``field:<name>`` array ``[items, *shape]`` per field. ``Table`` takes the snapshot under
its index lock, so it holds whole items only; it is written to a temporary file that is
renamed into place, so a reader never finds half of one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

__all__ = ["CONFIG_KEYS", "Snapshot", "read", "write"]

CONFIG_KEYS = ("name", "spec", "max_size", "sampler", "remover", "rate_limiter", "max_times_sampled")
"""the entries of a table's segment metadata a checkpoint keeps"""


@dataclass(frozen=True)
class Snapshot:
    """A table's configuration and its ready items, in insertion order."""

    config: dict  # CONFIG_KEYS -> the segment metadata's value (JSON)
    keys: np.ndarray  # [items] int64
    times: np.ndarray  # [items] int64: how often each was sampled
    priorities: np.ndarray  # [items] float64
    counters: np.ndarray  # [4] int64: inserts, samples, deletes, the next key
    fields: dict[str, np.ndarray]  # field -> [items, *shape]


def write(snapshot: Snapshot, path: str | os.PathLike) -> str:
    """Write ``snapshot`` to ``path`` (whole, then renamed into place); the path."""
    path = os.fspath(path)
    arrays = {
        "keys": snapshot.keys,
        "times": snapshot.times,
        "priorities": snapshot.priorities,
        "counters": snapshot.counters,
    }
    for f, a in snapshot.fields.items():
        arrays["field:" + f] = a
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        np.savez(fh, config=np.array(json.dumps(snapshot.config)), **arrays)
    os.replace(tmp, path)
    return path


def read(path: str | os.PathLike) -> Snapshot:
    """The snapshot in the checkpoint at ``path``."""
    with np.load(os.fspath(path), allow_pickle=False) as z:
        fields = {name[len("field:") :]: z[name] for name in z.files if name.startswith("field:")}
        return Snapshot(json.loads(str(z["config"])), z["keys"], z["times"], z["priorities"], z["counters"], fields)
