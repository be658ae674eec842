"""Futex eventcount: wake-ups across processes, timeouts, the Dekker handshake, idle CPU."""

from __future__ import annotations

import multiprocessing
import platform
import time

import helpers
import numpy as np
import pytest
from numba import njit

from shmpad.shm.atomics import load_acquire, store_release
from shmpad.shm.wait import finish_wait, futex_wake, notify, notify_always, prepare_wait, sleep

MS = 1_000_000
SECOND = 1_000_000_000
LONG = 600 * SECOND  # a timeout no test waits out: returning within a 60 s hang guard proves it was not
SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}[platform.machine().lower()]

_fork = multiprocessing.get_context("fork")


@njit(nogil=True)
def _load_acquire(words, i):
    return load_acquire(words, i)


@njit(nogil=True)
def _store_release(words, i, v):
    store_release(words, i, v)


def _warm_up() -> None:
    """Compile every function a forked child calls, so that children do not compile."""
    w = np.zeros(16, np.int64)
    seq = prepare_wait(w, 0)
    _store_release(w, 8, 0)
    _load_acquire(w, 8)
    sleep(w, 0, seq + 1, 1)
    finish_wait(w, 0)
    notify(w, 0)
    notify_always(w, 0)


@pytest.fixture
def event(make_segment):
    """(words, ev, flag, out): an event at ``ev`` (seq, sleepers), a condition word ``flag`` on
    another cache line, and result words from ``out`` on, all in a fresh segment."""
    _warm_up()
    seg = make_segment("test", {}, 4096)
    base = seg.data_offset // 8
    return seg.words, base, base + 8, base + 16


def _stop(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)


# --- one process ----------------------------------------------------------------------------


def test_sleep_times_out(event):
    words, ev, _, _ = event
    seq = prepare_wait(words, ev)
    t0 = time.monotonic()
    r = sleep(words, ev, seq, 50 * MS)
    elapsed = time.monotonic() - t0
    finish_wait(words, ev)
    assert r == -1
    assert elapsed >= 0.040  # it waited its timeout: a sleep may end late on a busy machine, never early
    assert (words[ev], words[ev + 1]) == (0, 0)


def test_sleep_returns_at_once_when_seq_already_moved(event):
    words, ev, _, _ = event
    words[ev] = 5
    t0 = time.monotonic()
    assert sleep(words, ev, 4, LONG) == -1
    assert time.monotonic() - t0 < 60  # hang guard: it did not wait out its 600 s timeout


@pytest.mark.parametrize("seq", [0x8000_0001, 0xFFFF_FFFF, 2**32 + 5, -1, 2**63 - 1])
def test_sleep_compares_the_low_32_bits_of_seq(event, seq):
    """A seq whose low word has its top bit set must still sleep: no spurious mismatch."""
    words, ev, _, _ = event
    words[ev] = seq
    t0 = time.monotonic()
    assert sleep(words, ev, seq, 50 * MS) == -1
    assert time.monotonic() - t0 >= 0.040
    t0 = time.monotonic()
    assert sleep(words, ev, seq & 0xFFFF_FFFF, 50 * MS) == -1  # same low word: sleeps too
    assert time.monotonic() - t0 >= 0.040


def test_notify_between_prepare_and_sleep_is_not_lost(event):
    """The Dekker handshake: a notify that sees the announced sleeper moves seq, so the
    sleep that follows returns at once instead of waiting for its timeout."""
    words, ev, _, _ = event
    seq = prepare_wait(words, ev)
    assert words[ev + 1] == 1
    notify(words, ev)
    assert words[ev] == seq + 1
    t0 = time.monotonic()
    assert sleep(words, ev, seq, LONG) == -1
    assert time.monotonic() - t0 < 60  # hang guard: it did not wait out its 600 s timeout
    finish_wait(words, ev)
    assert words[ev + 1] == 0


def test_notify_without_sleepers_does_not_touch_seq(event):
    words, ev, _, _ = event
    words[ev] = 41
    before = words.copy()
    for _ in range(3):
        notify(words, ev)
    assert np.array_equal(words, before)


def test_notify_always_bumps_seq_without_sleepers(event):
    words, ev, _, _ = event
    words[ev] = 41
    notify_always(words, ev)
    notify_always(words, ev)
    assert (words[ev], words[ev + 1]) == (43, 0)


def test_futex_wake_with_nobody_asleep_wakes_nobody(event):
    words, ev, _, _ = event
    assert futex_wake(words, ev) == 0


