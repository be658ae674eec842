"""The byte rings' API in one process: every put and get path, messages of any
bytes-like type, bad input and its exact messages, held views, attach and pickle, and
regressions for the bugs these tests found.

Waiting, timeouts, close and the wait counters are in test_ringbuf_blocking.py, random
call sequences in test_ringbuf_props.py, many processes in test_ringbuf_multiprocess.py,
SIGKILLed processes in test_ringbuf_faults.py.
"""

from __future__ import annotations

import pickle
import time

import helpers
import numpy as np
import pytest
from helpers.ring_workers import drain, make_ring, ring_cls  # noqa: F401 - fixtures

from shmpad.errors import Closed, SegmentError, Timeout, WouldBlock
from shmpad.ringbuf import MPMCRing, SPSCRing, mpmc

BYTES_LIKE = r"a message must be bytes-like \(bytes, bytearray, memoryview, numpy array\), got "


# --- round trips --------------------------------------------------------------------------


def test_every_put_path_feeds_every_get_path_in_order(make_ring):
    ring = make_ring(capacity=8, slot_size=16)
    ring.put(b"put")
    ring.put_nowait(b"put_nowait")
    ring.put_many([b"many-0", bytearray(b"many-1")])
    ring.put_many(np.frombuffer(b"row0row1", np.uint8).reshape(2, 4))
    view = ring.reserve(7)
    view[:] = b"reserve"
    ring.commit()
    ring.reserve(16)[:9] = b"shortened"
    ring.commit(9)

    assert bytes(ring.get()) == b"put"
    assert ring.get_bytes() == b"put_nowait"
    assert bytes(ring.get_nowait()) == b"many-0"
    assert ring.get_bytes_nowait() == b"many-1"
    batch = ring.get_many(8)
    assert batch.to_bytes() == [b"row0", b"row1", b"reserve", b"shortened"][: len(batch)]
    ring.release()
    rest = [b"row0", b"row1", b"reserve", b"shortened"][len(batch) :]
    assert drain(ring) == rest
    s = ring.statistics()
    assert (s.puts, s.gets, s.size) == (8, 8, 0)
    sent = [b"put", b"put_nowait", b"many-0", b"many-1", b"row0", b"row1", b"reserve", b"shortened"]
    assert s.bytes_put == s.bytes_got == sum(map(len, sent))


def test_get_into_copies_into_the_callers_buffer(make_ring):
    ring = make_ring(capacity=4, slot_size=8)
    ring.put_many([b"abc", b"", b"12345678"])
    out = np.full(10, 0xEE, np.uint8)
    assert ring.get_into(out) == 3
    assert out[:4].tobytes() == b"abc\xee"
    assert ring.get_into(memoryview(bytearray(8))) == 0
    buf = bytearray(8)
    assert ring.get_into(buf, timeout=1) == 8 and buf == b"12345678"
    assert ring.statistics().size == 0


@pytest.mark.parametrize(
    "out, error, message",
    [
        (b"12345678", TypeError, r"^out must be writable, got a read-only bytes$"),
        (123, TypeError, r"^out must be a writable, contiguous bytes-like object, got int$"),
        ("12345678", TypeError, r"^out must be a writable, contiguous bytes-like object, got str$"),
        (bytearray(7), ValueError, r"^out holds 7 bytes; get_into needs room for a whole slot \(8 bytes\)$"),
    ],
    ids=["bytes", "int", "str", "small"],
)
def test_get_into_rejects_a_bad_buffer(make_ring, out, error, message):
    ring = make_ring()
    ring.put(b"kept")
    with pytest.raises(error, match=message):
        ring.get_into(out)
    assert drain(ring) == [b"kept"]


def test_empty_messages_round_trip(make_ring):
    ring = make_ring()
    ring.put(b"")
    ring.put_many([b"", b""])
    ring.reserve(0)
    ring.commit()
    assert [bytes(ring.get()) for _ in range(4)] == [b""] * 4
    ring.release()


