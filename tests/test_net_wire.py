"""shmpad.net.wire: the handshake both ways, every kind of bad input refused with a log
line (and nothing unpickled), addresses and tokens.

The ``send_*`` functions are attacks on a listening endpoint; ``test_net_broker`` aims
them at a broker in a process of its own.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import socket
import threading

import pytest
from helpers import wait_until

from shmpad.errors import AuthError, FrameError
from shmpad.net import auth, wire
from shmpad.net.broker import Broker

TOKEN = b"test-token-0123456789"
HUNDRED_GIB = 100 << 30


# ---------------------------------------------------------------- attacks


class _RunsShell:
    """Unpickling this runs ``touch path`` (through os.system): the payload of a pickle attack."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def pickle_bomb(path: str) -> bytes:
    payload = pickle.dumps(_RunsShell(path))
    assert b"system" in payload
    return payload


def _drain_until_closed(sock: socket.socket, timeout: float = 5.0) -> None:
    """Read until the other side closes (frames it sent on the way are dropped)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass


def _raw_frame(kind: int, payload: bytes, length: int | None = None) -> bytes:
    return (
        wire.HEADER.pack(wire.FRAME_MAGIC, wire.VERSION, kind, 0, 0, len(payload) if length is None else length)
        + payload
    )


def send_wrong_token(address: str, token: bytes) -> None:
    with pytest.raises(AuthError, match="refused our token"):
        auth.connect(address, token + b"-not")


def send_random_hello(address: str, token: bytes) -> int:
    """Random bytes where the client's hello belongs; returns our port."""
    with socket.create_connection(wire.parse_address(address), timeout=5) as sock:
        port = sock.getsockname()[1]
        sock.sendall(b"NOPE" + os.urandom(auth.CLIENT_HELLO.size - 4))
        _drain_until_closed(sock)
    return port


def send_frame_bytes(address: str, token: bytes, data: bytes, join_first: bool = False) -> int:
    """Authenticate (and join a broker's group if ``join_first``), then send ``data`` raw."""
    conn = auth.connect(address, token)
    try:
        port = conn.sock.getsockname()[1]
        if join_first:
            conn.send_json({"op": "join", "group": "attack", "name": f"attacker-{port}", "address": "nowhere:1"})
            assert conn.recv_json()["op"] == "welcome"
        conn.sock.sendall(data)
        _drain_until_closed(conn.sock)
    finally:
        conn.close()
    return port


def send_random_frame(address: str, token: bytes) -> int:
    return send_frame_bytes(address, token, b"JUNK" + os.urandom(60))


def send_huge_frame(address: str, token: bytes) -> int:
    """A header that claims a 100 GiB payload (and no payload)."""
    return send_frame_bytes(address, token, _raw_frame(wire.Kind.BYTES, b"", length=HUNDRED_GIB))


def send_truncated_frame(address: str, token: bytes) -> int:
    """A header that says 1000 bytes, then 10 bytes, then the connection closes."""
    conn = auth.connect(address, token)
    port = conn.sock.getsockname()[1]
    conn.sock.sendall(_raw_frame(wire.Kind.CONTROL, b"{" * 10, length=1000))
    conn.close()
    return port


def send_pickle(address: str, token: bytes, kind: int, path: str, join_first: bool = False) -> int:
    return send_frame_bytes(address, token, _raw_frame(kind, pickle_bomb(path)), join_first)


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.INFO)
    return caplog


def log_line(caplog, text: str, port: int | None = None, timeout: float = 5.0) -> str:
    """The log line that contains ``text`` (and ``:port``, if given), waiting for it."""

    def find():
        return next(
            (
                r.getMessage()
                for r in caplog.records
                if text in r.getMessage() and (port is None or f":{port}" in r.getMessage())
            ),
            None,
        )

    assert wait_until(lambda: find() is not None, timeout), (
        f"no log line with {text!r} (port {port}) in:\n{caplog.text}"
    )
    return find()


