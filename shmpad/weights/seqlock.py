"""The compiled side of the weight store (``store.py``): the layout of its control lines and
the kernels that read and write them, each a few atomic operations on the segment's words.

Data area of a ``"weights"`` segment (byte offsets from the start of the page-aligned
data area; every control line is 64 bytes)::

    offset     size  written by           contents
    0          8     writer (release)     LATEST: 4 * latest complete version + the buffer
                                          holding it; 0 = nothing published yet
    64         8     creator (release)    CLOSED: 1 once the creator closed the store
    72         8     readers (atomic add) PULLS: pulls by every handle that copied a version out
                                          (what ``python -m shmpad.top`` shows; one add per pull)
    128        16    writer, waiters      event (seq, sleepers) for wait_for_version (shm/wait.py)
    192        16    readers, writer      event for a writer waiting for a pin to go (shm/wait.py)
    256        24    writer, readers      buffer 0: STATE = SEQ << 20 | PINS (SEQ odd while
                                          being written; PINS: readers copying under a pin),
                                          HELD (the version it holds, written inside the SEQ
                                          window), PINNER (pid of the reader that pinned it last)
    320        24    writer, readers      buffer 1: STATE, HELD, PINNER
    384        24    writer, readers      buffer 2: STATE, HELD, PINNER
    448        B     writer               buffer 0: every tensor in metadata order, each at a
                                          64-byte aligned offset inside the buffer
    448 + B    B     writer               buffer 1: the same layout
    448 + 2B   B     writer               buffer 2: the same layout

SEQ and PINS share a word so that the writer's claim of a buffer (PINS == 0, SEQ made odd)
and a reader's pin (SEQ even, PINS + 1) are single compare-and-swaps that exclude each
other; HELD and PINNER share their line because readers read and write them together.

Why a dead writer never hangs a reader: the writer only ever writes a buffer LATEST does
not name, so killing it mid-copy leaves LATEST naming a complete buffer. A reader whose
buffer's SEQ is odd or moved re-reads LATEST, which then names a complete buffer; a pin
is taken only on an even SEQ, and never waits. A new writer may take over from a dead
one: it skips past the odd SEQ the dead writer left.

The retry and pin policy (how often a pull retries before it pins, how long a publish waits
for pins) is ``WeightStore``'s, in ``store.py``.
"""

from __future__ import annotations

from numba import njit

from shmpad.shm.atomics import (
    cas,
    cpu_pause,
    fence_acquire,
    fence_release,
    fetch_add,
    load_acquire,
    load_relaxed,
    store_relaxed,
    store_release,
)
from shmpad.shm.segment import CACHE_LINE
from shmpad.shm.wait import finish_wait, notify, notify_always, prepare_wait, sleep

# Byte offsets of the control lines in the data area.
_LATEST = 0
_CLOSED = 64
# In CLOSED's line, which changes once: a reader's add per completed pull (a whole copy of the
# parameters) costs the others at most one cache miss on their next CLOSED load.
_PULLS = 72
_EVENT = 128
_PIN_EVENT = 192
_BUFFER_LINES = 256  # buffer b's line is at _BUFFER_LINES + 64 * b
BUFFERS = 3
CONTROL_BYTES = _BUFFER_LINES + BUFFERS * CACHE_LINE

_PIN_BITS = 20  # STATE = SEQ << _PIN_BITS | PINS
_PINS = (1 << _PIN_BITS) - 1
_HELD, _PINNER = 1, 2  # words of a buffer's line after STATE
_ALL_BUFFERS = (1 << BUFFERS) - 1  # a mask of the buffers whose pins _claim may break

# Kernel return codes in the place of a buffer index (0, 1 and 2 are buffers).
_NOTHING_NEWER = -1
_RETRY = -2
_IS_CLOSED = -3
_ALL_PINNED = -4

_SPINS = 2000


@njit(nogil=True, cache=True)
def _line(ctl, b):
    """The word index of buffer ``b``'s STATE (HELD is the next word)."""
    return ctl + (_BUFFER_LINES + CACHE_LINE * b) // 8