def test_get_bytes_copies_small_and_large_messages_whole_and_frees_their_slots(make_ring):
    """MPMC copies a message of up to mpmc.SMALL bytes out in the call that takes it and a
    larger one straight from its slot; either way the slot is free afterwards."""
    sizes = [0, 1, mpmc.SMALL - 1, mpmc.SMALL, mpmc.SMALL + 1, 3 * mpmc.SMALL]
    ring = make_ring(capacity=2, slot_size=3 * mpmc.SMALL)
    for size in sizes:
        message = bytes((size + k) % 251 for k in range(size))
        for get in (ring.get_bytes, ring.get_bytes_nowait):
            ring.put_nowait(message)
            ring.put_nowait(message)
            assert get() == message and get() == message
            assert ring.statistics().size == 0
    ring.put_many_nowait([b"a", b"b"])  # every slot free again
    assert [ring.get_bytes(), ring.get_bytes()] == [b"a", b"b"]


@pytest.mark.parametrize(
    "message, expected",
    [
        (np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int32).tobytes()),
        (np.array([[1.5, -2.0]], dtype=np.float64), np.array([1.5, -2.0]).tobytes()),
        (np.arange(10, dtype=np.int16)[::3], np.array([0, 3, 6, 9], np.int16).tobytes()),  # not contiguous
        (np.array(7, dtype=np.uint16), np.uint16(7).tobytes()),  # 0-d
        (np.array([True, False]), b"\x01\x00"),
        (bytearray(b"bytearray"), b"bytearray"),
        (memoryview(b"memoryview"), b"memoryview"),
        (memoryview(np.arange(2, dtype=np.int32)), np.arange(2, dtype=np.int32).tobytes()),  # format "i"
        (memoryview(b"xxsliced")[2:], b"sliced"),
    ],
    ids=[
        "int32",
        "float64-2d",
        "strided",
        "0d",
        "bool",
        "bytearray",
        "memoryview",
        "memoryview-int",
        "memoryview-slice",
    ],
)
def test_any_bytes_like_message_is_accepted(make_ring, message, expected):
    ring = make_ring(slot_size=16)
    ring.put(message)
    ring.put_nowait(message)
    ring.put_many([message])
    assert drain(ring) == [expected] * 3


def test_put_many_takes_arrays_of_any_dtype_as_rows(make_ring):
    ring = make_ring(capacity=8, slot_size=16)
    rows = np.arange(6, dtype=np.int16).reshape(3, 2)
    ring.put_many(rows)
    ring.put_many(np.asfortranarray(np.arange(4, dtype=np.float32).reshape(2, 2)))
    ring.put_many(np.zeros((2, 0), np.uint8))
    expected = [r.tobytes() for r in rows] + [np.float32([0, 1]).tobytes(), np.float32([2, 3]).tobytes(), b"", b""]
    assert drain(ring) == expected


@pytest.mark.parametrize("bad", ["text", 123, None, 1.5, [1, 2], object()], ids=lambda v: type(v).__name__)
def test_a_message_that_is_not_bytes_like_raises_type_error(make_ring, bad):
    ring = make_ring()
    name = type(bad).__name__
    with pytest.raises(TypeError, match=f"^{BYTES_LIKE}{name}$"):
        ring.put(bad)
    with pytest.raises(TypeError, match=f"^{BYTES_LIKE}{name}$"):
        ring.put_nowait(bad)
    with pytest.raises(TypeError, match=f"^{BYTES_LIKE}{name}$"):
        ring.put_many([b"ok", bad])
    ring.put(b"ok")
    assert drain(ring) == [b"ok"]
    assert ring.statistics().puts == 1


# --- messages larger than a slot -------------------------------------------------------------


def test_a_message_larger_than_a_slot_raises_value_error_and_the_ring_stays_usable(make_ring):
    ring = make_ring(capacity=2, slot_size=8)
    with pytest.raises(ValueError, match=r"^slot holds at most 8 bytes, got 9$"):
        ring.put(b"123456789")
    with pytest.raises(ValueError, match=r"^slot holds at most 8 bytes, got 9$"):
        ring.put(b"123456789", timeout=1)
    with pytest.raises(ValueError, match=r"^slot holds at most 8 bytes, got 9$"):
        ring.put_nowait(bytearray(9))
    with pytest.raises(ValueError, match=r"^slot holds at most 8 bytes, got 16$"):
        ring.put(np.zeros(2, np.float64))
    with pytest.raises(ValueError, match=r"^slot holds at most 8 bytes, got 9 \(message 1\)$"):
        ring.put_many([b"ok", b"123456789"])
    with pytest.raises(ValueError, match=r"^slot holds at most 8 bytes, got messages of 9$"):
        ring.put_many(np.zeros((2, 9), np.uint8))
    with pytest.raises(ValueError, match=r"^n must be between 0 and 8, got 9$"):
        ring.reserve(9)
    assert ring.statistics().puts == 0, "a rejected put_many put a prefix"

    ring.put(b"12345678")
    ring.reserve(8)[:] = b"abcdefgh"
    ring.commit()
    with pytest.raises(ValueError, match=r"^slot holds at most 8 bytes, got 9$"):
        ring.put(b"123456789", timeout=0)  # full, but the size is checked first
    assert drain(ring) == [b"12345678", b"abcdefgh"]


