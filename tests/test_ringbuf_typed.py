"""TypedRing: slots of fixed-shape arrays over the SPSC and MPMC control rings.

Items are trajectory steps ``make_item(writer, seq)`` whose every field, and every
element of ``obs``, is derived from (writer, seq), so ``check_rows`` tells a torn item
(fields or elements from two different steps) from a whole one. Covered: round trips
through ``put`` and ``reserve``/``commit``, read-only views, torch tensors over the
ring's memory, ``get_batch`` views and gathers, timed-out batches, bad input with the
exact messages, attach and pickle, a model-based property test against
``collections.deque``, writers in other processes, a writer SIGKILLed mid-item, close.
"""

from __future__ import annotations

import collections
import pickle
import re
import threading
import time

import helpers
import numpy as np
import pytest
import torch
from helpers import FORK, Forked
from helpers.ring_workers import forked_children, rings_made_by
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmpad.errors import Closed, SegmentError, Timeout, WouldBlock
from shmpad.ringbuf import MPMCRing, Segment, SPSCRing, TypedRing

pytestmark = pytest.mark.usefixtures("shm_leak_check")

SPEC = {
    "obs": (np.uint8, (4, 84, 84)),  # [C, H, W]
    "action": (np.int64, ()),
    "reward": (np.float32, ()),
    "done": (np.bool_, ()),
    "logits": (np.float32, (18,)),  # [A]
}
ITEM_BYTES = 4 * 84 * 84 + 8 + 4 + 1 + 18 * 4
FIELDS = sorted(SPEC)
RESULT_TIMEOUT = 60.0
READ_ONLY = "assignment destination is read-only"


@pytest.fixture(params=[False, True], ids=["spsc", "mpmc"])
def multi(request) -> bool:
    return request.param


@pytest.fixture
def make_ring(multi):
    """``make_ring(capacity=8, spec=SPEC)``: a typed ring of the parametrized kind, closed
    (and so unlinked) when the test ends."""
    with rings_made_by(lambda capacity=8, spec=SPEC: TypedRing.create(spec, capacity, multi=multi)) as make:
        yield make


# --- self-checking items ----------------------------------------------------------------------


def _values(writer, seq):
    """Every field of step (writer, seq); works on ints and on int arrays alike."""
    return {
        "obs": (writer * 131 + seq * 31) % 251,  # every element of the frame
        "action": writer * 1_000_000 + seq,
        "reward": seq % 4096 + writer / 4,
        "done": (seq + writer) % 3 == 0,
        "logits": (writer * 1000 + seq % 997)[..., None] + 0.5 * np.arange(18),
    }


def make_item(writer: int, seq: int) -> dict[str, np.ndarray]:
    v = _values(np.int64(writer), np.int64(seq))
    return {f: np.broadcast_to(np.asarray(v[f]).astype(dtype), shape) for f, (dtype, shape) in SPEC.items()}


def fill(slot: dict[str, np.ndarray], writer: int, seq: int) -> None:
    """Write step (writer, seq) into a reserved slot, in place."""
    for f, value in make_item(writer, seq).items():
        slot[f][...] = value


def check_rows(batch: dict) -> list[tuple[int, int]]:
    """(writer, seq) of every row of a ``[B, ...]`` batch; AssertionError naming the rows
    that are torn (a field or an element of ``obs`` that another step wrote)."""
    b = {f: (v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v)) for f, v in batch.items()}
    assert sorted(b) == FIELDS
    n = b["action"].shape[0]
    for f, (dtype, shape) in SPEC.items():
        assert b[f].dtype == dtype and b[f].shape == (n, *shape), f"{f}: {b[f].dtype}{b[f].shape}"
    writer, seq = np.divmod(b["action"], 1_000_000)
    want = _values(writer, seq)
    ok = (b["obs"].reshape(n, -1) == want["obs"][:, None].astype(np.uint8)).all(axis=1)
    ok &= b["reward"] == want["reward"].astype(np.float32)
    ok &= b["done"] == want["done"]
    ok &= (b["logits"] == want["logits"].astype(np.float32)).all(axis=1)
    torn = np.flatnonzero(~ok)
    assert len(torn) == 0, (
        f"torn items at rows {torn[:10]}: (writer, seq) by action {list(zip(writer[torn], seq[torn]))[:5]}"
    )
    return list(zip(writer.tolist(), seq.tolist()))


def check_item(item: dict) -> tuple[int, int]:
    """(writer, seq) of one item from ``get``."""
    return check_rows({f: v[None] for f, v in item.items()})[0]


def _inside(t: torch.Tensor, a: np.ndarray) -> bool:
    """The tensor's memory lies within the array's (so it is a view, not a copy)."""
    lo, start = a.ctypes.data, t.data_ptr()
    return lo <= start and start + t.numel() * t.element_size() <= lo + a.nbytes


# --- round trips ------------------------------------------------------------------------------