@pytest.fixture
def listener():
    """A Listener that echoes every frame; ``outcomes`` holds what its handlers received
    (each Frame, and the exception that ended a connection)."""
    outcomes: queue.Queue = queue.Queue()

    def handle(conn: wire.Connection) -> None:
        while True:
            try:
                frame = conn.recv()
            except Exception as e:
                outcomes.put(e)
                raise
            outcomes.put(frame)
            if frame.kind == wire.Kind.CONTROL:
                conn.send_json({"echo": frame.json()}, tag=frame.tag)
            else:
                conn.send(frame.kind, frame.payload, tag=frame.tag, flags=frame.flags)

    with auth.Listener(handle, token=TOKEN) as lst:
        lst.outcomes = outcomes
        yield lst


@pytest.fixture
def broker():
    with Broker(port=0, token=TOKEN, heartbeat_s=0.1, timeout_s=5.0, settle_s=0.05) as b:
        yield b


# ---------------------------------------------------------------- handshake


def test_handshake_and_round_trip(listener):
    with auth.connect(listener.address, TOKEN) as conn:
        conn.send_json({"hello": [1, "two"]}, tag=7)
        assert conn.recv_json() == {"echo": {"hello": [1, "two"]}}
    assert listener.outcomes.get(timeout=5).tag == 7


def test_wrong_token_refused_by_the_server(listener, logs):
    send_wrong_token(listener.address, TOKEN)
    assert "wrong token" in log_line(logs, "wrong token")
    assert listener.outcomes.empty()


