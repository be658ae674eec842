"""The versioned weight store: one writer publishes whole state dicts, many readers pull
them, never torn (``store``: the handle and its retry and pin policy; ``seqlock``: the
control lines and the compiled seqlock-with-pins kernels; ``tensors``: where each tensor
sits in a buffer, and the state dicts, arrays and tensors it takes and gives)."""

from shmpad.weights.store import WeightStore
from shmpad.weights.store import WeightStoreStatistics

__all__ = [
    "WeightStore",
    "WeightStoreStatistics",
]
