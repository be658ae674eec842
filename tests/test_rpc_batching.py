"""``lp.batched_handler``: concurrent calls become one call with stacked arguments and each
caller gets its own row back; batches fill to batch_size or run at their timeout, padded
when asked; a failure reaches every caller; at most max_parallelism batches run; and the
same through both RPC servers, from many client processes at once."""

from __future__ import annotations

import collections
import datetime
import threading

import numpy as np
import pytest
from helpers import Forked

import shmpad as lp
from shmpad.rpc.batching import stack, unstack
from shmpad.rpc.shm_client import RpcClient
from shmpad.rpc.shm_server import RpcServer, create_request_ring
from shmpad.rpc.tcp_client import TcpRpcClient
from shmpad.rpc.tcp_server import TcpRpcServer

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("shm_leak_check")]

NEVER = datetime.timedelta(minutes=10)  # batches run only when full


class Doubler:
    """Doubles a [3] vector per call; remembers the size of every batch it ran."""

    def __init__(self, batch_size: int, timeout=NEVER, pad_batch: bool = False, max_parallelism: int = 1):
        self.sizes: list[int] = []
        self.double = lp.batched_handler(batch_size, max_parallelism, timeout, pad_batch)(self.double)

    def double(self, x, *, scale=1.0):
        self.sizes.append(len(x))
        return {"y": x * 2 * scale[:, None], "first": x[:, 0]}

    def batch_sizes(self):
        return list(self.sizes)


def call_in_threads(fn, n: int) -> list:
    """``fn(k)`` for k < n, each in its own thread at once; their results (or exceptions)."""
    out: list = [None] * n

    def one(k):
        try:
            out[k] = fn(k)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            out[k] = e

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a batched call did not return"
    return out


def row(k: int) -> np.ndarray:
    return np.arange(3, dtype=np.float32) + 10 * k


# -- batching and unbatching values ------------------------------------------------------


def test_values_batch_as_launchpad_batches_them():
    Point = collections.namedtuple("Point", "x y")
    batched = stack([(np.zeros(2), 1, 0.5, True, "a", [1], None, Point(1, 2.0), {"k": np.ones(3)})] * 4)
    arr, ints, floats, bools, strs, lists, nones, point, d = batched
    assert arr.shape == (4, 2)
    assert ints.dtype == np.int64 and ints.shape == (4,)
    assert floats.dtype == np.float64 and bools.dtype == np.bool_
    assert strs == ["a"] * 4 and lists == [[1]] * 4 and nones == [None] * 4
    assert isinstance(point, Point) and point.x.dtype == np.int64 and point.y.dtype == np.float64
    assert d["k"].shape == (4, 3)


def test_results_unbatch_into_rows():
    Point = collections.namedtuple("Point", "x y")
    rows = unstack((np.arange(6).reshape(3, 2), ["a", "b", "c"], Point(np.arange(3), [7, 8, 9])), 3)
    assert [r[1] for r in rows] == ["a", "b", "c"]
    assert np.array_equal(rows[2][0], [4, 5])
    assert rows[1][2] == Point(1, 8)
    assert unstack({"a": np.arange(2)}, 2) == [{"a": 0}, {"a": 1}]


@pytest.mark.parametrize(
    "values, match",
    [
        ([np.zeros(2), np.zeros(3)], r"argument 0: .* one shape and dtype, got"),
        ([np.zeros(2), np.zeros(2, np.int32)], r"one shape and dtype"),
        ([1, 2.5], r"numbers of one kind, got \['float', 'int'\]"),
        ([(1, 2), (1,)], "tuples of one type and length"),
        ([{"a": 1}, {"b": 1}], "dicts with the same keys"),
    ],
)
def test_values_that_do_not_batch_are_named(values, match):
    with pytest.raises(ValueError, match=match):
        stack(values, "argument 0")


@pytest.mark.parametrize(
    "result, error, match",
    [
        (5, TypeError, "one row per call .* got int"),
        (np.zeros((2, 3)), ValueError, r"a batch of 3 calls got an array of shape \(2, 3\)"),
        (np.float32(1.0), TypeError, "one row per call .* got float32"),
        ([1, 2], ValueError, "a batch of 3 calls got a list of 2"),
    ],
)
def test_results_that_do_not_unbatch_are_named(result, error, match):
    # a result of a type that has no rows is a TypeError; rows that are not one per call a ValueError
    with pytest.raises(error, match=match):
        unstack(result, 3)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        lp.batched_handler(0)
    with pytest.raises(TypeError, match="max_parallelism must be an int, got float"):
        lp.batched_handler(2, max_parallelism=1.5)
    with pytest.raises(ValueError, match="timeout must be a finite duration >= 0"):
        lp.batched_handler(2, timeout=-1)
    with pytest.raises(TypeError, match="pad_batch must be a bool, got str"):
        lp.batched_handler(2, pad_batch="yes")


def test_a_method_decorated_in_the_class_body_is_refused():
    with pytest.raises(TypeError, match="takes 'self' but is not bound: do not decorate methods in the class body"):

        class Server:
            @lp.batched_handler(batch_size=2)
            def compute(self, x):
                return x


# -- the batcher, called from threads ---------------------------------------------------------


def test_concurrent_calls_fill_batches_and_each_caller_gets_its_row():
    server = Doubler(batch_size=4)
    out = call_in_threads(lambda k: server.double(row(k), scale=float(k % 2 + 1)), 12)
    for k, got in enumerate(out):
        assert np.array_equal(got["y"], row(k) * 2 * (k % 2 + 1)), (k, got)
        assert got["first"] == row(k)[0]
    assert server.sizes == [4, 4, 4]