def _fake_server(greeting: bytes, proof: bytes | None):
    """A one-shot server that greets with ``greeting`` and answers a hello with ``proof``."""
    sock = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = sock.accept()
        with conn:
            conn.sendall(greeting)
            if proof is not None:
                conn.recv(auth.CLIENT_HELLO.size, socket.MSG_WAITALL)
                conn.sendall(proof)
            conn.recv(1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return sock, thread, f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize(
    "greeting, proof, message",
    [
        (
            auth.SERVER_HELLO.pack(auth.HELLO_MAGIC, wire.VERSION, os.urandom(32)),
            os.urandom(32),
            "does not hold our token",
        ),
        (b"SSH-2.0-OpenSSH_9.2p1 Debian\r\n" + bytes(7), None, "is not a shmpad endpoint"),
        (auth.SERVER_HELLO.pack(auth.HELLO_MAGIC, 99, os.urandom(32)), None, "speaks wire version 99"),
    ],
    ids=["server-without-token", "not-shmpad", "other-version"],
)
def test_client_refuses_a_server_that_fails_the_handshake(greeting, proof, message):
    sock, thread, address = _fake_server(greeting, proof)
    try:
        with pytest.raises(AuthError, match=message):
            auth.connect(address, TOKEN)
    finally:
        thread.join(5)
        sock.close()


def _idle_socket(address: str, source: str) -> socket.socket:
    """A TCP connection from ``source`` (any 127.x.y.z works on loopback) that never says a word."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.connect(wire.parse_address(address))
    return sock


def _was_refused(sock: socket.socket) -> bool:
    """True if the listener reset ``sock`` unread (an idle one being served got a hello instead)."""
    sock.settimeout(5)
    try:
        return sock.recv(auth.SERVER_HELLO.size, socket.MSG_WAITALL) == b""
    except ConnectionResetError:
        return True


def test_idle_sockets_from_one_address_cannot_lock_others_out(listener, logs, monkeypatch):
    """With a per-address cap below the global one, one host's silent sockets take only
    their share of the handshake slots: a client from another address still connects."""
    monkeypatch.setattr(auth, "MAX_HANDSHAKES", 4)
    monkeypatch.setattr(auth, "EVICT_AFTER_S", 60.0)  # refusal, not eviction, is tested here
    idle = []
    with auth.Listener(listener._handler, token=TOKEN, max_handshakes_per_ip=2) as lst:
        try:
            idle = [_idle_socket(lst.address, "127.0.0.2") for _ in range(8)]
            refused = [_was_refused(sock) for sock in idle]
            assert refused == [False] * 2 + [True] * 6
            assert "2 handshakes from 127.0.0.2 already in progress" in log_line(
                logs, "refused 127.0.0.2:", idle[-1].getsockname()[1]
            )
            with auth.connect(lst.address, TOKEN) as conn:  # from 127.0.0.1
                conn.send_json({"still": "here"})
                assert conn.recv_json() == {"echo": {"still": "here"}}
            # the global cap still holds over all addresses
            idle += [_idle_socket(lst.address, "127.0.0.3") for _ in range(2)]
            assert [_was_refused(sock) for sock in idle[-2:]] == [False, False]
            late = _idle_socket(lst.address, "127.0.0.4")
            idle.append(late)
            assert _was_refused(late)
            assert "4 handshakes already in progress" in log_line(logs, "refused 127.0.0.4:", late.getsockname()[1])
        finally:
            for sock in idle:
                sock.close()


def test_a_silent_client_frees_its_slot_after_the_server_deadline(listener, logs, monkeypatch):
    assert auth.SERVER_HANDSHAKE_TIMEOUT_S <= 5.0 < auth.HANDSHAKE_TIMEOUT_S
    monkeypatch.setattr(auth, "SERVER_HANDSHAKE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(auth, "EVICT_AFTER_S", 60.0)  # the deadline, not eviction, frees the slot here
    with auth.Listener(listener._handler, token=TOKEN, max_handshakes_per_ip=1) as lst:
        with _idle_socket(lst.address, "127.0.0.2") as sock:
            assert not _was_refused(sock)
            log_line(logs, "no complete handshake within 0.3 s", sock.getsockname()[1])
            _drain_until_closed(sock)
        assert wait_until(lambda: not lst._handshakes, 60)
        with _idle_socket(lst.address, "127.0.0.2") as sock:  # the slot is free again
            assert not _was_refused(sock)


@pytest.mark.parametrize("cap, error", [(0, ValueError), (True, TypeError), (1.5, TypeError)])
def test_max_handshakes_per_ip_is_checked(cap, error):
    with pytest.raises(error, match="max_handshakes_per_ip must be"):
        auth.Listener(lambda conn: None, token=TOKEN, max_handshakes_per_ip=cap)


# ---------------------------------------------------------------- bad input


def test_random_bytes_instead_of_a_hello(listener, logs):
    port = send_random_hello(listener.address, TOKEN)
    assert "not a shmpad client" in log_line(logs, "refused", port)
    assert listener.outcomes.empty()


@pytest.mark.parametrize(
    "attack, message",
    [
        (send_random_frame, "bad frame magic"),
        (send_huge_frame, f"frame claims {HUNDRED_GIB} bytes, the limit is {wire.MAX_FRAME}"),
    ],
    ids=["random-bytes", "100-GiB"],
)
def test_bad_frame_closes_the_connection_with_a_log_line(listener, logs, attack, message):
    port = attack(listener.address, TOKEN)
    assert message in log_line(logs, "closing connection from", port)
    outcome = listener.outcomes.get(timeout=5)
    assert isinstance(outcome, FrameError) and message in str(outcome)
    with auth.connect(listener.address, TOKEN) as conn:  # the listener goes on
        conn.send_json({"still": "here"})
        assert conn.recv_json() == {"echo": {"still": "here"}}


def test_truncated_frame(listener):
    send_truncated_frame(listener.address, TOKEN)
    outcome = listener.outcomes.get(timeout=5)
    assert isinstance(outcome, ConnectionError) and "in the middle of a 1000-byte frame" in str(outcome)


def test_oversized_frame_is_refused_before_sending(listener):
    with auth.connect(listener.address, TOKEN, max_frame=100) as conn:
        with pytest.raises(FrameError, match="frame of 101 bytes exceeds this connection's limit of 100 bytes"):
            conn.send(wire.Kind.BYTES, bytes(101))


@pytest.mark.parametrize("join_first", [False, True], ids=["first-frame", "after-join"])
@pytest.mark.parametrize("kind", list(wire.Kind), ids=[k.name for k in wire.Kind])
def test_broker_never_unpickles(broker, logs, tmp_path, kind, join_first):
    marker = tmp_path / "unpickled"
    port = send_pickle(broker.address, TOKEN, kind, str(marker), join_first)
    expected = (
        "not valid UTF-8 JSON" if kind == wire.Kind.CONTROL else f"expected a CONTROL frame, got kind {int(kind)}"
    )
    assert expected in log_line(logs, "closing connection from", port)
    assert not marker.exists()


def test_deeply_nested_json_is_a_frame_error():
    frame = wire.Frame(wire.Kind.CONTROL, 0, 0, bytearray(b"[" * 200000))
    with pytest.raises(FrameError, match="nests its JSON deeper than this side can decode"):
        frame.json()


@pytest.fixture
def json_listener():
    """A Listener (default max_frame, like the mesh's) whose handlers read with
    ``recv_json``; ``outcomes`` holds the exception that ended each connection."""
    outcomes: queue.Queue = queue.Queue()

    def handle(conn: wire.Connection) -> None:
        try:
            while True:
                conn.recv_json()
        except Exception as e:
            outcomes.put(e)
            raise

    with auth.Listener(handle, token=TOKEN) as lst:
        lst.outcomes = outcomes
        yield lst


def test_recv_json_refuses_a_frame_of_another_kind_before_reading_it(json_listener, logs):
    """A BYTES header claiming 200 MiB (under max_frame) is refused at once, unread:
    the sender never sends the payload and the receiver allocates nothing for it."""
    claim = 200 << 20
    port = send_frame_bytes(json_listener.address, TOKEN, _raw_frame(wire.Kind.BYTES, b"", length=claim))
    message = f"expected a CONTROL frame, got kind 3 ({claim} bytes)"
    assert message in log_line(logs, "closing connection from", port)
    outcome = json_listener.outcomes.get(timeout=5)
    assert isinstance(outcome, FrameError) and message in str(outcome)


def test_recv_json_refuses_deeply_nested_json_with_a_log_line(json_listener, logs):
    port = send_frame_bytes(json_listener.address, TOKEN, _raw_frame(wire.Kind.CONTROL, b"[" * 200000))
    assert "nests its JSON deeper" in log_line(logs, "closing connection from", port)
    assert isinstance(json_listener.outcomes.get(timeout=5), FrameError)


# ---------------------------------------------------------------- addresses and tokens


@pytest.mark.parametrize(
    "address, expected",
    [
        ("10.0.0.1:4431", ("10.0.0.1", 4431)),
        ("[::1]:80", ("::1", 80)),
        (("h", 5), ("h", 5)),
        ("host:0", ("host", 0)),
        ("host.example:65535", ("host.example", 65535)),
    ],
)
def test_parse_address(address, expected):
    assert wire.parse_address(address) == expected
    assert wire.parse_address(wire.join_address(*expected)) == expected


@pytest.mark.parametrize(
    "address, expected",
    [("4431", ("127.0.0.1", 4431)), (":4431", ("127.0.0.1", 4431)), (0, ("127.0.0.1", 0)), ("h:80", ("h", 80))],
)
def test_parse_address_with_a_default_host_takes_a_port_alone(address, expected):
    assert wire.parse_address(address, default_host="127.0.0.1") == expected


@pytest.mark.parametrize(
    "address, error, message",
    [
        ("localhost", ValueError, "address 'localhost' has no port; use HOST:PORT"),
        ("", ValueError, "address '' has no port; use HOST:PORT"),
        ("4431", ValueError, "address '4431' has no port; use HOST:PORT"),  # no default host: a host named 4431
        ("h:http", ValueError, "address 'h:http': port 'http' is not a number"),
        ("h:", ValueError, "address 'h:': port '' is not a number"),
        ("h:-1", ValueError, "address 'h:-1': port '-1' is not a number"),
        ("h: 80", ValueError, "address 'h: 80': port ' 80' is not a number"),
        ("h:\u0668\u0660", ValueError, "address 'h:\u0668\u0660': port '\u0668\u0660' is not a number"),
        (":4431", ValueError, "address ':4431' has no host"),
        ("[]:4431", ValueError, r"address '\[\]:4431' has no host"),
        ("h:70000", ValueError, "address 'h:70000': port must be in 0..65535, got 70000"),
        ("::1:80", ValueError, r"address '::1:80': an IPv6 host goes in brackets, as \[::1\]:4431"),
        ("[::1]", ValueError, r"address '\[::1\]': an IPv6 host in brackets takes a port"),
        ("[::1:80", ValueError, r"address '\[::1:80': an IPv6 host in brackets takes a port"),
        ("tcp://h:80", ValueError, "address 'tcp://h:80': no scheme here; use HOST:PORT"),
        ("my host:80", ValueError, "address 'my host:80': host 'my host' holds a space"),
        (4431, TypeError, "address must be 'HOST:PORT', a \\(host, port\\) pair, got int"),
        (None, TypeError, "got NoneType"),
        (("h", "80"), TypeError, r"address \('h', '80'\): port must be an int, got str"),
        (("h", True), TypeError, r"address \('h', True\): port must be an int, got bool"),
        (("h",), TypeError, r"address \('h',\) must be a \(host: str, port: int\) pair"),
        (("h", 70000), ValueError, r"address \('h', 70000\): port must be in 0..65535, got 70000"),
    ],
)
def test_parse_address_errors_name_the_value(address, error, message):
    with pytest.raises(error, match=message):
        wire.parse_address(address)


def test_parse_address_with_a_default_host_refuses_a_bool_and_a_name_alone():
    with pytest.raises(TypeError, match=r"a \(host, port\) pair or a port number, got bool"):
        wire.parse_address(True, default_host="127.0.0.1")
    with pytest.raises(ValueError, match="address 'localhost' has no port; use HOST:PORT"):
        wire.parse_address("localhost", default_host="127.0.0.1")


def test_refuse_tells_the_peer_why_logs_it_and_closes(logs):
    ours, theirs = socket.socketpair()
    conn, other = wire.Connection(ours, "them"), wire.Connection(theirs, "us")  # each named for its peer
    try:
        conn.refuse("it asked for ring 'x' twice", {"refused": "ring 'x' twice"})
        assert conn.closed
        assert log_line(logs, "them") == "closing connection from them: it asked for ring 'x' twice"
        assert other.recv_json() == {"refused": "ring 'x' twice"}
        with pytest.raises(ConnectionError, match="^us closed the connection$"):
            other.recv_json()
    finally:
        other.close()
        conn.close()


def test_refuse_closes_a_connection_whose_peer_has_left():
    ours, theirs = socket.socketpair()
    conn = wire.Connection(ours, "them")
    theirs.close()
    conn.refuse("too late", {"refused": "too late"})  # nobody to tell: no error
    assert conn.closed


def test_load_token(tmp_path, monkeypatch):
    monkeypatch.delenv(auth.TOKEN_ENV, raising=False)
    with pytest.raises(AuthError, match=r"no token: set \$SHMPAD_TOKEN"):
        auth.load_token()
    monkeypatch.setenv(auth.TOKEN_ENV, " from-env\n")
    assert auth.load_token() == b"from-env"
    assert auth.load_token("given") == b"given"
    path = tmp_path / "token"
    path.write_text("from-file\n")
    assert auth.load_token(token_file=path) == b"from-file"
    path.write_text(" \n")
    with pytest.raises(AuthError, match=f"token file '{path}' is empty"):
        auth.load_token(token_file=path)
    with pytest.raises(AuthError, match=f"cannot read token file '{tmp_path / 'nope'}': No such file"):
        auth.load_token(token_file=tmp_path / "nope")
    monkeypatch.setenv(auth.TOKEN_ENV, "")
    with pytest.raises(AuthError, match=r"\$SHMPAD_TOKEN is empty"):
        auth.load_token()


def _sealed_pair(key_ab: bytes = b"k" * 32, key_ba: bytes = b"K" * 32):
    a, b = socket.socketpair()
    return wire.Connection(a, "a", keys=(key_ab, key_ba)), wire.Connection(b, "b", keys=(key_ba, key_ab))


def test_pickle_frames_carry_an_integrity_tag_checked_before_decoding():
    """A PICKLE frame arrives only if it is exactly what the peer sent, in order: a
    replayed, tampered or foreign-key frame closes the connection undecoded."""
    sender, receiver = _sealed_pair()
    with sender, receiver:
        for payload in (b"first", b"", b"x" * 100_000):
            sender.send(wire.Kind.PICKLE, payload, tag=7)
            frame = receiver.recv()
            assert (frame.kind, frame.tag, bytes(frame.payload)) == (wire.Kind.PICKLE, 7, payload)
        # the same keys with a sequence of its own: a replay of frame 0
        replay = wire.Connection(sender.sock.dup(), "replayer", keys=(b"k" * 32, b"K" * 32))
        replay.send(wire.Kind.PICKLE, b"first")
        with pytest.raises(wire.FrameError, match="failed its integrity check"):
            receiver.recv()
        replay.close()
    for mutate in ("tamper", "wrong key"):
        a, b = socket.socketpair()
        with a, b:
            key = b"z" * 32 if mutate == "wrong key" else b"k" * 32
            wire.Connection(a, "a", keys=(key, b"")).send(wire.Kind.PICKLE, b"payload")
            raw = bytearray(b.recv(1 << 16))
            if mutate == "tamper":
                raw[wire.HEADER.size] ^= 1
            c, d = socket.socketpair()
            with c, wire.Connection(d, "d", keys=(b"", b"k" * 32)) as receiver:
                c.sendall(raw)
                with pytest.raises(wire.FrameError, match="failed its integrity check"):
                    receiver.recv()


def test_sockets_trickling_bytes_cannot_keep_members_out(listener, caplog):
    """Slowloris from the members' own address: 40 sockets each trickle a byte of the
    hello every 0.5 s, for as long as the test runs. A member connecting meanwhile gets in
    while the attack still holds every handshake slot: a handshake pending for
    EVICT_AFTER_S is evicted to make room (the listener logs each eviction)."""
    caplog.set_level(logging.WARNING, logger="shmpad.net")
    address = wire.parse_address(listener.address)
    stop = threading.Event()
    attackers: list[socket.socket] = []

    def trickle() -> None:
        while not stop.is_set():
            for sock in list(attackers):
                try:
                    sock.send(b"S")
                except OSError:
                    attackers.remove(sock)  # evicted
            stop.wait(0.5)

    for _ in range(40):
        try:
            attackers.append(socket.create_connection(address, timeout=5))
        except OSError:
            pass
    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        stop.wait(auth.EVICT_AFTER_S + 0.2)  # the attack established: its sockets are past the eviction age
        for i in range(5):
            stop.wait(0.3)
            with auth.connect(listener.address, TOKEN, timeout=60) as conn:  # 60 s: a hang guard
                conn.send_json({"member": i})
                assert conn.recv_json() == {"echo": {"member": i}}
        assert "evicted a handshake" in caplog.text, "the members got in without evicting the attack"
    finally:
        stop.set()
        thread.join(10)
        for sock in attackers:
            sock.close()
