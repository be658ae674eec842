"""shmpad.portal: a server restarted under calls in flight (closed, or SIGKILLed) answers
every call of a client that reconnects; what a closing server answers; the values and
addresses portal's tests showed differing (batched strings, port forms, stats keys)."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest
from helpers import wait_until

import shmpad.portal as portal

HANG_S = 60.0  # a hang guard, never a timing assertion


@pytest.fixture(params=["shm", "tcp"])
def transport(request, monkeypatch):
    monkeypatch.setenv("SHMPAD_TRANSPORT", request.param)
    return request.param


class _Gated:
    """A handler that holds every call until its gate opens, and records which calls it
    ran and the most it held at once."""

    def __init__(self, gate: threading.Event):
        self.gate = gate
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.ran: list[int] = []

    def __call__(self, x):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.ran.append(int(x))
        self.gate.wait(HANG_S)
        with self.lock:
            self.running -= 1
        return 2 * x


@pytest.mark.parametrize("Server", [portal.Server, portal.BatchServer])
def test_a_server_restarted_under_load_answers_every_call(Server, transport):
    """A client with maxinflight=4 makes 200 calls while the server at its port is made
    again 6 times. Each server holds its calls until it has 4 (then no more come: the
    client waits); then it either closes at once, leaving them unanswered, or answers
    them as it closes. Every call gets its own answer; the unanswered ones were sent
    again to the next server, and no server ever held more than 4 (a resend respects
    maxinflight)."""
    port = portal.free_port()
    total, restarts, maxinflight = 200, 6, 4
    handlers: list[_Gated] = []

    def make(gate):
        handler = _Gated(gate)
        server = Server(port, errors=False, logging=False)
        server.bind("fn", handler, workers=16)
        server.start(block=False)
        handlers.append(handler)
        return server

    gate = threading.Event()
    server = make(gate)
    client = portal.Client(port, maxinflight=maxinflight, logging=False)
    results: list[int] = []
    caller = threading.Thread(
        target=lambda: results.extend(int(f.result(HANG_S)) for f in [client.fn(x) for x in range(total)])
    )
    caller.start()
    for i in range(restarts):
        handler = handlers[-1]
        assert wait_until(lambda h=handler: h.running == maxinflight, HANG_S)
        if i % 2:
            gate.set()
            server.close()  # answers the 4 it took
        else:
            # answers none: the client sees the server gone and sends them again (the
            # transports wait for the handlers that hold the calls, so open the gate then)
            closer = threading.Thread(target=server.close, kwargs={"timeout": 0})
            closer.start()
            assert wait_until(lambda: not client.connected, HANG_S)
            gate.set()
            closer.join(HANG_S)
        gate = threading.Event()
        server = make(gate)
    gate.set()
    caller.join(HANG_S)
    assert not caller.is_alive()
    server.close()
    client.close()
    assert results == [2 * x for x in range(total)]
    assert sorted(set(x for h in handlers for x in h.ran)) == list(range(total))
    assert [h.most for h in handlers[:-1]] == [maxinflight] * restarts
    assert handlers[-1].most <= maxinflight
    # the calls a server closed on were run again by the next, before any later call (the
    # order in which they reach its handler is the transport threads', over TCP)
    for i in range(0, restarts, 2):
        assert sorted(handlers[i + 1].ran[:maxinflight]) == sorted(handlers[i].ran[-maxinflight:])


def _serve(port, ready):
    server = portal.Server(port, errors=False, logging=False)
    server.bind("fn", lambda x: 2 * x, workers=8)
    server.start(block=False)
    ready.set()
    threading.Event().wait()


@pytest.mark.parametrize("transport_name", ["shm", "tcp"])
def test_a_sigkilled_server_restarted_answers_every_call(transport_name, monkeypatch):
    """The server's process is SIGKILLed 4 times under a client with 8 calls in flight
    and started again at the same port: every one of 400 calls gets its answer."""
    monkeypatch.setenv("SHMPAD_TRANSPORT", transport_name)
    port = portal.free_port()
    total, kills = 400, 4
    answered = []
    results: list[int] = []

    def start():
        ready = portal.context.mp.Event()
        proc = portal.Process(_serve, port, ready, name="server", start=True)
        assert ready.wait(HANG_S)
        return proc

    proc = start()
    client = portal.Client(port, maxinflight=8, logging=False)

    def calls():
        futures = []
        for x in range(total):
            futures.append(client.fn(x))
            futures[-1].add_callback(lambda f: answered.append(1))
        results.extend(int(f.result(HANG_S)) for f in futures)

    caller = threading.Thread(target=calls)
    caller.start()
    try:
        for _ in range(kills):
            seen = len(answered)
            assert wait_until(lambda s=seen: len(answered) > s + 20 or not caller.is_alive(), HANG_S)
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(HANG_S)
            assert proc.exitcode == -signal.SIGKILL
            proc = start()
        caller.join(HANG_S)
        assert not caller.is_alive()
        assert results == [2 * x for x in range(total)]
    finally:
        client.close()
        proc.kill()


def test_close_answers_the_calls_it_took(transport):
    """close() while a call runs: the call is answered (not failed), and the server
    closes only after."""
    port = portal.free_port()
    entered, release = threading.Event(), threading.Event()

    def slow(x):
        entered.set()
        release.wait(HANG_S)
        return x

    server = portal.Server(port, errors=False)
    server.bind("slow", slow)
    server.start(block=False)
    client = portal.Client(port, logging=False)
    future = client.slow(7)
    assert entered.wait(HANG_S)
    closer = threading.Thread(target=server.close)
    closer.start()
    release.set()
    assert future.result(HANG_S) == 7
    closer.join(HANG_S)
    assert not closer.is_alive()
    client.close()


def test_batched_strings_come_back_as_python_strings(transport):
    port = portal.free_port()
    server = portal.BatchServer(port, errors=False)
    server.bind("fn", lambda x: x, batch=2)
    server.start(block=False)
    client = portal.Client(port, logging=False)
    data = {"a": np.array(12), "b": ["c", b"d"]}
    for result in [f.result(HANG_S) for f in [client.fn(data), client.fn(data)]]:
        assert type(result["b"][0]) is str and result["b"][0] == "c"
        assert type(result["b"][1]) is bytes and result["b"][1] == b"d"
        assert portal.tree_equals(result, data)
    client.close()
    server.close()


@pytest.mark.parametrize("form", ["{port}", ":{port}", "localhost:{port}", "123.456:789:::{port}", "[::1]:{port}"])
def test_a_server_takes_the_port_of_any_address_form(form):
    """As portal: the part after the last ':' is the port; the server binds its host option."""
    port = portal.free_port()
    server = portal.Server(form.format(port=port), errors=False)
    assert server.port == port and server.host == "127.0.0.1"
    server.bind("fn", lambda x: x)
    server.start(block=False)
    client = portal.Client(port, logging=False)
    assert client.fn(42).result(HANG_S) == 42
    client.close()
    server.close()


def test_addr_true_gives_the_callers_tcp_address():
    """A method bound with addr=True gets the caller's (host, port); such a server serves
    every client over TCP, a client on this host too (its doorbell says so)."""
    port = portal.free_port()
    server = portal.Server(port, errors=False)
    server.bind("who", lambda addr, x: [addr[0], int(addr[1]), x], addr=True)
    server.bind("plain", lambda x: x)
    server.start(block=False)
    client = portal.Client(port, logging=False)
    host, their_port, x = client.who(5).result(HANG_S)
    assert client.transport == "tcp"
    assert (host, x) == ("127.0.0.1", 5) and 0 < their_port < 65536 and their_port != port
    assert client.plain(3).result(HANG_S) == 3
    client.close()
    server.close()


def test_addr_true_is_refused_where_only_shared_memory_is_served(monkeypatch):
    monkeypatch.setenv("SHMPAD_TRANSPORT", "shm")
    server = portal.Server(portal.free_port())
    with pytest.raises(ValueError, match=r"addr=True \(binding 'who'\) needs TCP"):
        server.bind("who", lambda addr: addr, addr=True)


def test_stats_has_portals_keys_with_a_postfn(transport):
    port = portal.free_port()
    posted = []
    server = portal.Server(port, errors=False)
    server.bind("fn", lambda x: (x, x), postfn=posted.append)
    server.start(block=False)
    client = portal.Client(port, logging=False)
    assert [client.fn(i).result(HANG_S) for i in range(3)] == [0, 1, 2]
    assert wait_until(lambda: len(posted) == 3, HANG_S)
    stats = server.stats()
    assert set(stats) == {
        "numsend",
        "numrecv",
        "sendrate",
        "recvrate",
        "requests",
        "jobs",
        "post_iqueue",
        "post_oqueue",
    }
    assert (stats["numrecv"], stats["numsend"], stats["post_iqueue"], stats["post_oqueue"]) == (3, 3, 0, 0)
    client.close()
    server.close()


def test_a_client_with_another_handshake_does_not_connect(transport):
    """The server's handshake word is checked before a link is made (on the doorbell, or
    by the TCP ping), as portal's server closes a connection of another protocol."""
    from shmpad.portal.link import WrongProtocol, open_link

    port = portal.free_port()
    server = portal.Server(port, errors=False)
    server.bind("fn", lambda x: x)
    server.start(block=False)
    with pytest.raises(WrongProtocol, match="expected handshake 'other_protocol', the server has 'portal_handshake'"):
        open_link("127.0.0.1", port, "C", HANG_S, "other_protocol")
    same = portal.Client(port, autoconn=False, logging=False)
    assert same.connect(timeout=HANG_S)
    same.close()
    server.close()
