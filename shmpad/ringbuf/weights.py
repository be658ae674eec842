"""The versioned weight store: one writer publishes whole state dicts, many readers pull them.

A reader never sees a torn mix of two versions and never blocks the writer: the
store keeps two copies of the parameters and guards each with a seqlock. The writer
always fills the buffer that does *not* hold the latest version, then publishes the
new version number; a reader copies the buffer the latest version names and checks
the buffer's sequence word did not move while it copied.

Data area of a ``"weights"`` segment (byte offsets from the start of the page-aligned
data area; every control line is 64 bytes)::

    offset     size  written by           contents
    0          8     writer (release)     VERSION: latest complete version; 0 = none yet;
                                          the buffer holding it is VERSION % 2
    64         8     creator (release)    CLOSED: 1 once the creator closed the store
    72         8     readers (atomic add) PULLS: pulls by every handle that copied a version out
                                          (what ``python -m shmpad.top`` shows; one add per pull)
    128        16    writer, waiters      event (seq, sleepers) for wait_for_version (wait.py)
    192        16    writer               buffer 0: SEQ (odd while being written), HELD
                                          (the version it holds, written inside the SEQ window)
    256        16    writer               buffer 1: SEQ, HELD
    320        B     writer               buffer 0: every tensor in metadata order, each at a
                                          64-byte aligned offset inside the buffer
    320 + B    B     writer               buffer 1: the same layout

SEQ and HELD share a line: they have the one writer and readers read them together.

Metadata (segment JSON): ``{"buffer_bytes": B, "tensors": [{"name", "dtype" (numpy
dtype string, e.g. "<f4"), "shape", "offset" (inside a buffer), "nbytes"}, ...]}``.
``attach`` recomputes the offsets from names, dtypes and shapes and checks them and
the segment size against the metadata.

Why a dead writer never hangs a reader: the writer only ever writes the buffer the
current VERSION does not name, so killing it mid-copy leaves VERSION pointing at a
complete buffer. A reader whose buffer's SEQ is odd or moved re-reads VERSION, which
then names the other, complete buffer; it retries only while the writer keeps
completing publishes. (A reader copies while the writer fills the other buffer, so
it is starved only by a writer that publishes twice in the time one pull copies;
``statistics().retries`` counts the copies thrown away.) A new writer may take over
from a dead one: it skips past the odd SEQ the dead writer left.

One writer at a time is the caller's contract; it is not checked.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from numba import njit

from shmpad._checks import check_int
from shmpad._checks import deadline as _deadline
from shmpad.errors import Closed, SegmentError, Timeout
from shmpad.ringbuf.atomics import (
    cpu_pause,
    fence_acquire,
    fence_release,
    fetch_add,
    load_acquire,
    load_relaxed,
    store_relaxed,
    store_release,
)
from shmpad.ringbuf.segment import CACHE_LINE, PAGE, Segment
from shmpad.ringbuf.wait import finish_wait, notify, notify_always, prepare_wait, sleep

__all__ = ["WeightStore", "WeightStoreStatistics"]

KIND = "weights"

# Byte offsets of the control lines in the data area.
_VERSION = 0
_CLOSED = 64
# In CLOSED's line, which changes once: a reader's add per completed pull (a whole copy of the
# parameters) costs the others at most one cache miss on their next CLOSED load.
_PULLS = 72
_EVENT = 128
_BUFFER_LINES = (192, 256)
CONTROL_BYTES = 320

# Kernel return codes in the place of a buffer index (0 and 1 are buffers).
_NOTHING_NEWER = -1
_RETRY = -2
_IS_CLOSED = -3

_SPINS = 2000
_SLEEP_SLICE = 0.1  # seconds per futex sleep, so Ctrl+C and deadlines are noticed
_NUMERIC_KINDS = "biufc"


@njit(nogil=True, cache=True)
def _read_begin(words, ctl, newer_than):
    """Returns (version, buffer or code, seq). ``ctl`` is the word index of the data area."""
    if load_relaxed(words, ctl + _CLOSED // 8) != 0:
        return 0, _IS_CLOSED, 0
    v = load_acquire(words, ctl + _VERSION // 8)  # pairs with store_release(VERSION) in _write_end
    if v <= newer_than or v == 0:
        return v, _NOTHING_NEWER, 0
    b = v & 1
    line = ctl + (_BUFFER_LINES[1] if b else _BUFFER_LINES[0]) // 8
    s = load_acquire(words, line)  # pairs with store_release(SEQ even) in _write_end
    if s & 1:
        return v, _RETRY, 0  # the writer has moved on twice and is refilling this buffer
    held = load_relaxed(words, line + 1)  # validated by the SEQ re-check in _read_end
    return held, b, s


@njit(nogil=True, cache=True)
def _read_end(words, ctl, b, s):
    """True when buffer ``b`` was not written since its SEQ read ``s`` (and the pull is counted)."""
    fence_acquire()  # pairs with fence_release in _write_begin: our copy's loads happen before the re-check
    line = ctl + (_BUFFER_LINES[1] if b else _BUFFER_LINES[0]) // 8
    whole = load_relaxed(words, line) == s
    if whole:
        fetch_add(words, ctl + _PULLS // 8, 1)
    return whole


@njit(nogil=True, cache=True)
def _write_begin(words, ctl):
    """Marks the buffer for the next version odd; returns (next version, buffer or code, odd SEQ)."""
    if load_acquire(words, ctl + _CLOSED // 8) != 0:  # pairs with store_release(CLOSED) in _close_shared
        return 0, _IS_CLOSED, 0
    v = load_relaxed(words, ctl + _VERSION // 8) + 1  # the writer reads its own word
    b = v & 1
    line = ctl + (_BUFFER_LINES[1] if b else _BUFFER_LINES[0]) // 8
    s = load_relaxed(words, line)
    # An odd SEQ is left by a writer that died (or raised) mid-copy; stay odd but move on.
    odd = s + 2 if s & 1 else s + 1
    store_relaxed(words, line, odd)
    fence_release()  # pairs with fence_acquire in _read_end: odd SEQ is visible before any payload store
    return v, b, odd


@njit(nogil=True, cache=True)
def _write_end(words, ctl, v, b, odd):
    line = ctl + (_BUFFER_LINES[1] if b else _BUFFER_LINES[0]) // 8
    store_relaxed(words, line + 1, v)  # HELD, inside the SEQ window
    store_release(words, line, odd + 1)  # pairs with load_acquire(SEQ) in _read_begin: payload and HELD first
    store_release(words, ctl + _VERSION // 8, v)  # pairs with load_acquire(VERSION) in _read_begin, _wait_newer
    notify(words, ctl + _EVENT // 8)


@njit(nogil=True, cache=True)
def _wait_newer(words, ctl, newer_than, timeout_ns):
    """The version once it exceeds ``newer_than``, _IS_CLOSED, or _RETRY after one sleep."""
    for _ in range(_SPINS):
        if load_relaxed(words, ctl + _CLOSED // 8) != 0:
            return _IS_CLOSED
        v = load_acquire(words, ctl + _VERSION // 8)  # pairs with store_release(VERSION) in _write_end
        if v > newer_than:
            return v
        cpu_pause()
    ev = ctl + _EVENT // 8
    seq = prepare_wait(words, ev)
    v = load_acquire(words, ctl + _VERSION // 8)  # pairs with store_release(VERSION) in _write_end
    closed = load_acquire(words, ctl + _CLOSED // 8)  # pairs with store_release(CLOSED) in _close_shared
    if v <= newer_than and closed == 0:
        sleep(words, ev, seq, timeout_ns)
    finish_wait(words, ev)
    if closed != 0:
        return _IS_CLOSED
    return v if v > newer_than else _RETRY


@njit(nogil=True, cache=True)
def _load_version(words, ctl):
    return load_acquire(words, ctl + _VERSION // 8)  # pairs with store_release(VERSION) in _write_end


@njit(nogil=True, cache=True)
def _load_pulls(words, ctl):
    return load_relaxed(words, ctl + _PULLS // 8)  # a count for display: no ordering needed


@njit(nogil=True, cache=True)
def _close_shared(words, ctl):
    store_release(words, ctl + _CLOSED // 8, 1)  # pairs with the CLOSED loads in readers and waiters
    notify_always(words, ctl + _EVENT // 8)


_MAX_VERSION = (1 << 63) - 1


def _version_arg(newer_than: Any) -> int:
    """``newer_than`` as the kernels take it: None (no version yet) is -1."""
    if newer_than is None:
        return -1
    if type(newer_than) is int and -_MAX_VERSION <= newer_than < _MAX_VERSION:
        return newer_than  # the common case costs two comparisons
    return check_int("newer_than", newer_than, -_MAX_VERSION, _MAX_VERSION - 1)


@dataclass(frozen=True)
class WeightStoreStatistics:
    """Counters of one handle (one process's view of the store)."""

    publishes: int
    """Versions this handle published."""
    pulls: int
    """Pulls that copied a version out (pulls that found nothing newer are not counted)."""
    retries: int
    """Copies thrown away because the writer refilled the buffer meanwhile (torn reads avoided)."""


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


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


def _layout(tensors: list[tuple[str, np.dtype, tuple[int, ...]]]) -> dict[str, Any]:
    """The metadata placing each (name, dtype, shape) in a buffer, 64-byte aligned."""
    if not tensors:
        raise ValueError("a weight store needs at least one tensor, got an empty template")
    entries = []
    offset = 0
    for name, dtype, shape in tensors:
        nbytes = dtype.itemsize * math.prod(shape)
        entries.append({"name": name, "dtype": dtype.str, "shape": list(shape), "offset": offset, "nbytes": nbytes})
        offset = _round_up(offset + nbytes, CACHE_LINE)
    return {"buffer_bytes": max(offset, CACHE_LINE), "tensors": entries}


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


class WeightStore:
    """A versioned store of named fixed-shape arrays in shared memory.

    One writer at a time calls ``publish``; any number of readers in any processes
    call ``pull``. Versions count publishes from 1; version 0 means nothing was
    published yet. Pickles by name: unpickling attaches to the same store.
    """

    def __init__(self, segment: Segment):
        """Use ``create`` or ``attach``."""
        try:
            buffer_bytes = int(segment.meta["buffer_bytes"])
            entries = segment.meta["tensors"]
            tensors = [(t["name"], np.dtype(t["dtype"]), tuple(t["shape"])) for t in entries]
            if len({name for name, _, _ in tensors}) != len(tensors) or any(d < 0 for _, _, sh in tensors for d in sh):
                raise ValueError("duplicate names or negative dimensions")
            expected = _layout(tensors)
        except (KeyError, TypeError, ValueError) as e:
            raise SegmentError(f"weight store {segment.name!r} has unreadable metadata: {e!r}") from None
        if expected != {"buffer_bytes": buffer_bytes, "tensors": entries}:
            raise SegmentError(
                f"weight store {segment.name!r} is damaged: its metadata offsets do not match its tensors"
            )
        need = CONTROL_BYTES + 2 * buffer_bytes
        if segment.data.nbytes != _round_up(need, PAGE):
            raise SegmentError(
                f"weight store {segment.name!r} is damaged: its metadata needs {need} data bytes, "
                f"the segment has {segment.data.nbytes}"
            )
        self._seg: Segment | None = segment
        self._words = segment.words
        self._ctl = segment.data_offset // 8
        self._names = tuple(name for name, _, _ in tensors)
        self._index = {n: i for i, n in enumerate(self._names)}
        self._shapes = {name: shape for name, _, shape in tensors}
        self._dtypes = {name: dtype for name, dtype, _ in tensors}
        # [buffer][tensor] -> numpy view of that tensor's bytes in the buffer
        self._views = [
            [
                segment.data[start + t["offset"] : start + t["offset"] + t["nbytes"]]
                .view(self._dtypes[t["name"]])
                .reshape(self._shapes[t["name"]])
                for t in entries
            ]
            for start in (CONTROL_BYTES, CONTROL_BYTES + buffer_bytes)
        ]
        self._torch_views: list[list[Any]] | None = None  # torch.from_numpy of _views, made on first use
        self._creator_pid = 0  # set by create: only that handle, in that process, closes the store for all
        self._publishes = 0
        self._pulls = 0
        self._retries = 0

    @classmethod
    def create(cls, template: Mapping[str, Any] | Any, name: str | None = None) -> "WeightStore":
        """A new store shaped like ``template`` (dict of arrays/tensors, or an nn.Module's
        state dict). Its values are not published; the store starts at version 0."""
        layout = _layout(_template_tensors(_as_mapping(template, "WeightStore.create")))
        segment = Segment.create(KIND, layout, CONTROL_BYTES + 2 * layout["buffer_bytes"], name=name)
        try:
            store = cls(segment)
        except BaseException:
            segment.unlink()
            raise
        store._creator_pid = os.getpid()
        return store

    @classmethod
    def attach(cls, name: str) -> "WeightStore":
        """Map the store created elsewhere under ``name``."""
        return cls(Segment.attach(name, KIND))

    @property
    def name(self) -> str:
        """The shared-memory name; ``WeightStore.attach(name)`` maps the same store."""
        return self._segment().name

    @property
    def names(self) -> tuple[str, ...]:
        """Tensor names, in layout order."""
        return self._names

    @property
    def spec(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """Tensor name -> (numpy dtype, shape), in the order ``TypedRing.spec`` uses."""
        return {n: (self._dtypes[n], self._shapes[n]) for n in self._names}

    @property
    def version(self) -> int:
        """The latest published version (0 if none)."""
        self._segment()
        return int(_load_version(self._words, self._ctl))

    def publish(self, state: Mapping[str, Any] | Any) -> int:
        """Publish a complete new version of every tensor; returns its number. Never
        waits for readers. ``state`` must have exactly the store's names, shapes and dtypes."""
        self._segment()
        sources = self._checked(_as_mapping(state, "publish"))  # GPU -> CPU copies happen here, outside the window
        v, b, odd = _write_begin(self._words, self._ctl)
        if b == _IS_CLOSED:
            self._close_local()
            raise Closed("the weight store was closed")
        for dst, src in zip(self._views[b], sources):
            np.copyto(dst, src)
        _write_end(self._words, self._ctl, v, b, odd)
        self._publishes += 1
        return int(v)

    def pull(self, dst: Mapping[str, Any] | Any, newer_than: int | None = None) -> int:
        """Copy the latest version into ``dst`` in place if it is newer than ``newer_than``
        (None, the default: the caller has no version yet, so any published one is newer).

        ``dst`` is a dict of writable numpy arrays or torch tensors (any device), or an
        nn.Module (its state dict), with exactly the store's names, shapes and dtypes;
        it is checked only when there is something to copy. Returns the latest version;
        when that is not newer than ``newer_than``, or is 0 (nothing published), nothing
        is copied. Never waits for the writer: a copy the writer overtook is retried.
        """
        self._segment()
        newer_than = _version_arg(newer_than)
        v, b, s = _read_begin(self._words, self._ctl, newer_than)
        if b == _NOTHING_NEWER:
            return int(v)  # the cheap poll: one kernel call; ``dst`` is not even looked at
        targets = self._targets(dst)
        torch_views = self._torch_buffers() if any(is_torch for is_torch, _ in targets) else None
        while b != _NOTHING_NEWER:
            if b == _IS_CLOSED:
                self._close_local()
                raise Closed("the weight store was closed")
            if b != _RETRY:
                if torch_views is None:
                    for (_, t), src in zip(targets, self._views[b]):
                        np.copyto(t, src)
                else:
                    with _torch().no_grad():
                        for (is_torch, t), src, tsrc in zip(targets, self._views[b], torch_views[b]):
                            if is_torch:
                                t.copy_(tsrc)
                            else:
                                np.copyto(t, src)
                if _read_end(self._words, self._ctl, b, s):
                    self._pulls += 1
                    return int(v)
            self._retries += 1
            v, b, s = _read_begin(self._words, self._ctl, newer_than)
        return int(v)

    def pull_arrays(self, newer_than: int | None = None) -> tuple[int, dict[str, np.ndarray] | None]:
        """``(version, fresh numpy copies)``, or ``(version, None)`` when nothing newer
        than ``newer_than`` (None: no version yet) was published."""
        newer_than = _version_arg(newer_than)
        arrays = {n: np.empty(self._shapes[n], self._dtypes[n]) for n in self._names}
        v = self.pull(arrays, newer_than)
        return v, (arrays if v > newer_than and v > 0 else None)

    def wait_for_version(self, newer_than: int | None = None, timeout: float | None = None) -> int:
        """Block (spin briefly, then sleep on a futex) until a version newer than
        ``newer_than`` (None: no version yet) and than 0 is published; returns it. Raises
        ``Timeout`` after ``timeout`` seconds and ``Closed`` if the store is closed. It has
        no ``_nowait`` twin because ``version`` and ``pull`` already never wait."""
        self._segment()
        newer_than = max(_version_arg(newer_than), 0)
        deadline = _deadline(timeout)
        while True:
            left = _SLEEP_SLICE if deadline is None else min(_SLEEP_SLICE, max(deadline - time.monotonic(), 0.0))
            r = _wait_newer(self._words, self._ctl, newer_than, int(left * 1e9))
            if r >= 0:
                return int(r)
            if r == _IS_CLOSED:
                self._close_local()
                raise Closed("the weight store was closed")
            if deadline is not None and time.monotonic() >= deadline:
                raise Timeout(f"no version newer than {newer_than} was published within {timeout} s")

    @property
    def pulls_by_all(self) -> int:
        """Pulls that copied a version out, by every handle in every process since the
        store was created (``statistics().pulls`` counts this handle's)."""
        self._segment()
        return int(_load_pulls(self._words, self._ctl))

    def statistics(self) -> WeightStoreStatistics:
        """This handle's counters."""
        return WeightStoreStatistics(publishes=self._publishes, pulls=self._pulls, retries=self._retries)

    def close(self) -> None:
        """Make this handle unusable. On the handle ``create`` returned, in the process
        that called it, this also closes the store for every process (their calls raise
        ``Closed``, waiters wake) and removes its name. Idempotent."""
        seg = self._seg
        if seg is None:
            return
        if self._creator_pid == os.getpid():
            _close_shared(self._words, self._ctl)
            seg.unlink()
        self._close_local()

    def __enter__(self) -> "WeightStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self):
        return (WeightStore.attach, (self._segment().name,))

    def __repr__(self) -> str:
        if self._seg is None:
            return "WeightStore(closed)"
        return f"WeightStore({self._seg.name!r}, tensors={len(self._names)}, version={self.version})"

    def _segment(self) -> Segment:
        if self._seg is None:
            raise Closed("the weight store was closed")
        return self._seg

    def _close_local(self) -> None:
        self._seg = None
        self._views = [[], []]
        self._torch_views = None

    def _check_names(self, given: Mapping[str, Any]) -> None:
        for key in given:
            if key not in self._index:
                raise ValueError(f"unknown tensor {key!r}: this weight store holds {_names_hint(self._names)}")
        if len(given) != len(self._names):
            missing = [n for n in self._names if n not in given]
            raise ValueError(
                f"missing tensor {missing[0]!r}: every tensor of the store is needed ({len(missing)} missing)"
            )

    def _check_one(self, name: str, shape: tuple[int, ...], dtype: Any) -> None:
        if shape != self._shapes[name]:
            raise ValueError(f"tensor {name!r} has shape {shape}, expected {self._shapes[name]}")
        if dtype != self._dtypes[name]:
            raise TypeError(f"tensor {name!r} has dtype {dtype}, expected {self._dtypes[name]}")

    def _checked(self, state: Mapping[str, Any]) -> list[np.ndarray]:
        """The sources of a publish as numpy arrays in layout order, validated."""
        self._check_names(state)
        sources = []
        for name in self._names:
            arr = _as_numpy(name, state[name])
            self._check_one(name, arr.shape, arr.dtype)
            sources.append(arr)
        return sources

    def _targets(self, dst: Mapping[str, Any] | Any) -> list[tuple[bool, Any]]:
        """The destinations of a pull in layout order, validated, as (True, tensor) for
        tensors off the CPU and (False, numpy array) for the rest: a CPU tensor is
        written through its numpy alias (one memcpy, no torch threads in forked actors)."""
        given = _as_mapping(dst, "pull")
        self._check_names(given)
        torch = _torch()
        targets = []
        for name in self._names:
            t = given[name]
            if torch is not None and isinstance(t, torch.Tensor):
                if tuple(t.shape) != self._shapes[name]:
                    raise ValueError(f"tensor {name!r} has shape {tuple(t.shape)}, expected {self._shapes[name]}")
                expected = self._torch_buffers()[0][self._index[name]].dtype
                if t.dtype != expected:
                    raise TypeError(f"tensor {name!r} has dtype {t.dtype}, expected {expected}")
                if t.device.type == "cpu":
                    targets.append((False, t.detach().numpy()))
                else:
                    targets.append((True, t))
            elif isinstance(t, np.ndarray):
                self._check_one(name, t.shape, t.dtype)
                if not t.flags.writeable:
                    raise ValueError(f"tensor {name!r} of the pull destination is read-only")
                targets.append((False, t))
            else:
                raise TypeError(f"tensor {name!r} must be a numpy array or a torch tensor, got {type(t).__name__}")
        return targets

    def _torch_buffers(self) -> list[list[Any]]:
        if self._torch_views is None:
            torch = _torch()
            self._torch_views = [[torch.from_numpy(v) for v in views] for views in self._views]
        return self._torch_views