@njit(nogil=True, cache=True)
def _latest(words, ctl, newer_than):
    """(latest version, the buffer holding it), or (version, _NOTHING_NEWER) when it is not
    newer than ``newer_than`` or is 0, or (0, _IS_CLOSED): the start of _read_begin and _pin."""
    if load_relaxed(words, ctl + _CLOSED // 8) != 0:
        return 0, _IS_CLOSED
    latest = load_acquire(words, ctl + _LATEST // 8)  # pairs with store_release(LATEST) in _write_end
    v = latest >> 2
    if v <= newer_than or v == 0:
        return v, _NOTHING_NEWER
    return v, latest & 3


@njit(nogil=True, cache=True)
def _read_begin(words, ctl, newer_than):
    """Returns (version, buffer or code, SEQ). ``ctl`` is the word index of the data area."""
    v, b = _latest(words, ctl, newer_than)
    if b < 0:
        return v, b, 0
    line = _line(ctl, b)
    s = load_acquire(words, line) >> _PIN_BITS  # pairs with store_release(STATE) in _write_end
    if s & 1:
        return v, _RETRY, 0  # the writer has moved on twice and is refilling this buffer
    held = load_relaxed(words, line + _HELD)  # validated by the SEQ re-check in _read_end
    return held, b, s


@njit(nogil=True, cache=True)
def _read_end(words, ctl, b, s):
    """True when buffer ``b`` was not written since its SEQ read ``s`` (and the pull is counted)."""
    fence_acquire()  # pairs with fence_release in _claim: our copy's loads happen before the re-check
    whole = load_relaxed(words, _line(ctl, b)) >> _PIN_BITS == s
    if whole:
        fetch_add(words, ctl + _PULLS // 8, 1)
    return whole


@njit(nogil=True, cache=True)
def _pin(words, ctl, newer_than, pid):
    """Like _read_begin, with the buffer pinned by ``pid``: the writer will not claim it until
    _unpin (unless ``pid`` dies or the pin outlasts weights._PIN_TIMEOUT)."""
    v = 0
    for _ in range(_SPINS):
        v, b = _latest(words, ctl, newer_than)
        if b < 0:
            return v, b, 0
        line = _line(ctl, b)
        state = load_relaxed(words, line)  # validated by the cas
        if (state >> _PIN_BITS) & 1 == 0 and state & _PINS != _PINS:
            # acquire pairs with store_release(STATE) in _write_end (payload and HELD visible);
            # a claim in _claim after this cas sees PINS > 0 and leaves the buffer alone
            if cas(words, line, state, state + 1) == state:
                store_relaxed(words, line + _PINNER, pid)
                return load_relaxed(words, line + _HELD), b, state >> _PIN_BITS
        cpu_pause()
    return v, _RETRY, 0  # the writer or other readers kept changing the word: try again


@njit(nogil=True, cache=True)
def _unpin(words, ctl, b, s):
    """Drops the pin _pin took at SEQ ``s``; True when the copy made under it is whole
    (False: the writer broke the pin, reset PINS and may have written meanwhile)."""
    fence_acquire()  # pairs with fence_release in _claim: our copy's loads happen before the check
    line = _line(ctl, b)
    while True:  # a failed cas means another reader pinned or unpinned: it made progress
        state = load_relaxed(words, line)  # validated by the cas
        if state >> _PIN_BITS != s:
            return False
        # release: our copy's loads stay before it; pairs with the cas in _claim
        if cas(words, line, state, state - 1) == state:
            notify(words, ctl + _PIN_EVENT // 8)  # a writer may wait in _claim_or_sleep
            fetch_add(words, ctl + _PULLS // 8, 1)
            return True


@njit(nogil=True, cache=True)
def _lone_pinner(words, ctl, b):
    """PINNER of buffer ``b`` if exactly one reader holds a pin on it, else 0."""
    line = _line(ctl, b)
    return load_relaxed(words, line + _PINNER) if load_relaxed(words, line) & _PINS == 1 else 0


@njit(nogil=True, cache=True)
def _claim(words, ctl, breakable):
    """Makes the SEQ of a buffer for the next version odd; returns (next version, buffer or
    code, odd SEQ, pins broken). Prefers an unpinned buffer, then breaks the pins of one
    in the mask ``breakable`` (bit b: buffer b)."""
    if load_acquire(words, ctl + _CLOSED // 8) != 0:  # pairs with store_release(CLOSED) in _close_shared
        return 0, _IS_CLOSED, 0, 0
    latest = load_relaxed(words, ctl + _LATEST // 8)  # the writer reads its own word
    v = (latest >> 2) + 1
    # The spare buffer written last first: it is the one most likely still in cache.
    first = ((latest & 3) + 1) % BUFFERS
    second = ((latest & 3) + 2) % BUFFERS
    if load_relaxed(words, _line(ctl, second) + _HELD) > load_relaxed(words, _line(ctl, first) + _HELD):
        first, second = second, first
    for forcing in range(2 if breakable else 1):
        for k in range(2):
            b = first if k == 0 else second
            line = _line(ctl, b)
            state = load_relaxed(words, line)  # validated by the cas
            if state & _PINS == 0 or (forcing and (breakable >> b) & 1):
                seq = state >> _PIN_BITS
                # An odd SEQ is left by a writer that died (or raised) mid-copy; stay odd but move on.
                odd = seq + 2 if seq & 1 else seq + 1
                # acq_rel; pairs with the cas in _pin and _unpin: a pin taken before it fails it,
                # the copies of readers that unpinned before it happen before our payload stores
                if cas(words, line, state, odd << _PIN_BITS) == state:
                    fence_release()  # pairs with fence_acquire in _read_end, _unpin: odd SEQ before payload
                    return v, b, odd, state & _PINS
    return v, _ALL_PINNED, 0, 0


@njit(nogil=True, cache=True)
def _claim_or_sleep(words, ctl, timeout_ns):
    """_claim without force, or _ALL_PINNED after sleeping until a reader unpins or ``timeout_ns``."""
    ev = ctl + _PIN_EVENT // 8
    seq = prepare_wait(words, ev)
    r = _claim(words, ctl, 0)
    if r[1] == _ALL_PINNED:
        sleep(words, ev, seq, timeout_ns)
    finish_wait(words, ev)
    return r


@njit(nogil=True, cache=True)
def _write_end(words, ctl, v, b, odd):
    line = _line(ctl, b)
    store_relaxed(words, line + _HELD, v)  # inside the SEQ window
    # No reader changes STATE while SEQ is odd (_pin needs it even, _unpin its old SEQ), so a store suffices.
    store_release(words, line, (odd + 1) << _PIN_BITS)  # pairs with the STATE loads in _read_begin, _pin
    store_release(words, ctl + _LATEST // 8, v << 2 | b)  # pairs with load_acquire(LATEST) in readers, waiters
    notify(words, ctl + _EVENT // 8)


@njit(nogil=True, cache=True)
def _wait_newer(words, ctl, newer_than, timeout_ns):
    """The version once it exceeds ``newer_than``, _IS_CLOSED, or _RETRY after one sleep."""
    for _ in range(_SPINS):
        if load_relaxed(words, ctl + _CLOSED // 8) != 0:
            return _IS_CLOSED
        v = load_acquire(words, ctl + _LATEST // 8) >> 2  # pairs with store_release(LATEST) in _write_end
        if v > newer_than:
            return v
        cpu_pause()
    ev = ctl + _EVENT // 8
    seq = prepare_wait(words, ev)
    v = load_acquire(words, ctl + _LATEST // 8) >> 2  # pairs with store_release(LATEST) in _write_end
    closed = load_acquire(words, ctl + _CLOSED // 8)  # pairs with store_release(CLOSED) in _close_shared
    if v <= newer_than and closed == 0:
        sleep(words, ev, seq, timeout_ns)
    finish_wait(words, ev)
    if closed != 0:
        return _IS_CLOSED
    return v if v > newer_than else _RETRY


@njit(nogil=True, cache=True)
def _load_version(words, ctl):
    return load_acquire(words, ctl + _LATEST // 8) >> 2  # pairs with store_release(LATEST) in _write_end


@njit(nogil=True, cache=True)
def _load_pulls(words, ctl):
    return load_relaxed(words, ctl + _PULLS // 8)  # a count for display: no ordering needed


@njit(nogil=True, cache=True)
def _close_shared(words, ctl):
    store_release(words, ctl + _CLOSED // 8, 1)  # pairs with the CLOSED loads in readers and waiters
    notify_always(words, ctl + _EVENT // 8)
    notify_always(words, ctl + _PIN_EVENT // 8)  # a publish waiting for pins