def test_round_trip_through_put_and_reserve(make_ring):
    ring = make_ring(8)
    assert ring.item_bytes == ITEM_BYTES
    assert ring.spec == {f: (np.dtype(d), s) for f, (d, s) in SPEC.items()}
    for seq in range(3):
        ring.put(make_item(0, seq), timeout=5)
    for seq in range(3, 6):
        fill(ring.reserve(timeout=5), 0, seq)
        ring.commit()
    for seq in range(6):
        item = ring.get(timeout=5)
        assert check_item(item) == (0, seq)
        assert item["action"].shape == () and item["logits"].shape == (18,)
        assert np.shares_memory(item["obs"], ring._fields["obs"])
        with pytest.raises(ValueError, match=READ_ONLY):
            item["obs"][0, 0, 0] = 1
        with pytest.raises(ValueError, match=READ_ONLY):
            item["reward"][...] = 1.0
        ring.release()
    s = ring.statistics()
    assert (s.puts, s.gets, s.size, s.bytes_put, s.bytes_got) == (6, 6, 0, 6 * ITEM_BYTES, 6 * ITEM_BYTES)


def test_get_torch_shares_the_rings_memory(make_ring):
    ring = make_ring(8)
    for seq in range(8):
        ring.put(make_item(1, seq))
    item = ring.get(timeout=5, torch=True)
    assert {f: t.dtype for f, t in item.items()} == {
        "obs": torch.uint8,
        "action": torch.int64,
        "reward": torch.float32,
        "done": torch.bool,
        "logits": torch.float32,
    }
    assert all(_inside(item[f], ring._fields[f]) for f in SPEC), "get(torch=True) copied"
    assert check_item({f: t.numpy() for f, t in item.items()}) == (1, 0)
    batch = ring.get_batch(4, timeout=5, torch=True)  # slots 1..4: consecutive
    assert all(isinstance(t, torch.Tensor) and _inside(t, ring._fields[f]) for f, t in batch.items())
    assert check_rows(batch) == [(1, s) for s in range(1, 5)]
    ring.release()


def test_get_batch_views_when_the_slots_are_consecutive(make_ring):
    ring = make_ring(16)
    seq = 0
    for _ in range(3):  # laps
        for _ in range(16):
            ring.put(make_item(0, seq), timeout=5)
            seq += 1
        for half in range(2):
            batch = ring.get_batch(8, timeout=5)
            for f in SPEC:
                assert np.shares_memory(batch[f], ring._fields[f]), f"{f} was copied"
                assert not batch[f].flags.writeable
            assert [s for _, s in check_rows(batch)] == list(range(seq - 16 + 8 * half, seq - 8 + 8 * half))
            ring.release()


@pytest.mark.parametrize("torch_out", [False, True], ids=["numpy", "torch"])
def test_get_batch_gathers_in_order_when_the_slots_wrap(make_ring, torch_out):
    capacity, b = 12, 8
    ring = make_ring(capacity)
    wrapped = 0
    for k in range(6):
        for s in range(k * b, (k + 1) * b):
            ring.put(make_item(2, s), timeout=5)
        batch = ring.get_batch(b, timeout=5, torch=torch_out)
        assert check_rows(batch) == [(2, s) for s in range(k * b, (k + 1) * b)]
        wraps = (k * b) % capacity + b > capacity
        wrapped += wraps
        for f, v in batch.items():
            a = ring._fields[f]
            shared = _inside(v, a) if torch_out else np.shares_memory(v, a)
            assert shared == (not wraps), f"batch {k} field {f}: {'view' if shared else 'copy'}, slots wrap: {wraps}"
        ring.release()
    assert wrapped == 2  # batches start at slots 0, 8, 4, 0, 8, 4


# --- get_batch semantics -------------------------------------------------------------------------


def test_get_batch_waits_for_exactly_batch_size_items(make_ring):
    ring = make_ring(8)
    for s in range(5):
        ring.put(make_item(0, s))
    assert check_rows(ring.get_batch(3, timeout=5)) == [(0, s) for s in range(3)]
    ring.release()
    assert ring.statistics().size == 2

    def slow_writer():
        for s in range(5, 9):
            time.sleep(0.02)
            ring.put(make_item(0, s), timeout=5)

    writer = threading.Thread(target=slow_writer, daemon=True)
    start = time.monotonic()
    writer.start()
    try:
        batch = ring.get_batch(6, timeout=10)
        took = time.monotonic() - start
    finally:
        writer.join(10)
    assert not writer.is_alive()
    assert check_rows(batch) == [(0, s) for s in range(3, 9)]
    assert took >= 0.06, f"get_batch returned after {took:.3f} s, before the 4th slow item"
    ring.release()


def test_timed_out_get_batch_keeps_its_items_for_the_next_call(make_ring):
    ring = make_ring(5)  # the kept items wrap round the end of the ring
    seq = 0

    def put(n):
        nonlocal seq
        for _ in range(n):
            ring.put(make_item(0, seq), timeout=5)
            seq += 1

    put(3)
    assert [s for _, s in check_rows(ring.get_batch(3, timeout=5))] == [0, 1, 2]
    ring.release()
    put(1)
    with pytest.raises(
        Timeout, match=re.escape("get_batch timed out after 0.05 s with 1 of 4 items (kept for the next call)")
    ):
        ring.get_batch(4, timeout=0.05)
    put(2)
    with pytest.raises(
        Timeout, match=re.escape("get_batch timed out after 0 s with 3 of 4 items (kept for the next call)")
    ):
        ring.get_batch(4, timeout=0)
    put(2)
    assert [s for _, s in check_rows(ring.get_batch(4, timeout=5))] == [3, 4, 5, 6]
    ring.release()
    assert [s for _, s in check_rows(ring.get_batch(1, timeout=5))] == [7]
    ring.release()
    s = ring.statistics()
    assert (s.puts, s.gets, s.size) == (8, 8, 0)


