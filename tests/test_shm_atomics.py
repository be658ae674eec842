"""Atomic intrinsics: single-process semantics, type checks, and exactness across processes."""

from __future__ import annotations

import multiprocessing
import time

import helpers
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from shmpad.shm.atomics import (
    cas,
    cpu_pause,
    fence_acquire,
    fence_release,
    fence_seq_cst,
    fetch_add,
    load_acquire,
    load_relaxed,
    store_relaxed,
    store_release,
    word_address,
)

I64_MAX = 2**63 - 1
I64_MIN = -(2**63)

_fork = multiprocessing.get_context("fork")


# --- compiled wrappers (the intrinsics are only callable from @njit code) ---------------


@njit(nogil=True)
def _load_acquire(a, i):
    return load_acquire(a, i)


@njit(nogil=True)
def _load_relaxed(a, i):
    return load_relaxed(a, i)


@njit(nogil=True)
def _store_release(a, i, v):
    store_release(a, i, v)


@njit(nogil=True)
def _store_relaxed(a, i, v):
    store_relaxed(a, i, v)


@njit(nogil=True)
def _cas(a, i, expected, new):
    return cas(a, i, expected, new)


@njit(nogil=True)
def _fetch_add(a, i, v):
    return fetch_add(a, i, v)


@njit(nogil=True)
def _word_address(a, i):
    return word_address(a, i)


@njit(nogil=True)
def _fences_and_pause(a):
    store_relaxed(a, 0, 1)
    fence_release()
    fence_seq_cst()
    cpu_pause()
    fence_acquire()
    return load_relaxed(a, 0)


@njit(nogil=True)
def _start_together(words, gate, n_procs):
    """Spin until ``n_procs`` processes have arrived, so that their loops really overlap."""
    fetch_add(words, gate, 1)
    while load_acquire(words, gate) < n_procs:  # pairs with the other arrivals' fetch_add
        cpu_pause()


@njit(nogil=True)
def _fetch_add_loop(words, idx, n, out, gate, n_procs):
    """``n`` increments of ``words[idx]``; adds the sum of the old values seen to ``words[out]``."""
    _start_together(words, gate, n_procs)
    total = 0
    for _ in range(n):
        total += fetch_add(words, idx, 1)
    fetch_add(words, out, total)


@njit(nogil=True)
def _cas_loop(words, idx, n, out, gate, n_procs):
    """``n`` CAS increments of ``words[idx]``; adds the sum of the old values replaced to ``words[out]``."""
    _start_together(words, gate, n_procs)
    total = 0
    for _ in range(n):
        while True:
            old = load_relaxed(words, idx)
            if cas(words, idx, old, old + 1) == old:
                total += old
                break
            cpu_pause()
    fetch_add(words, out, total)


@njit(nogil=True)
def _spin_until_set(words, flag, started, cap):
    """Spin on ``words[flag]`` with acquire loads; the number of iterations it took, or -1 after ``cap``.

    No store inside the loop: a store to ``words`` could alias the flag and keep a compiler from
    hoisting a plain load, which would hide exactly the bug this loop exists to catch.
    """
    store_release(words, started, 1)  # pairs with the test's poll of ``started``
    n = 0
    while n < cap:
        if load_acquire(words, flag) != 0:  # pairs with the parent's store_release of flag
            return n
        n += 1
    return -1


def _run_forked(target, args_list, timeout: float) -> list:
    """Run ``target(*args)`` in one forked process per args; all must exit 0 within ``timeout``."""
    procs = [_fork.Process(target=target, args=args, daemon=True) for args in args_list]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [p.pid for p in procs if p.is_alive()]
        assert not hung, f"processes {hung} still running after {timeout} s"
        assert [p.exitcode for p in procs] == [0] * len(procs)
        return procs
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(10)


# --- single-process semantics -----------------------------------------------------------


def test_store_load_round_trip_every_ordering():
    a = np.zeros(4, np.int64)
    for store in (_store_release, _store_relaxed):
        for load in (_load_acquire, _load_relaxed):
            for v in (0, 1, -1, 12345678901, -98765432109, I64_MAX, I64_MIN):
                store(a, 2, v)
                assert a[2] == v
                assert load(a, 2) == v
    assert a[0] == a[1] == a[3] == 0


