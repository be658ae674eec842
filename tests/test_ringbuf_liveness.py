"""Several consumers on one MPMC typed ring keep moving: one takes batches while another
takes single items, with no fault injected, and every item arrives exactly once and
whole. (A batch that waited used to hold the slots it had taken: with the other
consumer draining the ring, the producer came round to a held slot and waited for the
batch consumer, which waited for the producer.)"""

from __future__ import annotations

import multiprocessing
import time

import helpers
import numpy as np
import pytest

from shmpad import Closed, Timeout, TypedRing, WouldBlock

FORK = multiprocessing.get_context("fork")
SPEC = {"x": (np.int64, (16,))}
ITEMS = 5_000  # items moved before the producer stops
HANG_S = 120.0  # hang guard: a healthy run moves thousands of items a second


def _produce(name: str, stop, produced) -> None:
    ring = TypedRing.attach(name)
    n = 0
    try:
        while not stop.is_set():
            try:
                slot = ring.reserve(timeout=0.5)
            except Timeout:
                continue
            slot["x"][:] = n
            ring.commit()
            n += 1
    except Closed:
        pass
    produced.value = n


def _consume(name: str, batch: int, count, out) -> None:
    ring = TypedRing.attach(name)
    seen: list[int] = []

    def take(items: np.ndarray) -> None:
        for row in np.atleast_2d(items):
            assert (row == row[0]).all(), f"torn item {row}"
            seen.append(int(row[0]))
        with count.get_lock():
            count.value += len(np.atleast_2d(items))

    try:
        while True:
            try:
                take(ring.get_batch(batch, timeout=0.5)["x"] if batch > 1 else ring.get(timeout=0.5)["x"])
                ring.release()
            except Timeout:
                continue
    except Closed:
        pass
    while True:  # what a timed-out batch kept comes out one by one
        try:
            take(ring.get_nowait()["x"])
            ring.release()
        except (WouldBlock, Closed):
            break
    out.send(seen)


@pytest.mark.parametrize("batches", [(8, 1), (8, 8), (4, 1, 1)], ids=["batch+single", "two batches", "batch+2 singles"])
def test_batch_and_single_consumers_never_stall(batches):
    ring = TypedRing.create(SPEC, 32, multi=True)
    stop, count, produced = FORK.Event(), FORK.Value("q", 0), FORK.Value("q", -1)
    pipes = [FORK.Pipe(duplex=False) for _ in batches]
    procs = [FORK.Process(target=_produce, args=(ring.name, stop, produced), daemon=True)]
    procs += [
        FORK.Process(target=_consume, args=(ring.name, b, count, w), daemon=True) for b, (_, w) in zip(batches, pipes)
    ]
    try:
        for p in procs:
            p.start()
        for _, w in pipes:
            w.close()  # the consumers hold the write ends: one that dies gives EOFError below, not a hang
        # a stall (a consumer that never takes the items it waits for) leaves the count short for good
        moved = helpers.wait_until(lambda: count.value >= ITEMS, HANG_S, interval=0.05)
        assert moved, f"{count.value} of {ITEMS} items moved: {ring.statistics()}"
        stop.set()
        procs[0].join(30)
        ring.close()  # the consumers drain what is left, then see Closed
        if not all(r.poll(HANG_S) for r, _ in pipes):  # a hang guard, with what the consumers were doing
            pytest.fail(f"a consumer never reported after the close: alive {[p.is_alive() for p in procs[1:]]}")
        try:
            seen = sorted(s for r, _ in pipes for s in r.recv())
        except EOFError:
            pytest.fail(f"a consumer ended without its items: exit codes {[p.exitcode for p in procs[1:]]}")
        for p in procs[1:]:
            p.join(30)
        assert produced.value >= ITEMS
        assert seen == list(range(produced.value)), "an item was lost or delivered twice"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(30)
        ring.close()


def _drain(name: str, stop, got) -> None:
    from shmpad import MPMCRing

    ring = MPMCRing.attach(name)
    while not stop.is_set():
        try:
            ring.get_bytes(timeout=0.2)
            with got.get_lock():
                got.value += 1
        except Timeout:
            continue
        except Closed:
            break


def _put_forever(name: str, stop, put) -> None:
    from shmpad import MPMCRing

    ring = MPMCRing.attach(name)
    while not stop.is_set():
        try:
            ring.put(b"m" * 32, timeout=0.2)
            with put.get_lock():
                put.value += 1
        except Timeout:
            continue
        except Closed:
            break


def _wait_for(what: str, condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_consumer_holding_a_view_cannot_wedge_the_ring_by_waiting():
    """Consumer A holds a view and asks for the next message while B drains the ring:
    the producers come round to A's slot and can put nothing until A releases it, so
    A's wait could never end. A's get raises at once, naming the fix; after A's
    release the producer moves again."""
    from shmpad import MPMCRing

    ring = MPMCRing.create(4, 64)
    stop, got, put = FORK.Event(), FORK.Value("q", 0), FORK.Value("q", 0)
    procs = [
        FORK.Process(target=_put_forever, args=(ring.name, stop, put), daemon=True),
    ]
    try:
        procs[0].start()
        _wait_for("a first message", lambda: put.value >= 1)
        view = ring.get(timeout=5)  # A holds this view
        assert bytes(view) == b"m" * 32
        procs.append(FORK.Process(target=_drain, args=(ring.name, stop, got), daemon=True))
        procs[1].start()
        _wait_for(
            "the producer to come round to A's slot",
            lambda: ring.statistics().waits_full > 0 and ring.statistics().size == 0,
        )
        with pytest.raises(RuntimeError, match=r"^get\(\) would wait forever: .* release\(\) them before waiting$"):
            ring.get(timeout=None)  # with no timeout, only this error can end it
        before = put.value
        ring.release()
        _wait_for("the producer to move again", lambda: put.value > before + 10)
    finally:
        stop.set()
        ring.close()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(10)


def test_an_spsc_consumer_holding_every_slot_cannot_wait_forever():
    from shmpad import SPSCRing

    ring = SPSCRing.create(2, 16)
    try:
        ring.put(b"a")
        ring.put(b"b")
        views = [ring.get_nowait(), ring.get_nowait()]
        with pytest.raises(RuntimeError, match="would wait forever"):
            ring.get(timeout=None)
        assert [bytes(v) for v in views] == [b"a", b"b"]
        ring.release()
        ring.put(b"c", timeout=1)
        assert ring.get_bytes(timeout=1) == b"c"
    finally:
        ring.close()