def test_release_after_a_timed_out_get_batch_keeps_the_kept_items(make_ring):
    """A consumer that releases whatever it holds after a timeout (``except Timeout:
    ring.release()``) must not free the items kept for the next call: the writer would
    overwrite them and the next batch would hold newer items in their place."""
    ring = make_ring(4)
    ring.put(make_item(0, 0))
    ring.put(make_item(0, 1))
    with pytest.raises(Timeout, match="with 2 of 3 items"):
        ring.get_batch(3, timeout=0.05)
    ring.release()  # nothing was handed out
    for s in range(2, 6):
        try:
            ring.put(make_item(0, s), timeout=0.05)
        except Timeout:  # expected from item 4 on: items 0 and 1 still occupy two slots
            break
    assert [s for _, s in check_rows(ring.get_batch(3, timeout=5))] == [0, 1, 2]


def test_gathered_batches_stay_valid_until_release():
    """Two consumers of one MPMC ring interleave, so one handle's runs are not consecutive
    and each of its batches is gathered; both stay valid until ``release()``. (An SPSC
    ring has one consumer, whose batches are consecutive unless the ring wraps.)"""
    ring = TypedRing.create(SPEC, 8, multi=True)
    other = TypedRing.attach(ring.name)
    try:
        batches = []
        for k in range(2):
            ring.put(make_item(0, 3 * k))
            with pytest.raises(Timeout):
                ring.get_batch(2, timeout=0)
            ring.put(make_item(0, 3 * k + 1))
            assert check_item(other.get(timeout=5)) == (0, 3 * k + 1)
            ring.put(make_item(0, 3 * k + 2))
            batches.append(ring.get_batch(2, timeout=5))
        assert not np.shares_memory(batches[0]["action"], ring._fields["action"])
        assert [s for _, s in check_rows(batches[1])] == [3, 5]
        assert [s for _, s in check_rows(batches[0])] == [0, 2], "the second gather overwrote the first batch"
    finally:
        ring.release()
        other.release()
        ring.close()


def test_a_smaller_batch_after_a_timeout_loses_nothing(make_ring):
    """Items kept by a timed-out ``get_batch(3)`` outnumber a following ``get_batch(1)``:
    it returns the first and keeps the other for the call after it."""
    ring = make_ring(4)
    ring.put(make_item(0, 0))
    ring.put(make_item(0, 1))
    with pytest.raises(Timeout, match="with 2 of 3 items"):
        ring.get_batch(3, timeout=0)
    assert [s for _, s in check_rows(ring.get_batch(1, timeout=0))] == [0]
    ring.release()
    try:
        second = ring.get_batch(1, timeout=0)
    except Timeout:
        pytest.fail("item 1, kept by the timed-out get_batch(3), was lost")
    assert [s for _, s in check_rows(second)] == [1]
    ring.release()
    s = ring.statistics()
    assert (s.puts, s.gets, s.size) == (2, 2, 0)


@pytest.mark.parametrize(
    "batch_size, error, message",
    [
        (0, ValueError, "batch_size must be between 1 and the capacity 4, got 0"),
        (5, ValueError, "batch_size must be between 1 and the capacity 4, got 5"),
        (-1, ValueError, "batch_size must be between 1 and the capacity 4, got -1"),
        ("x", TypeError, "batch_size must be an int, got str"),
        (2.0, TypeError, "batch_size must be an int, got float"),
        (True, TypeError, "batch_size must be an int, got bool"),
    ],
)
def test_get_batch_rejects_bad_sizes(make_ring, batch_size, error, message):
    ring = make_ring(4)
    ring.put(make_item(0, 0))
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        ring.get_batch(batch_size, timeout=0)
    assert check_rows(ring.get_batch(np.int64(1), timeout=5)) == [(0, 0)]
    ring.release()


def test_empty_and_full_rings(make_ring):
    ring = make_ring(2)
    with pytest.raises(WouldBlock, match="^ring is empty$"):
        ring.get_nowait()
    with pytest.raises(Timeout, match=re.escape("timed out after 0.02 s: ring empty (2 slots)")):
        ring.get(timeout=0.02)
    ring.put(make_item(0, 0))
    ring.put(make_item(0, 1))
    with pytest.raises(Timeout, match=re.escape("timed out after 0.02 s: ring full (2 slots)")):
        ring.put(make_item(0, 2), timeout=0.02)
    with pytest.raises(Timeout, match=re.escape("timed out after 0 s: ring full (2 slots)")):
        ring.reserve(timeout=0)
    assert check_item(ring.get_nowait()) == (0, 0)
    ring.release()
    ring.put(make_item(0, 2), timeout=5)
    assert check_rows(ring.get_batch(2, timeout=5)) == [(0, 1), (0, 2)]
    ring.release()


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, error, message",
    [
        ([("obs", (np.uint8, (2,)))], TypeError, "spec must be a dict of name -> (dtype, shape), got list"),
        ({}, ValueError, "spec must name at least one field, got an empty dict"),
        ({1: (np.uint8, ())}, TypeError, "spec field names must be non-empty str, got 1"),
        ({"": (np.uint8, ())}, TypeError, "spec field names must be non-empty str, got ''"),
        ({"x": np.uint8}, TypeError, "spec['x'] must be (dtype, shape), got <class 'numpy.uint8'>"),
        ({"x": (np.uint8, (), 1)}, TypeError, "spec['x'] must be (dtype, shape), got (<class 'numpy.uint8'>, (), 1)"),
        ({"x": ("float3", (2,))}, TypeError, "spec['x'] has an unknown dtype 'float3'"),
        ({"x": (object, (2,))}, TypeError, "spec['x'] dtype must be a fixed-size numeric type, got object"),
        (
            {"x": (np.dtype([("a", object)]), ())},
            TypeError,
            "spec['x'] dtype must be a fixed-size numeric type, got [('a', 'O')]",
        ),
        ({"x": (str, ())}, TypeError, "spec['x'] dtype must be a fixed-size numeric type, got <U0"),
        ({"x": (np.float32, (2, -1))}, ValueError, "spec['x'] shape must be non-negative ints, got (2, -1)"),
        ({"x": (np.float32, -3)}, ValueError, "spec['x'] shape must be non-negative ints, got (-3,)"),
        ({"x": (np.float32, (2.0,))}, TypeError, "spec['x'] shape must be ints, got (2.0,)"),
    ],
    ids=lambda v: None,
)
def test_create_rejects_bad_specs(spec, error, message, multi):
    with pytest.raises(error, match=f"^{re.escape(message)}"):
        TypedRing.create(spec, 4, multi=multi)


