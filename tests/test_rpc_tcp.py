"""Cross-host RPC (``shmpad.rpc.tcp_client``) and the courier's choice of transport: calls,
futures, remote errors, deadlines, a server not up yet or killed, large arrays, tokens
and frames that must be refused (nothing unpickled before authentication), launched
programs over TCP and over shared memory, a handle used by another program and from
another network namespace. No thread, socket, process or segment outlives a test."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import pickle
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import NoReturn

import cloudpickle
import numpy as np
import pytest
from helpers import FORK, kill_pid, pid_alive, run_forked, start_session, track_pid, wait_until
from test_rpc_shm import CustomError
from test_rpc_shm import Service as SameHostService

import shmpad as lp
from shmpad import Timeout
from shmpad.errors import AuthError, RemoteError
from shmpad.net import auth, wire
from shmpad.nodes.courier import Endpoint, host_identity
from shmpad.rpc.codec import RemoteTraceback, encode_message
from shmpad.rpc.shm_server import create_request_ring
from shmpad.rpc.tcp_client import TcpRpcClient
from shmpad.rpc.tcp_server import TcpRpcServer, reserve

TOKEN = "net-rpc-test-token"


class Service(SameHostService):
    """test_rpc_shm's service, and calls that need many in flight or big replies."""

    def __init__(self, parties: int = 16, meet_timeout: float = 20.0):
        super().__init__()
        self.barrier = threading.Barrier(parties)
        self.meet_timeout = meet_timeout

    def meet(self, i):
        """Returns only once ``parties`` calls are in here at the same time."""
        self.barrier.wait(self.meet_timeout)
        return i

    def zeros(self, n):
        return np.zeros(n, np.uint8)


