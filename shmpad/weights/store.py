"""The versioned weight store: one writer publishes whole state dicts, many readers pull them.

A reader never sees a torn mix of two versions, never waits for the writer, and is never
starved by it. The store keeps three copies of the parameters, each guarded by a seqlock
with a pin count. The writer fills a buffer that neither holds the latest version nor is
pinned, of those the one it wrote last (still in cache: two buffers alternate as in a
double buffer until a reader pins one), then publishes the new version and its buffer in
one word. A reader copies the
buffer that word names and checks the buffer's sequence number did not move while it
copied; after ``_COPIES_BEFORE_PIN`` such copies were thrown away it pins the buffer
(a compare-and-swap on the buffer's state) so the writer leaves it alone until the copy
is done.

The layout of the data area (control lines, then the three buffers), what each word holds and
why a dead writer never hangs a reader are in ``seqlock.py``, beside the kernels that
read and write those words.

The metadata that places each tensor in a buffer is in ``tensors.py``, with the
conversions of state dicts, arrays and tensors.

Why a slow reader is never starved: a copy is thrown away only when the writer refilled
its buffer meanwhile, which takes one more publish and the start of another (the writer
never fills the buffer LATEST names). A reader slower than that
pins its buffer after ``_COPIES_BEFORE_PIN`` overtaken attempts; the writer does not claim
a pinned buffer, so the pinned copy completes unless it outlasts ``_PIN_TIMEOUT`` while
the writer waits (below). ``statistics().pinned_pulls`` counts these pulls,
``statistics().retries`` the copies thrown away.

Why a dead reader never blocks the writer for long: the writer needs one unpinned buffer
besides the latest. Only when pins hold both does it wait, on a futex that unpinning
readers notify. A buffer pinned once, by a PINNER that is no longer alive, it claims at
once, breaking the pin (resetting PINS); after ``_PIN_TIMEOUT`` seconds it breaks the
pins of one buffer whoever holds them. A live reader whose pin was broken (its copy took
that long, or PINNER named a reader that had already unpinned) sees SEQ moved and copies
again (``statistics().publish_waits`` and ``.pins_broken`` count both sides).

One writer at a time is the caller's contract; it is not checked.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from shmpad._checks import check_int
from shmpad._checks import deadline as _deadline
from shmpad.errors import Closed, SegmentError, Timeout
from shmpad.shm.pids import pid_alive
from shmpad.shm.segment import PAGE, Segment, round_up
from shmpad.weights.seqlock import (
    _ALL_BUFFERS,
    _ALL_PINNED,
    _IS_CLOSED,
    _NOTHING_NEWER,
    _RETRY,
    BUFFERS,
    CONTROL_BYTES,
    _claim,
    _claim_or_sleep,
    _close_shared,
    _load_pulls,
    _load_version,
    _lone_pinner,
    _pin,
    _read_begin,
    _read_end,
    _unpin,
    _wait_newer,
    _write_end,
)
from shmpad.weights.tensors import (
    _as_mapping,
    _as_numpy,
    _names_hint,
    _placement,
    _template_tensors,
    _torch,
)

__all__ = ["WeightStore", "WeightStoreStatistics"]

KIND = "weights"

_COPIES_BEFORE_PIN = 2  # discarded copies after which a pull pins its buffer
_PIN_TIMEOUT = 1.0  # seconds a writer waits for pinned readers before it breaks a pin
_SLEEP_SLICE = 0.1  # seconds per futex sleep, so Ctrl+C and deadlines are noticed


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
    pinned_pulls: int
    """Pulls that pinned their buffer after the writer overtook them ``_COPIES_BEFORE_PIN``
    times (copies thrown away, or the latest buffer found being refilled)."""
    publish_waits: int
    """Publishes that waited because pinned readers held every buffer the writer could fill."""
    pins_broken: int
    """Reader pins this handle's publishes broke: pins of readers that died holding them,
    or pins held longer than ``_PIN_TIMEOUT`` seconds while the writer waited."""


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
            expected = _placement(tensors)
        except (KeyError, TypeError, ValueError) as e:
            raise SegmentError(f"weight store {segment.name!r} has unreadable metadata: {e!r}") from None
        if expected != {"buffer_bytes": buffer_bytes, "tensors": entries}:
            raise SegmentError(
                f"weight store {segment.name!r} is damaged: its metadata offsets do not match its tensors"
            )
        need = CONTROL_BYTES + BUFFERS * buffer_bytes
        if segment.data.nbytes != round_up(need, PAGE):
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
            for start in (CONTROL_BYTES + b * buffer_bytes for b in range(BUFFERS))
        ]
        self._torch_views: list[list[Any]] | None = None  # torch.from_numpy of _views, made on first use
        self._creator_pid = 0  # set by create: only that handle, in that process, closes the store for all
        self._publishes = 0
        self._pulls = 0
        self._retries = 0
        self._pinned_pulls = 0
        self._publish_waits = 0
        self._pins_broken = 0

    @classmethod
    def create(cls, template: Mapping[str, Any] | Any, name: str | None = None) -> "WeightStore":
        """A new store shaped like ``template`` (dict of arrays/tensors, or an nn.Module's
        state dict). Its values are not published; the store starts at version 0."""
        placement = _placement(_template_tensors(_as_mapping(template, "WeightStore.create")))
        segment = Segment.create(KIND, placement, CONTROL_BYTES + BUFFERS * placement["buffer_bytes"], name=name)
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
        """Tensor names, in placement order."""
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
        """Publish a complete new version of every tensor; returns its number. Waits only
        while pinned readers hold both buffers it could fill (see the module docstring), at
        most ``_PIN_TIMEOUT`` seconds. ``state`` must have exactly the store's names,
        shapes and dtypes."""
        self._segment()
        sources = self._checked(_as_mapping(state, "publish"))  # GPU -> CPU copies happen here, outside the window
        v, b, odd, _ = _claim(self._words, self._ctl, 0)
        if b == _ALL_PINNED:
            v, b, odd = self._claim_waiting()
        if b == _IS_CLOSED:
            self._close_local()
            raise Closed("the weight store was closed")
        for dst, src in zip(self._views[b], sources):
            np.copyto(dst, src)
        _write_end(self._words, self._ctl, v, b, odd)
        self._publishes += 1
        return int(v)

    def _claim_waiting(self) -> tuple[int, int, int]:
        """_claim's (version, buffer or code, odd SEQ) once a pin goes, or by breaking the
        pin of a dead reader, or any pin after _PIN_TIMEOUT seconds."""
        self._publish_waits += 1
        deadline = time.monotonic() + _PIN_TIMEOUT
        while True:
            left = deadline - time.monotonic()
            breakable = _ALL_BUFFERS if left <= 0 else self._dead_pins()
            if breakable:
                v, b, odd, broken = _claim(self._words, self._ctl, breakable)
                self._pins_broken += int(broken)
            else:
                v, b, odd, _ = _claim_or_sleep(self._words, self._ctl, int(min(left, _SLEEP_SLICE) * 1e9))
            if b != _ALL_PINNED:
                return v, b, odd

    def _dead_pins(self) -> int:
        """The mask of buffers pinned once, by a reader that is no longer alive."""
        mask = 0
        for b in range(BUFFERS):
            pid = _lone_pinner(self._words, self._ctl, b)
            if pid and not pid_alive(pid):
                mask |= 1 << b
        return mask

    def pull(self, dst: Mapping[str, Any] | Any, newer_than: int | None = None) -> int:
        """Copy the latest version into ``dst`` in place if it is newer than ``newer_than``
        (None, the default: the caller has no version yet, so any published one is newer).

        ``dst`` is a dict of writable numpy arrays or torch tensors (any device), or an
        nn.Module (its state dict), with exactly the store's names, shapes and dtypes;
        it is checked only when there is something to copy. Returns the latest version;
        when that is not newer than ``newer_than``, or is 0 (nothing published), nothing
        is copied. Never waits for the writer: a copy the writer overtook is retried, and
        after ``_COPIES_BEFORE_PIN`` such copies the pull pins its buffer (module docstring).
        """
        self._segment()
        newer_than = _version_arg(newer_than)
        v, b, s = _read_begin(self._words, self._ctl, newer_than)
        if b == _NOTHING_NEWER:
            return int(v)  # the cheap poll: one kernel call; ``dst`` is not even looked at
        targets = self._targets(dst)
        torch_views = self._torch_buffers() if any(is_torch for is_torch, _ in targets) else None
        for _ in range(_COPIES_BEFORE_PIN):
            if b == _NOTHING_NEWER:
                return int(v)
            if b == _IS_CLOSED:
                self._close_local()
                raise Closed("the weight store was closed")
            if b != _RETRY:
                self._copy(targets, torch_views, b)
                if _read_end(self._words, self._ctl, b, s):
                    self._pulls += 1
                    return int(v)
                self._retries += 1
            v, b, s = _read_begin(self._words, self._ctl, newer_than)
        return self._pull_pinned(targets, torch_views, newer_than)

    def _pull_pinned(
        self, targets: list[tuple[bool, Any]], torch_views: list[list[Any]] | None, newer_than: int
    ) -> int:
        """``pull``'s fallback: copy the latest buffer under a pin."""
        while True:
            v, b, s = _pin(self._words, self._ctl, newer_than, os.getpid())
            if b == _NOTHING_NEWER:
                return int(v)
            if b == _IS_CLOSED:
                self._close_local()
                raise Closed("the weight store was closed")
            if b == _RETRY:
                continue
            try:
                self._copy(targets, torch_views, b)
            finally:
                whole = _unpin(self._words, self._ctl, b, s)  # also when the copy raised
            if whole:
                self._pulls += 1
                self._pinned_pulls += 1
                return int(v)
            self._retries += 1

    def _copy(self, targets: list[tuple[bool, Any]], torch_views: list[list[Any]] | None, b: int) -> None:
        """Copy buffer ``b`` into ``targets`` (``_targets``'s list)."""
        if torch_views is None:
            for (_, t), src in zip(targets, self._views[b]):
                np.copyto(t, src)
            return
        with _torch().no_grad():
            for (is_torch, t), src, tsrc in zip(targets, self._views[b], torch_views[b]):
                if is_torch:
                    t.copy_(tsrc)
                else:
                    np.copyto(t, src)

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
        return WeightStoreStatistics(
            publishes=self._publishes,
            pulls=self._pulls,
            retries=self._retries,
            pinned_pulls=self._pinned_pulls,
            publish_waits=self._publish_waits,
            pins_broken=self._pins_broken,
        )

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
        self._views = [[] for _ in range(BUFFERS)]
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
        """The sources of a publish as numpy arrays in placement order, validated."""
        self._check_names(state)
        sources = []
        for name in self._names:
            arr = _as_numpy(name, state[name])
            self._check_one(name, arr.shape, arr.dtype)
            sources.append(arr)
        return sources

    def _targets(self, dst: Mapping[str, Any] | Any) -> list[tuple[bool, Any]]:
        """The destinations of a pull in placement order, validated, as (True, tensor) for
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
