"""Waiting and full/empty: timeouts and their messages, bad timeouts, *_nowait, slots
held by views and copies, close (from this process and another) with puts refused and
gets draining first, and the statistics that count calls that had to wait."""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import threading
import time

import helpers
import pytest
from helpers.ring_workers import drain, fill, make_ring, ring_cls  # noqa: F401 - fixtures

from shmpad.errors import Closed, Timeout, WouldBlock
from shmpad.ringbuf import MPMCRing, blocking
from shmpad.ringbuf.control import EV_NOT_EMPTY, HEAD

SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}[platform.machine().lower()]


# --- timeouts -------------------------------------------------------------------------------


def _waiting_calls(ring):
    """Calls that have to wait on ``ring`` (which is empty, or full after ``fill``)."""
    return {
        "get": lambda t: ring.get(timeout=t),
        "get_bytes": lambda t: ring.get_bytes(timeout=t),
        "get_many": lambda t: ring.get_many(2, timeout=t),
        "get_into": lambda t: ring.get_into(bytearray(ring.slot_size), timeout=t),
        "put": lambda t: ring.put(b"x", timeout=t),
        "reserve": lambda t: ring.reserve(1, timeout=t),
        "put_many": lambda t: ring.put_many([b"x"], timeout=t),
    }


@pytest.mark.parametrize("op", ["get", "get_bytes", "get_many", "get_into", "put", "reserve", "put_many"])
@pytest.mark.parametrize(
    "timeout, error, message",
    [
        (-1, ValueError, r"^timeout must be a finite number of seconds >= 0 or None, got -1$"),
        (-0.5, ValueError, r"^timeout must be a finite number of seconds >= 0 or None, got -0.5$"),
        (math.nan, ValueError, r"^timeout must be a finite number of seconds >= 0 or None, got nan$"),
        ("x", TypeError, r"^timeout must be a number of seconds or None, got str$"),
        (True, TypeError, r"^timeout must be a number of seconds or None, got bool$"),
    ],
)
def test_a_call_that_has_to_wait_rejects_a_bad_timeout(make_ring, op, timeout, error, message):
    ring = make_ring()
    if op in ("put", "reserve", "put_many"):
        fill(ring)
    with pytest.raises(error, match=message):
        _waiting_calls(ring)[op](timeout)
    assert ring.statistics().waits_full + ring.statistics().waits_empty == 0


@pytest.mark.parametrize("op", ["get", "get_bytes", "get_many", "get_into", "put", "reserve", "put_many"])
def test_a_call_that_cannot_proceed_times_out_after_its_timeout(make_ring, op):
    ring = make_ring()
    full = op in ("put", "reserve", "put_many")
    if full:
        fill(ring)
    if op == "put_many":
        message = r"^put_many timed out after 0.1 s with 0 of 1 messages put$"
    else:
        message = rf"^{op} timed out after 0.1 s: ring {'full' if full else 'empty'} \(4 slots\)$"
    start = time.monotonic()
    with pytest.raises(Timeout, match=message):
        _waiting_calls(ring)[op](0.1)
    waited = time.monotonic() - start
    assert 0.1 <= waited < 60, waited  # not before its timeout; 60 s: a hang guard
    s = ring.statistics()
    assert (s.waits_full, s.waits_empty) == ((1, 0) if full else (0, 1))
    assert isinstance(Timeout("x"), TimeoutError)


def test_put_many_that_times_out_says_how_many_it_put(make_ring):
    ring = make_ring()
    ring.put(b"a")
    ring.put(b"b")
    with pytest.raises(Timeout, match=r"^put_many timed out after 0 s with 2 of 5 messages put$"):
        ring.put_many([b"1", b"2", b"3", b"4", b"5"], timeout=0)
    assert drain(ring) == [b"a", b"b", b"1", b"2"]


# --- full and empty ------------------------------------------------------------------------


def test_nowait_calls_raise_would_block(make_ring):
    ring = make_ring(capacity=2)
    for get in (ring.get_nowait, ring.get_bytes_nowait, lambda: ring.get_many_nowait(2)):
        with pytest.raises(WouldBlock, match=r"^ring is empty$"):
            get()
    fill(ring)
    with pytest.raises(WouldBlock, match=r"^ring is full \(2 messages\)$"):
        ring.put_nowait(b"x")
    s = ring.statistics()
    assert (s.waits_full, s.waits_empty, s.puts) == (0, 0, 2)


def test_get_into_that_times_out_says_so_even_while_views_are_held(make_ring):
    ring = make_ring()
    ring.put(b"a")
    view = ring.get()
    with pytest.raises(Timeout, match=r"^get_into timed out after 0.05 s: ring empty \(4 slots\)$"):
        ring.get_into(bytearray(8), timeout=0.05)
    assert bytes(view) == b"a"
    ring.release()