class _MakesDirectory:
    """Unpickling this creates a directory: proof of whether a pickle was loaded."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


# ---------------------------------------------------------------- fixtures


def _our_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("shmpad-tcp-rpc")]


def _sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


@pytest.fixture(autouse=True)
def no_leaks(monkeypatch):
    """Every test runs with the token set and the transport unforced, and must leave no
    RPC thread or socket behind."""
    monkeypatch.setenv("SHMPAD_TOKEN", TOKEN)
    monkeypatch.delenv("SHMPAD_TRANSPORT", raising=False)
    sockets = _sockets()
    yield
    assert wait_until(lambda: not _our_threads(), 60), f"threads left running: {_our_threads()}"
    assert wait_until(lambda: _sockets() <= sockets, 60), f"{_sockets() - sockets} socket(s) left open"


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.INFO, logger="shmpad.net")
    return caplog


def log_line(caplog, text: str) -> str:
    def find():
        return next((r.getMessage() for r in caplog.records if text in r.getMessage()), None)

    assert wait_until(lambda: find() is not None, 60), f"no log line with {text!r} in:\n{caplog.text}"
    return find()


@pytest.fixture
def service():
    return Service()


@pytest.fixture
def server(service):
    srv = TcpRpcServer(service, "127.0.0.1:0")
    yield srv
    srv.close()


@pytest.fixture
def client(server):
    c = TcpRpcClient(server.address)
    yield c
    c.close()


def _serve_forever(bind: str) -> None:
    TcpRpcServer(Service(), bind)
    threading.Event().wait()


def _start_remote(bind: str):
    proc = FORK.Process(target=_serve_forever, args=(bind,), daemon=True)
    proc.start()
    track_pid(proc.pid)
    return proc


@pytest.fixture
def remote():
    """``(address, start)``: ``start()`` runs a server on ``address`` in a forked process
    (the port is held from the start; connections are refused until a server listens)."""
    sock, bind, _ = reserve("127.0.0.1:0")
    procs = []

    def start():
        procs.append(_start_remote(bind))
        return procs[-1]

    yield bind, start
    for proc in procs:
        kill_pid(proc.pid)
        proc.join(10)
    sock.close()


# ---------------------------------------------------------------- calls


def test_sync_calls(client):
    assert client.ping() == "pong"
    assert client.add(1, 2, c=3) == 6
    assert client(5) == ("called", 5)
    assert client.echo(lambda x: x + 1)(1) == 2  # cloudpickle both ways
    assert client.transport == "tcp"
    assert repr(client) == f"TcpRpcClient({client.address!r})"


def test_sixteen_calls_in_flight_on_one_connection(client):
    futures = [client.futures.meet(i) for i in range(16)]  # each returns once all 16 run at once
    assert [f.result(30) for f in futures] == list(range(16))
    assert [f.result(30) for f in [client.futures.add(i, 1) for i in range(64)]] == list(range(1, 65))


def test_server_thread_pool_is_bounded():
    with TcpRpcServer(Service(parties=3, meet_timeout=1.0), threads=2) as srv, TcpRpcClient(srv.address) as c:
        futures = [c.futures.meet(i) for i in range(3)]  # the third waits for a thread: the barrier breaks
        assert all(isinstance(f.exception(30), threading.BrokenBarrierError) for f in futures)


def _counting_reads(srv: TcpRpcServer) -> list:
    """The requests ``srv`` has read (each is handed to its workers once read)."""
    read: list = []
    submit = srv._workers.submit

    def counted(fn, conn, call_id, *rest):
        read.append(call_id)
        submit(fn, conn, call_id, *rest)

    srv._workers.submit = counted
    return read


def test_a_pipelining_client_is_held_to_twice_the_threads_in_flight():
    """With every thread busy, the server reads 2 x threads requests of one connection
    ahead of their replies and no more (the rest wait in the client); all complete."""
    service = Service()
    with TcpRpcServer(service, threads=2) as srv, TcpRpcClient(srv.address) as c:
        read = _counting_reads(srv)
        blocked = [c.futures.wait_gate() for _ in range(2)]
        megabyte = np.ones(1 << 20, np.uint8)
        sent: list = []
        sender = threading.Thread(target=lambda: sent.extend(c.futures.echo(megabyte) for _ in range(60)))
        sender.start()  # its sends block once the socket buffers are full
        assert wait_until(lambda: len(read) == 4, 60), read
        assert not wait_until(lambda: len(read) > 4, 0.5), f"the server read {len(read)} requests with 2 threads busy"
        service.gate.set()
        sender.join(30)
        assert all(f.result(30) is True for f in blocked)
        assert all(np.array_equal(f.result(30), megabyte) for f in sent) and len(sent) == 60


def test_closing_the_server_releases_a_connection_at_its_limit():
    service = Service()
    srv = TcpRpcServer(service, threads=1)
    try:
        with TcpRpcClient(srv.address) as c:
            read = _counting_reads(srv)
            waiting = [c.futures.wait_gate() for _ in range(3)]
            assert wait_until(lambda: len(read) == 2, 60)
            readers = [t for t in threading.enumerate() if t.name.startswith("shmpad-tcp-rpc-127.0.0.1")]
            assert len(readers) == 1
            srv.close(timeout=0.1)  # its handler is still blocked
            readers[0].join(5)
            assert not readers[0].is_alive(), "the connection's reader waits for a handler of a closed connection"
            assert all(isinstance(f.exception(5), ConnectionError) for f in waiting)
    finally:
        service.gate.set()
        srv.close()


def test_remote_exception_has_type_message_and_traceback(client):
    with pytest.raises(CustomError, match="^boom$") as info:
        client.fail("boom")
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "in fail" in cause.tb and "raise CustomError(msg)" in cause.tb
    assert isinstance(client.futures.fail("x").exception(10), CustomError)
    with pytest.raises(RemoteError, match="Unpicklable: cannot travel"):
        client.fail_unpicklable()
    with pytest.raises(RemoteError, match="could not pickle the result"):
        client.unpicklable_result()
    with pytest.raises(AttributeError, match="no public method '_private'"):
        client.call("_private")
    with pytest.raises(AttributeError, match="no public method 'missing'"):
        client.missing()
    assert client.ping() == "pong"


def test_call_timeout_sync_and_futures(server, service):
    """The calls wait at a gate that opens only after both timed out: the Timeout can only
    come from call_timeout, however slow the machine."""
    with TcpRpcClient(server.address, call_timeout=0.3) as c:
        with pytest.raises(
            Timeout, match=r"call to 'wait_gate' on '127\.0\.0\.1:\d+' did not complete within call_timeout=0\.3 s"
        ):
            c.wait_gate()
        with pytest.raises(Timeout, match="call to 'wait_gate'"):
            c.futures.wait_gate().result(60)
        service.gate.set()
        assert wait_until(lambda: service.passed_gate == 2, 60)
        assert c.ping() == "pong"  # the connection survives; the late replies are dropped


def test_a_stuck_future_expires_while_other_replies_keep_coming(server, service):
    """The call waits at a gate that opens only after the future expired: only its call_timeout can end it."""
    with TcpRpcClient(server.address, call_timeout=0.4) as c:
        fut = c.futures.wait_gate()
        start = time.monotonic()
        while not fut.done() and time.monotonic() - start < 60:  # hang guard
            assert c.ping() == "pong"  # the connection is never idle
        assert fut.done()
        with pytest.raises(Timeout, match="call to 'wait_gate'"):
            fut.result()
        service.gate.set()


def test_a_call_before_the_server_is_up_waits_for_it(remote):
    address, start = remote
    timer = threading.Timer(0.5, start)
    timer.start()
    with TcpRpcClient(address) as c:
        began = time.monotonic()
        assert c.ping() == "pong"
        assert time.monotonic() - began >= 0.4
    timer.join()


def test_nobody_listening_gives_up_at_the_deadline(remote):
    address, _ = remote
    with TcpRpcClient(address, call_timeout=0.3) as c, pytest.raises(Timeout, match="call_timeout=0.3 s"):
        c.ping()
    with (
        TcpRpcClient(address, connect_timeout=0.3) as c,
        pytest.raises(Timeout, match="accepted a connection within 0.3 s"),
    ):
        c.ping()


def test_large_argument_and_result(client):
    a = np.random.default_rng(0).standard_normal(5_000_000).astype(np.float32)  # 20 MB
    back = client.echo(a)
    assert back.dtype == a.dtype and np.array_equal(back, a)
    back += 1  # received into a buffer of its own
    nested = client.echo({"x": [a[::2], a[:10].reshape(2, 5).T]})  # strided arrays travel too
    assert np.array_equal(nested["x"][0], a[::2]) and np.array_equal(nested["x"][1], a[:10].reshape(2, 5).T)


def test_calls_and_replies_beyond_the_frame_limit_fail_alone(server):
    with TcpRpcClient(server.address, max_frame=1 << 20) as c:
        with pytest.raises(
            ValueError, match=r"the arguments of 'echo' are \d+ bytes; one call carries at most 1048576"
        ):
            c.echo(np.zeros(2 << 20, np.uint8))
        assert c.ping() == "pong"
    with TcpRpcServer(Service(), max_frame=1 << 20) as small, TcpRpcClient(small.address) as c:
        with pytest.raises(RemoteError, match=r"the result is \d+ bytes; one reply carries at most 1048576"):
            c.zeros(2 << 20)
        assert c.ping() == "pong"


def test_server_killed_fails_pending_calls_and_the_next_call_reconnects(remote):
    address, start = remote
    first = start()
    with TcpRpcClient(address) as c:
        assert c.pid() == first.pid
        fut = c.futures.sleep(30)
        outcome = []
        caller = threading.Thread(target=lambda: outcome.append(pytest.raises(ConnectionError, c.sleep, 30)))
        caller.start()
        kill_pid(first.pid)
        # the calls sleep 30 s on a dead server: only the broken connection can end them
        with pytest.raises(
            ConnectionError, match=r"connection to '127\.0\.0\.1:\d+' at 127\.0\.0\.1:\d+ broke before 'sleep' answered"
        ):
            fut.result(60)
        caller.join(60)
        assert outcome and "broke before 'sleep' answered" in str(outcome[0].value)
        first.join(10)
        second = start()
        assert c.pid() == second.pid


def test_a_forked_child_gets_its_own_connection(client):
    assert client.ping() == "pong"
    assert run_forked(client.pid, timeout=30) == os.getpid()
    assert client.ping() == "pong"  # the child did not shut the parent's connection down


def test_a_pickled_client_carries_no_token(client):
    data = pickle.dumps(client)
    assert TOKEN.encode() not in data
    with pickle.loads(data) as again:
        assert again.ping() == "pong"


# ---------------------------------------------------------------- refused peers


def test_wrong_token_is_refused(server, client, logs):
    with (
        TcpRpcClient(server.address, token="not-the-token") as bad,
        pytest.raises(AuthError, match="refused our token"),
    ):
        bad.ping()
    log_line(logs, "wrong token")
    assert client.ping() == "pong"


def _pickle_frame(path: str) -> bytes:
    payload = b"".join(bytes(p) for p in encode_message(("echo", (_MakesDirectory(path),), {})))
    return wire.HEADER.pack(wire.FRAME_MAGIC, wire.VERSION, wire.Kind.PICKLE, 0, 1, len(payload)) + payload


def _until_closed(sock: socket.socket) -> None:
    sock.settimeout(10)
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass


def test_a_pickle_from_an_unauthenticated_or_injected_source_is_never_unpickled(server, client, tmp_path, logs):
    target = tmp_path / "made-by-unpickling"
    frame = _pickle_frame(str(target))
    host, port = wire.parse_address(server.address)
    with socket.create_connection((host, port)) as sock:  # the frame where the hello belongs
        sock.sendall(frame)
        _until_closed(sock)
    with socket.create_connection((host, port)) as sock:  # a hello with a wrong proof, then the frame
        auth.SERVER_HELLO.unpack(sock.recv(auth.SERVER_HELLO.size, socket.MSG_WAITALL))
        sock.sendall(auth.CLIENT_HELLO.pack(auth.HELLO_MAGIC, wire.VERSION, os.urandom(32), os.urandom(32)) + frame)
        _until_closed(sock)
    log_line(logs, "not a shmpad client")
    log_line(logs, "wrong token")
    assert client.ping() == "pong"
    assert not target.exists()
    # the same bytes injected raw into an authenticated connection (as someone on the
    # path could) lack the frame's integrity tag: refused, never unpickled
    with auth.connect(server.address, TOKEN) as conn:
        conn.sock.sendall(frame)
        with pytest.raises(ConnectionError):
            conn.recv()
    log_line(logs, "failed its integrity check")
    assert not target.exists()
    # sent by the authenticated peer itself, the payload is unpickled: the probe was live
    with auth.connect(server.address, TOKEN) as conn:
        conn.send(wire.Kind.PICKLE, frame[wire.HEADER.size :], tag=1)
        assert conn.recv().tag == 1
    assert target.is_dir()


def test_malformed_frames_close_only_their_connection(server, client, logs):
    assert client.ping() == "pong"
    bad = [
        (wire.Kind.CONTROL, b"{}", "an RPC connection carries only PICKLE frames"),
        (wire.Kind.PICKLE, struct.pack("<I", 5000), "claims 5000 buffers, at most 4096 allowed"),
        (wire.Kind.PICKLE, struct.pack("<IQ", 1, 1 << 40) + b"x", "cannot hold the 1099511627776 buffer bytes"),
        (wire.Kind.PICKLE, b"\x00", "shorter than its 4-byte header"),
    ]
    for kind, payload, reason in bad:
        with auth.connect(server.address, TOKEN) as conn:
            conn.send(kind, payload)
            with pytest.raises(ConnectionError):
                conn.recv()
        log_line(logs, reason)
    assert client.ping() == "pong"


# ---------------------------------------------------------------- courier nodes


def caller(server, results):
    fanned = [f.result(30) for f in [server.futures.add(i, 1) for i in range(16)]]
    results.put(repr((server.transport, server.pid(), os.getpid(), server.add(2, 3), fanned)).encode())


@pytest.mark.parametrize("forced", ["tcp", None])
def test_a_launched_program_uses_tcp_when_told_and_shared_memory_otherwise(forced, shm_leak_check):
    program = lp.Program("net_rpc")
    results = program.add_node(lp.RingNode(4, slot_size=4096), "results")
    server = program.add_node(lp.CourierNode(Service, courier_kwargs={"listen": "127.0.0.1:0"}), "server")
    program.add_node(lp.PyNode(caller, server, results), "caller")
    env = {"SHMPAD_TRANSPORT": forced} if forced else {}
    manager = lp.launch(program, launch_type="local_mp", local_resources={"caller": lp.PythonProcess(env=env)})
    try:
        used, server_pid, caller_pid, total, fanned = eval(results.dereference().get_bytes(timeout=30).decode())
        manager.wait(["caller"])
    finally:
        manager.stop_and_wait()
    assert used == (forced or "shm")
    assert server_pid == manager.pids()["server/0"] != caller_pid
    assert total == 5 and fanned == list(range(1, 17))
    assert not any(pid_alive(pid) for pid in manager.pids().values())
    with pytest.raises(ConnectionRefusedError):  # nothing listens once the program is over
        socket.create_connection(wire.parse_address(server.tcp_address), timeout=5).close()


@pytest.mark.parametrize("launch_type", ["local_mt", "test_mt"])
def test_a_thread_node_serves_tcp_until_the_program_stops(launch_type, monkeypatch):
    program = lp.Program("net_rpc")
    server = program.add_node(lp.CourierNode(Service, courier_kwargs={"listen": 0}), "server")
    manager = lp.launch(program, launch_type=launch_type)
    try:
        monkeypatch.setenv("SHMPAD_TRANSPORT", "tcp")
        with server.dereference() as client:
            assert client.transport == "tcp" and client.pid() == os.getpid()
    finally:
        manager.stop_and_wait()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(wire.parse_address(server.tcp_address), timeout=5).close()


def test_no_token_fails_the_launch_before_anything_runs(monkeypatch, tmp_path, shm_leak_check):
    monkeypatch.delenv("SHMPAD_TOKEN")
    for kwargs, message in [
        ({"listen": "127.0.0.1:0"}, "no token: set \\$SHMPAD_TOKEN"),
        ({"listen": "127.0.0.1:0", "token_file": tmp_path / "missing"}, "cannot read token file"),
    ]:
        program = lp.Program("net_rpc")
        program.add_node(lp.RingNode(4, slot_size=64), "ring")
        program.add_node(lp.CourierNode(Service, courier_kwargs=kwargs), "server")
        with pytest.raises(AuthError, match=message):
            lp.launch(program, launch_type="test_mt")


def test_courier_kwargs_are_checked():
    with pytest.raises(
        TypeError, match=r"allowed: \['thread_pool_size'\], and 'listen' and 'token_file' to serve over TCP too"
    ):
        lp.CourierNode(Service, courier_kwargs={"port": 1})
    with pytest.raises(TypeError, match="courier_kwargs\\['listen'\\] must be 'HOST:PORT' or a port number, got list"):
        lp.CourierNode(Service, courier_kwargs={"listen": ["x"]})
    with pytest.raises(ValueError, match="'token_file'\\] is for TCP; give courier_kwargs\\['listen'\\] too"):
        lp.CourierNode(Service, courier_kwargs={"token_file": "/x"})


def test_transport_selection(monkeypatch, shm_leak_check):
    elsewhere = "another-host/another-boot"
    no_tcp = lp.CourierHandle(endpoint=Endpoint("courier node X", ring="/shmpad.nowhere", host=elsewhere))
    hint = "give it courier_kwargs=\\{'listen': 'HOST:PORT'\\}"
    with pytest.raises(RuntimeError, match=f"^courier node X is on another host and does not listen on TCP; {hint}$"):
        no_tcp.dereference()
    ring = create_request_ring()
    try:
        for host, ring_name, expected in [
            (elsewhere, ring.name, "tcp"),  # another host: its ring is not ours even if a name matches
            (host_identity(), ring.name, "shm"),
            (host_identity(), "/shmpad.gone", "tcp"),  # this host, but the ring is gone
        ]:
            handle = lp.CourierHandle(endpoint=Endpoint("n", ring=ring_name, host=host, tcp="127.0.0.1:9"))
            with handle.dereference() as c:
                assert c.transport == expected
        monkeypatch.setenv("SHMPAD_TRANSPORT", "tcp")
        with pytest.raises(
            ValueError, match=f"SHMPAD_TRANSPORT=tcp, but courier node X does not listen on TCP; {hint}"
        ):
            no_tcp.dereference()
        monkeypatch.setenv("SHMPAD_TRANSPORT", "sideways")
        with pytest.raises(
            ValueError, match=r"SHMPAD_TRANSPORT must be one of \['auto', 'shm', 'tcp'\], got 'sideways'"
        ):
            no_tcp.dereference()
    finally:
        ring.close()


def test_a_handle_from_an_address(monkeypatch):
    handle = lp.CourierHandle.from_address("tcp://127.0.0.1:9")
    assert handle.tcp_address == "127.0.0.1:9" and pickle.loads(pickle.dumps(handle)).tcp_address == "127.0.0.1:9"
    with handle.dereference() as c:
        assert c.transport == "tcp" and c.address == "127.0.0.1:9"
    assert lp.CourierHandle.from_address("[::1]:9").tcp_address == "[::1]:9"
    with pytest.raises(ValueError, match="only tcp:// addresses are allowed"):
        lp.CourierHandle.from_address("udp://127.0.0.1:9")
    with pytest.raises(ValueError, match="has no port"):
        lp.CourierHandle.from_address("tcp://somehost")
    monkeypatch.setenv("SHMPAD_TRANSPORT", "shm")
    with pytest.raises(ValueError, match="has no shared-memory ring"):
        handle.dereference()


# ---------------------------------------------------------------- another program, another host

CLIENT = """
import base64, json, pickle, sys
import shmpad as lp
import shmpad.rpc.tcp_client
handle = pickle.loads(base64.b64decode(sys.stdin.readline()))
out = {}
with handle.dereference() as c:
    out["pickled"] = [c.transport, c.pid(), c.add(2, 3)]
