"""Allreduce and broadcast over a ring of TCP connections (shmpad.net.mesh, shmpad.net.allreduce).

Members run as forked processes, each with a Mesh of its own, and trade addresses
through the test. Results are checked against numpy: exactly for integer-valued
floats and integers, to a tight tolerance for random floats, and bit for bit between
members. Faults: a member SIGKILLed in the middle of a large allreduce, a silent
member, a ring closed from another thread, mismatched operations, and connections
for the wrong ring.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
from helpers import FORK, Forked, wait_until

from shmpad.errors import Abandoned, AuthError
from shmpad.net import auth
from shmpad.net.allreduce import CHUNK_BYTES, PeerRing
from shmpad.net.mesh import Mesh

TOKEN = "allreduce-test-token"
SMALL_CHUNK = 4096  # many chunks per segment even for small arrays
DEADLINE_S = 30.0


# ---------------------------------------------------------------------------------------
# A group of forked members


_here: dict = {}  # in a member: its mesh and everyone's addresses


def _member(rank: int, size: int, up, down, chunk_bytes: int, fn, args):
    with Mesh(token=TOKEN) as mesh:
        up.send(mesh.address)
        addresses = down.recv()
        _here.update(mesh=mesh, addresses=addresses)
        ring = mesh.ring("test", addresses, rank, timeout=DEADLINE_S, chunk_bytes=chunk_bytes)
        return fn(ring, *args)


class Group:
    """``size`` forked members joined into one ring, each running ``fn(ring, *args)``
    (``args`` may hold a per-rank list under ``per_rank``); ``results()`` gathers what they return."""

    def __init__(self, size: int, fn, *args, chunk_bytes: int = SMALL_CHUNK, per_rank: list | None = None):
        self.members: list[Forked] = []
        pipes = []
        try:
            for rank in range(size):
                up_r, up_w = FORK.Pipe(duplex=False)
                down_r, down_w = FORK.Pipe(duplex=False)
                pipes.append((up_r, down_w))
                extra = (per_rank[rank],) if per_rank is not None else ()
                self.members.append(
                    Forked(_member, rank, size, up_w, down_r, chunk_bytes, fn, (*extra, *args), name=f"rank {rank}")
                )
                up_w.close()
                down_r.close()
            addresses = []
            for member, (up_r, _) in zip(self.members, pipes):
                if not up_r.poll(DEADLINE_S):
                    member.result(0)  # raises the member's failure
                addresses.append(up_r.recv())
            for _, down_w in pipes:
                down_w.send(addresses)
        except BaseException:
            self.kill()
            raise
        finally:
            for up_r, down_w in pipes:
                up_r.close()
                down_w.close()

    def results(self, timeout: float = DEADLINE_S) -> list:
        return [m.result(timeout) for m in self.members]

    def kill(self) -> None:
        for m in self.members:
            m.kill()

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


def run_group(size: int, fn, *args, **kwargs) -> list:
    with Group(size, fn, *args, **kwargs) as group:
        return group.results()


# ---------------------------------------------------------------------------------------
# Inputs and what they sum to


def inputs(rank: int, count: int, dtype: str, kind: str) -> np.ndarray:
    """Rank ``rank``'s contribution: integer-valued (``"int"``, sums are exact) or random normal."""
    rng = np.random.default_rng([rank, count, len(dtype), 7])
    if kind == "int":
        return rng.integers(-1000, 1000, count).astype(dtype)
    return rng.standard_normal(count).astype(dtype)


# (count, dtype, kind): empty, fewer elements than members, not divisible, many chunks
CASES = [
    (0, "float32", "int"),
    (1, "float32", "int"),
    (2, "int64", "int"),
    (3, "float64", "int"),
    (5, "int32", "int"),
    (1001, "float32", "int"),
    (30_011, "float32", "int"),
    (20_003, "int64", "int"),
    (20_003, "int32", "int"),
    (10_007, "float64", "random"),
    (25_000, "float32", "random"),
]


