"""Progress of the weight store under pressure: slow readers against a writer that never
pauses (and dies and is replaced now and then) each complete their pulls, every copy
whole; readers that die holding a pin delay the writer a bounded time, never forever."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from helpers import FORK, Forked, child_log, wait_until

from shmpad.errors import Closed
from shmpad.weights import seqlock
from shmpad.weights import store as store_module
from shmpad.weights.store import WeightStore

TIMEOUT = 60.0
STALL = 20.0  # seconds a reader may go without completing a pull before the test calls it starved

# Every array of a version is filled with the version number (a torn copy shows two values).
# About 34 MB, so that a reader's copy spans several scheduler slices even on a busy box.
BIG = {
    "conv.weight": ((2048, 2048), np.float32),
    "fc.weight": ((1024, 2048), np.float32),  # float32: versions stay exact up to 2**24
    "counts": ((640, 2048), np.int64),
    "fc.bias": ((1024,), np.float64),
    "step": ((), np.int32),
}
KILLS = 3


def _big(value: int = 0) -> dict[str, np.ndarray]:
    return {k: np.full(shape, value, dtype) for k, (shape, dtype) in BIG.items()}


def _slow_destination() -> dict[str, np.ndarray]:
    """Destinations in the other memory order: each copy writes across cache lines and costs
    several publishes (the writer refills every buffer while one reader copies)."""
    return {k: np.full(shape[::-1], -1, dtype).T for k, (shape, dtype) in BIG.items()}


def _values(arrays: dict[str, np.ndarray]) -> set[int]:
    """The distinct values across all arrays (one value = one whole version)."""
    seen: set[int] = set()
    for a in arrays.values():
        seen.update({int(a.min()), int(a.max())})
    return seen


def _publish_forever(store: WeightStore) -> None:
    arrays = _big()
    while True:
        v = store.version + 1
        for a in arrays.values():
            a.fill(v)
        got = store.publish(arrays)
        if got != v:
            raise AssertionError(f"publish returned version {got}, expected {v}")


def _slow_reader(store: WeightStore, pulls: int) -> tuple[int, list[str], dict[str, int]]:
    dst = _slow_destination()
    last = done = 0
    problems = []
    while done < pulls:
        store.wait_for_version(last, timeout=TIMEOUT)
        v = store.pull(dst, newer_than=last)
        if v <= last:
            problems.append(f"pull after wait_for_version({last}) returned {v}")
            continue
        if _values(dst) != {v}:
            problems.append(f"pull returned {v} and saw values {sorted(_values(dst))[:5]}")
        last = v
        done += 1
        child_log(f"pull {done}: version {v}")
    stats = store.statistics()
    return done, problems, {"pulls": stats.pulls, "retries": stats.retries, "pinned_pulls": stats.pinned_pulls}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_slow_readers_each_complete_their_pulls_while_the_writer_publishes_and_dies():
    readers_n, pulls = 4, 12
    with WeightStore.create(_big()) as store:
        store.pull(_big())  # compile the kernels once, before forking
        readers: list[Forked] = []
        writers: list[Forked] = []
        try:
            readers = [Forked(_slow_reader, store, pulls, name=f"reader/{i}") for i in range(readers_n)]
            writers.append(Forked(_publish_forever, store, name="writer/0"))
            # SIGKILL the writer at arbitrary moments (mostly mid-copy: it never pauses) and
            # replace it; the last one publishes until the readers are done or one stalls.
            while len(writers) <= KILLS:
                store.wait_for_version(store.version + 100, timeout=TIMEOUT)
                writers[-1].kill()
                writers.append(Forked(_publish_forever, store, name=f"writer/{len(writers)}"))
            results = [r.result(timeout=TIMEOUT, stall=STALL) for r in readers]
        finally:
            for p in readers + writers:
                p.kill()
        for done, problems, stats in results:
            assert problems == []
            assert done == pulls
            assert stats["pulls"] == pulls
        version, got = store.pull_arrays()
        assert _values(got) == {version}


# --- the fallback, step by step, in one process ----------------------------------------------


class _OvertakenCopies:
    """Wraps a reader's buffer copy so that ``publishes`` versions are published (by the
    writer handle) in the middle of each copy, as a writer faster than the reader would."""

    def __init__(self, reader: WeightStore, writer: WeightStore, publishes: int):
        self.reader, self.writer, self.publishes = reader, writer, publishes
        self.copy = reader._copy
        self.calls = 0

    def __call__(self, targets, torch_views, b) -> None:
        self.calls += 1
        for _ in range(self.publishes):
            self.writer.publish(_small(self.writer.version + 1))
        self.copy(targets, torch_views, b)


def _small(value: int) -> dict[str, np.ndarray]:
    return {"w": np.full(1000, value, np.int64), "b": np.full(3, value, np.int64)}


def test_a_reader_overtaken_on_every_copy_pins_its_buffer_and_completes():
    with WeightStore.create(_small(0)) as writer:
        reader = WeightStore.attach(writer.name)
        try:
            writer.publish(_small(1))
            reader._copy = _OvertakenCopies(reader, writer, 3)  # three publishes refill every buffer
            dst = _small(-1)
            v = reader.pull(dst)
            assert reader._copy.calls == store_module._COPIES_BEFORE_PIN + 1
            assert _values(dst) == {v}
            assert writer.version == v + 3  # the writer went on past the pinned buffer without waiting
            stats = reader.statistics()
            assert (stats.pulls, stats.retries, stats.pinned_pulls) == (1, store_module._COPIES_BEFORE_PIN, 1)
            assert (writer.statistics().publish_waits, writer.statistics().pins_broken) == (0, 0)
            reader._copy = reader._copy.copy
            assert reader.pull(dst, newer_than=v) == writer.version  # the pin was released
            assert _values(dst) == {writer.version}
            assert reader.statistics().pinned_pulls == 1
        finally:
            reader.close()


def test_a_publish_waits_for_a_pinned_copy_and_a_broken_pin_fails_the_copy(monkeypatch):
    monkeypatch.setattr(store_module, "_PIN_TIMEOUT", TIMEOUT)  # a wait that ends before this was woken by the unpin
    with WeightStore.create(_small(0)) as store:
        words, ctl = store._words, store._ctl
        store.publish(_small(1))
        first = seqlock._pin(words, ctl, 0, os.getpid())
        store.publish(_small(2))
        second = seqlock._pin(words, ctl, 0, os.getpid())
        assert [first[0], second[0]] == [1, 2]
        assert store.publish(_small(3)) == 3  # the third buffer was free: no wait
        assert store.statistics().publish_waits == 0

        publisher = threading.Thread(target=store.publish, args=(_small(4),))
        publisher.start()
        try:
            sleepers = ctl + seqlock._PIN_EVENT // 8 + 1
            assert wait_until(lambda: words[sleepers] > 0, TIMEOUT), "the publish never waited"
            assert seqlock._unpin(words, ctl, first[1], first[2])  # the copy under the first pin was whole
        finally:
            publisher.join(TIMEOUT)
        assert not publisher.is_alive()
        stats = store.statistics()
        assert (stats.publishes, stats.publish_waits, stats.pins_broken) == (4, 1, 0)

        third = seqlock._pin(words, ctl, 0, os.getpid())  # the buffer of version 4
        assert third[0] == 4
        assert store.publish(_small(5)) == 5  # into the buffer the first pin left
        monkeypatch.setattr(store_module, "_PIN_TIMEOUT", 0.0)
        assert store.publish(_small(6)) == 6  # both others pinned: breaks the pin of version 4's buffer
        stats = store.statistics()
        assert (stats.publish_waits, stats.pins_broken) == (2, 1)
        assert not seqlock._unpin(words, ctl, third[1], third[2])  # that copy may be torn: it is thrown away
        assert seqlock._unpin(words, ctl, second[1], second[2])
        version, got = store.pull_arrays()
        assert (version, _values(got)) == (6, {6})


def test_close_wakes_a_publish_waiting_for_pins(monkeypatch):
    monkeypatch.setattr(store_module, "_PIN_TIMEOUT", TIMEOUT)
    store = WeightStore.create(_small(0))
    words, ctl = store._words, store._ctl
    store.publish(_small(1))
    seqlock._pin(words, ctl, 0, os.getpid())
    store.publish(_small(2))
    seqlock._pin(words, ctl, 0, os.getpid())
    store.publish(_small(3))
    outcome: list[BaseException] = []

    def publish() -> None:
        try:
            store.publish(_small(4))
        except BaseException as e:
            outcome.append(e)

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        sleepers = ctl + seqlock._PIN_EVENT // 8 + 1
        assert wait_until(lambda: words[sleepers] > 0, TIMEOUT), "the publish never waited"
        store.close()  # the creator's close: every process's calls raise Closed, waiters wake
        publisher.join(TIMEOUT)
        assert not publisher.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], Closed), outcome
    finally:
        publisher.join(TIMEOUT)
        store.close()


def _pin_latest_and_hang(store: WeightStore, pinned) -> None:
    """Pin the buffer of the latest version as a pull's fallback does, then hang until SIGKILL."""
    v, b, _ = seqlock._pin(store._words, store._ctl, 0, os.getpid())
    if b < 0:
        raise AssertionError(f"pinning version {v} returned code {b}")
    pinned.set()
    store.wait_for_version(v + 1_000_000, timeout=TIMEOUT)