with lp.CourierHandle.from_address("tcp://" + handle.tcp_address).dereference() as c:
    out["from_address"] = [c.transport, c.pid()]
print(json.dumps(out), flush=True)
"""


def cannot_make_another_host(reason: str) -> NoReturn:
    """Under CI (``CI=true``), where the machine is made to allow namespaces, a failure that
    names the reason; elsewhere a skip with the reason (a user's machine may not allow them)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run the another-host case, but {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def other_host():
    """A network namespace joined to this one by a veth pair: a stand-in for another host.
    Yields ``(namespace, address of this side)``; both are removed on exit, whatever happened."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        cannot_make_another_host("a network namespace needs root and iproute2")
    pid = os.getpid()
    name, outer, inner = f"shmpad-rpc-{pid}", f"shr{pid}o", f"shr{pid}i"
    third, fourth = (pid >> 6) % 250, (pid % 64) * 4  # a /30 of its own per test process
    here, there = f"10.78.{third}.{fourth + 1}", f"10.78.{third}.{fourth + 2}"
    steps = [
        ["netns", "add", name],
        ["link", "add", outer, "type", "veth", "peer", "name", inner],
        ["link", "set", inner, "netns", name],
        ["addr", "add", f"{here}/30", "dev", outer],
        ["link", "set", outer, "up"],
        ["-n", name, "addr", "add", f"{there}/30", "dev", inner],
        ["-n", name, "link", "set", inner, "up"],
    ]
    try:
        for step in steps:
            done = subprocess.run(["ip", *step], check=False, capture_output=True, text=True, timeout=30)
            if done.returncode:
                cannot_make_another_host(
                    f"this machine does not allow a namespace with a veth pair: `ip {' '.join(step)}`: {done.stderr.strip()}"
                )
        yield name, here
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", outer], check=False, capture_output=True, timeout=30)


@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_missing_other_host_fails_under_ci_and_is_skipped_elsewhere(monkeypatch, ci, outcome):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="`ip netns add x` failed"):
        cannot_make_another_host("`ip netns add x` failed")


@pytest.mark.parametrize("where", ["this host", "this host, tcp forced", "another host"])
def test_a_handle_pickled_to_another_program(where, shm_leak_check):
    with contextlib.ExitStack() as stack:
        listen, prefix, env = "127.0.0.1:0", [], dict(os.environ)
        if where == "another host":
            namespace, address = stack.enter_context(other_host())
            listen, prefix = f"{address}:0", ["ip", "netns", "exec", namespace]
            env["SHMPAD_TRANSPORT"] = "tcp"  # a namespace shares this host's /dev/shm: auto would pick it
        elif where == "this host, tcp forced":
            env["SHMPAD_TRANSPORT"] = "tcp"
        program = lp.Program("net_rpc")
        server = program.add_node(lp.CourierNode(Service, courier_kwargs={"listen": listen}), "server")
        manager = lp.launch(program, launch_type="test_mp")
        stack.callback(manager.stop_and_wait)
        proc = start_session(
            [*prefix, sys.executable, "-c", CLIENT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        track_pid(proc.pid)
        try:
            out, err = proc.communicate(base64.b64encode(cloudpickle.dumps(server)) + b"\n", timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(10)
        assert proc.returncode == 0, err.decode()
        got = json.loads(out)
        server_pid = manager.pids()["server/0"]
        assert got["pickled"] == ["shm" if where == "this host" else "tcp", server_pid, 5]
        assert got["from_address"] == ["tcp", server_pid]


_RSS_SERVER = """
import os, sys, time
from shmpad.rpc.tcp_server import TcpRpcServer
class Echo:
    def echo(self, x):
        return x
server = TcpRpcServer(Echo(), "127.0.0.1:0", sys.argv[1])
print(server.address, flush=True)
time.sleep(120)
"""


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_memory_follows_the_bytes_a_peer_sent_not_the_lengths_it_claims():
    """Authenticated peers send headers claiming 200 MiB frames, then a little of each
    and nothing more: the server's memory grows by about what arrived, not by 800 MiB."""
    server = subprocess.Popen([sys.executable, "-c", _RSS_SERVER, TOKEN], stdout=subprocess.PIPE, text=True)
    conns = []
    try:
        address = server.stdout.readline().strip()
        with TcpRpcClient(address, TOKEN) as c:
            assert c.echo(1) == 1  # the server is up and has served a call
        before = _rss_kib(server.pid)
        for i in range(4):
            conn = auth.connect(address, TOKEN)
            conns.append(conn)
            claim = 200 << 20
            conn.sock.sendall(wire.HEADER.pack(wire.FRAME_MAGIC, wire.VERSION, wire.Kind.PICKLE, 0, i, claim))
            conn.sock.sendall(bytes(64 << 10))  # a little of it, then silence
        with TcpRpcClient(address, TOKEN) as c:  # a legitimate client is served meanwhile
            assert c.echo(b"x" * 1000) == b"x" * 1000
        deadline = time.monotonic() + 2.0  # the attack window: memory must stay low all through it
        peak = before
        while time.monotonic() < deadline:
            peak = max(peak, _rss_kib(server.pid))
            time.sleep(0.05)
        assert peak - before < 64 << 10, f"the server grew by {(peak - before) >> 10} MiB for 4 x 64 KiB received"
    finally:
        for conn in conns:
            conn.close()
        server.kill()
        server.wait(30)