# --- across processes -------------------------------------------------------------------------


def _waiter(words, ev, flag, out, timeout_ns):
    seq = prepare_wait(words, ev)
    if _load_acquire(words, flag) != 0:  # pairs with the notifier's store_release of flag
        r = 1
    else:
        r = sleep(words, ev, seq, timeout_ns)
    finish_wait(words, ev)
    words[out] = r


def _in_futex(pid: int) -> bool:
    return helpers.current_syscall(pid) == SYS_FUTEX


@pytest.mark.parametrize("n_waiters", [1, 3])
def test_notify_wakes_sleepers_in_other_processes(event, n_waiters):
    words, ev, flag, out = event
    outs = [out + 8 * i for i in range(n_waiters)]
    for o in outs:
        words[o] = -99
    procs = [_fork.Process(target=_waiter, args=(words, ev, flag, o, LONG), daemon=True) for o in outs]
    try:
        for p in procs:
            p.start()
        assert helpers.wait_until(lambda: words[ev + 1] == n_waiters, 60), "waiters did not announce themselves"
        # Every waiter asleep in the kernel, so that the wake-up, not the re-check, is tested.
        asleep = helpers.wait_until(lambda: all(_in_futex(p.pid) for p in procs), 10)
        assert asleep, f"not all waiters reached futex_wait: {[helpers.current_syscall(p.pid) for p in procs]}"
        assert all(words[o] == -99 for o in outs), "a waiter returned before it was notified"

        _store_release(words, flag, 1)  # pairs with the waiter's load_acquire of flag
        notify(words, ev)
        for p in procs:
            p.join(60)  # hang guard: their 600 s timeouts are far off
        assert [p.exitcode for p in procs] == [0] * n_waiters
        # 0, not -1: futex_wait returned for the wake-up, not for its timeout
        assert [int(words[o]) for o in outs] == [0] * n_waiters, "futex_wait did not report a wake-up"
        assert (words[ev], words[ev + 1]) == (1, 0)
    finally:
        _stop(procs)


def test_a_blocked_waiter_sleeps_in_the_kernel_and_is_not_woken_until_notified(event):
    """Idle waits do not burn a core, shown by the mechanism rather than by a share of CPU
    (which a loaded machine blurs): the waiter sits in futex_wait in state S, and while it
    waits it is not woken once (its voluntary context switches do not move); notify wakes it."""
    words, ev, flag, out = event
    words[out] = -99
    p = _fork.Process(target=_waiter, args=(words, ev, flag, out, LONG), daemon=True)
    try:
        p.start()
        assert helpers.wait_until(lambda: _in_futex(p.pid), 60), "the waiter never reached futex_wait"
        assert helpers.all_threads_asleep(p.pid)
        before = helpers.thread_wakeups(p.pid)
        helpers.wait_until(lambda: words[out] != -99, 0.5)  # a window in which nothing may happen
        assert words[out] == -99 and helpers.thread_wakeups(p.pid) == before, "the waiter woke up unasked"
        assert _in_futex(p.pid)
        _store_release(words, flag, 1)  # pairs with the waiter's load_acquire of flag
        notify(words, ev)
        p.join(60)  # hang guard: its 600 s timeout is far off
        assert p.exitcode == 0 and words[out] == 0, "futex_wait did not report a wake-up"
    finally:
        _stop([p])


def test_futex_path_is_cacheable():
    """Every wait function is ``cache=True``; a process that starts afresh must not have to
    compile them again (numba warns "Cannot cache ..." when it cannot)."""
    code = (
        "import warnings\n"
        "from numba.core.errors import NumbaWarning\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always', NumbaWarning)\n"
        "    import numpy as np\n"
        "    from shmpad.shm import wait\n"
        "    w = np.zeros(8, np.int64)\n"
        "    wait.finish_wait(w, 0); wait.notify(w, 0); wait.notify_always(w, 0)\n"
        "    wait.sleep(w, 0, 5, 1); wait.futex_wake(w, 0)\n"
        "print(sorted({str(x.message).split(' as ')[0] for x in caught if 'annot cache' in str(x.message)}))\n"
    )
    proc = helpers.spawn_python(code)
    try:
        assert helpers.read_line(proc, timeout=60) == "[]"
        assert proc.wait(timeout=30) == 0
    finally:
        helpers.kill_and_reap(proc)