@pytest.mark.timeout(60)
def test_a_pin_of_a_reader_killed_holding_it_is_broken_at_once(monkeypatch):
    monkeypatch.setattr(store_module, "_PIN_TIMEOUT", 3600.0)  # only the dead pid can end the wait in time
    with WeightStore.create(_small(0)) as store:
        store.version  # compile the kernels once, before forking
        pinners = []
        try:
            for v in (1, 2):  # a pin on the buffers of versions 1 and 2: the writer's only choices for 4
                store.publish(_small(v))
                pinned = FORK.Event()
                pinners.append(Forked(_pin_latest_and_hang, store, pinned, name=f"pinner/{v}"))
                assert pinned.wait(TIMEOUT)
            for p in pinners:
                p.kill()  # SIGKILL while holding the pin
            assert store.publish(_small(3)) == 3  # the third buffer was free
            assert store.statistics().publish_waits == 0
            assert store.publish(_small(4)) == 4  # finds a dead pinner and breaks its pin
            assert store.publish(_small(5)) == 5  # the broken buffer is free again: no wait
            stats = store.statistics()
            assert (stats.publishes, stats.publish_waits, stats.pins_broken) == (5, 1, 1)
            version, got = store.pull_arrays()
            assert version == 5
            assert _values(got) == {5}
        finally:
            for p in pinners:
                p.kill()
