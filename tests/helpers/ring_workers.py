"""What the ring tests share: producer and consumer loops that the multi-process and
fault tests run in child processes, with stall diagnosis (messages are
``helpers.make_message``s, checked whole by every consumer), and the fixtures of the
single-process tests.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator

import numpy as np
import pytest

from helpers import MESSAGE_HEADER, Forked, make_message, parse_message
from shmpad.errors import Closed, WouldBlock
from shmpad.ringbuf import MPMCRing, SPSCRing, control, mpmc

CAPACITY = 16
SLOT_SIZE = 200
STALL_S = 60.0  # a hang guard: a healthy run moves tens of thousands of messages a second
RINGS = [SPSCRing, MPMCRing]


def _size(producer: int, seq: int) -> int:
    return MESSAGE_HEADER.size + (seq * 7919 + producer * 104729) % (SLOT_SIZE - MESSAGE_HEADER.size + 1)


def produce(ring, producer: int, n: int, how: str) -> int:
    """Send messages 0..n-1 of ``producer`` through ``ring`` by ``how``; returns the bytes sent."""
    rng = random.Random(producer)
    sent = 0
    seq = 0
    while seq < n:
        if how == "put":
            m = make_message(producer, seq, _size(producer, seq))
            ring.put(m, timeout=30)
            sent += len(m)
            seq += 1
        elif how == "put_many_list":
            k = min(rng.randint(1, 2 * CAPACITY), n - seq)
            batch = [make_message(producer, s, _size(producer, s)) for s in range(seq, seq + k)]
            ring.put_many(batch, timeout=30)
            sent += sum(map(len, batch))
            seq += k
        elif how == "put_many_array":
            k = min(rng.randint(1, 2 * CAPACITY), n - seq)
            width = _size(producer, seq)
            rows = np.frombuffer(b"".join(make_message(producer, s, width) for s in range(seq, seq + k)), np.uint8)
            ring.put_many(rows.reshape(k, width), timeout=30)
            sent += k * width
            seq += k
        else:
            m = make_message(producer, seq, _size(producer, seq))
            if seq % 3:
                ring.reserve(len(m), timeout=30)[:] = m
                ring.commit()
            else:  # reserve a whole slot, commit what was written
                ring.reserve(SLOT_SIZE, timeout=30)[: len(m)] = m
                ring.commit(len(m))
            sent += len(m)
            seq += 1
    return sent


def consume(ring, how: str, seed: int):
    """Take messages by ``how`` until the ring is closed and drained; every producer's
    sequence numbers in the order they arrived."""
    rng = random.Random(seed)
    seen: dict[int, list[int]] = {}

    def record(m) -> None:
        producer, seq = parse_message(m)
        seen.setdefault(producer, []).append(seq)

    views: list[memoryview] = []  # held until release, several at a time
    try:
        while True:
            if how == "get_bytes":
                record(ring.get_bytes(timeout=30))
            elif how == "get":
                record(ring.get(timeout=30))
                ring.release()
            elif how == "get_held":  # one consumer only: see test_ringbuf_multiprocess.py
                for _ in range(rng.randint(1, 3)):
                    views.append(ring.get(timeout=30))
                for v in views:
                    record(v)
                views.clear()
                ring.release()
            else:
                batch = ring.get_many(rng.randint(1, CAPACITY), timeout=30)
                for v in batch:
                    record(v)
                ring.release()
    except Closed:
        for v in views:  # taken before the ring was found drained
            record(v)
        ring.release()
    return {p: np.array(s, np.int64) for p, s in seen.items()}


def produce_until_killed(ring, producer: int, how: str, conn) -> None:
    """Tell the test through ``conn`` that it started, then produce until SIGKILLed."""
    conn.send("started")
    produce(ring, producer, 2**31, how)


def produce_then_claim(ring, producer: int, n: int, conn) -> None:
    """Put messages 0..n-1, then claim a slot for message n and write it but never
    commit: tell the test through ``conn`` and sleep until SIGKILLed."""
    produce(ring, producer, n, "put")
    m = make_message(producer, n, 40)
    ring.reserve(len(m), timeout=30)[:] = m
    conn.send("claimed")
    time.sleep(120)


def take_and_hold(ring, k: int, conn) -> None:
    """Take ``k`` messages, releasing all but the last, whose view stays held: send what
    was taken through ``conn`` and sleep until SIGKILLed."""
    taken = [parse_message(ring.get_bytes(timeout=30)) for _ in range(k - 1)]
    taken.append(parse_message(ring.get(timeout=30)))
    conn.send(taken)
    time.sleep(120)


def attach_and_consume(ring_cls, name: str, how: str):
    """``consume`` through a handle attached by name, as a consumer started afresh would."""
    return consume(ring_cls.attach(name), how, 0)


@contextlib.contextmanager
def forked_children(ring, signal_r) -> Iterator[list[Forked]]:
    """The children a fault test forks, in a list it appends to: however the test ends,
    every child is killed and the test's signal pipe and ring are closed."""
    children: list[Forked] = []
    try:
        yield children
    finally:
        for child in children:
            child.kill()
        signal_r.close()
        ring.close()