def test_a_batch_that_does_not_fill_runs_at_its_timeout():
    server = Doubler(batch_size=8, timeout=datetime.timedelta(milliseconds=20))
    out = call_in_threads(lambda k: server.double(row(k), scale=1.0), 3)
    assert [got["first"] for got in out] == [0, 10, 20]
    assert sum(server.sizes) == 3 and max(server.sizes) <= 3


def test_pad_batch_pads_with_the_first_call_and_drops_the_padding():
    server = Doubler(batch_size=4, timeout=0.01, pad_batch=True)
    got = server.double(row(5), scale=3.0)
    assert np.array_equal(got["y"], row(5) * 6)
    assert server.sizes == [4]


def test_an_exception_in_the_handler_reaches_every_caller():
    calls = []

    def fails(x):
        calls.append(len(x))
        raise KeyError(f"bad batch of {len(x)}")

    handler = lp.batched_handler(batch_size=3, timeout=NEVER)(fails)
    out = call_in_threads(lambda k: handler(k), 3)
    assert calls == [3]
    assert all(isinstance(e, KeyError) and "bad batch of 3" in str(e) for e in out), out


def test_calls_that_do_not_batch_fail_every_caller_of_the_batch():
    handler = lp.batched_handler(batch_size=2, timeout=NEVER)(lambda x: x)
    out = call_in_threads(lambda k: handler(np.zeros(k + 1)), 2)
    assert all(isinstance(e, ValueError) and "one shape and dtype" in str(e) for e in out), out


@pytest.mark.parametrize("parallelism", [1, 3])
def test_at_most_max_parallelism_batches_run_at_once(parallelism):
    running = 0
    most = 0
    lock = threading.Lock()
    all_in = threading.Barrier(parallelism)

    def work(x):
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            all_in.wait(30)  # with parallelism > 1, the batches meet here: they run at once
        finally:
            with lock:
                running -= 1
        return x

    handler = lp.batched_handler(batch_size=1, max_parallelism=parallelism)(work)
    out = call_in_threads(handler, 3 * parallelism)
    assert out == list(range(3 * parallelism))
    assert most == parallelism


def test_a_due_batch_waiting_for_a_running_one_keeps_taking_calls():
    started = threading.Event()
    release = threading.Event()
    sizes = []

    def work(x):
        sizes.append(len(x))
        if len(sizes) == 1:
            started.set()
            assert release.wait(30)
        return x

    handler = lp.batched_handler(batch_size=10, timeout=0.0)(work)
    first = threading.Thread(target=handler, args=(0,))
    first.start()
    assert started.wait(30)
    futures = [handler.submit((k,), {}) for k in range(1, 6)]  # due at once, but one batch runs
    release.set()
    assert [f.result(30) for f in futures] == [1, 2, 3, 4, 5]
    first.join(30)
    assert sizes == [1, 5]


# -- through the servers, from many clients -------------------------------------------------


def _call_many(address: str, base: int, n: int) -> list:
    with RpcClient(address, call_timeout=60) as client:
        futures = [client.futures.double(row(base + k), scale=1.0) for k in range(n)]
        return [f.result()["first"] for f in futures]


def test_clients_in_several_processes_get_their_own_rows_over_shared_memory():
    service = Doubler(batch_size=8, timeout=0.05)
    ring = create_request_ring()
    # forked before the server's threads exist (a thread compiling with numba at the fork
    # would leave the child numba's lock held); their calls wait in the ring
    children = [Forked(_call_many, ring.name, 100 * p, 6, name=f"client-{p}") for p in range(4)]
    try:
        with RpcServer(service, ring.name, threads=2):
            results = [c.result(60) for c in children]
    finally:
        for c in children:
            c.kill()
        ring.close()
    assert results == [[row(100 * p + k)[0] for k in range(6)] for p in range(4)]
    assert sum(service.sizes) == 24


def test_waiting_calls_hold_no_server_thread():
    # Launchpad's courier needs thread_pool_size >= batch_size; here one thread serves a batch of 8
    service = Doubler(batch_size=8)
    with RpcServer(service, threads=1) as server, RpcClient(server.address, call_timeout=60) as client:
        out = call_in_threads(lambda k: client.double(row(k), scale=2.0)["first"], 8)
    assert out == [row(k)[0] for k in range(8)]
    assert service.sizes == [8]


def test_an_exception_reaches_every_remote_caller():
    class Failing:
        def __init__(self):
            self.compute = lp.batched_handler(batch_size=4, timeout=NEVER)(self.compute)

        def compute(self, x):
            raise RuntimeError(f"batch of {len(x)} refused")

    with RpcServer(Failing()) as server, RpcClient(server.address, call_timeout=60) as client:
        out = call_in_threads(lambda k: client.compute(k), 4)
    assert all(isinstance(e, RuntimeError) and "batch of 4 refused" in str(e) for e in out), out


def test_clients_get_their_own_rows_over_tcp(monkeypatch):
    monkeypatch.setenv("SHMPAD_TOKEN", "batching-test-token")
    service = Doubler(batch_size=6)
    with TcpRpcServer(service, threads=1) as server:
        clients = [TcpRpcClient(server.address, call_timeout=60) for _ in range(3)]
        try:
            out = call_in_threads(lambda k: clients[k % 3].double(row(k), scale=1.0)["first"], 12)
        finally:
            for c in clients:
                c.close()
    assert out == [row(k)[0] for k in range(12)]
    assert service.sizes == [6, 6]
