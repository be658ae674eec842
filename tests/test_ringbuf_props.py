"""Property tests of the byte rings against a model built on ``collections.deque``.

One process, random sequences of every producing and consuming call, capacities of 1
to 8 so that wrap-around, full and empty happen all the time. The model knows which
slots views still hold, so it says exactly when a call must raise ``WouldBlock`` (or
time out), and what ``statistics()`` must count.

A ring bug can be a loop in compiled code, which no signal or thread interrupts; so
each property runs in a forked child that logs every call it makes, and a child that
stops making progress is killed and the steps of the example that hung are shown,
rather than the test session hanging.
"""

from __future__ import annotations

import collections

import helpers
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from shmpad.errors import Closed, Timeout, WouldBlock
from shmpad.ringbuf import MPMCRing, SPSCRing

RINGS = [SPSCRing, MPMCRing]
HANG_S = 5.0  # one in-process ring call takes microseconds; this long means it never returns
EXAMPLES = 150
STEPS = 60


class RingMachine(RuleBasedStateMachine):
    """Model: every position ever claimed for writing, in order, with its message and state:
    ``reserved`` (MPMC claims the slot at reserve; SPSC only at commit), ``ready``,
    ``taken`` (by a view, by a copy made while SPSC views are held, or by an SPSC
    ``get_bytes`` run read ahead) and ``released``. ``queue`` holds the positions not
    taken yet, oldest first."""

    RING: type = SPSCRing

    @initialize(capacity=st.integers(1, 8) | st.just(8), slot_size=st.integers(1, 80))
    def create(self, capacity, slot_size):
        self.mpmc = self.RING is MPMCRing
        self.ring = self.RING.create(capacity, slot_size)
        helpers.child_log(f"{helpers.LOG_MARK} {self.RING.__name__}.create({capacity}, {slot_size})")
        self.capacity = capacity
        self.slot_size = slot_size
        self.messages: list[bytes | None] = []
        self.state: list[str] = []
        self.queue: collections.deque[int] = collections.deque()
        self.held: list[tuple[object, list[int]]] = []  # (view, batch or None for a copy; positions)
        self.reservation = None  # (view, data written, position or None)
        self.run: list[int] = []  # SPSC get_bytes: positions read ahead, not handed out yet
        self.run_out: list[int] = []  # and those of the run handed out, freed with the last
        self.closed = False
        self.stats = collections.Counter()

    def teardown(self):
        ring = getattr(self, "ring", None)
        if ring is not None:
            self.held.clear()
            self.reservation = None
            ring.release()
            ring.close()

    # -- the model ---------------------------------------------------------------------

    @property
    def head(self) -> int:
        return len(self.messages)

    def can_claim(self) -> bool:
        """A slot is free for the next position: the message a lap before it was released."""
        return self.head < self.capacity or self.state[self.head - self.capacity] == "released"

    def write_outcome(self) -> str:
        if self.closed:
            return "closed"
        return "ok" if self.can_claim() else "block"

    def read_outcome(self) -> str:
        if self.queue:
            return "ok" if self.state[self.queue[0]] == "ready" else "block"  # MPMC: reserved at tail
        return "closed" if self.closed else "block"

    def publish(self, data: bytes) -> None:
        self.messages.append(data)
        self.state.append("ready")
        self.queue.append(self.head - 1)
        self.stats["puts"] += 1
        self.stats["bytes_put"] += len(data)

    def take(self) -> int:
        p = self.queue.popleft()
        self.state[p] = "taken"
        self.stats["gets"] += 1
        self.stats["bytes_got"] += len(self.messages[p])
        return p

    def call(self, what: str, fn, *args, **kwargs):
        if what != "statistics()":
            helpers.child_log(what)
        return fn(*args, **kwargs)

    def expect_blocked(self, what: str, fn, op: str, timeout, full: bool) -> None:
        """``fn`` (the call ``op``) must fail at once: ``WouldBlock`` if it is a *_nowait call
        (``timeout`` None), else ``Timeout`` after a wait of 0 s, counted in the statistics."""
        if timeout is None:
            expected = rf"^ring is full \({self.capacity} messages\)$" if full else r"^ring is empty$"
            with pytest.raises(WouldBlock, match=expected):
                self.call(what, fn)
            return
        state = "full" if full else "empty"
        with pytest.raises(
            Timeout, match=rf"^{op} timed out after {timeout} s: ring {state} \({self.capacity} slots\)$"
        ):
            self.call(what, fn)
        self.stats["waits_full" if full else "waits_empty"] += 1

    def unneeded_timeout(self, data) -> float | None:
        """A timeout for a call that the model says will not wait."""
        return data.draw(st.sampled_from([None, 0, 0.0, 5]))

    # -- producing ---------------------------------------------------------------------

    def puts_allowed(self) -> bool:
        # SPSC: a put while this handle has a reservation open writes into the reserved slot
        # (test_ringbuf_rings.py::test_put_while_a_reservation_is_open_does_not_corrupt_messages).
        return self.mpmc or self.reservation is None

    @precondition(lambda self: self.puts_allowed())
    @rule(data=st.data(), nowait=st.booleans())
    def put(self, data, nowait):
        msg = data.draw(st.binary(max_size=self.slot_size))
        outcome = self.write_outcome()
        if nowait:
            what, fn = f"put_nowait(<{len(msg)} bytes>)", lambda: self.ring.put_nowait(msg)
            timeout = None
        else:
            timeout = self.unneeded_timeout(data) if outcome != "block" else data.draw(st.sampled_from([0, 0.0]))
            what, fn = f"put(<{len(msg)} bytes>, timeout={timeout})", lambda: self.ring.put(msg, timeout=timeout)
        if outcome == "closed":
            with pytest.raises(Closed, match=r"^ring is closed$"):
                self.call(what, fn)
        elif outcome == "block":
            self.expect_blocked(what, fn, "put", timeout, full=True)
        else:
            self.call(what, fn)
            self.publish(msg)

    @precondition(lambda self: self.puts_allowed())
    @rule(data=st.data(), as_array=st.booleans(), k=st.integers(0, 10))
    def put_many(self, data, as_array, k):
        if as_array:
            n = data.draw(st.integers(0, self.slot_size))
            rows = np.frombuffer(data.draw(st.binary(min_size=k * n, max_size=k * n)), np.uint8).reshape(k, n)
            msgs = [r.tobytes() for r in rows]
            arg = rows
        else:
            msgs = data.draw(st.lists(st.binary(max_size=self.slot_size), min_size=k, max_size=k))
            arg = data.draw(st.sampled_from([list, tuple]))(msgs)
        what = f"put_many({type(arg).__name__} of lengths {[len(m) for m in msgs]}, timeout=0)"
        if self.closed and k:
            with pytest.raises(Closed, match=rf"^ring is closed; put_many put 0 of {k} messages$"):
                self.call(what, self.ring.put_many, arg, timeout=0)
            return
        fits = []
        for msg in msgs:
            if not self.can_claim():
                break
            self.publish(msg)
            fits.append(msg)
        if len(fits) == k:
            self.call(what, self.ring.put_many, arg, timeout=0)
        else:
            self.stats["waits_full"] += 1
            with pytest.raises(Timeout, match=rf"^put_many timed out after 0 s with {len(fits)} of {k} messages put$"):
                self.call(what, self.ring.put_many, arg, timeout=0)

    @precondition(lambda self: self.reservation is None)
    @rule(data=st.data())
    def reserve(self, data):
        n = data.draw(st.integers(0, self.slot_size))
        outcome = self.write_outcome()
        timeout = self.unneeded_timeout(data) if outcome != "block" else 0
        what = f"reserve({n}, timeout={timeout})"
        if outcome == "closed":
            with pytest.raises(Closed, match=r"^ring is closed$"):
                self.call(what, self.ring.reserve, n, timeout=timeout)
        elif outcome == "block":
            self.expect_blocked(what, lambda: self.ring.reserve(n, timeout=timeout), "reserve", timeout, full=True)
        else:
            view = self.call(what, self.ring.reserve, n, timeout=timeout)
            assert len(view) == n and not view.readonly
            payload = data.draw(st.binary(min_size=n, max_size=n))
            view[:] = payload
            position = None
            if self.mpmc:  # the slot is claimed now, in FIFO order
                position = self.head
                self.messages.append(None)
                self.state.append("reserved")
                self.queue.append(position)
            self.reservation = (view, payload, position)

    @precondition(lambda self: self.reservation is not None)
    @rule(data=st.data())
    def commit(self, data):
        view, payload, position = self.reservation
        n = data.draw(st.none() | st.integers(0, len(payload)))
        self.call(f"commit({n})", self.ring.commit, n)
        self.reservation = None
        msg = payload if n is None else payload[:n]
        if position is None:
            self.publish(msg)
        else:
            self.messages[position] = msg
            self.state[position] = "ready"
            self.stats["puts"] += 1
            self.stats["bytes_put"] += len(msg)

    @precondition(lambda self: self.reservation is not None)
    @rule()
    def reserve_twice(self):
        with pytest.raises(
            RuntimeError, match=r"^reserve\(\) called again before commit\(\) of the previous reservation$"
        ):
            self.call("reserve(0) again", self.ring.reserve, 0)

    @precondition(lambda self: self.reservation is None)
    @rule()
    def commit_without_reserve(self):
        with pytest.raises(RuntimeError, match=r"^commit\(\) without a reserve\(\)$"):
            self.call("commit() without reserve", self.ring.commit)

    # -- consuming ---------------------------------------------------------------------

    def drop_run(self) -> None:
        """SPSC ``get_bytes`` reads ahead: a run of messages taken at once and handed out
        one per call, whose slots are freed as the last goes. Any other consumer call
        first hands back what is left of the run and frees what was handed out."""
        for p in reversed(self.run):
            self.state[p] = "ready"
            self.queue.appendleft(p)
            self.stats["gets"] -= 1
            self.stats["bytes_got"] -= len(self.messages[p])
        for p in self.run_out:
            self.state[p] = "released"
        self.run, self.run_out = [], []

    def read_ahead(self, what: str, call) -> bytes:
        """An SPSC ``get_bytes`` with nothing held and no run left: it takes a run of 1 to
        (a quarter of the ring) messages in consecutive slots; the statistics say how many."""
        before = self.ring.statistics().gets
        got = self.call(what, call)
        k = self.ring.statistics().gets - before
        ready = 0
        while ready < len(self.queue) and self.state[self.queue[ready]] == "ready":
            ready += 1
        most = min(ready, max(1, self.capacity // 4), self.capacity - self.queue[0] % self.capacity)
        assert 1 <= k <= most, f"get_bytes read ahead {k} messages, expected 1..{most}"
        self.run = [self.take() for _ in range(k)]
        return got

    def copy_taken(self, p: int) -> None:
        """Position ``p`` was taken by a copying get (not a read-ahead)."""
        if self.held and not self.mpmc:
            self.held.append((None, [p]))  # SPSC frees slots in order: with the views before it
        else:
            self.state[p] = "released"

    @rule(data=st.data(), how=st.sampled_from(["get", "get_nowait", "get_bytes", "get_bytes_nowait", "get_into"]))
    def get(self, data, how):
        if self.run and how == "get_bytes":  # hand out the next message of the run
            got = self.call("get_bytes()", self.ring.get_bytes)
            p = self.run.pop(0)
            assert got == self.messages[p], f"position {p}"
            self.run_out.append(p)
            if not self.run:
                self.drop_run()
            return
        self.drop_run()
        reads_ahead = how == "get_bytes" and not self.mpmc and not self.held
        outcome = self.read_outcome()
        nowait = how.endswith("_nowait")
        timeout = None if nowait else (self.unneeded_timeout(data) if outcome != "block" else 0)
        out = None
        if how == "get_into":
            out = data.draw(st.sampled_from([bytearray, lambda n: np.zeros(n + 3, np.uint8)]))(self.slot_size)
            fn = lambda timeout=None: self.ring.get_into(out, timeout=timeout)  # noqa: E731
        else:
            fn = getattr(self.ring, how)
        what = f"{how}()" if nowait else f"{how}(timeout={timeout})"
        call = fn if nowait else (lambda: fn(timeout=timeout))
        if outcome == "closed":
            with pytest.raises(Closed, match=r"^ring is closed and drained$"):
                self.call(what, call)
            return
        if outcome == "block":
            self.expect_blocked(what, call, how, timeout, full=False)
            return
        if reads_ahead:
            got = self.read_ahead(what, call)
            p = self.run.pop(0)
            self.run_out.append(p)
            if not self.run:
                self.drop_run()
        else:
            got = self.call(what, call)
            p = self.take()
        if how == "get_into":
            got = bytes(out[:got])
        assert bytes(got) == self.messages[p], f"position {p}"
        if how in ("get", "get_nowait"):
            assert isinstance(got, memoryview) and got.readonly
            self.held.append((got, [p]))
        elif not reads_ahead:
            assert how == "get_into" or type(got) is bytes
            self.copy_taken(p)

    @rule(data=st.data(), max_n=st.integers(1, 9), nowait=st.booleans())
    def get_many(self, data, max_n, nowait):
        self.drop_run()
        outcome = self.read_outcome()
        timeout = None if nowait else (self.unneeded_timeout(data) if outcome != "block" else 0)
        if nowait:
            what, call = f"get_many_nowait({max_n})", lambda: self.ring.get_many_nowait(max_n)
        else:
            what, call = f"get_many({max_n}, timeout={timeout})", lambda: self.ring.get_many(max_n, timeout=timeout)
        if outcome == "closed":
            with pytest.raises(Closed, match=r"^ring is closed and drained$"):
                self.call(what, call)
            return
        if outcome == "block":
            self.expect_blocked(what, call, "get_many", timeout, full=False)
            return
        batch = self.call(what, call)
        # Consecutive ready positions, never wrapping past the last slot.
        most = 0
        limit = min(max_n, self.capacity - self.queue[0] % self.capacity)
        while most < min(limit, len(self.queue)) and self.state[self.queue[most]] == "ready":
            most += 1
        assert 1 <= len(batch) <= most, f"get_many({max_n}) took {len(batch)}, expected 1..{most}"
        positions = [self.take() for _ in range(len(batch))]
        expected = [self.messages[p] for p in positions]
        assert batch.to_bytes() == expected
        assert [bytes(m) for m in batch] == expected
        assert [bytes(batch[j]) for j in range(len(batch))] == expected
        assert batch.lengths.tolist() == [len(m) for m in expected]
        assert batch.rows.dtype == np.uint8 and batch.rows.shape[0] == len(batch) and not batch.rows.flags.writeable
        assert batch.rows.shape[1] >= self.slot_size
        self.held.append((batch, positions))

    @rule()
    def release(self):
        for view, positions in self.held:  # views stay valid (untouched by producers) until release
            if isinstance(view, memoryview):
                assert bytes(view) == self.messages[positions[0]], f"held view of position {positions[0]} changed"
            elif view is not None:
                assert view.to_bytes() == [self.messages[p] for p in positions], f"held batch {positions} changed"
        self.call("release()", self.ring.release)
        self.drop_run()
        for _, positions in self.held:
            for p in positions:
                self.state[p] = "released"
        self.held.clear()

    @rule(coin=st.integers(0, 9))
    def close(self, coin):
        if coin == 0:  # rarely: a closed ring has little left to explore
            self.call("close()", self.ring.close)
            self.drop_run()  # close hands back what get_bytes read ahead
            self.closed = True

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def statistics_agree(self):
        if not hasattr(self, "ring"):
            return
        s = self.call("statistics()", self.ring.statistics)
        if self.mpmc:
            size = len(self.queue)  # claimed for writing (reserved too), not yet for reading
        else:
            size = sum(1 for st_ in self.state if st_ != "released")
        expected = dict(
            capacity=self.capacity,
            size=size,
            puts=self.stats["puts"],
            gets=self.stats["gets"],
            bytes_put=self.stats["bytes_put"],
            bytes_got=self.stats["bytes_got"],
            waits_full=self.stats["waits_full"],
            waits_empty=self.stats["waits_empty"],
            dead_claims_skipped=0,
            closed=self.closed,
        )
        actual = {k: getattr(s, k) for k in expected}
        assert actual == expected
        assert self.ring.closed == self.closed


def _run_machine(ring_cls) -> None:
    machine = type(f"{ring_cls.__name__}Machine", (RingMachine,), {"RING": ring_cls})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


@pytest.mark.parametrize("ring_cls", RINGS, ids=lambda r: r.__name__)
def test_ring_behaves_like_a_deque(ring_cls):
    helpers.run_forked(_run_machine, ring_cls, timeout=120, stall=HANG_S)
