"""What a ring kind (``spsc.py``, ``mpmc.py``) and ``ring.ByteRing`` share: the words of
the control block, the codes the kernels return, and the kernels a kind provides.

The data area of a ring segment starts with these 64-byte lines (word = 8 bytes;
indices below are word indices from the start of the data area)::

    line  words   written by   contents
    0     0-7     producers    HEAD (SPSC: messages published; MPMC: enqueue position),
                               PUTS, BYTES_PUT, WAITS_FULL, TAIL_SEEN (SPSC: the producer's
                               cached copy of TAIL)
    1     8-15    consumers    TAIL (SPSC: messages released; MPMC: dequeue position),
                               READ (SPSC: read cursor), READER (SPSC: pid owning READ),
                               GETS, BYTES_GOT, WAITS_EMPTY, HEAD_SEEN (SPSC: the
                               consumer's cached copy of HEAD), DELIVERED (SPSC: messages
                               handed out as copies, freed or not)
    2     16-23   both         event NOT_EMPTY: seq, sleepers (see ``shmpad/shm/wait.py``)
    3     24-31   both         event NOT_FULL: seq, sleepers
    4     32-39   any          CLOSED, DEAD_CLAIMS
    5     40-47   creator      CAPACITY, SLOT_SIZE (bytes; 0 for typed rings), STRIDE (bytes
                               between slots), SLOT_WORDS (word index of the per-slot words),
                               SLOTS (byte offset of slot 0 from the data area)
    6..   ...                  per-slot words, then slot payloads (see spsc.py and mpmc.py)

Each line has one writer side, so a producer's stores never invalidate the line a
consumer writes (rigtorp/SPSCQueue). MPMC rings leave PUTS, BYTES_PUT, GETS and
BYTES_GOT at 0 and count in their slot lines instead (see mpmc.py). Per-slot words and payloads are laid out by the
ring kind.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np
from numba import njit

from shmpad.shm.memcopy import copy_bytes

WORDS_PER_LINE = 8

HEAD = 0
PUTS = 1
BYTES_PUT = 2
WAITS_FULL = 3
TAIL_SEEN = 4

TAIL = 8
READ = 9
READER = 10
GETS = 11
BYTES_GOT = 12
WAITS_EMPTY = 13
HEAD_SEEN = 14
DELIVERED = 15

EV_NOT_EMPTY = 16
EV_NOT_FULL = 24

CLOSED = 32
DEAD_CLAIMS = 33

CAPACITY = 40
SLOT_SIZE = 41
STRIDE = 42
SLOT_WORDS = 43
SLOTS = 44

CONTROL_WORDS = 48

# Return codes of the kernels (non-negative values are results).
EMPTY = -1
FULL = -1
CLOSED_CODE = -2
TOO_BIG = -3
IN_PROGRESS = -4
RESERVATION_OPEN = -5


class Kernels(NamedTuple):
    """The compiled operations a ring kind provides (see each kind's module). Kernels take
    the control words (``ctl``, the data area as int64) and the pid of the calling
    process, and return a result >= 0 or one of the codes above."""

    put: Callable
    put_rows: Callable
    put_packed: Callable
    reserve: Callable
    commit: Callable
    peek: Callable
    peek_many: Callable
    take_into: Callable
    release: Callable
    watch_write: Callable
    watch_read: Callable
    holder: Callable

    @classmethod
    def of(cls, namespace: dict[str, Any]) -> Kernels:
        """A kind's kernels: the functions ``_put``, ``_put_rows``... its module defines."""
        return cls(**{field: namespace["_" + field] for field in cls._fields})


# inline: numba compiles it into each kind's _take_into with that kind's kernels as
# direct calls; a call taking kernels as arguments would make the caller uncacheable
@njit(inline="always")
def take_into_with(ctl, out, pid, peek, release):
    """A kind's ``take_into`` from its ``peek`` and ``release`` kernels: take the next
    message, copy it into ``out`` and free its slot; its length, or a code."""
    r = peek(ctl, pid)
    if r < 0:
        return r
    i = r >> 32
    n = r & 0xFFFFFFFF
    copy_bytes(out, 0, ctl.view(np.uint8), ctl[SLOTS] + i * ctl[STRIDE], n)
    release(ctl, i, 1)
    return n
