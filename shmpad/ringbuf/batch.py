"""``MessageBatch``: the messages one ``get_many`` call took, viewed in place."""

from __future__ import annotations

from typing import Iterator

import numpy as np

__all__ = ["MessageBatch"]


class MessageBatch:
    """Messages taken by one ``get_many`` call, in consecutive slots, without a copy.

    ``rows`` is a read-only ``[k, stride]`` uint8 view of the slots and
    ``lengths[j]`` the length of message ``j``; ``batch[j]`` is a read-only
    memoryview of message ``j``. Valid until the ring's ``release()``.
    """

    __slots__ = ("rows", "lengths")

    def __init__(self, rows: np.ndarray, lengths: np.ndarray):
        self.rows = rows
        self.lengths = lengths

    def __len__(self) -> int:
        return self.rows.shape[0]

    def __getitem__(self, j: int) -> memoryview:
        return self.rows[j, : self.lengths[j]].data

    def __iter__(self) -> Iterator[memoryview]:
        for row, n in zip(self.rows, self.lengths.tolist()):
            yield row[:n].data

    def to_bytes(self) -> list[bytes]:
        """Copies of the messages, valid after ``release()``."""
        return [bytes(m) for m in self]
