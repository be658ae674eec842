"""The Future of shared-memory RPC calls (``shmpad.rpc.future``): made without its
condition, settled and read without one when nobody asked for it, and a full
``concurrent.futures.Future`` as soon as somebody does (waiters, callbacks, cancel),
including when they race with the settle."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import sys
import threading

import pytest
from helpers import FORK, kill_pid, track_pid

import shmpad.rpc.future as future_module
from shmpad.rpc.future import LAZY, PumpedFuture


class NoReplies:
    """A client stand-in: its futures are settled by the test, never by reading."""

    def __init__(self):
        self.pumps = 0

    def _pump(self, fut, timeout):
        self.pumps += 1


def new() -> PumpedFuture:
    return PumpedFuture(NoReplies())


def test_this_python_gets_the_lazy_condition():
    # the tests below that check the lazy path would pass vacuously without it
    assert LAZY


def test_settled_and_read_without_a_condition():
    fut = new()
    fut.set_result(42)
    assert fut.result() == 42
    assert fut.result(timeout=0) == 42
    assert "_condition" not in vars(fut)
    assert fut._client.pumps == 0  # a finished future reads nothing


def test_exception_is_raised_and_returned():
    fut = new()
    err = KeyError("gone")
    fut.set_exception(err)
    with pytest.raises(KeyError, match="gone"):
        fut.result()
    assert fut.exception() is err
    assert fut.done() and not fut.cancelled()


def test_unsettled_result_times_out_after_pumping():
    fut = new()
    with pytest.raises(concurrent.futures.TimeoutError):
        fut.result(timeout=0)
    assert fut._client.pumps == 1


def test_settling_twice_is_refused():
    fut = new()
    fut.set_result(1)
    with pytest.raises(concurrent.futures.InvalidStateError):
        fut.set_result(2)
    with pytest.raises(concurrent.futures.InvalidStateError):
        fut.set_exception(ValueError("late"))
    assert fut.result() == 1


def test_cancelled_before_the_reply_stays_cancelled():
    fut = new()
    assert fut.cancel()
    with pytest.raises(concurrent.futures.InvalidStateError):
        fut.set_result(1)
    with pytest.raises(concurrent.futures.CancelledError):
        fut.result()
    assert not new_settled().cancel()  # a finished future cannot be cancelled


def new_settled() -> PumpedFuture:
    fut = new()
    fut.set_result(0)
    return fut


def test_callbacks_run_once_whenever_they_are_added():
    seen = []
    before = new()
    before.add_done_callback(lambda f: seen.append(("before", f.result())))
    assert "_condition" in vars(before)  # asking made the condition: the settle takes Future's path
    before.set_result(1)
    after = new_settled()
    after.add_done_callback(lambda f: seen.append(("after", f.result())))
    assert seen == [("before", 1), ("after", 0)]


def test_wait_and_as_completed_see_futures_settled_without_a_condition():
    futs = [new() for _ in range(4)]
    futs[0].set_result(0)
    futs[1].set_exception(ValueError("bad"))
    done, pending = concurrent.futures.wait(futs, timeout=0)
    assert done == set(futs[:2]) and pending == set(futs[2:])
    for i in (2, 3):
        futs[i].set_result(i)
    assert {f.result() for f in concurrent.futures.as_completed(futs[2:], timeout=10)} == {2, 3}


@pytest.fixture
def switch_often():
    """Threads switch every microsecond instead of every 5 ms: each settle meets the
    other thread mid-way, not once per time slice."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


@pytest.mark.parametrize("how", ["wait", "callback", "cancel"])
def test_no_settle_is_lost_when_it_races_with_the_condition(how, switch_often):
    """One thread settles futures while another waits on, watches or cancels each in
    the same moment: every future ends settled or cancelled exactly once, every
    callback runs exactly once and no wait misses its settle (each is bounded: a lost
    settle fails the test rather than hang it)."""
    n = 3000
    futs = [new() for _ in range(n)]
    called = [0] * n
    cancelled = [False] * n
    refused = [False] * n
    go = threading.Barrier(2, timeout=10)

    def settle():
        go.wait()
        for i, fut in enumerate(futs):
            try:
                fut.set_result(i)
            except concurrent.futures.InvalidStateError:
                refused[i] = True

    def watch():
        go.wait()
        for i, fut in enumerate(futs):
            if how == "wait":
                done, _ = concurrent.futures.wait([fut], timeout=10)
                assert done == {fut}, f"future {i}: its settle was lost"
            elif how == "callback":
                fut.add_done_callback(lambda f, i=i: called.__setitem__(i, called[i] + 1))
            else:
                cancelled[i] = fut.cancel()

    settler = threading.Thread(target=settle)
    settler.start()
    try:
        watch()
    finally:
        settler.join(30)
    assert not settler.is_alive()
    for i, fut in enumerate(futs):
        if cancelled[i]:
            assert refused[i] and fut.cancelled()
        else:
            assert not refused[i] and fut.result(timeout=0) == i
    if how == "callback":
        assert called == [1] * n


def test_without_the_gil_it_is_a_plain_future(monkeypatch):
    """A free-threaded Python gets Future's own locking: a second copy of the module,
    loaded as if the GIL were off, makes futures with their condition."""
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
    spec = importlib.util.spec_from_file_location("future_without_gil", future_module.__file__)
    plain = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plain)
    assert not plain.LAZY
    fut = plain.PumpedFuture(NoReplies())
    assert "_condition" in vars(fut)
    seen = []
    fut.add_done_callback(lambda f: seen.append(f.result()))
    fut.set_result(7)
    assert fut.result() == 7 and seen == [7]
    with pytest.raises(concurrent.futures.InvalidStateError):
        fut.set_exception(ValueError("late"))
    other = plain.PumpedFuture(NoReplies())
    assert other.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        other.result()


def test_a_fork_while_the_lock_is_held_leaves_the_child_its_own():
    """A thread settling a future at the moment another forks must not leave the
    child's futures a lock nobody will release."""
    with future_module._LAZY:
        proc = FORK.Process(target=_settle_one_and_exit, daemon=True)
        proc.start()
    track_pid(proc.pid)
    proc.join(30)
    if proc.is_alive():
        kill_pid(proc.pid)
        proc.join(10)
        pytest.fail("the child hung settling a future: the lock held at the fork was inherited")
    assert proc.exitcode == 0


def _settle_one_and_exit() -> None:
    fut = new()
    fut.set_result(5)
    sys.exit(0 if fut.result() == 5 else 1)
