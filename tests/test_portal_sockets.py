"""shmpad.portal's ServerSocket and ClientSocket: portal's message sockets on shmpad's
authenticated TCP."""

from __future__ import annotations

import os
import signal
import socket
import threading

import pytest
from helpers import wait_until

import shmpad.portal as portal

HANG_S = 60.0  # a hang guard, never a timing assertion


@pytest.fixture
def pair():
    port = portal.free_port()
    server = portal.ServerSocket(port, logging=False)
    client = portal.ClientSocket(port, logging=False)
    yield server, client
    client.close()
    server.close()


def test_messages_of_several_buffers_arrive_joined_in_order(pair):
    server, client = pair
    client.send(b"ab", bytearray(b"c"), memoryview(b"de"))
    client.send(b"f")
    addr, data = server.recv(timeout=HANG_S)
    assert isinstance(data, memoryview) and bytes(data) == b"abcde"
    assert bytes(server.recv(timeout=HANG_S)[1]) == b"f"
    assert server.connections == (addr,) and addr[0] == "127.0.0.1"
    big = os.urandom(3 << 20)
    server.send(addr, big[:1], big[1:])
    server.send(addr, b"after")
    assert bytes(client.recv(timeout=HANG_S)) == big
    assert bytes(client.recv(timeout=HANG_S)) == b"after"
    with pytest.raises(TimeoutError):
        server.recv(timeout=0)


def test_bad_messages_and_options_are_refused(pair):
    server, client = pair
    with pytest.raises(ValueError, match="a message needs at least one buffer"):
        client.send()
    with pytest.raises(ValueError, match="a message holds 1 to"):
        client.send(b"")
    with pytest.raises(TypeError, match="a message is made of bytes, bytearray or memoryview, got str"):
        client.send("text")
    with pytest.raises(TypeError, match="ClientSocket got an unknown option 'keepalive'; its options are"):
        portal.ClientSocket(1234, keepalive=True)
    with pytest.raises(TypeError, match="ServerSocket option max_recv_queue must be int, got float"):
        portal.ServerSocket(1234, max_recv_queue=1.5)
    small = portal.ClientSocket(server.port, max_msg_size=4, start=False)
    with pytest.raises(ValueError, match=r"a message holds 1 to 4 bytes \(max_msg_size\), got 5"):
        small.send(b"12345")
    small.close()


def test_a_client_of_another_protocol_is_closed_before_a_message_is_read(pair):
    server, _ = pair
    other = portal.ClientSocket(server.port, autoconn=False, handshake="other_protocol", logging=False)
    assert other.connect(timeout=HANG_S)
    try:
        other.send(b"never read")  # or the server closed it already
    except portal.Disconnected:
        pass
    with pytest.raises(portal.Disconnected):
        other.recv(timeout=HANG_S)
    with pytest.raises(TimeoutError):
        server.recv(timeout=0.2)  # nothing of it reached the queue
    other.close()


def test_a_peer_without_the_token_is_refused_before_a_byte_is_decoded(pair):
    server, _ = pair
    with socket.create_connection(("127.0.0.1", server.port), timeout=HANG_S) as raw:
        raw.recv(37)  # the server's hello
        raw.sendall(b"SHPD\x01" + bytes(64))  # a hello with a wrong proof
        assert raw.recv(1) == b""  # closed
    with pytest.raises(TimeoutError):
        server.recv(timeout=0.2)
    assert len(server.connections) == 1  # only the pair's own client


def test_too_many_messages_waiting_is_portals_error():
    port = portal.free_port()
    server = portal.ServerSocket(port, max_recv_queue=2, logging=False)
    client = portal.ClientSocket(port, logging=False)
    for i in range(3):
        client.send(bytes([i + 1]))
    assert wait_until(lambda: server.error is not None, HANG_S)
    with pytest.raises(RuntimeError, match="Too many incoming messages enqueued"):
        server.recv()
    client.close()
    server.close()


def _echo_one(port):
    server = portal.ServerSocket(port, logging=False)
    addr, data = server.recv()
    server.send(addr, b"got ", data)
    threading.Event().wait()


def test_a_sigkilled_server_is_seen_and_a_new_one_reached():
    port = portal.free_port()
    proc = portal.Process(_echo_one, port, start=True)
    client = portal.ClientSocket(port, autoconn=False, logging=False)
    assert client.connect(timeout=HANG_S)
    client.send(b"first")
    assert bytes(client.recv(timeout=HANG_S)) == b"got first"
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.join(HANG_S).exitcode == -signal.SIGKILL
    with pytest.raises(portal.Disconnected):
        client.recv(timeout=HANG_S)
    with pytest.raises(portal.Disconnected):
        client.send(b"lost")
    proc = portal.Process(_echo_one, port, start=True)
    assert client.connect(timeout=HANG_S)
    client.send(b"second")
    assert bytes(client.recv(timeout=HANG_S)) == b"got second"
    client.close()
    proc.kill()


def test_close_sends_what_was_queued_then_the_server_sees_the_client_go(pair):
    server, client = pair
    for i in range(50):
        client.send(bytes(1000) + bytes([i]))
    client.close()
    got = [bytes(server.recv(timeout=HANG_S)[1])[-1] for _ in range(50)]
    assert got == list(range(50))
    assert wait_until(lambda: not server.connections, HANG_S)
