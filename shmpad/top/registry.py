"""A launched program's registry: what ``python -m shmpad.top`` reads to show it live.

The launcher creates one ``"registry"`` segment per program, named
``/shmpad.<launcher pid>.registry.<n>`` so that a reader on the host finds every running
program by listing ``/dev/shm`` (and a test's leak check knows whose it is). Like every segment, the launcher unlinks it when the
program has ended and the janitor does after a SIGKILL of the launcher.

Metadata (segment JSON, written once at launch)::

    {"program": name, "launcher_pid": pid, "launch_type": "local_mp", "started": unix time,
     "nodes": [{"label", "index"}, ...],             # one row each, in this order
     "rings": [{"label", "segment", "kind"}, ...],   # kind: "typed", "mpmc" or "spsc"
     "weights": [{"label", "segment"}, ...],
     "rpc": [{"label", "segment", "stats"}, ...],    # the courier's request ring (an MPMC ring)
                                                     # and its call statistics (shmpad.rpc.stats)
     "counters": capacity}

Data area (8-byte words; every row and entry a 64-byte line)::

    offset        written by          contents
    0             launcher            PHASE: 0 running, 1 stopping, 2 ended
    64 * (1+i)    launcher            node row i: PID (0 until forked), STATE (0 pending,
                                      1 running, 2 ended), EXIT (exit code once ended;
                                      negative: killed by that signal), STARTED and
                                      ENDED (unix time in ns)
                  the node            word 5: RESTARTS (children a colocation node restarted)
    64 * (1+N+j)  the publisher       counter entry j: OWNER (0 free, -1 being claimed,
                                      else the publishing pid), ROW (node row, -1 for the
                                      launcher), VALUE (float64 bits), NAME (32 bytes UTF-8,
                                      NUL-padded)

Every word is one writer's: a node row's words the launcher's (RESTARTS the node's
own), a counter entry's the process that claimed it with a compare-and-swap of OWNER.
Each is stored whole with one atomic store, so a reader sees an old or a new value,
never a torn one; OWNER is published last (release), so a reader that sees a pid sees
the entry's name. Readers only load: reading a program costs it nothing.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

import numpy as np
from numba import njit

from shmpad import context
from shmpad.errors import SegmentError
from shmpad.shm.atomics import cas, fetch_add, load_acquire, store_release
from shmpad.shm.segment import PREFIX, SHM_DIR, Segment

__all__ = ["Registry", "publish_counter", "counters", "running_programs", "TAG"]

KIND = "registry"
TAG = "registry"
COUNTERS = 256
NAME_BYTES = 32
_LINE = 8  # words per line

PHASE_RUNNING, PHASE_STOPPING, PHASE_ENDED = 0, 1, 2
PHASES = {PHASE_RUNNING: "running", PHASE_STOPPING: "stopping", PHASE_ENDED: "ended"}
PENDING, RUNNING, ENDED = 0, 1, 2
STATES = {PENDING: "pending", RUNNING: "running", ENDED: "ended"}
_PID, _STATE, _EXIT, _STARTED, _ENDED, _RESTARTS = range(6)
_OWNER, _ROW, _VALUE, _NAME = 0, 1, 2, 3
_CLAIMING = -1

_counter = itertools.count()


@njit(nogil=True, cache=True)
def _load(words, at):
    return load_acquire(words, at)  # pairs with store_release in _store


@njit(nogil=True, cache=True)
def _store(words, at, value):
    store_release(words, at, value)  # pairs with load_acquire in _load: what was written before is seen


@njit(nogil=True, cache=True)
def _claim(words, at):
    return cas(words, at, 0, _CLAIMING) == 0  # acq_rel: one claimant wins a free entry


@njit(nogil=True, cache=True)
def _add(words, at, value):
    fetch_add(words, at, value)


def _float_bits(value: float) -> int:
    return int(np.float64(value).view(np.int64))


class Registry:
    """One program's registry segment: ``create`` in the launcher, ``attach`` in a reader."""

    def __init__(self, segment: Segment):
        self._seg = segment
        self.meta = segment.meta
        try:
            self.nodes = [(str(n["label"]), int(n["index"])) for n in segment.meta["nodes"]]
            self.capacity = int(segment.meta["counters"])
        except (KeyError, TypeError, ValueError) as e:
            raise SegmentError(f"registry {segment.name!r} has unreadable metadata: {e!r}") from None
        need = (1 + len(self.nodes) + self.capacity) * _LINE * 8
        if segment.data.nbytes < need:
            raise SegmentError(
                f"registry {segment.name!r} is damaged: {len(self.nodes)} nodes and {self.capacity} counters "
                f"need {need} data bytes, the segment has {segment.data.nbytes}"
            )
        self._words = segment.data[:need].view(np.int64)
        self._rows = {name: i for i, name in enumerate(self.nodes)}
        self._mine: dict[tuple[int, str], int] = {}  # (row, name) -> entry, in the process that claimed it
        self._mine_pid = os.getpid()
        self._claiming = threading.Lock()  # threads of one process claim a name once

    @classmethod
    def create(
        cls,
        program: str,
        launch_type: str,
        nodes: list[tuple[str, int]],
        rings: list[dict[str, str]],
        weights: list[dict[str, str]],
        rpc: list[dict[str, str]],
    ) -> "Registry":
        meta = {
            "program": program,
            "launcher_pid": os.getpid(),
            "launch_type": launch_type,
            "started": time.time(),
            "nodes": [{"label": label, "index": index} for label, index in nodes],
            "rings": rings,
            "weights": weights,
            "rpc": rpc,
            "counters": COUNTERS,
        }
        name = f"/{PREFIX}{os.getpid()}.{TAG}.{next(_counter)}"
        return cls(Segment.create(KIND, meta, (1 + len(nodes) + COUNTERS) * _LINE * 8, name=name))

    @classmethod
    def attach(cls, name: str) -> "Registry":
        return cls(Segment.attach(name, KIND))

    @property
    def name(self) -> str:
        return self._seg.name

    def close(self) -> None:
        """Unmap (and, in the launcher, remove the name)."""
        self._words = None
        self._seg.close()

    # -- the launcher writes ----------------------------------------------------------------

    def set_phase(self, phase: int) -> None:
        _store(self._words, 0, phase)

    def node_started(self, row: int, pid: int) -> None:
        at = (1 + row) * _LINE
        _store(self._words, at + _PID, pid)
        _store(self._words, at + _STARTED, time.time_ns())
        _store(self._words, at + _STATE, RUNNING)

    def node_ended(self, row: int, exit_code: int) -> None:
        at = (1 + row) * _LINE
        _store(self._words, at + _EXIT, exit_code)
        _store(self._words, at + _ENDED, time.time_ns())
        _store(self._words, at + _STATE, ENDED)

    # -- a node writes ----------------------------------------------------------------------

    def row_of(self, label: str, index: int) -> int:
        """The row of node ``label/index``, or -1 (the launcher, or a node it does not list)."""
        return self._rows.get((label, index), -1)

    def node_restarted(self, row: int) -> None:
        if row >= 0:
            _add(self._words, (1 + row) * _LINE + _RESTARTS, 1)

    def publish(self, row: int, name: str, value: float) -> None:
        """Set counter ``name`` of node ``row`` to ``value`` (claiming an entry the first time).
        Once the launcher has closed the registry (the program ended; a thread node may
        still run) there is nowhere to publish, and nothing is."""
        words = self._words  # (its view keeps the mapping alive should close() run meanwhile)
        if words is None:
            return
        if self._mine_pid != os.getpid():  # a forked child claims entries of its own
            self._mine, self._mine_pid, self._claiming = {}, os.getpid(), threading.Lock()
        entry = self._mine.get((row, name))
        if entry is None:
            with self._claiming:
                entry = self._mine.get((row, name)) or self._claim_entry(words, row, name)
        _store(words, entry + _VALUE, _float_bits(value))

    def _claim_entry(self, words: np.ndarray, row: int, name: str) -> int:
        raw = name.encode("utf-8")
        first = (1 + len(self.nodes)) * _LINE
        for j in range(self.capacity):
            at = first + j * _LINE
            if _claim(words, at + _OWNER):
                words[at + _NAME : at + _NAME + NAME_BYTES // 8] = 0
                words[at + _NAME : at + _NAME + NAME_BYTES // 8].view(np.uint8)[: len(raw)] = np.frombuffer(
                    raw, np.uint8
                )
                _store(words, at + _ROW, row)
                _store(words, at + _VALUE, _float_bits(0.0))
                _store(words, at + _OWNER, os.getpid())  # last: the entry is whole now
                self._mine[(row, name)] = at
                return at
        raise RuntimeError(
            f"the program's {self.capacity} counters are all taken: cannot publish {name!r} "
            "(publish fewer distinct names)"
        )

    # -- a reader reads ---------------------------------------------------------------------

    def phase(self) -> str:
        return PHASES.get(int(_load(self._words, 0)), "unknown")

    def node_rows(self) -> list[dict[str, Any]]:
        rows = []
        for i, (label, index) in enumerate(self.nodes):
            at = (1 + i) * _LINE
            state = int(_load(self._words, at + _STATE))
            ended = state == ENDED
            rows.append(
                {
                    "name": f"{label}/{index}",
                    "label": label,
                    "index": index,
                    "pid": int(_load(self._words, at + _PID)) or None,
                    "state": STATES.get(state, "unknown"),
                    "exit_code": int(_load(self._words, at + _EXIT)) if ended else None,
                    "restarts": int(_load(self._words, at + _RESTARTS)),
                    "started": int(_load(self._words, at + _STARTED)) / 1e9 or None,
                    "ended": int(_load(self._words, at + _ENDED)) / 1e9 if ended else None,
                }
            )
        return rows

    def counter_entries(self) -> list[dict[str, Any]]:
        """Every published counter: ``{"node", "pid", "name", "value"}`` (node None: the launcher)."""
        out = []
        first = (1 + len(self.nodes)) * _LINE
        for j in range(self.capacity):
            at = first + j * _LINE
            owner = int(_load(self._words, at + _OWNER))
            if owner in (0, _CLAIMING):
                continue
            row = int(_load(self._words, at + _ROW))
            raw = self._words[at + _NAME : at + _NAME + NAME_BYTES // 8].tobytes().rstrip(b"\0")
            value = float(np.int64(_load(self._words, at + _VALUE)).view(np.float64))
            node = f"{self.nodes[row][0]}/{self.nodes[row][1]}" if 0 <= row < len(self.nodes) else None
            out.append({"node": node, "pid": owner, "name": raw.decode("utf-8", "replace"), "value": value})
        return out


def running_programs() -> list[str]:
    """The names of the registry segments on this host (programs launched and not yet ended)."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    return sorted("/" + n for n in names if n.startswith(PREFIX) and n.split(".")[2:3] == [TAG])


def _here() -> tuple[Registry, int]:
    ctx = context.current("publish_counter")
    registry = ctx.extra.get("registry")
    if registry is None:
        raise RuntimeError(
            f"program {ctx.program!r} has no registry to publish counters in (it was launched before this "
            "process could make one)"
        )
    return registry, registry.row_of(ctx.label, ctx.index) if ctx.label else -1


def publish_counter(name: str, value: float) -> None:
    """Publish ``value`` as this node's counter ``name`` (at most 32 UTF-8 bytes), for
    ``python -m shmpad.top`` to show with its change per second. Call it from a node of a
    launched program (or from the launching process) as often as you like: after the
    first call for a name it is one atomic store."""
    if not isinstance(name, str):
        raise TypeError(f"a counter name must be a str, got {type(name).__name__}")
    if not 0 < len(name.encode("utf-8")) <= NAME_BYTES:
        raise ValueError(f"a counter name is 1 to {NAME_BYTES} UTF-8 bytes, got {name!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"counter {name!r} takes a number, got {type(value).__name__}")
    registry, row = _here()
    registry.publish(row, name, float(value))


def counters() -> dict[str, dict[str, float]]:
    """The counters every node of this program published: ``{"label/i": {name: value}}``
    (the launcher's own under ``""``)."""
    registry, _ = _here()
    out: dict[str, dict[str, float]] = {}
    for entry in registry.counter_entries():
        out.setdefault(entry["node"] or "", {})[entry["name"]] = entry["value"]
    return out
