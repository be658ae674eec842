"""The shared-memory RPC under CourierNode: calls, futures, errors with the remote
type and traceback, deadlines, calls before the server exists, concurrency, large
messages, a dead or closed server, and no leaked segments."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from helpers import FORK, kill_pid, shm_exists, track_pid, wait_until

from shmpad import Closed, Timeout
from shmpad.errors import RemoteError
from shmpad.ringbuf import MPMCRing
from shmpad.rpc.codec import RemoteTraceback, encode_reply
from shmpad.rpc.future import PumpedFuture
from shmpad.rpc.shm_client import RpcClient
from shmpad.rpc.shm_server import RpcServer, create_request_ring
from shmpad.rpc.stats import CallStats, _read, _record


class CustomError(Exception):
    pass


class Unpicklable(Exception):
    def __init__(self, msg):
        super().__init__(msg)
        self.lock = threading.Lock()


class Service:
    def __init__(self):
        self.gate = threading.Event()
        self.at_gate = threading.Event()
        self.lock = threading.Lock()
        self.passed_gate = 0  # wait_gate calls that returned
        self.calls = 0

    def ping(self):
        return "pong"

    def __call__(self, x=1):
        return ("called", x)

    def add(self, a, b=0, *, c=0):
        return a + b + c

    def echo(self, x):
        return x

    def fail(self, msg):
        raise CustomError(msg)

    def fail_unpicklable(self):
        raise Unpicklable("cannot travel")

    def unpicklable_result(self):
        return threading.Lock()

    def sleep(self, s):
        time.sleep(s)
        return s

    def wait_gate(self):
        self.at_gate.set()
        opened = self.gate.wait(30)
        with self.lock:
            self.passed_gate += 1
        return opened

    def open_gate(self):
        self.gate.set()
        return True

    def pid(self):
        return os.getpid()

    def _private(self):
        return "secret"

    attribute = 5


def run_in_threads(work, n: int) -> list[BaseException]:
    """Run ``work(k)`` for k < n in n threads at once; the exceptions they raised."""
    errors: list[BaseException] = []

    def guarded(k):
        try:
            work(k)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a worker thread did not finish in 60 s"
    return errors


@pytest.fixture
def server():
    """A server in a thread of this process (the transport is the same as across processes)."""
    srv = RpcServer(Service())
    yield srv
    srv.close()
    assert srv.wait(10)


@pytest.fixture
def client(server):
    c = RpcClient(server.address)
    yield c
    c.close()


def _serve_forked(address: str) -> None:
    RpcServer(Service(), address).wait()


@pytest.fixture
def remote(shm_leak_check):
    """A server in a forked process; the test process is the client."""
    ring = create_request_ring()
    proc = FORK.Process(target=_serve_forked, args=(ring.name,), daemon=True)
    proc.start()
    track_pid(proc.pid)
    client = RpcClient(ring.name)
    yield client, proc, ring
    client.close()
    ring.close()
    proc.join(10)
    if proc.is_alive():
        kill_pid(proc.pid)
        proc.join(10)
        pytest.fail("server process did not end when its request ring was closed")


def test_sync_calls(client):
    assert client.ping() == "pong"
    assert client() == ("called", 1)
    assert client(x=3) == ("called", 3)
    assert client.add(1, 2) == 3
    assert client.add(1, b=2, c=4) == 7
    assert client.call("add", (5,), {"c": 1}) == 6
    assert client.echo(b"\x00" * 10) == b"\x00" * 10
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(client.echo(arr), arr)


def test_futures(client):
    futs = [client.futures.add(i, i) for i in range(100)]
    assert [f.result(10) for f in futs] == [2 * i for i in range(100)]
    assert client.futures().result(10) == ("called", 1)
    assert client.futures.ping().result(10) == "pong"


def test_a_reply_settles_its_future_without_making_a_lock(client):
    """The client settles futures through their own fast path (shmpad.rpc.future): a
    future that nobody waited on, watched or cancelled never makes its condition."""
    assert client.futures.ping().result(10) == "pong"  # the futures ring exists
    futs = {}
    for call_id, ok, value in [(10**6, True, "fine"), (10**6 + 1, False, (CustomError("bad"), "tb"))]:
        futs[call_id] = fut = PumpedFuture(client)
        client._pending[call_id] = (fut, None, "m")
        client._complete(encode_reply(call_id, ok, value, 1024))
    fine, bad = futs.values()
    assert fine.result(0) == "fine"
    with pytest.raises(CustomError, match="bad"):
        bad.result(0)
    assert "_condition" not in vars(fine) and "_condition" not in vars(bad)


def test_remote_exception_has_type_message_and_traceback(client):
    with pytest.raises(CustomError, match="^bad input 7$") as info:
        client.fail("bad input 7")
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "in fail" in cause.tb and "raise CustomError(msg)" in cause.tb
    fut = client.futures.fail("async bad")
    with pytest.raises(CustomError, match="async bad"):
        fut.result(10)


def test_exceptions_and_results_that_cannot_travel(client):
    with pytest.raises(RemoteError, match=r"test_rpc_shm\.Unpicklable: cannot travel") as info:
        client.fail_unpicklable()
    assert "fail_unpicklable" in info.value.__cause__.tb
    with pytest.raises(RemoteError, match="could not pickle the result of the call"):
        client.unpicklable_result()
    assert client.ping() == "pong"  # the server is fine afterwards


def test_only_public_methods_are_served(client):
    with pytest.raises(AttributeError, match="'Service' object has no public method 'missing'"):
        client.missing()
    with pytest.raises(AttributeError, match="only names not starting with '_' and __call__ can be called"):
        client.call("_private")
    with pytest.raises(AttributeError, match="no public method 'attribute'"):
        client.attribute()
    with pytest.raises(AttributeError):
        client._private  # noqa: B018 - private names are not even turned into stubs


def test_unpicklable_arguments_fall_back_to_cloudpickle(client):
    assert client.echo(lambda: 3)() == 3


def test_large_messages_travel_through_spill_segments(shm_leak_check, client):
    big = np.random.default_rng(0).integers(0, 255, size=3_000_000, dtype=np.uint8)
    np.testing.assert_array_equal(client.echo(big), big)
    assert client.futures.echo(big.tobytes()).result(30) == big.tobytes()


def test_call_timeout_sync_and_futures():
    """The calls wait at a gate that opens only after both timed out: the Timeout can only
    come from call_timeout, however slow the machine."""
    service = Service()
    server = RpcServer(service)
    c = RpcClient(server.address, call_timeout=0.2)
    try:
        with pytest.raises(Timeout, match=r"call to 'wait_gate' on .* did not complete within call_timeout=0.2 s"):
            c.wait_gate()
        with pytest.raises(Timeout, match="call to 'wait_gate'"):  # the future's own, not result()'s
            c.futures.wait_gate().result(60)
        assert issubclass(Timeout, TimeoutError)
        service.gate.set()
        # the late replies of the timed-out calls must not answer the next one
        assert wait_until(lambda: service.passed_gate == 2, 60)
        assert c.add(2, 2) == 4
        assert c.ping() == "pong"
    finally:
        c.close()
        server.close()
        assert server.wait(60)


def test_bad_client_arguments():
    with pytest.raises(TypeError, match="address must be a str, got int"):
        RpcClient(3)
    with pytest.raises(ValueError, match="call_timeout must be > 0 or None, got 0"):
        RpcClient("/x", call_timeout=0)
    with pytest.raises(TypeError, match="call_timeout must be a number of seconds, a timedelta or None, got str"):
        RpcClient("/x", call_timeout="1")
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        RpcServer(Service(), threads=0)


def test_call_before_the_server_exists_waits_for_it():
    ring = create_request_ring()
    client = RpcClient(ring.name)
    fut = client.futures.add(500, 500)
    results = []
    caller = threading.Thread(target=lambda: results.append(client.ping()))
    caller.start()
    time.sleep(0.3)
    assert not fut.done() and results == []
    server = RpcServer(Service(), ring.name)
    try:
        assert fut.result(10) == 1000
        caller.join(10)
        assert results == ["pong"]
    finally:
        client.close()
        server.close()
        ring.close()
        assert server.wait(10)


def test_call_before_the_ring_exists_times_out_with_call_timeout():
    c = RpcClient("/shmpad.0.does-not-exist", call_timeout=0.2)
    with pytest.raises(Timeout, match="call_timeout=0.2"):
        c.ping()


def test_handlers_run_concurrently():
    """A handler that blocks does not stop the server from serving others: one call
    waits on a gate that only another call can open."""
    service = Service()
    server = RpcServer(service)
    client = RpcClient(server.address)
    try:
        waiting = client.futures.wait_gate()
        assert service.at_gate.wait(60)  # its handler runs and waits at the gate (60 s: a hang guard)
        assert not waiting.done()
        assert client.open_gate() is True
        assert waiting.result(10) is True
    finally:
        client.close()
        server.close()
        assert server.wait(10)


def test_a_handler_blocked_on_a_later_call_of_its_run_does_not_stall_it():
    """Calls waiting in the ring are taken in one go; when the first blocks until a
    later one of the same run opens its gate, another thread serves the rest."""
    ring = create_request_ring()
    client = RpcClient(ring.name)
    waiting = client.futures.wait_gate()
    pings = [client.futures.ping() for _ in range(3)]
    opened = client.futures.open_gate()
    wait_until(lambda: ring.statistics().size == 5, 10)
    server = RpcServer(Service(), ring.name)
    try:
        assert opened.result(10) is True
        assert waiting.result(10) is True
        assert [f.result(10) for f in pings] == ["pong"] * 3
    finally:
        client.close()
        server.close()
        ring.close()
        assert server.wait(10)


def test_calls_taken_before_stop_are_answered():
    """stop() ends the taking, not the calls already taken: with one thread stuck in
    a handler, the calls that came in the same run are answered once it returns."""
    ring = create_request_ring()
    client = RpcClient(ring.name)
    service = Service()
    waiting = client.futures.wait_gate()
    pings = [client.futures.ping() for _ in range(3)]
    wait_until(lambda: ring.statistics().size == 4, 10)
    server = RpcServer(service, ring.name, threads=1)
    try:
        assert service.at_gate.wait(10)
        server.stop()
        service.gate.set()
        assert waiting.result(10) is True
        assert [f.result(10) for f in pings] == ["pong"] * 3
        assert server.wait(10)
    finally:
        client.close()
        server.close()
        ring.close()
        assert server.wait(10)


def test_many_threads_share_one_client(client):
    def work(k):
        for i in range(200):
            assert client.add(k, i) == k + i
        assert [f.result(10) for f in [client.futures.add(k, i) for i in range(50)]] == [k + i for i in range(50)]

    assert not run_in_threads(work, 8)


def test_server_thread_pool_is_bounded():
    srv = RpcServer(Service(), threads=2)
    c = RpcClient(srv.address)
    try:
        futs = [c.futures.sleep(0.3) for _ in range(4)]
        t0 = time.monotonic()
        assert [f.result(10) for f in futs] == [0.3] * 4
        # two at a time: at least two rounds
        assert time.monotonic() - t0 >= 0.55
        assert len(srv._workers) + 1 <= 2
    finally:
        c.close()
        srv.close()
        assert srv.wait(10)


def test_across_processes(remote):
    client, proc, _ = remote
    assert client.pid() == proc.pid
    assert client.add(1, 2) == 3
    assert [f.result(10) for f in [client.futures.add(i, 1) for i in range(64)]] == list(range(1, 65))
    with pytest.raises(CustomError, match="remote"):
        client.fail("remote")


def test_closed_server_fails_calls_instead_of_hanging(remote):
    client, proc, ring = remote
    assert client.ping() == "pong"
    ring.close()
    proc.join(10)
    assert not proc.is_alive()
    with pytest.raises(Closed, match="is stopped: cannot call 'ping'"):
        client.ping()
    with pytest.raises(Closed):
        client.futures.ping().result(10)


def test_server_closed_during_a_call(remote):
    client, proc, ring = remote
    fut = client.futures.sleep(0.5)
    time.sleep(0.1)
    ring.close()  # the server finishes the call it took
    assert fut.result(10) == 0.5


def test_server_killed_during_a_call_with_timeout(remote):
    client, proc, ring = remote
    client.call_timeout = 1.0
    fut = client.futures.sleep(30)
    wait_until(lambda: ring.statistics().gets >= 1, 10)
    kill_pid(proc.pid)
    proc.join(10)
    with pytest.raises(Timeout):
        fut.result(10)


def test_forked_child_gets_its_own_client_state(server):
    """A client used before fork works in the child without touching the parent's rings."""
    c = RpcClient(server.address)
    try:
        assert c.ping() == "pong"
        assert c.futures.ping().result(10) == "pong"

        def child(q):
            q.put((c.add(20, 22), c.futures.add(1, 1).result(10)))
            c.close()

        q = FORK.Queue()
        p = FORK.Process(target=child, args=(q,))
        p.start()
        track_pid(p.pid)
        assert q.get(timeout=30) == (42, 2)
        p.join(10)
        assert c.ping() == "pong"
    finally:
        c.close()