def test_every_copying_get_frees_its_slots_by_release(make_ring):
    """SPSC get_bytes reads ahead (a run of up to a quarter of the ring, freed as its last
    message goes); release() hands back the rest and frees what was handed out."""
    ring = make_ring(capacity=8)
    fill(ring)
    out = bytearray(8)
    assert ring.get_bytes() == b"\x00"
    assert ring.get_into(out) == 1 and out[:1] == b"\x01"
    assert ring.get_bytes_nowait() == b"\x02"
    assert ring.get_bytes() == b"\x03"
    ring.release()
    s = ring.statistics()
    assert (s.gets, s.bytes_got, s.size) == (4, 4, 4)
    for m in (b"w", b"x", b"y", b"z"):
        ring.put_nowait(m)
    assert drain(ring) == [bytes([i]) for i in range(4, 8)] + [b"w", b"x", b"y", b"z"]
    assert ring.statistics().gets == ring.statistics().puts == 12


def test_held_views_keep_their_slots_until_release(make_ring):
    ring = make_ring(capacity=2)
    fill(ring)
    first, second = ring.get(), ring.get()
    with pytest.raises(WouldBlock):
        ring.put_nowait(b"x")
    assert (bytes(first), bytes(second)) == (b"\x00", b"\x01")
    ring.release()
    ring.put_nowait(b"y")
    ring.put_nowait(b"z")
    assert drain(ring) == [b"y", b"z"]


def test_views_are_read_only(make_ring):
    ring = make_ring()
    ring.put_many([b"ab", b"cd"])
    view = ring.get()
    with pytest.raises(TypeError):
        view[0] = 1
    batch = ring.get_many(1)
    assert not batch.rows.flags.writeable
    with pytest.raises(ValueError):
        batch.rows[0, 0] = 1
    with pytest.raises(TypeError):
        batch[0][0] = 1
    assert (bytes(view), batch.to_bytes()) == (b"ab", [b"cd"])
    ring.release()


# --- close ---------------------------------------------------------------------------------


def test_close_rejects_puts_and_lets_gets_drain_first(make_ring):
    ring = make_ring()
    ring.put_many([b"a", b"b", b"c"])
    ring.close()
    ring.close()  # idempotent
    assert ring.closed and ring.statistics().closed
    with pytest.raises(Closed, match=r"^ring is closed$"):
        ring.put(b"x")
    with pytest.raises(Closed, match=r"^ring is closed$"):
        ring.put_nowait(b"x")
    with pytest.raises(Closed, match=r"^ring is closed$"):
        ring.reserve(1)
    with pytest.raises(Closed, match=r"^ring is closed; put_many put 0 of 2 messages$"):
        ring.put_many([b"x", b"y"])
    assert ring.get_bytes() == b"a"
    assert bytes(ring.get(timeout=1)) == b"b"
    assert ring.get_many(5).to_bytes() == [b"c"]
    ring.release()
    for get in (
        ring.get,
        ring.get_bytes,
        lambda: ring.get_many(1),
        lambda: ring.get_into(bytearray(8)),
        ring.get_nowait,
        ring.get_bytes_nowait,
        lambda: ring.get_many_nowait(1),
    ):
        with pytest.raises(Closed, match=r"^ring is closed and drained$"):
            get()
    assert ring.statistics().puts == 3


def test_a_reservation_open_at_close_can_still_be_committed_and_drained(make_ring):
    ring = make_ring()
    ring.reserve(3)[:] = b"lat"
    ring.close()
    ring.commit()
    assert ring.get_bytes(timeout=1) == b"lat"
    with pytest.raises(Closed):
        ring.get_bytes(timeout=1)


def _blocked_call(ring, op: str):
    """Block in ``op`` (with a timeout no test waits out) until something ends it; its outcome."""
    try:
        if op == "get":
            ring.get(timeout=600)
        elif op == "get_many":
            ring.get_many(4, timeout=600)
        elif op == "put":
            ring.put(b"x", timeout=600)
        else:
            ring.put_many([b"x", b"y"], timeout=600)
    except Closed as e:
        return f"Closed: {e}"
    return "returned"


@pytest.mark.parametrize(
    "op, message",
    [
        ("get", "ring is closed and drained"),
        ("get_many", "ring is closed and drained"),
        ("put", "ring is closed"),
        ("put_many", "ring is closed; put_many put 0 of 2 messages"),
    ],
)
def test_close_from_another_process_wakes_a_blocked_call(make_ring, op, message):
    ring = make_ring()
    full = op.startswith("put")
    if full:
        fill(ring)
    child = helpers.Forked(_blocked_call, ring, op)
    try:
        counter = "waits_full" if full else "waits_empty"
        assert helpers.wait_until(lambda: getattr(ring.statistics(), counter) == 1, 60), f"{op} never waited"
        assert helpers.wait_until(lambda: helpers.current_syscall(child.pid) == SYS_FUTEX, 60), "never slept"
        ring.close()
        outcome = child.result(60)  # hang guard: only the close can end a 600 s wait this soon
    finally:
        child.kill()
    assert outcome == f"Closed: {message}"


# --- statistics ------------------------------------------------------------------------------


def _put_when_waited_on(ring, counter: str) -> None:
    assert helpers.wait_until(lambda: getattr(ring.statistics(), counter) >= 1, 60)
    ring.put(b"late", timeout=10)


