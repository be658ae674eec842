"""What every subject of ``python -m bench.replay`` stores and how it is driven: the item kinds
(``KINDS``, ``CAPACITY``), the batch size, and the interface: ``Subject(kind, prioritized)``
built in the parent before any fork, then ``insert(item)``, ``sample()`` (one batch of
``BATCH``) and ``close()``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BATCH", "CAPACITY", "KINDS", "make_item"]

KINDS = {
    "atari": {
        "obs": (np.uint8, (4, 84, 84)),
        "action": (np.int64, ()),
        "reward": (np.float32, ()),
        "done": (np.float32, ()),
    },
    "vec64": {"x": (np.float32, (64,))},
}
CAPACITY = {"atari": 4096, "vec64": 65536}
BATCH = 32


def make_item(spec: dict) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {f: (rng.random(s) * 200).astype(d) for f, (d, s) in spec.items()}