def test_client_close_frees_reply_rings(shm_leak_check, server):
    c = RpcClient(server.address)
    c.ping()
    c.futures.ping().result(10)
    c.close()
    c.close()


def test_futures_complete_without_anyone_calling_result(client):
    """Callbacks and concurrent.futures.wait get their replies from the background reader."""
    import concurrent.futures

    done = threading.Event()
    got = []
    fut = client.futures.add(1, 1)
    fut.add_done_callback(lambda f: (got.append(f.result()), done.set()))
    assert done.wait(10) and got == [2]
    futs = [client.futures.add(i, 0) for i in range(20)]
    finished, pending = concurrent.futures.wait(futs, timeout=10)
    assert not pending and sorted(f.result() for f in finished) == list(range(20))
    as_completed = sorted(
        f.result() for f in concurrent.futures.as_completed([client.futures.add(i, 1) for i in range(5)], timeout=10)
    )
    assert as_completed == [1, 2, 3, 4, 5]


def test_many_threads_waiting_on_futures_share_the_reading(client):
    def work(k):
        futs = [client.futures.add(k, i) for i in range(100)]
        for i, f in enumerate(futs):
            assert f.result(10) == k + i

    assert not run_in_threads(work, 6)


def test_cancelled_future_drops_its_reply():
    """The reply of a cancelled call, which comes after another call was answered and
    before the next one is made, answers neither."""
    service = Service()
    server = RpcServer(service)
    client = RpcClient(server.address)
    try:
        fut = client.futures.wait_gate()
        assert fut.cancel() and fut.cancelled()
        assert client.futures.add(1, 2).result(10) == 3  # the cancelled call is still at its gate
        service.gate.set()
        # both replies are in the client's ring of future replies before the next call is made
        replies = client._futures_ring
        assert wait_until(lambda: replies.statistics().puts == 2, 60), replies.statistics()
        assert client.futures.add(2, 2).result(10) == 4
    finally:
        client.close()
        server.close()
        assert server.wait(10)