@pytest.mark.parametrize(
    "capacity, error, message",
    [
        (0, ValueError, "capacity must be between 1 and 2147483647, got 0"),
        (-4, ValueError, "capacity must be between 1 and 2147483647, got -4"),
        (4.0, TypeError, "capacity must be an int, got float"),
        ("4", TypeError, "capacity must be an int, got str"),
        (True, TypeError, "capacity must be an int, got bool"),
    ],
)
def test_create_rejects_bad_capacities(capacity, error, message, multi):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        TypedRing.create(SPEC, capacity, multi=multi)


def test_create_accepts_int_shapes_and_empty_fields(make_ring):
    ring = make_ring(3, {"v": (np.float64, 3), "none": (np.int32, (2, 0)), "m": ("<i2", (np.int64(2), 2))})
    assert ring.spec == {
        "v": (np.dtype(np.float64), (3,)),
        "none": (np.dtype(np.int32), (2, 0)),
        "m": (np.dtype("<i2"), (2, 2)),
    }
    assert ring.item_bytes == 3 * 8 + 0 + 4 * 2
    ring.put(
        {"v": [1.0, 2.0, 3.0], "none": np.zeros((2, 0), np.int32), "m": np.arange(4, dtype=np.int16).reshape(2, 2)}
    )
    item = ring.get(timeout=5)
    assert (
        item["v"].tolist() == [1.0, 2.0, 3.0]
        and item["none"].shape == (2, 0)
        and item["m"].tolist() == [[0, 1], [2, 3]]
    )
    ring.release()


def _without(f):
    item = make_item(0, 0)
    del item[f]
    return item


def _with(**fields):
    return {**make_item(0, 0), **fields}


@pytest.mark.parametrize(
    "item, error, message",
    [
        ([1, 2], TypeError, "item must be a dict of field -> array, got list"),
        (None, TypeError, "item must be a dict of field -> array, got NoneType"),
        (_without("obs"), ValueError, f"item fields must be {FIELDS}; missing ['obs'], unknown []"),
        (_with(extra=1), ValueError, f"item fields must be {FIELDS}; missing [], unknown ['extra']"),
        ({"extra": 1}, ValueError, f"item fields must be {FIELDS}; missing {list(SPEC)}, unknown ['extra']"),
        (_with(obs=np.zeros((84, 84), np.uint8)), ValueError, "field 'obs' has shape (84, 84), expected (4, 84, 84)"),
        (
            _with(obs=np.zeros((1, 4, 84, 84), np.uint8)),
            ValueError,
            "field 'obs' has shape (1, 4, 84, 84), expected (4, 84, 84)",
        ),
        (_with(logits=0.5), ValueError, "field 'logits' has shape (), expected (18,)"),
        (_with(action=[3]), ValueError, "field 'action' has shape (1,), expected ()"),
        (_with(action=1.5), TypeError, "field 'action' has dtype float64, expected int64 (or one of the same kind)"),
        (
            _with(action=np.float32(1)),
            TypeError,
            "field 'action' has dtype float32, expected int64 (or one of the same kind)",
        ),
        (_with(done=1), TypeError, "field 'done' has dtype int64, expected bool (or one of the same kind)"),
        (
            _with(obs=np.zeros((4, 84, 84))),
            TypeError,
            "field 'obs' has dtype float64, expected uint8 (or one of the same kind)",
        ),
        # signed into unsigned is another kind: a frame of Python ints does not go into uint8
        (
            _with(obs=np.zeros((4, 84, 84), np.int64)),
            TypeError,
            "field 'obs' has dtype int64, expected uint8 (or one of the same kind)",
        ),
        (
            _with(reward=1 + 2j),
            TypeError,
            "field 'reward' has dtype complex128, expected float32 (or one of the same kind)",
        ),
        (_with(reward="1"), TypeError, "field 'reward' has dtype <U1, expected float32 (or one of the same kind)"),
        (_with(logits=torch.zeros(17)), ValueError, "field 'logits' has shape (17,), expected (18,)"),
        (
            _with(logits=torch.zeros(18, dtype=torch.complex64)),
            TypeError,
            "field 'logits' has dtype complex64, expected float32",
        ),
    ],
    ids=lambda v: None,
)
def test_put_rejects_bad_items(make_ring, item, error, message):
    ring = make_ring(2)
    ring.put(make_item(0, 0))
    with pytest.raises(error, match=f"^{re.escape(message)}"):
        ring.put(item, timeout=0)
    s = ring.statistics()
    assert (s.puts, s.size) == (1, 1), "a rejected item claimed or published a slot"
    ring.put(make_item(0, 1), timeout=0)
    assert check_rows(ring.get_batch(2, timeout=5)) == [(0, 0), (0, 1)]
    ring.release()