def _reduce_cases(ring: PeerRing, op: str) -> list[bytes]:
    out = []
    for count, dtype, kind in CASES:
        if op == "mean" and dtype.startswith("int"):
            continue
        array = inputs(ring.rank, count, dtype, kind)
        ring.allreduce(array, op=op)
        out.append(array.tobytes())
    return out


def _expected(size: int, count: int, dtype: str, kind: str, op: str) -> np.ndarray:
    stacked = np.stack([inputs(r, count, dtype, kind) for r in range(size)])
    total = stacked.sum(axis=0, dtype=dtype)
    return total / np.asarray(size, dtype) if op == "mean" else total


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_allreduce_equals_the_numpy_sum_on_every_member(size, op):
    results = run_group(size, _reduce_cases, op)
    cases = [c for c in CASES if not (op == "mean" and c[1].startswith("int"))]
    for i, (count, dtype, kind) in enumerate(cases):
        first = results[0][i]
        for rank in range(1, size):
            assert results[rank][i] == first, f"{count} x {dtype}: rank {rank}'s result differs from rank 0's"
        got = np.frombuffer(first, dtype)
        want = _expected(size, count, dtype, kind, op)
        assert got.shape == want.shape
        if kind == "int":
            np.testing.assert_array_equal(got, want, err_msg=f"{op} of {count} x {dtype}")
        else:
            tol = 1e-12 if dtype == "float64" else 1e-5
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"{op} of {count} x {dtype}")


def _large(ring: PeerRing, count: int, repeats: int) -> list[str]:
    digests = []
    for i in range(repeats):
        array = inputs(ring.rank + i, count, "float32", "int")
        ring.allreduce(array)
        digests.append(hashlib.sha256(array.tobytes()).hexdigest())
    return digests