class _BreaksOnLoad:
    """Pickles fine, fails to unpickle (like a class only the server's __main__ has)."""

    def __reduce__(self):
        return (_raise_on_load, ())


def _raise_on_load():
    raise ValueError("cannot rebuild this here")


class Tricky(Service):
    def unloadable(self):
        return _BreaksOnLoad()

    def exits(self):
        raise SystemExit(3)


@pytest.fixture
def tricky():
    srv = RpcServer(Tricky())
    c = RpcClient(srv.address)
    yield c
    c.close()
    srv.close()
    assert srv.wait(10)


def test_a_reply_that_cannot_be_unpickled_fails_only_its_own_call(tricky):
    with pytest.raises(
        RemoteError, match="the reply could not be unpickled here: ValueError: cannot rebuild this here"
    ):
        tricky.unloadable()
    assert tricky.ping() == "pong"  # the pooled reply ring is still good
    bad = tricky.futures.unloadable()
    good = tricky.futures.add(1, 2)
    assert good.result(10) == 3  # whoever reads, each reply lands on its own future
    with pytest.raises(RemoteError, match="could not be unpickled"):
        bad.result(10)
    done = threading.Event()
    tricky.futures.unloadable()  # read by the background reader: it must survive
    tricky.futures.add(2, 2).add_done_callback(lambda f: done.set())
    assert done.wait(10)


