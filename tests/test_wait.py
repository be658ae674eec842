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
    assert 0.040 <= elapsed < 2.0
    assert (words[ev], words[ev + 1]) == (0, 0)


def test_sleep_returns_at_once_when_seq_already_moved(event):
    words, ev, _, _ = event
    words[ev] = 5
    t0 = time.monotonic()
    assert sleep(words, ev, 4, 10 * SECOND) == -1
    assert time.monotonic() - t0 < 1.0


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
    assert sleep(words, ev, seq, 10 * SECOND) == -1
    assert time.monotonic() - t0 < 1.0
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
    woke = time.monotonic_ns()
    finish_wait(words, ev)
    words[out + 1] = woke
    words[out] = r


def _in_futex(pid: int) -> bool:
    return helpers.current_syscall(pid) == SYS_FUTEX


@pytest.mark.parametrize("n_waiters", [1, 3])
def test_notify_wakes_sleepers_in_other_processes(event, n_waiters):
    words, ev, flag, out = event
    outs = [out + 8 * i for i in range(n_waiters)]
    for o in outs:
        words[o] = -99
    procs = [_fork.Process(target=_waiter, args=(words, ev, flag, o, 30 * SECOND), daemon=True) for o in outs]
    try:
        for p in procs:
            p.start()
        assert helpers.wait_until(lambda: words[ev + 1] == n_waiters, 10), "waiters did not announce themselves"
        # Every waiter asleep in the kernel, so that the wake-up, not the re-check, is tested.
        asleep = helpers.wait_until(lambda: all(_in_futex(p.pid) for p in procs), 10)
        assert asleep, f"not all waiters reached futex_wait: {[helpers.current_syscall(p.pid) for p in procs]}"
        assert all(words[o] == -99 for o in outs), "a waiter returned before it was notified"

        notified = time.monotonic_ns()
        _store_release(words, flag, 1)  # pairs with the waiter's load_acquire of flag
        notify(words, ev)
        for p in procs:
            p.join(10)
        assert [p.exitcode for p in procs] == [0] * n_waiters

        assert [int(words[o]) for o in outs] == [0] * n_waiters, "futex_wait did not report a wake-up"
        delays = [(int(words[o + 1]) - notified) / SECOND for o in outs]
        assert all(d < 5.0 for d in delays), f"woken {delays} s after notify (sleep timeout 30 s)"
        assert (words[ev], words[ev + 1]) == (1, 0)
    finally:
        _stop(procs)


def _idle_waiter(words, ev, flag, state, seconds, conn):
    words[state] = 1
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seq = prepare_wait(words, ev)
        if _load_acquire(words, flag) != 0:
            finish_wait(words, ev)
            break
        sleep(words, ev, seq, 50 * MS)
        finish_wait(words, ev)
    words[state] = 2
    conn.recv()  # stay alive, blocked in read(), until the test has read our CPU time


def test_blocked_waiter_uses_almost_no_cpu(event):
    words, ev, flag, out = event
    state = out
    parent_end, child_end = _fork.Pipe()
    p = _fork.Process(target=_idle_waiter, args=(words, ev, flag, state, 2.0, child_end), daemon=True)
    try:
        p.start()
        assert helpers.wait_until(lambda: words[state] >= 1, 10)
        cpu0, t0 = helpers.proc_cpu_seconds(p.pid), time.monotonic()
        assert helpers.wait_until(lambda: words[state] == 2, 10)
        cpu1, t1 = helpers.proc_cpu_seconds(p.pid), time.monotonic()
        parent_end.send(None)
        p.join(10)
        assert p.exitcode == 0
        wall, cpu = t1 - t0, cpu1 - cpu0
        assert wall >= 1.9
        assert cpu < 0.05 * wall, f"an idle waiter used {cpu:.3f} s of CPU in {wall:.2f} s"
    finally:
        _stop([p])
        parent_end.close()
        child_end.close()


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