# --- bad arguments ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "capacity, slot_size, error, message",
    [
        (0, 8, ValueError, r"^capacity must be between 1 and 2147483647, got 0$"),
        (-1, 8, ValueError, r"^capacity must be between 1 and 2147483647, got -1$"),
        (2**31, 8, ValueError, r"^capacity must be between 1 and 2147483647, got 2147483648$"),
        ("x", 8, TypeError, r"^capacity must be an int, got str$"),
        (True, 8, TypeError, r"^capacity must be an int, got bool$"),
        (4.0, 8, TypeError, r"^capacity must be an int, got float$"),
        (None, 8, TypeError, r"^capacity must be an int, got NoneType$"),
        (4, 0, ValueError, r"^slot_size must be between 1 and 4294967295, got 0$"),
        (4, -8, ValueError, r"^slot_size must be between 1 and 4294967295, got -8$"),
        (4, "8", TypeError, r"^slot_size must be an int, got str$"),
        (4, False, TypeError, r"^slot_size must be an int, got bool$"),
    ],
)
def test_create_rejects_bad_sizes(shm_leak_check, ring_cls, capacity, slot_size, error, message):
    with pytest.raises(error, match=message):
        ring_cls.create(capacity, slot_size)


def test_create_accepts_numpy_integers(ring_cls):
    with ring_cls.create(np.int64(3), np.int32(5)) as ring:
        assert (ring.capacity, ring.slot_size) == (3, 5)


def test_get_many_and_commit_reject_bad_counts(make_ring):
    ring = make_ring()
    with pytest.raises(ValueError, match=r"^max_n must be between 1 and 2147483647, got 0$"):
        ring.get_many(0)
    with pytest.raises(TypeError, match=r"^max_n must be an int, got float$"):
        ring.get_many(1.0)
    with pytest.raises(ValueError, match=r"^n must be between 0 and 8, got -1$"):
        ring.reserve(-1)
    with pytest.raises(TypeError, match=r"^n must be an int, got str$"):
        ring.reserve("1")
    ring.reserve(5)[:] = b"hello"
    with pytest.raises(ValueError, match=r"^n must be between 0 and 5, got 6$"):
        ring.commit(6)
    ring.commit(4)  # the reservation survived the bad commit
    assert drain(ring) == [b"hell"]


def test_commit_without_reserve_and_reserve_twice_raise_runtime_error(make_ring):
    ring = make_ring()
    with pytest.raises(RuntimeError, match=r"^commit\(\) without a reserve\(\)$"):
        ring.commit()
    ring.reserve(1)[:] = b"a"
    with pytest.raises(RuntimeError, match=r"^reserve\(\) called again before commit\(\) of the previous reservation$"):
        ring.reserve(1)
    ring.commit()
    with pytest.raises(RuntimeError, match=r"^commit\(\) without a reserve\(\)$"):
        ring.commit()
    assert drain(ring) == [b"a"]


# --- names, attach, pickle -------------------------------------------------------------------


def test_attach_and_pickle_reach_the_same_ring(make_ring, ring_cls):
    ring = make_ring()
    other = ring_cls.attach(ring.name)
    again = pickle.loads(pickle.dumps(ring))
    assert type(again) is ring_cls and again.name == other.name == ring.name
    assert (other.capacity, other.slot_size) == (4, 8)
    other.put(b"other")
    again.put(b"again")
    assert drain(ring) == [b"other", b"again"]
    assert again.statistics() == ring.statistics()
    assert repr(ring) == f"{ring_cls.__name__}({ring.name!r}, capacity=4, slot_size=8)"