def test_a_handler_raising_systemexit_does_not_exit_the_caller(tricky):
    with pytest.raises(RemoteError, match="the handler raised SystemExit: 3"):
        tricky.exits()
    assert tricky.ping() == "pong"


def test_failed_sends_do_not_leak_reply_rings(shm_leak_check):
    ring = create_request_ring()
    c = RpcClient(ring.name)
    try:
        MPMCRing.attach(ring.name).close()  # closed for everyone, name kept (as a launcher does at stop)
        for _ in range(20):
            with pytest.raises(Closed, match="is stopped: cannot call 'ping'"):
                c.ping()
        assert len(c._all_rings) == 1  # one pooled ring, reused by every attempt
    finally:
        c.close()
        ring.close()


def test_closing_a_client_fails_its_pending_futures_with_closed(server):
    c = RpcClient(server.address)
    fut = c.futures.sleep(5)
    waiter_got = []
    waiter = threading.Thread(target=lambda: waiter_got.append(fut.exception(30)))
    waiter.start()
    time.sleep(0.1)
    c.close()
    waiter.join(10)
    assert len(waiter_got) == 1 and isinstance(waiter_got[0], Closed)


def test_an_address_nobody_creates_does_not_hang_a_call(monkeypatch):
    import shmpad.rpc.calls as rpc

    monkeypatch.setattr(rpc, "CONNECT_TIMEOUT_S", 0.3)
    c = RpcClient("/shmpad.0.nobody-creates-this")
    with pytest.raises(
        Timeout, match=r"no courier server at '/shmpad.0.nobody-creates-this' appeared within 0.3 s \(calling 'ping'\)"
    ):
        c.ping()