def test_fetch_add_returns_old_value():
    a = np.zeros(3, np.int64)
    a[1] = 10
    assert _fetch_add(a, 1, 5) == 10
    assert a[1] == 15
    assert _fetch_add(a, 1, -20) == 15
    assert a[1] == -5
    assert _fetch_add(a, 1, 0) == -5
    assert list(a) == [0, -5, 0]


def test_fetch_add_wraps_like_int64():
    a = np.array([I64_MAX], np.int64)
    assert _fetch_add(a, 0, 1) == I64_MAX
    assert a[0] == I64_MIN


def test_cas_returns_old_value_and_swaps_only_on_match():
    a = np.zeros(2, np.int64)
    a[0] = -7
    assert _cas(a, 0, 3, 99) == -7  # mismatch: no swap
    assert a[0] == -7
    assert _cas(a, 0, -7, -8) == -7  # match: swapped
    assert a[0] == -8
    assert _cas(a, 0, -8, I64_MIN) == -8
    assert a[0] == I64_MIN
    assert a[1] == 0


def test_index_and_value_of_other_integer_types():
    a = np.zeros(4, np.int64)
    _store_release(a, np.int32(3), np.int32(-2))
    assert a[3] == -2
    assert _load_acquire(a, np.uint8(3)) == -2
    assert _fetch_add(a, np.int16(3), np.int8(5)) == -2
    assert _cas(a, np.uint32(3), np.int32(3), np.int64(4)) == 3
    assert a[3] == 4


def test_word_address_is_the_element_address():
    a = np.zeros(8, np.int64)
    for i in range(8):
        assert _word_address(a, i) == a.ctypes.data + 8 * i


def test_fences_and_pause_compile_and_run():
    a = np.zeros(1, np.int64)
    assert _fences_and_pause(a) == 1


def test_atomics_on_a_shared_segment_view(make_segment):
    seg = make_segment(data_bytes=4096)
    base = seg.data_offset // 8
    _store_release(seg.words, base + 3, -42)
    assert seg.words[base + 3] == -42
    assert _fetch_add(seg.words, base + 3, 2) == -42
    assert int.from_bytes(seg.data[24:32].tobytes(), "little", signed=True) == -40


_ops = st.tuples(
    st.sampled_from(["store", "fetch_add", "cas_hit", "cas_miss"]),
    st.integers(0, 3),
    st.integers(I64_MIN, I64_MAX),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_ops, max_size=30))
def test_random_op_sequences_match_a_reference(ops):
    a = np.zeros(4, np.int64)
    ref = [0, 0, 0, 0]
    for op, i, v in ops:
        if op == "store":
            _store_release(a, i, v)
            ref[i] = v
        elif op == "fetch_add":
            assert _fetch_add(a, i, v) == ref[i]
            ref[i] = (ref[i] + v + 2**63) % 2**64 - 2**63
        elif op == "cas_hit":
            assert _cas(a, i, ref[i], v) == ref[i]
            ref[i] = v
        else:
            expected = ref[i] ^ 1
            assert _cas(a, i, expected, v) == ref[i]
        assert [int(x) for x in a] == ref
        assert _load_relaxed(a, i) == ref[i]


# --- misuse ---------------------------------------------------------------------------------

_WORDS = np.zeros(2, np.int64)

_PURE_PYTHON_CALLS = [
    (load_acquire, (_WORDS, 0)),
    (load_relaxed, (_WORDS, 0)),
    (store_release, (_WORDS, 0, 1)),
    (store_relaxed, (_WORDS, 0, 1)),
    (cas, (_WORDS, 0, 0, 1)),
    (fetch_add, (_WORDS, 0, 1)),
    (word_address, (_WORDS, 0)),
    (fence_seq_cst, ()),
    (fence_acquire, ()),
    (fence_release, ()),
    (cpu_pause, ()),
]


@pytest.mark.parametrize("fn,args", _PURE_PYTHON_CALLS, ids=lambda x: getattr(x, "__name__", ""))
def test_calling_from_pure_python_raises(fn, args):
    with pytest.raises(NotImplementedError, match="not usable in pure-python"):
        fn(*args)
    assert _WORDS[0] == 0