def test_put_casts_within_a_kind(make_ring):
    """``put`` casts with numpy's ``same_kind`` rule: every safe cast (bool into anything,
    int into float) plus any cast within one kind (int64 into int8, uint64 into uint16,
    float64 into float16) even where the value does not fit: ints wrap, floats round or
    overflow to inf (with numpy's RuntimeWarning). Torch tensors go in like arrays."""
    ring = make_ring(
        4, {"i8": (np.int8, ()), "f16": (np.float16, (2,)), "f64": (np.float64, ()), "u2": (np.uint16, ())}
    )
    with pytest.warns(RuntimeWarning, match="overflow encountered in cast"):  # 70000 into float16
        ring.put({"i8": 300, "f16": [0.1, 70000.0], "f64": np.int64(2**53 + 1), "u2": np.uint64(70000)})
    ring.put(
        {"i8": np.int8(-5), "f16": torch.tensor([1.5, 2.5], dtype=torch.float64), "f64": True, "u2": np.bool_(True)}
    )
    first = {f: v.copy() for f, v in ring.get(timeout=5).items()}
    second = ring.get(timeout=5)
    assert first["i8"] == np.int8(44)  # 300 wraps
    assert first["f16"].tolist() == [np.float16(0.1), np.inf]
    assert first["f64"] == 2.0**53  # rounds to the nearest double
    assert first["u2"] == 70000 % 65536
    assert (second["i8"], second["f16"].tolist(), second["f64"], second["u2"]) == (-5, [1.5, 2.5], 1.0, 1)
    ring.release()


def test_reserve_twice_and_commit_without_reserve(make_ring):
    ring = make_ring(4)
    with pytest.raises(RuntimeError, match=re.escape("commit() without a reserve()")):
        ring.commit()
    fill(ring.reserve(timeout=5), 0, 0)
    with pytest.raises(
        RuntimeError, match=re.escape("reserve() called again before commit() of the previous reservation")
    ):
        ring.reserve(timeout=5)
    with pytest.raises(RuntimeError, match=re.escape("put() called between reserve() and commit()")):
        ring.put(make_item(0, 1), timeout=5)
    ring.commit()
    with pytest.raises(RuntimeError, match=re.escape("commit() without a reserve()")):
        ring.commit()
    ring.put(make_item(0, 1), timeout=5)
    assert check_rows(ring.get_batch(2, timeout=5)) == [(0, 0), (0, 1)]
    ring.release()
    assert ring.statistics().puts == 2


# --- attach, pickle, statistics, close -----------------------------------------------------------


def test_attach_by_name_reaches_the_same_ring(make_ring, multi):
    ring = make_ring(4)
    other = TypedRing.attach(ring.name.lstrip("/"))
    assert (other.name, other.capacity, other.multi, other.spec, other.item_bytes) == (
        ring.name,
        4,
        multi,
        ring.spec,
        ITEM_BYTES,
    )
    assert (
        repr(other)
        == repr(ring)
        == (
            f"TypedRing({ring.name!r}, {'MPMC' if multi else 'SPSC'}, capacity=4, "
            "{obs: uint8[4, 84, 84], action: int64[], reward: float32[], done: bool[], logits: float32[18]})"
        )
    )
    other.put(make_item(3, 0))
    assert check_item(ring.get(timeout=5)) == (3, 0)
    ring.release()


def test_attach_errors_leave_the_rings_usable(make_ring, multi):
    ring = make_ring(4)
    missing = helpers.unique_segment_name("missing")
    with pytest.raises(SegmentError, match=f"^{re.escape(f'no shared-memory segment named {missing!r}')}$"):
        TypedRing.attach(missing)
    byte_ring = (MPMCRing if multi else SPSCRing).create(4, 8)
    try:
        with pytest.raises(
            SegmentError, match=f"^{re.escape(f'segment {byte_ring.name!r} holds a byte ring, not a typed ring')}$"
        ):
            TypedRing.attach(byte_ring.name)
        byte_ring.put(b"still")
        assert bytes(byte_ring.get_bytes(timeout=5)) == b"still"
    finally:
        byte_ring.close()
    same, cross = (MPMCRing, SPSCRing) if multi else (SPSCRing, MPMCRing)
    with pytest.raises(
        SegmentError,
        match=f"^{re.escape(f'segment {ring.name!r} holds a typed ring: attach it with TypedRing.attach')}$",
    ):
        same.attach(ring.name)
    with pytest.raises(
        SegmentError, match=f"^{re.escape(f'segment {ring.name!r} holds a {same.KIND!r}, not a {cross.KIND!r}')}$"
    ):
        cross.attach(ring.name)
    weights = helpers.unique_segment_name("weights")
    seg = Segment.create("weights", {}, 64, name=weights)
    try:
        with pytest.raises(
            SegmentError, match=f"^{re.escape(f'segment {weights!r} holds neither an SPSC nor an MPMC ring')}$"
        ):
            TypedRing.attach(weights)
    finally:
        seg.close()
    ring.put(make_item(0, 0))
    assert check_item(ring.get(timeout=5)) == (0, 0)
    ring.release()