def test_large_allreduce_in_default_chunks_repeatedly():
    size, count, repeats = 3, 3 * (CHUNK_BYTES // 4) + 12_345, 3  # several chunks per segment
    results = run_group(size, _large, count, repeats, chunk_bytes=CHUNK_BYTES)
    for i in range(repeats):
        want = sum(inputs(r + i, count, "float32", "int") for r in range(size))
        assert results[0][i] == hashlib.sha256(want.tobytes()).hexdigest(), f"allreduce {i} is wrong"
        assert all(r[i] == results[0][i] for r in results)


def _broadcasts(ring: PeerRing) -> list:
    out = []
    for root in range(ring.size):
        array = np.arange(10_007, dtype=np.float64) * (root + 1) if ring.rank == root else np.zeros(10_007)
        ring.broadcast(array, root)
        out.append(array.tobytes())
        empty = np.empty(0, np.int32)
        ring.broadcast(empty, root)
    for root, data in [(0, b""), (ring.size - 1, b"x"), (ring.size // 2, os.urandom(0) + bytes(range(256)) * 400)]:
        out.append(ring.broadcast_bytes(data if ring.rank == root else None, root))
    return out


@pytest.mark.parametrize("size", [1, 2, 4])
def test_broadcast_copies_the_roots_data_to_every_member(size):
    results = run_group(size, _broadcasts)
    for root in range(size):
        want = np.arange(10_007, dtype=np.float64) * (root + 1)
        for rank in range(size):
            np.testing.assert_array_equal(np.frombuffer(results[rank][root]), want)
    for rank in range(size):
        assert results[rank][size:] == [b"", b"x", bytes(range(256)) * 400]


def _epochs(ring: PeerRing, epochs: int) -> list[float]:
    """A new ring per epoch, formed as soon as the last one is done (neighbours race ahead)."""
    mesh, addresses = _here["mesh"], _here["addresses"]
    ring.close()
    sums = []
    for epoch in range(epochs):
        with mesh.ring(f"epoch-{epoch}", addresses, ring.rank, timeout=DEADLINE_S) as r:
            array = np.full(3, float(r.rank + epoch))
            r.allreduce(array)
            sums.append(float(array[0]))
    return sums


def test_rings_formed_back_to_back():
    size, epochs = 4, 25
    results = run_group(size, _epochs, epochs)
    want = [float(sum(r + e for r in range(size))) for e in range(epochs)]
    assert results == [want] * size


# ---------------------------------------------------------------------------------------
# What the caller gets wrong (a ring of one: no sockets)


def test_a_ring_of_one_needs_no_sockets_and_checks_its_arguments():
    with Mesh(token=TOKEN) as mesh:
        ring = mesh.ring("solo", [mesh.address], 0)
        array = np.arange(5, dtype=np.float32)
        ring.allreduce(array, op="mean")
        np.testing.assert_array_equal(array, np.arange(5))
        assert ring.broadcast_bytes(b"abc", 0) == b"abc"
        with pytest.raises(TypeError, match="float16"):
            ring.allreduce(np.zeros(3, np.float16))
        with pytest.raises(TypeError, match="got list"):
            ring.allreduce([1.0, 2.0])
        with pytest.raises(ValueError, match="contiguous"):
            ring.allreduce(np.zeros((4, 4), np.float32)[:, 1])
        with pytest.raises(ValueError, match="read-only"):
            ring.allreduce(np.frombuffer(b"\0" * 8, np.float32))
        with pytest.raises(TypeError, match="mean of int64"):
            ring.allreduce(np.zeros(3, np.int64), op="mean")
        with pytest.raises(ValueError, match="'sum', 'mean'|sum, mean"):
            ring.allreduce(np.zeros(3), op="max")
        with pytest.raises(ValueError, match=r"root must be a rank in 0..0, got 1"):
            ring.broadcast(np.zeros(3), root=1)
        with pytest.raises(TypeError, match=r"root must be a rank \(an int\), got str"):
            ring.broadcast(np.zeros(3), root="0")
        with pytest.raises(ValueError, match="the root passes bytes"):
            ring.broadcast_bytes(None, 0)
        with pytest.raises(ValueError, match="used before"):
            mesh.ring("solo", [mesh.address], 0)
        with pytest.raises(ValueError, match="rank must be in 0..1"):
            mesh.ring("bad rank", [mesh.address, mesh.address], 2)
        with pytest.raises(TypeError, match="rank must be an int, got float"):
            mesh.ring("float rank", [mesh.address], 0.0)
        with pytest.raises(TypeError, match="key must be a str, got int"):
            mesh.ring(7, [mesh.address], 0)
        with pytest.raises(ValueError, match="key must be a non-empty string, got ''"):
            mesh.ring("", [mesh.address], 0)
        ring.close()
        with pytest.raises(Abandoned, match="closed"):
            ring.allreduce(array)


# ---------------------------------------------------------------------------------------
# Faults: every live member raises Abandoned promptly


def _mismatched(ring: PeerRing) -> str:
    try:
        ring.allreduce(np.zeros(10 + ring.rank, np.float32))
    except Abandoned as e:
        return str(e)
    return "no error"


def test_members_starting_different_operations_are_abandoned_not_mixed():
    messages = run_group(2, _mismatched)
    for msg in messages:
        assert "was abandoned" in msg
    assert any("allreduce(<f4 x 10, op='sum')" in m and "allreduce(<f4 x 11, op='sum')" in m for m in messages), (
        messages
    )


def _until_abandoned(ring: PeerRing, count: int, victim: int) -> dict:
    """Allreduce repeatedly; the victim SIGKILLs itself in the middle of its second one."""
    if ring.rank == victim:
        frames = [0]
        recv = ring._recv

        def recv_then_die(view, index, what):
            frames[0] += 1
            if ring._seq == 1 and index == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            recv(view, index, what)

        ring._recv = recv_then_die
    array = np.ones(count, np.float32)
    done = 0
    try:
        while True:
            ring.allreduce(array)
            done += 1
    except Abandoned as e:
        return {"t": time.monotonic(), "error": str(e), "done": done}


@pytest.mark.parametrize("size,victim", [(3, 1), (4, 0)])
def test_a_member_killed_mid_allreduce_abandons_the_others_promptly(size, victim):
    count = 4 << 20  # 16 MB of float32: the victim dies with chunks in flight
    with Group(size, _until_abandoned, count, victim, chunk_bytes=256 << 10) as group:
        dead = group.members[victim]
        dead.process.join(DEADLINE_S)
        assert dead.process.exitcode == -signal.SIGKILL
        for rank, member in enumerate(group.members):
            if rank == victim:
                continue
            report = member.result(DEADLINE_S)
            assert report["done"] >= 1, report
            assert f"rank {rank} of {size}" in report["error"]
            # noticed at the broken connection, not by the ring's timeout running out
            assert "made no progress" not in report["error"], report


def _silent_or_waiting(ring: PeerRing, go) -> dict:
    array = np.ones(1000, np.float32)
    if ring.rank == 1:
        go.recv()  # stays silent until rank 0 has given up
        t0 = time.monotonic()
    else:
        t0 = time.monotonic()
    try:
        ring.allreduce(array, timeout=0.5 if ring.rank == 0 else 600.0)
    except Abandoned as e:
        return {"waited": time.monotonic() - t0, "error": str(e)}
    return {"waited": time.monotonic() - t0, "error": None}


def test_a_silent_neighbour_times_out_and_the_failure_travels():
    go_r, go_w = FORK.Pipe(duplex=False)
    with Group(2, _silent_or_waiting, go_r) as group:
        first = group.members[0].result(DEADLINE_S)
        go_w.send(True)
        second = group.members[1].result(DEADLINE_S)
    go_r.close()
    go_w.close()
    assert first["waited"] > 0.4, first  # not before its timeout: load only delays it
    assert "made no progress for 0.5 s" in first["error"]
    # rank 1's own timeout is 600 s: what ended its wait is rank 0's failure, travelling
    assert second["error"] is not None and "made no progress" not in second["error"], second


def _closed_from_another_thread(ring: PeerRing) -> dict:
    array = np.ones(1 << 20, np.float32)
    if ring.rank == 0:
        closer = threading.Thread(target=lambda: (wait_until(ring._busy.locked, 10), ring.close()))
        closer.start()
        t0 = time.monotonic()
        try:
            ring.allreduce(array, timeout=None)  # rank 1 never starts: only close() can end this
        except Abandoned as e:
            closer.join()
            return {"waited": time.monotonic() - t0, "error": str(e), "threads": threading.active_count()}
        return {"error": None}
    # Rank 1 starts only after rank 0 closed: the closed sockets make it fail at once.
    wait_until(lambda: _peer_closed(ring), DEADLINE_S)
    t0 = time.monotonic()
    try:
        ring.allreduce(array)
    except Abandoned as e:
        return {"waited": time.monotonic() - t0, "error": str(e)}
    return {"error": None}


def _peer_closed(ring: PeerRing) -> bool:
    """True once the other member closed its end: a peek at the connection to it, on
    which it never sends, sees EOF."""
    sock = ring._send_conn.sock
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False


def test_close_from_another_thread_unblocks_and_propagates():
    first, second = run_group(2, _closed_from_another_thread)
    assert first["error"] is not None and "the ring was closed" in first["error"], first  # its timeout is None
    # noticed at the closed sockets, not by its timeout running out
    assert second["error"] is not None and "made no progress" not in second["error"], second


# ---------------------------------------------------------------------------------------
# Forming rings (threads of this process)


@pytest.fixture
def meshes():
    made: list[Mesh] = []

    def make(n: int, **kwargs) -> list[Mesh]:
        new = [Mesh(token=TOKEN, **kwargs) for _ in range(n)]
        made.extend(new)
        return new

    before = threading.active_count()
    yield make
    for m in made:
        m.close()
    assert wait_until(lambda: threading.active_count() <= before, 60), f"threads left: {threading.enumerate()}"


def _form(meshes: list[Mesh], key: str, **kwargs) -> list[PeerRing]:
    addresses = [m.address for m in meshes]
    rings: list = [None] * len(meshes)
    errors: list = []

    def join(rank: int) -> None:
        try:
            rings[rank] = meshes[rank].ring(key, addresses, rank, **kwargs)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(len(meshes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    if errors:
        raise errors[0]
    return rings


def _hello(mesh: Mesh, token: str = TOKEN, **hello) -> dict:
    with auth.connect(mesh.address, token) as conn:
        conn.send_json(hello)
        conn.settimeout(10)
        return conn.recv_json()


def test_connections_for_the_wrong_ring_are_refused(meshes):
    a, b = meshes(2, park_timeout=0.3)
    _form([a, b], "epoch-1")
    assert "formed here already" in _hello(a, ring="epoch-1", rank=1, size=2)["refused"]
    assert "no ring 'epoch-9' was made here within 0.3 s" in _hello(a, ring="epoch-9", rank=1, size=2)["refused"]
    assert "the first frame must be" in _hello(a, hello="there")["refused"]
    with pytest.raises(AuthError):
        _hello(a, token="not the token", ring="epoch-1", rank=1, size=2)


def test_a_wrong_rank_is_refused_while_the_ring_forms(meshes):
    a, b, c = meshes(3)
    addresses = [m.address for m in (a, b, c)]
    failed: list = []
    forming = threading.Thread(
        target=lambda: failed.append(pytest.raises(Abandoned, a.ring, "e", addresses, 0, timeout=1))
    )
    forming.start()
    wait_until(lambda: "e" in a._forming, 5)
    assert "expects rank 2 to connect to rank 0, got rank 1" in _hello(a, ring="e", rank=1, size=3)["refused"]
    assert "has 3 members here, the connection says 4" in _hello(a, ring="e", rank=3, size=4)["refused"]
    forming.join(DEADLINE_S)
    assert failed and "rank 2 did not connect to rank 0 within 1 s" in str(failed[0].value)


def test_a_neighbour_that_connects_before_ring_is_called_is_parked(meshes):
    a, b = meshes(2)
    addresses = [a.address, b.address]
    rings: dict = {}
    early = threading.Thread(target=lambda: rings.update(a=a.ring("k", addresses, 0)))
    early.start()
    assert wait_until(lambda: len(b._parked) == 1, 60), "rank 0's connection was not parked at rank 1"
    rings["b"] = b.ring("k", addresses, 1)
    early.join(DEADLINE_S)
    x, y = np.arange(7.0), np.ones(7)
    threads = [threading.Thread(target=rings[k].allreduce, args=(v,)) for k, v in (("a", x), ("b", y))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    np.testing.assert_array_equal(x, np.arange(7.0) + 1)
    np.testing.assert_array_equal(y, x)


def test_forming_a_ring_with_an_unreachable_member_gives_up_in_time(meshes):
    (a,) = meshes(1)
    with socket.socket() as nobody:  # bound, not listening: connections are refused
        nobody.bind(("127.0.0.1", 0))
        t0 = time.monotonic()
        with pytest.raises(Abandoned, match="cannot reach rank 1"):
            a.ring("k", [a.address, f"127.0.0.1:{nobody.getsockname()[1]}"], 0, timeout=1.0)
    assert time.monotonic() - t0 < 60  # hang guard: it gives up rather than retrying for ever


def test_closing_the_mesh_abandons_its_rings(meshes):
    a, b = meshes(2)
    ra, rb = _form([a, b], "k", timeout=5)
    got: list = []
    waiter = threading.Thread(
        target=lambda: got.append(pytest.raises(Abandoned, ra.allreduce, np.ones(3), timeout=None))
    )
    waiter.start()
    wait_until(ra._busy.locked, 5)
    a.close()
    waiter.join(DEADLINE_S)
    assert got and ra.closed
    with pytest.raises(Abandoned):
        rb.allreduce(np.ones(3))


# ---------------------------------------------------------------------------------------
# The benchmark's harness (nothing timed)


def test_bench_measures_every_subject_and_leaves_no_process():
    pytest.importorskip("torch.distributed")
    from bench.allreduce import benchmark as bench

    args = bench.Args(reps=2, warmup=1)
    subjects = [s for s in bench.SUBJECTS if bench.missing(s) is None]
    assert [s.name for s in subjects] == ["gloo", "shmpad", "acc-gloo", "acc-shmpad"]
    before = set(FORK.active_children())
    sizes = (4096, 3 << 20)
    times = bench.measure(2, list(sizes), subjects, args)
    kinds = ("", bench.CPU, bench.SYS)
    assert set(times) == {(kind + s.name, size) for kind in kinds for s in subjects for size in sizes}
    assert all(len(t) == 2 for t in times.values())
    assert all(min(times[(s.name, size)]) > 0 for s in subjects for size in sizes)
    assert set(FORK.active_children()) == before


def test_bench_times_a_join_and_a_kill_per_backend_and_leaves_no_process():
    pytest.importorskip("torch.distributed")
    from bench.allreduce.change import EVENTS, measure_changes

    before = set(FORK.active_children())
    results, failures = measure_changes(peers=2, reps=1)
    assert failures == []
    assert set(results) == {(b, e) for b in ("shmpad", "gloo") for e in EVENTS}
    assert all(len(s) == 1 and 0 < s[0] < 60 for s in results.values())
    assert set(FORK.active_children()) == before


def _ring_in_thread(
    mesh: Mesh, key: str, addresses: list[str], rank: int, timeout: float
) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        start = time.monotonic()
        try:
            out["ring"] = mesh.ring(key, addresses, rank, timeout=timeout)
        except Abandoned as e:
            out["error"] = e
        out["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _waits_for(mesh: Mesh, key: str, stage: str) -> bool:
    """Whether ``mesh``'s ``ring(key)`` has come to ``stage``: connected to its next member
    (which it does before it waits for the previous one), and for the welcome, also
    joined by its previous member. Read from the mesh's record of the ring it forms."""
    forming = mesh._forming.get(key)
    if forming is None or forming.out is None:
        return False
    return stage == "waiting for the previous member" or forming.incoming is not None


@pytest.mark.parametrize("stage", ["waiting for the previous member", "waiting for the next member's welcome"])
@pytest.mark.parametrize("how", ["abandon", "close"])
def test_a_ring_still_forming_is_abandoned_promptly(meshes, stage, how):
    """A group change (``abandon(key)``) or the mesh closing wakes ``ring()`` at once,
    whichever neighbour it waits for, instead of leaving it to its timeout."""
    if stage == "waiting for the previous member":
        a, b = meshes(2)  # b never calls ring(): a's previous member never connects
        addresses, other = [a.address, b.address], None
    else:
        # c connects to a, but b (a's next) never calls ring(): a waits for b's welcome
        a, b, c = meshes(3)
        addresses = [a.address, b.address, c.address]
        other, _ = _ring_in_thread(c, "k", addresses, 2, timeout=2)
    thread, out = _ring_in_thread(a, "k", addresses, 0, timeout=600)
    assert wait_until(lambda: _waits_for(a, "k", stage), 60), f"a never came to be {stage}"
    assert thread.is_alive()
    a.abandon("k", "the group changed") if how == "abandon" else a.close()
    thread.join(60)  # hang guard: only the abandon or close can end a 600 s wait this soon
    assert not thread.is_alive() and "error" in out, out
    if other is not None:
        other.join(10)