def wait_while_progressing(ring, children: list[Forked]) -> None:
    """Wait for ``children`` to report, failing with the ring's state if no message moves
    for ``STALL_S`` (a healthy run moves tens of thousands a second)."""
    last, since = None, time.monotonic()
    while not all(c.ready() for c in children):
        s = ring.statistics()
        if (s.puts, s.gets) != last:
            last, since = (s.puts, s.gets), time.monotonic()
        elif time.monotonic() - since > STALL_S:
            raise AssertionError(f"no message moved for {STALL_S} s: {s}\n{describe(ring)}")
        time.sleep(0.05)


def describe(ring) -> str:
    """HEAD, TAIL and (MPMC) every slot's state word, to diagnose a stall."""
    ctl = ring._ctl
    text = f"HEAD {ctl[control.HEAD]} TAIL {ctl[control.TAIL]}"
    if isinstance(ring, MPMCRing):
        phases = ["FREE", "WRITING", "READY", "READING"]
        for i in range(ring.capacity):
            s = int(ctl[mpmc._state_word(ctl, i)])
            text += f"\n  slot {i}: lap {s >> 32} {phases[(s >> 30) & 3]} pid {s & mpmc.PID_MASK}"
    else:
        text += f" READ {ctl[control.READ]} READER {ctl[control.READER]}"
    return text


# --- fixtures and helpers of the single-process tests ------------------------------------


@pytest.fixture(params=RINGS, ids=lambda r: r.__name__)
def ring_cls(request):
    return request.param


@pytest.fixture
def make_ring(ring_cls):
    """``make_ring(capacity=4, slot_size=8)``: a ring of the parametrized kind, closed (and
    so unlinked) when the test ends."""
    with rings_made_by(lambda capacity=4, slot_size=8: ring_cls.create(capacity, slot_size)) as make:
        yield make


@contextlib.contextmanager
def rings_made_by(create) -> Iterator:
    """``create`` wrapped so that every ring it makes is released and closed (and so
    unlinked) when the block ends."""
    made = []

    def make(*args, **kwargs):
        ring = create(*args, **kwargs)
        made.append(ring)
        return ring

    try:
        yield make
    finally:
        for ring in made:
            ring.release()
            ring.close()


def fill(ring) -> None:
    """Put messages b"\\x00", b"\\x01", ... until the ring is full."""
    for i in range(ring.capacity):
        ring.put_nowait(bytes([i]))


def drain(ring) -> list[bytes]:
    """Every message left, as copies, until the ring is empty (or closed and drained)."""
    out = []
    while True:
        try:
            out.append(ring.get_bytes_nowait())
        except (WouldBlock, Closed):
            return out