def _put_from_pickle(blob: bytes, writer: int, n: int) -> str:
    ring = pickle.loads(blob)
    for s in range(n):
        ring.put(make_item(writer, s), timeout=30)
    return repr(ring)


def test_pickled_ring_works_in_this_process_and_a_forked_child(make_ring):
    ring = make_ring(8)
    blob = pickle.dumps(ring)
    copy = pickle.loads(blob)
    assert copy is not ring and repr(copy) == repr(ring)
    copy.put(make_item(0, 0))
    assert check_item(ring.get(timeout=5)) == (0, 0)
    ring.release()
    child = Forked(_put_from_pickle, blob, 1, 20, name="pickled writer")
    try:
        got = []
        for _ in range(5):
            got += check_rows(ring.get_batch(4, timeout=30))
            ring.release()
        assert child.result(RESULT_TIMEOUT) == repr(ring)
    finally:
        child.kill()
    assert got == [(1, s) for s in range(20)]
    s = ring.statistics()
    assert (s.puts, s.gets, s.bytes_put, s.bytes_got) == (21, 21, 21 * ITEM_BYTES, 21 * ITEM_BYTES)


def test_statistics_count_item_bytes(make_ring):
    ring = make_ring(4, {"a": (np.float64, (3, 5)), "b": (np.uint8, ()), "c": (np.int16, (7,))})
    item_bytes = 3 * 5 * 8 + 1 + 7 * 2
    assert ring.item_bytes == item_bytes
    for k in range(3):
        ring.put({"a": np.full((3, 5), k, np.float64), "b": np.uint8(k), "c": np.full(7, k, np.int16)})
    fields = ring.reserve(timeout=5)
    fields["b"][...] = 3
    ring.commit()
    s = ring.statistics()
    assert (s.capacity, s.size, s.puts, s.bytes_put, s.gets, s.bytes_got) == (4, 4, 4, 4 * item_bytes, 0, 0)
    assert ring.get_batch(3, timeout=5)["b"].tolist() == [0, 1, 2]
    ring.release()
    s = ring.statistics()
    assert (s.gets, s.bytes_got, s.closed) == (3, 3 * item_bytes, False)


def test_close_drains_then_raises_closed(make_ring):
    ring = make_ring(4)
    for s in range(3):
        ring.put(make_item(0, s))
    ring.close()
    assert ring.closed and ring.statistics().closed
    with pytest.raises(Closed, match="^ring is closed$"):
        ring.put(make_item(0, 3))
    with pytest.raises(Closed, match="^ring is closed$"):
        ring.reserve(timeout=1)
    assert check_rows(ring.get_batch(2, timeout=5)) == [(0, 0), (0, 1)]
    ring.release()
    assert check_item(ring.get(timeout=5)) == (0, 2)
    ring.release()
    with pytest.raises(Closed, match="^ring is closed and drained$"):
        ring.get_batch(1, timeout=5)
    with pytest.raises(Closed, match="^ring is closed and drained$"):
        ring.get_nowait()


def _wait_for_a_batch(ring: TypedRing):
    try:
        batch = ring.get_batch(8, timeout=600)  # no test waits this out: only the close can end it sooner
    except Closed as e:
        return str(e)
    return f"got a batch of {len(batch['action'])}"


def test_close_wakes_a_get_batch_blocked_in_another_process(make_ring):
    ring = make_ring(8)
    for s in range(3):
        ring.put(make_item(0, s))
    child = Forked(_wait_for_a_batch, ring, name="blocked reader")
    try:
        assert helpers.wait_until(lambda: ring.statistics().waits_empty >= 1 or child.ready(), 60), (
            "the reader never waited"
        )
        assert ring.statistics().gets == 3  # it holds the 3 items and waits for 5 more
        ring.close()
        message = child.result(RESULT_TIMEOUT)  # a hang guard, far short of the reader's 600 s timeout
    finally:
        child.kill()
    assert message == "ring is closed and drained"


# --- random call sequences against a deque -----------------------------------------------------

SMALL = {"k": (np.int64, ()), "v": (np.float32, (3,))}
SMALL_BYTES = 8 + 3 * 4
OPS = st.one_of(
    st.tuples(st.just("put"), st.integers(1, 3)),
    st.tuples(st.just("reserve"), st.integers(1, 3)),
    st.tuples(st.just("get"), st.just(0)),
    st.tuples(st.just("batch"), st.integers(1, 6)),
    st.tuples(st.just("release"), st.just(0)),
)
HANG_S = 5.0  # every call below uses timeout 0 and takes microseconds


def _small(seq: int) -> dict[str, np.ndarray]:
    return {"k": np.int64(seq), "v": seq + np.array([0.0, 0.25, 0.5], np.float32)}


def _seqs(out: dict) -> list[int]:
    k = np.atleast_1d(np.asarray(out["k"]))
    v = np.asarray(out["v"]).reshape(len(k), 3)
    assert (v == k[:, None].astype(np.float32) + np.array([0.0, 0.25, 0.5], np.float32)).all(), "torn item"
    return k.tolist()


