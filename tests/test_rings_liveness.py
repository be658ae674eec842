"""Several consumers on one MPMC typed ring keep moving: one takes batches while another
takes single items, with no fault injected, and every item arrives exactly once and
whole. (A batch that waited used to hold the slots it had taken: with the other
consumer draining the ring, the producer came round to a held slot and waited for the
batch consumer, which waited for the producer.)"""

from __future__ import annotations

import multiprocessing
import time

import numpy as np
import pytest

from shmpad import Closed, Timeout, TypedRing, WouldBlock

FORK = multiprocessing.get_context("fork")
SPEC = {"x": (np.int64, (16,))}
RUN_S = 4.0
STALL_S = 3.0


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
        start = last_change = time.monotonic()
        last = 0
        while time.monotonic() - start < RUN_S:
            time.sleep(0.05)
            if count.value != last:
                last, last_change = count.value, time.monotonic()
            assert time.monotonic() - last_change < STALL_S, (
                f"no item moved for {STALL_S} s after {last}: {ring.statistics()}"
            )
        stop.set()
        procs[0].join(30)
        ring.close()  # the consumers drain what is left, then see Closed
        seen = sorted(s for r, _ in pipes for s in r.recv())
        for p in procs[1:]:
            p.join(30)
        assert produced.value > 1000
        assert seen == list(range(produced.value)), "an item was lost or delivered twice"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(30)
        ring.close()