def test_the_creator_closing_removes_the_name(shm_leak_check, ring_cls):
    with ring_cls.create(2, 8) as ring:
        assert helpers.shm_exists(ring.name)
    assert not helpers.shm_exists(ring.name)
    with pytest.raises(SegmentError, match=rf"^no shared-memory segment named '{ring.name}'$"):
        ring_cls.attach(ring.name)


def test_attach_to_a_missing_name(ring_cls):
    name = helpers.unique_segment_name("missing")
    with pytest.raises(SegmentError, match=rf"^no shared-memory segment named '{name}'$"):
        ring_cls.attach(name)


def test_attach_to_a_ring_of_the_other_kind(make_ring, ring_cls):
    ring = make_ring()
    other_cls = MPMCRing if ring_cls is SPSCRing else SPSCRing
    with pytest.raises(
        SegmentError, match=rf"^segment '{ring.name}' holds a '{ring_cls.KIND}', not a '{other_cls.KIND}'$"
    ):
        other_cls.attach(ring.name)


# --- regressions ----------------------------------------------------------------------------


def _get_on_an_empty_ring_holding_last_laps_message(capacity: int):
    """Take every message, holding a view of the first: the ring is empty and the slot of
    the next position still holds the previous lap's message."""
    with MPMCRing.create(capacity, 8) as ring:
        ring.put_many([bytes([i]) for i in range(capacity)])
        held = ring.get()
        for _ in range(capacity - 1):
            ring.get_bytes()
        outcomes = []
        try:
            ring.get_nowait()
        except WouldBlock as e:
            outcomes.append(f"WouldBlock: {e}")
        start = time.monotonic()
        try:
            ring.get_many(2, timeout=0.2)
        except Timeout:
            outcomes.append(f"Timeout after {time.monotonic() - start >= 0.2}")
        assert bytes(held) == b"\x00"
        ring.release()
        ring.put(b"next")
        outcomes.append(ring.get_bytes(timeout=1))
        ring.close()
        try:
            ring.get_bytes_nowait()
        except Closed as e:
            outcomes.append(f"Closed: {e}")
        return outcomes


@pytest.mark.parametrize("capacity", [1, 4])
def test_mpmc_get_on_an_empty_ring_whose_next_slot_is_still_held_does_not_hang(capacity):
    """Regression: ``mpmc._claim_read`` looped forever (in compiled code: no timeout,
    close() or Ctrl+C ended it) when TAIL == HEAD and the slot of TAIL still held the
    previous lap's message, being read: ``r = MPMCRing.create(1, 8); r.put(b"a");
    v = r.get(); r.get_nowait()``."""
    outcomes = helpers.run_forked(_get_on_an_empty_ring_holding_last_laps_message, capacity, timeout=5)
    assert outcomes == [
        "WouldBlock: ring is empty",
        "Timeout after True",
        b"next",
        "Closed: ring is closed and drained",
    ]


def test_put_while_a_reservation_is_open_does_not_corrupt_messages(make_ring):
    """Bug (SPSC): ``reserve`` hands out the slot at HEAD without claiming it, so a ``put``
    by the same producer before ``commit`` writes into the reserved slot and publishes it;
    ``commit`` then publishes the next slot, whose length and payload are stale. Either
    refuse the put or deliver both messages whole, reserved first (as MPMC does)."""
    ring = make_ring()
    view = ring.reserve(8)
    try:
        ring.put(b"put")
    except RuntimeError:
        put = False
    else:
        put = True
    view[:] = b"reserved"
    ring.commit()
    assert drain(ring) == ([b"reserved", b"put"] if put else [b"reserved"])


def test_close_hands_back_what_get_bytes_read_ahead():
    """SPSC get_bytes takes a run of messages at once; close() gives back the part not
    handed out, so the statistics and a draining consumer see every message once."""
    ring = SPSCRing.create(capacity=8, slot_size=4)
    try:
        for i in range(8):
            ring.put(b"%d" % i)
        assert ring.get_bytes() == b"0"
        ring.close()
        stats = ring.statistics()
        assert (stats.gets, stats.size) == (1, 7)
        assert [ring.get_bytes(timeout=1) for _ in range(7)] == [b"%d" % i for i in range(1, 8)]
        with pytest.raises(Closed, match="^ring is closed and drained$"):
            ring.get_bytes(timeout=1)
    finally:
        ring.close()