# -- call statistics (what python -m shmpad.top shows as ms/call and latency) -------------

NAP_S = 0.02


def test_a_server_counts_each_call_with_its_service_time_and_latency(shm_leak_check):
    with RpcServer(Service()) as server, RpcClient(server.address) as client:
        stats = CallStats.attach(server.address)
        assert stats is not None and stats.read() == (0, 0, 0)
        client.ping()
        calls, _, _ = stats.read()
        assert calls == 1  # counted before its reply was put
        _, service_before, latency_before = stats.read()
        for _ in range(3):
            assert client.sleep(NAP_S) == NAP_S
        assert client.futures.sleep(NAP_S).result(60) == NAP_S
        calls, service_ns, latency_ns = stats.read()
        assert calls == 5
        assert service_ns - service_before >= 4 * NAP_S * 1e9  # a lower bound: the handler slept this long
        assert latency_ns - latency_before >= service_ns - service_before  # the queue wait comes on top
        name = stats.name
        stats.close()
    assert not shm_exists(name)  # the server made its ring, and its statistics went with it


def test_a_ring_without_statistics_is_served_and_counts_nothing(shm_leak_check):
    ring = create_request_ring()
    try:
        with RpcServer(Service(), ring.name) as server, RpcClient(ring.name) as client:
            assert client.ping() == "pong" and server._stats is None
            assert CallStats.attach(ring.name) is None
    finally:
        ring.close()


def test_a_read_of_call_statistics_waits_out_an_update_in_progress():
    """An update begun and not finished (a writer between its adds, or killed there) is
    not read as a whole set: the read gives up after its tries and says so."""
    words = np.zeros(8, np.int64)
    out = np.zeros(3, np.int64)
    words[:5] = [1, 1, 5, 0, 0]  # STARTED, CALLS, SERVICE_NS done; LATENCY_NS, FINISHED not yet
    assert not _read(words, out, 10)
    words[3:5] = [7, 1]
    assert _read(words, out, 10) and list(out) == [1, 5, 7]


def _add_calls(ring_name: str, n: int) -> None:
    stats = CallStats.attach(ring_name)
    for _ in range(n):
        _record(stats._words, 5, 7)


def test_call_statistics_count_every_add_of_processes_adding_at_once(shm_leak_check):
    ring = create_request_ring()
    stats = CallStats.create(ring.name)
    try:
        procs = [FORK.Process(target=_add_calls, args=(ring.name, 50_000), daemon=True) for _ in range(3)]
        for p in procs:
            p.start()
            track_pid(p.pid)
        _add_calls(ring.name, 50_000)
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0, 0]
        assert stats.read() == (200_000, 1_000_000, 1_400_000)
    finally:
        stats.close()
        ring.close()