def _run_against_deque(multi: bool, capacity: int, ops: list[tuple[str, int]]) -> None:
    """Model: ``queue`` the items in the ring not yet taken, ``held`` what was handed out
    and not released (with the arrays handed out, which must not change until release),
    ``kept`` what a timed-out ``get_batch`` took (in its slots on SPSC, copied out on MPMC). Every call uses timeout 0, so the model
    says exactly when it must succeed."""
    helpers.child_log(f"{helpers.LOG_MARK} TypedRing.create(SMALL, {capacity}, multi={multi})")
    ring = TypedRing.create(SMALL, capacity, multi=multi)
    queue: collections.deque[int] = collections.deque()
    held: list[tuple[dict, list[int]]] = []
    kept: list[int] = []
    private: set[int] = set()  # MPMC: items handed out of a timed-out batch's copy, in no slot
    next_seq = puts = gets = 0
    try:
        for op, n in ops:
            helpers.child_log(f"{op} {n}")
            # A slot is busy while its item is queued, handed out and not released, or kept
            # by a timed-out get_batch on an SPSC ring (on MPMC the batch copied it out and
            # freed the slot before it waited). Item ``seq`` goes in the slot of item
            # ``seq - capacity``: the ring is full while that one's slot is busy.
            busy = set(queue) | ({q for _, s in held for q in s} - private) | (set() if multi else set(kept))
            if op in ("put", "reserve"):
                for _ in range(n):
                    if next_seq - capacity in busy:
                        with pytest.raises(
                            Timeout, match=re.escape(f"timed out after 0 s: ring full ({capacity} slots)")
                        ):
                            if op == "put":
                                ring.put(_small(next_seq), timeout=0)
                            else:
                                ring.reserve(timeout=0)
                        break
                    if op == "put":
                        ring.put(_small(next_seq), timeout=0)
                    else:
                        slot = ring.reserve(timeout=0)
                        for f, value in _small(next_seq).items():
                            slot[f][...] = value
                        ring.commit()
                    queue.append(next_seq)
                    busy.add(next_seq)
                    next_seq += 1
                    puts += 1
            elif op == "get" and kept:
                item = ring.get_nowait()  # the items a timed-out get_batch kept come first
                want = [kept.pop(0)]
                if multi:
                    private.update(want)
                assert _seqs(item) == want
                held.append((item, want))
            elif op == "get":
                if not queue:
                    with pytest.raises(WouldBlock, match="^ring is empty$"):
                        ring.get_nowait()
                    continue
                item = ring.get_nowait()
                want = [queue.popleft()]
                assert _seqs(item) == want
                held.append((item, want))
                gets += 1
            elif op == "batch" and n <= capacity:
                have = len(kept) + len(queue)
                if have < n:
                    message = f"get_batch timed out after 0 s with {have} of {n} items (kept for the next call)"
                    with pytest.raises(Timeout, match=re.escape(message)):
                        ring.get_batch(n, timeout=0)
                    gets += len(queue)
                    kept += queue
                    queue.clear()
                    continue
                batch = ring.get_batch(n, timeout=0)
                taken = [queue.popleft() for _ in range(max(0, n - len(kept)))]
                gets += len(taken)
                if multi:
                    private.update(kept[:n])
                want, kept = (kept + taken)[:n], kept[n:]
                assert _seqs(batch) == want
                held.append((batch, want))
            elif op == "release":
                for out, want in held:
                    assert _seqs(out) == want, "an item changed before its release"
                ring.release()
                held.clear()
        helpers.child_log("statistics")
        s = ring.statistics()
        assert (s.puts, s.gets, s.bytes_put, s.bytes_got) == (puts, gets, puts * SMALL_BYTES, gets * SMALL_BYTES)
        unreleased = len(queue) + sum(len(s) for _, s in held) + len(kept)
        assert s.size == (len(queue) if multi else unreleased)  # MPMC: not yet taken; SPSC: not yet released
    finally:
        helpers.child_log("release, close")
        ring.release()
        ring.close()
        helpers.child_log("closed")


def _deque_property(multi: bool) -> None:
    @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(capacity=st.integers(1, 6), ops=st.lists(OPS, max_size=80))
    def prop(capacity, ops):
        _run_against_deque(multi, capacity, ops)

    prop()


def test_matches_a_deque(multi):
    """Random call sequences, in a forked child: a call that never returns (a loop in
    compiled code, which no signal interrupts) fails the test with the example's steps."""
    helpers.run_forked(_deque_property, multi, timeout=120, stall=HANG_S)


def _hold_every_slot_then_take(multi: bool) -> list[str]:
    ring = TypedRing.create(SMALL, 2, multi=multi)
    try:
        ring.put(_small(0))
        ring.put(_small(1))
        assert _seqs(ring.get_batch(2, timeout=0)) == [0, 1]
        out = []
        helpers.child_log("get_nowait")
        with pytest.raises(WouldBlock) as e:
            ring.get_nowait()
        out.append(str(e.value))
        helpers.child_log("get(timeout=0.05)")
        with pytest.raises(Timeout) as e:
            ring.get(timeout=0.05)
        out.append(str(e.value))
        helpers.child_log("get_batch(1, timeout=0.05)")
        with pytest.raises(Timeout) as e:
            ring.get_batch(1, timeout=0.05)
        out.append(str(e.value))
        ring.release()
        ring.put(_small(2))
        assert _seqs(ring.get_batch(1, timeout=0)) == [2]
        return out
    finally:
        ring.release()
        ring.close()