# One fresh (never compiled) wrapper per case, so every case really type-checks.
def _fresh_wrappers():
    return {
        "load_acquire": (njit(lambda a: load_acquire(a, 0)), ()),
        "load_relaxed": (njit(lambda a: load_relaxed(a, 0)), ()),
        "store_release": (njit(lambda a: store_release(a, 0, 1)), ()),
        "store_relaxed": (njit(lambda a: store_relaxed(a, 0, 1)), ()),
        "cas": (njit(lambda a: cas(a, 0, 0, 1)), ()),
        "fetch_add": (njit(lambda a: fetch_add(a, 0, 1)), ()),
        "word_address": (njit(lambda a: word_address(a, 0)), ()),
    }


@pytest.mark.parametrize("name", sorted(_fresh_wrappers()))
@pytest.mark.parametrize(
    "bad",
    [np.zeros(4, np.float64), np.zeros(4, np.int32), np.zeros(4, np.uint64), np.zeros((2, 2), np.int64)],
    ids=["float64", "int32", "uint64", "2d-int64"],
)
def test_wrong_array_fails_to_compile_with_type_error(name, bad):
    fn, _ = _fresh_wrappers()[name]
    with pytest.raises(TypeError, match=r"atomic word array must be a 1-D int64 array, got array\("):
        fn(bad)
    assert not bad.any()


def test_float_index_fails_to_compile_with_type_error():
    fn = njit(lambda a, i: load_acquire(a, i))
    with pytest.raises(TypeError, match="atomic word index must be an integer, got float64"):
        fn(np.zeros(2, np.int64), 1.0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: njit(lambda a, v: store_release(a, 0, v)),
        lambda: njit(lambda a, v: store_relaxed(a, 0, v)),
        lambda: njit(lambda a, v: fetch_add(a, 0, v)),
        lambda: njit(lambda a, v: cas(a, 0, 0, v)),
        lambda: njit(lambda a, v: cas(a, 0, v, 1)),
    ],
    ids=["store_release", "store_relaxed", "fetch_add", "cas-new", "cas-expected"],
)
def test_float_value_fails_to_compile_with_type_error(make):
    """A float written into a control word would be silently truncated (1.7 -> 1)."""
    a = np.zeros(2, np.int64)
    with pytest.raises(TypeError, match="integer"):
        make()(a, 1.7)
    assert a[0] == 0


# --- across processes -------------------------------------------------------------------------

N_PROCS = 4


@pytest.mark.parametrize(
    ("loop", "per_proc"), [(_fetch_add_loop, 1_000_000), (_cas_loop, 200_000)], ids=["fetch_add", "cas"]
)
def test_counters_are_exact_across_forked_processes(make_segment, loop, per_proc):
    seg = make_segment(data_bytes=4096)
    words = seg.words
    counter = seg.data_offset // 8
    checksum = counter + 8  # another cache line
    gate = counter + 16
    loop(np.zeros(3, np.int64), 0, 1, 1, 2, 1)  # compile before forking

    _run_forked(loop, [(words, counter, per_proc, checksum, gate, N_PROCS)] * N_PROCS, timeout=60)

    total = N_PROCS * per_proc
    assert words[counter] == total
    # Every increment saw a distinct old value 0 .. total-1.
    assert words[checksum] == total * (total - 1) // 2


def _spinner(words, flag, started, result, cap):
    _store_release(words, result, _spin_until_set(words, flag, started, cap))


def test_acquire_load_in_a_loop_sees_a_release_store_from_another_process(make_segment):
    cap = 10**10  # ~10 s of spinning; a hoisted load would end at the cap (or in an endless loop)
    seg = make_segment(data_bytes=4096)
    words = seg.words
    base = seg.data_offset // 8
    flag, started, result = base, base + 8, base + 16
    words[result] = -2
    scratch = np.zeros(3, np.int64)
    scratch[0] = 1
    assert _spin_until_set(scratch, 0, 1, 10) == 0  # compile before forking

    p = _fork.Process(target=_spinner, args=(words, flag, started, result, cap), daemon=True)
    try:
        p.start()
        assert helpers.wait_until(lambda: _load_acquire(words, started) == 1, timeout=10)
        _store_release(words, flag, 1)  # pairs with the load_acquire in _spin_until_set
        p.join(10)
        assert not p.is_alive(), "the spinning process did not see the store within 10 s"
        assert p.exitcode == 0
        assert words[result] >= 0, f"the spin loop ran to its cap ({words[result]}): the load was hoisted"
    finally:
        if p.is_alive():
            p.kill()
        p.join(10)