def _get_when_waited_on(ring, counter: str) -> bytes:
    assert helpers.wait_until(lambda: getattr(ring.statistics(), counter) >= 1, 60)
    return ring.get_bytes(timeout=10)


def test_statistics_count_calls_that_had_to_wait(make_ring):
    ring = make_ring(capacity=2)
    helper = helpers.Forked(_put_when_waited_on, ring, "waits_empty")
    try:
        assert bytes(ring.get(timeout=10)) == b"late"  # waits until the helper puts
        ring.release()
        helper.result(10)
    finally:
        helper.kill()
    assert ring.statistics().waits_empty == 1
    assert ring.statistics().waits_full == 0

    fill(ring)
    helper = helpers.Forked(_get_when_waited_on, ring, "waits_full")
    try:
        ring.put(b"more", timeout=10)  # waits until the helper takes one
        assert helper.result(10) == b"\x00"
    finally:
        helper.kill()
    s = ring.statistics()
    assert (s.waits_full, s.waits_empty, s.puts, s.gets, s.size) == (1, 1, 4, 2, 2)


def test_statistics_are_a_frozen_snapshot(make_ring):
    ring = make_ring()
    s = ring.statistics()
    assert s == type(s)(
        capacity=4,
        size=0,
        puts=0,
        gets=0,
        bytes_put=0,
        bytes_got=0,
        waits_full=0,
        waits_empty=0,
        dead_claims_skipped=0,
        closed=False,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.puts = 1
    ring.put(b"abc")
    assert s.puts == 0 and ring.statistics().puts == 1


# --- the adaptive spin ----------------------------------------------------------------------


def test_a_wait_says_whether_its_spin_or_its_sleep_saw_the_change(make_ring):
    ring = make_ring()
    ctl, head = ring._ctl, int(ring._ctl[HEAD])
    assert blocking._wait_change(ctl, HEAD, head + 1, EV_NOT_EMPTY, 10, 10**9) == blocking.SPUN
    # no spin: the re-check after announcing the sleeper sees it, without sleeping
    assert blocking._wait_change(ctl, HEAD, head + 1, EV_NOT_EMPTY, 0, 10**9) == blocking.SLEPT
    assert blocking._wait_change(ctl, HEAD, head, EV_NOT_EMPTY, 10, 10**6) == blocking.UNCHANGED


def test_the_spin_budget_doubles_after_a_short_wait_and_halves_after_a_long_one_within_its_bounds():
    spin, quick, slow = blocking.SPIN, blocking.QUICK_NS - 1, blocking.QUICK_NS
    assert blocking.next_spin(spin // 2, blocking.SPUN, slow) == spin  # spun: however long it took
    assert blocking.next_spin(spin // 2, blocking.SLEPT, quick) == spin  # slept, but a spin would have done
    for seen in (blocking.SLEPT, blocking.UNCHANGED):
        assert blocking.next_spin(spin, seen, slow) == spin // 2
    assert blocking.next_spin(spin, blocking.SPUN, quick) == spin
    assert blocking.next_spin(blocking.SPIN_MIN, blocking.SLEPT, slow) == blocking.SPIN_MIN
    budgets = [spin]
    while budgets[-1] > blocking.SPIN_MIN:
        budgets.append(blocking.next_spin(budgets[-1], blocking.SLEPT, slow))
    assert len(budgets) < 12  # a handle whose peers are off the CPU stops spinning within a few waits
    while budgets[-1] < blocking.SPIN:
        budgets.append(blocking.next_spin(budgets[-1], blocking.SPUN, quick))
    assert budgets[-1] == blocking.SPIN


def test_waits_that_time_out_bring_a_handle_to_its_least_spin(make_ring):
    ring = make_ring()
    assert ring._spin == blocking.SPIN
    for _ in range(12):
        with pytest.raises(Timeout):
            ring.get_bytes(timeout=0.001)
    assert ring._spin == blocking.SPIN_MIN


# --- a producer stalled by a held view, made visible ----------------------------------------------


def test_statistics_name_the_consumer_whose_held_view_a_waiting_producer_needs(make_ring, ring_cls):
    ring = make_ring(capacity=4, slot_size=8)
    fill(ring)
    view = ring.get()  # the oldest message, in the slot the next put needs
    if ring_cls is MPMCRing:
        drain(ring)  # another consumer's work: the ring is empty, and still the put cannot go ahead
    stats = ring.statistics()
    assert (stats.producers_waiting, stats.next_slot_held_by) == (0, os.getpid())
    producer = ring_cls.attach(ring.name)
    putting = threading.Thread(target=producer.put, args=(b"next",), kwargs={"timeout": 60.0})
    putting.start()
    try:
        assert helpers.wait_until(lambda: ring.statistics().producers_waiting == 1, 60.0), ring.statistics()
        stats = ring.statistics()
        assert stats.next_slot_held_by == os.getpid()
        assert stats.size == (0 if ring_cls is MPMCRing else 4)
        assert bytes(view) == b"\x00"
    finally:
        ring.release()
        putting.join(60.0)
    assert not putting.is_alive()
    stats = ring.statistics()
    assert (stats.producers_waiting, stats.next_slot_held_by) == (0, 0)