def test_taking_from_an_empty_ring_while_holding_every_slot(multi):
    """A learner that holds a whole ring's worth of items (say ``get_batch(capacity)``)
    and asks for more must be told the ring is empty, not spin in compiled code."""
    assert helpers.run_forked(_hold_every_slot_then_take, multi, timeout=10, stall=2.0) == [
        "ring is empty",
        "get timed out after 0.05 s: ring empty (2 slots)",
        "get_batch timed out after 0.05 s with 0 of 1 items (kept for the next call)",
    ]


# --- other processes ---------------------------------------------------------------------------


def _write(ring: TypedRing, writer: int, n: int) -> int:
    """Fill steps 0..n-1 of ``writer`` in place, one reserved slot at a time."""
    for seq in range(n):
        fill(ring.reserve(timeout=30), writer, seq)
        ring.commit()
    return n


def _read_all(ring: TypedRing, total: int, b: int, writers: list[Forked]) -> dict[int, list[int]]:
    """Every item, by get_batch(b); the sequence numbers of each writer in arrival order."""
    seen: dict[int, list[int]] = collections.defaultdict(list)
    for _ in range(total // b):
        try:
            batch = ring.get_batch(b, timeout=20)
        except Timeout:
            for w in writers:
                if w.ready():
                    w.result(1)  # raises with the writer's traceback
            raise
        for writer, seq in check_rows(batch):
            seen[writer].append(seq)
        ring.release()
    return seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize("run", range(3))
def test_writers_in_other_processes_fill_slots_in_place(multi, run):
    n_writers, n = (2, 2000) if multi else (1, 2000)
    ring = TypedRing.create(SPEC, 20, multi=multi)  # 20 slots, batches of 8: views and gathers
    writers: list[Forked] = []
    try:
        writers = [Forked(_write, ring, w, n, name=f"writer {w}") for w in range(n_writers)]
        seen = _read_all(ring, n_writers * n, 8, writers)
        assert [w.result(RESULT_TIMEOUT) for w in writers] == [n] * n_writers
        stats = ring.statistics()
    finally:
        for w in writers:
            w.kill()
        ring.close()
    for w in range(n_writers):
        assert seen[w] == list(range(n)), f"writer {w}: {len(seen[w])} items, not 0..{n - 1} in order"
    total = n_writers * n
    assert (stats.puts, stats.gets, stats.size, stats.dead_claims_skipped) == (total, total, 0, 0)
    assert (stats.bytes_put, stats.bytes_got) == (total * ITEM_BYTES, total * ITEM_BYTES)


def _write_then_die_mid_item(ring: TypedRing, writer: int, n: int, conn) -> None:
    """Put steps 0..n-1, then reserve a slot for step n, half-write it, tell the test
    through ``conn`` and sleep until SIGKILLed."""
    for seq in range(n):
        ring.put(make_item(writer, seq), timeout=30)
    slot = ring.reserve(timeout=30)
    fill(slot, writer, n)
    slot["obs"][:2] = 255  # torn, were it ever delivered
    conn.send("reserved")
    time.sleep(120)


@pytest.mark.timeout(120)
def test_writer_killed_between_reserve_and_commit_costs_one_item():
    capacity, b, n_victim, n_live = 16, 8, 3, 205
    ring = TypedRing.create(SPEC, capacity, multi=True)
    signal_r, signal_w = FORK.Pipe(duplex=False)
    with forked_children(ring, signal_r) as children:
        victim = Forked(_write_then_die_mid_item, ring, 0, n_victim, signal_w, name="victim writer")
        children.append(victim)
        signal_w.close()
        assert signal_r.poll(30), "the victim never reserved"
        try:
            assert signal_r.recv() == "reserved"
        except EOFError:
            victim.result(10)
            raise
        live = Forked(_write, ring, 1, n_live, name="live writer")
        children.append(live)
        # The live writer fills every slot behind the claim (positions 4..15), then waits.
        assert helpers.wait_until(lambda: ring.statistics().puts >= capacity - 1 or live.ready(), 60), (
            "the live writer stalled"
        )
        if live.ready():
            live.result(1)  # raises with the live writer's traceback
            raise AssertionError("the live writer finished before the reader took anything")
        with pytest.raises(
            Timeout,
            match=re.escape(f"get_batch timed out after 0.3 s with {n_victim} of {b} items (kept for the next call)"),
        ):
            ring.get_batch(b, timeout=0.3)  # stuck behind the live victim's claim
        victim.kill()
        seen: dict[int, list[int]] = collections.defaultdict(list)
        for _ in range((n_victim + n_live) // b):
            # only skipping the dead claim lets these through; 60 s is a hang guard (it takes ~50 ms)
            batch = ring.get_batch(b, timeout=60)
            for writer, seq in check_rows(batch):
                seen[writer].append(seq)
            ring.release()
        assert live.result(RESULT_TIMEOUT) == n_live
        stats = ring.statistics()
    assert seen[0] == list(range(n_victim)), "the victim's committed items, and not its claimed one"
    assert seen[1] == list(range(n_live))
    total = n_victim + n_live
    assert (stats.puts, stats.gets, stats.size, stats.dead_claims_skipped) == (total, total, 0, 1)
