"""The broker in a process of its own (``python -m shmpad.net.broker``) and GroupClients:
join order and epochs, peers dropped on EOF and on silence, a name that rejoins, bad
input refused with a log line while members stay, the broker killed and restarted,
binding, tokens, signals, and peers in separate network namespaces.

The broker logs to a file; tests wait for its lines (and for member lists) with
deadlines, never for a fixed time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
import test_net_wire as attacks
from helpers import kill_and_reap, read_line, start_session, track_pid, wait_until
from helpers.netns import netns  # noqa: F401  (a fixture)

from shmpad.net import auth, wire
from shmpad.net import broker as broker_module
from shmpad.net import group as group_module
from shmpad.net.group import GroupClient, Member, Membership

TOKEN = attacks.TOKEN.decode()
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = ["--settle", "0.1", "--heartbeat", "0.1", "--timeout", "3"]


class BrokerProcess:
    """``python -m shmpad.net.broker --port 0 ...`` with its stderr in ``log_path``."""

    def __init__(self, log_path, args: list[str], token: str | None = TOKEN):
        env = {k: v for k, v in os.environ.items() if k != auth.TOKEN_ENV}
        if token is not None:
            env[auth.TOKEN_ENV] = token
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = start_session(
                [sys.executable, "-m", "shmpad.net.broker", *args],
                stdout=subprocess.PIPE,
                stderr=log,
                bufsize=0,
                cwd=REPO,
                env=env,
            )
        track_pid(self.proc.pid)
        self.address = ""

    def ready(self) -> BrokerProcess:
        line = read_line(self.proc, timeout=30)
        assert line.startswith("broker listening on "), line
        self.address = line.rsplit(" ", 1)[1]
        return self

    @property
    def port(self) -> int:
        return wire.parse_address(self.address)[1]

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def log_line(self, text: str, port: int | None = None, timeout: float = 5.0) -> str:
        """The first log line that holds ``text`` (and ``:port``, if given), waiting for it."""

        def find():
            return next(
                (line for line in self.log().splitlines() if text in line and (port is None or f":{port}" in line)),
                None,
            )

        assert wait_until(lambda: find() is not None, timeout), (
            f"broker logged no line with {text!r} (port {port}):\n{self.log()}"
        )
        return find()

    def signal(self, sig: int, timeout: float = 10.0) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)


@pytest.fixture
def start_broker(tmp_path):
    """``start_broker(*args, token=TOKEN, ready=True)``; every broker is killed at teardown."""
    started: list[BrokerProcess] = []

    def start(*args: str, token: str | None = TOKEN, ready: bool = True) -> BrokerProcess:
        args = list(args) if any(a.startswith("--port") for a in args) else ["--port", "0", *args]
        broker = BrokerProcess(tmp_path / "broker.log", args, token)
        started.append(broker)
        return broker.ready() if ready else broker

    yield start
    for broker in started:
        kill_and_reap(broker.proc)


@pytest.fixture
def clients():
    """``clients(broker, group, name, address=..., **kw)`` -> a started GroupClient, closed at teardown."""
    made: list[GroupClient] = []

    def make(broker: BrokerProcess, group: str, name: str, address: str | None = None, **kwargs) -> GroupClient:
        kwargs.setdefault("token", TOKEN)
        kwargs.setdefault("reconnect_max_s", 0.2)
        client = GroupClient(broker.address, group, name, address or f"{name}.example:7000", **kwargs)
        made.append(client)
        return client.start()

    yield make
    for client in made:
        client.close()


def wait_for(client: GroupClient, want: Callable[[Membership], bool], what: str, timeout: float = 5.0) -> Membership:
    """The first list ``client`` holds that satisfies ``want``."""
    deadline = time.monotonic() + timeout
    m = client.membership()
    while m is None or not want(m):
        left = deadline - time.monotonic()
        assert left > 0, f"{client.name} holds {m}, not {what}; last_error={client.last_error!r}"
        m = client.wait_membership(m and m.key, timeout=left) or m
    return m


def wait_names(client: GroupClient, names: list[str], timeout: float = 5.0) -> Membership:
    """The first list ``client`` holds with exactly ``names``, in that order."""
    return wait_for(client, lambda m: list(m.names) == names, f"a list of {names}", timeout)


def raw_join(
    broker: BrokerProcess | broker_module.Broker, group: str, name: str, address: str = "raw:1"
) -> wire.Connection:
    """A member that joins by hand and then says nothing more."""
    conn = auth.connect(broker.address, TOKEN)
    conn.send_json({"op": "join", "group": group, "name": name, "address": address})
    welcome = conn.recv_json()
    assert welcome["op"] == "welcome", welcome
    return conn


PEER = """
import sys
from shmpad.net.group import GroupClient
broker, group, name, address = sys.argv[1:5]
client = GroupClient(broker, group, name, address, reconnect_max_s=0.2).start()
seen = None
while True:
    seen = client.wait_membership(seen and seen.key, timeout=60)
    if seen is None:
        break
    print(" ".join(f"{m.name}@{m.address}" for m in seen.members), flush=True)
"""


def peer_sees(proc: subprocess.Popen, members: set[str], timeout: float = 10.0) -> None:
    """Wait until a PEER process prints a list of exactly ``members`` ("name@address")."""
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while not seen or set(seen[-1].split()) != members:
        left = deadline - time.monotonic()
        assert left > 0, f"peer {proc.pid} printed {seen}, never {members}"
        seen.append(read_line(proc, timeout=left))


def spawn_peer(broker: BrokerProcess, group: str, name: str, address: str) -> subprocess.Popen:
    env = dict(os.environ, **{auth.TOKEN_ENV: TOKEN})
    proc = start_session(
        [sys.executable, "-c", PEER, broker.address, group, name, address],
        stdout=subprocess.PIPE,
        bufsize=0,
        cwd=REPO,
        env=env,
    )
    track_pid(proc.pid)
    return proc


# ---------------------------------------------------------------- membership


def test_join_order_and_epochs(start_broker, clients):
    broker = start_broker(*FAST)
    a = clients(broker, "g", "a")
    first = wait_names(a, ["a"])
    b = clients(broker, "g", "b")
    wait_names(a, ["a", "b"])
    c = clients(broker, "g", "c")
    full = wait_names(a, ["a", "b", "c"])
    for x in (b, c):
        assert wait_names(x, ["a", "b", "c"]).key == full.key
    assert full.broker_id == first.broker_id and full.epoch > first.epoch
    assert full.members[1] == Member("b", "b.example:7000")
    assert [full.rank(n) for n in "abc"] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"'zed' is not a member at epoch \d+ \(members: a, b, c\)"):
        full.rank("zed")

    other = clients(broker, "h", "zed")  # another group: its own list and epochs
    assert wait_names(other, ["zed"]).epoch == 1

    b.close()
    after = wait_names(a, ["a", "c"])
    assert after.epoch > full.epoch
    assert "'b' left group 'g'" in broker.log_line("left group")
    b2 = clients(broker, "g", "b")  # back at the end: ordered by join time
    assert wait_names(b2, ["a", "c", "b"]).epoch > after.epoch
    assert "zed" not in a.membership().names


def test_changes_that_come_together_make_one_list(start_broker):
    broker = start_broker("--settle", "2.0", "--timeout", "60")  # the raw members never ping
    conns = [raw_join(broker, "g", name) for name in "xyz"]
    try:
        for conn in conns:
            msg = conn.recv_json()
            assert (msg["op"], msg["epoch"], [m["name"] for m in msg["members"]]) == ("members", 1, ["x", "y", "z"])
    finally:
        for conn in conns:
            conn.close()


def test_sigkilled_peer_is_dropped_at_once(start_broker, clients):
    broker = start_broker("--settle", "0.1", "--heartbeat", "1", "--timeout", "600")
    observer = clients(broker, "g", "observer")
    wait_names(observer, ["observer"])
    peer = spawn_peer(broker, "g", "victim", "victim:1")
    try:
        peer_sees(peer, {"observer@observer.example:7000", "victim@victim:1"})
        wait_names(observer, ["observer", "victim"])
        kill_and_reap(peer)
        wait_names(observer, ["observer"], timeout=60)  # hang guard: the 600 s timeout is far off
        assert "closed the connection" in broker.log_line("dropped 'victim'"), "dropped by the timeout, not at EOF"
    finally:
        kill_and_reap(peer)


def test_silent_peer_is_dropped_after_the_timeout(start_broker, clients):
    broker = start_broker("--settle", "0.05", "--heartbeat", "0.1", "--timeout", "1.5")
    observer = clients(broker, "g", "observer")
    wait_names(observer, ["observer"])
    silent = raw_join(broker, "g", "silent")
    try:
        joined = time.monotonic()
        wait_names(observer, ["observer", "silent"])
        wait_names(observer, ["observer"], timeout=60)
        assert time.monotonic() - joined > 1.4  # not before its timeout: load only delays the drop
        assert "sent nothing for 1.5 s" in broker.log_line("dropped 'silent'")
        assert observer.connected  # pinging members outlive the timeout
    finally:
        silent.close()


def test_by_default_pings_are_fast_and_a_hung_member_goes_within_a_second(start_broker, clients):
    """The command line's defaults: pings every 0.2 s at most, and a member that stops
    pinging announced gone ``timeout + settle`` (under a second) after its last ping.
    What that takes in practice is measured by ``python -m bench.elastic``, not here."""
    broker = start_broker()
    observer = clients(broker, "g", "observer")
    lists: list[tuple[str, ...]] = []  # every list, in order: the one with "hung" is short-lived
    observer.add_listener(lambda m: lists.append(m.names))
    wait_names(observer, ["observer"])
    hung = auth.connect(broker.address, TOKEN)
    try:
        hung.send_json({"op": "join", "group": "g", "name": "hung", "address": "hung:1"})
        welcome = hung.recv_json()
        assert welcome["heartbeat_s"] <= 0.2
        assert welcome["timeout_s"] + broker_module.SETTLE_S < 1.0
        assert welcome["timeout_s"] >= 4 * welcome["heartbeat_s"], "a member a few pings late must not be dropped"
        joined = lambda: ("observer", "hung") in lists  # noqa: E731
        assert wait_until(joined, 10), f"lists seen: {lists}"
        dropped = lambda: ("observer",) in lists[lists.index(("observer", "hung")) + 1 :]  # noqa: E731
        assert wait_until(dropped, 60), f"lists seen: {lists}"  # 60 s: a hang guard only
        assert f"sent nothing for {welcome['timeout_s']} s" in broker.log_line("dropped 'hung'")
        assert observer.connected  # a pinging member outlives the timeout
    finally:
        hung.close()


def test_rejoin_with_the_same_name_replaces(start_broker, clients):
    broker = start_broker("--settle", "0.1", "--heartbeat", "0.1", "--timeout", "60")  # the raw member never pings
    observer = clients(broker, "g", "observer")
    wait_names(observer, ["observer"])
    old = raw_join(broker, "g", "x", "old:1")
    try:
        assert wait_names(observer, ["observer", "x"]).members[1].address == "old:1"
        new = clients(broker, "g", "x", "new:2")
        wait_for(
            observer,
            lambda m: m.members == (Member("observer", "observer.example:7000"), Member("x", "new:2")),
            "x at new:2",
        )
        farewell = next(msg for msg in iter(old.recv_json, None) if msg["op"] == "error")
        assert farewell["replaced"] is True and "'x' joined group 'g' again" in farewell["message"]
        with pytest.raises(ConnectionError):
            old.recv()
        newer = clients(broker, "g", "x", "newer:3")  # a live client that is replaced stops
        wait_for(observer, lambda m: m.members[1:] == (Member("x", "newer:3"),), "x at newer:3")
        assert wait_until(lambda: not new.connected and "replaced" in (new.last_error or ""), 60)
        started = time.monotonic()
        assert new.wait_membership(new.membership().key, timeout=0.3) is None  # blocks: nothing new comes
        assert time.monotonic() - started >= 0.3
        assert newer.connected and observer.membership().names == ("observer", "x")
    finally:
        old.close()


# ---------------------------------------------------------------- bad input

BAD_JOINS = [
    ({"op": "hello"}, "the first message must be a join, got op 'hello'"),
    ({"op": "join", "group": "g", "name": "n" * 129, "address": "a:1"}, "name must be at most 128 characters, got 129"),
    ({"op": "join", "group": "", "name": "n", "address": "a:1"}, "group must not be empty"),
    ({"op": "join", "group": "g", "name": "n", "address": 7}, "address must be a string, got 7"),
    ({"op": "join", "group": "g", "name": "n", "address": ""}, "join: address '' has no port; use HOST:PORT"),
    ({"op": "join", "group": "g", "name": "n", "address": "h:x"}, "join: address 'h:x': port 'x' is not a number"),
    ({"op": "join", "group": "g", "name": "n", "address": ":1"}, "join: address ':1' has no host"),
]


def _bad_join(broker: BrokerProcess, msg: dict, message: str) -> int:
    with auth.connect(broker.address, TOKEN) as conn:
        port = conn.sock.getsockname()[1]
        conn.send_json(msg)
        reply = conn.recv_json()
        assert reply["op"] == "error" and message in reply["message"], reply
        with pytest.raises(ConnectionError):
            conn.recv()
    return port


def _attacks(marker: str):
    """(name, attack(broker) -> our port or None, the text the broker's log line holds)."""
    yield "wrong-token", lambda b: attacks.send_wrong_token(b.address, TOKEN.encode()), "wrong token"
    yield "random-hello", lambda b: attacks.send_random_hello(b.address, TOKEN.encode()), "not a shmpad client"
    yield "random-frame", lambda b: attacks.send_random_frame(b.address, TOKEN.encode()), "bad frame magic"
    yield (
        "100-GiB",
        lambda b: attacks.send_huge_frame(b.address, TOKEN.encode()),
        f"frame claims {attacks.HUNDRED_GIB} bytes",
    )
    yield (
        "truncated",
        lambda b: attacks.send_truncated_frame(b.address, TOKEN.encode()),
        "in the middle of a 1000-byte frame",
    )
    for kind in wire.Kind:
        text = (
            "not valid UTF-8 JSON" if kind == wire.Kind.CONTROL else f"expected a CONTROL frame, got kind {int(kind)}"
        )
        for join_first in (False, True):
            name = f"pickle-{kind.name}{'-after-join' if join_first else ''}"
            yield (
                name,
                (lambda b, k=kind, j=join_first: attacks.send_pickle(b.address, TOKEN.encode(), k, marker, j)),
                text,
            )
    for i, (msg, text) in enumerate(BAD_JOINS):
        yield f"bad-join-{i}", (lambda b, m=msg, t=text: _bad_join(b, m, t)), text
    not_an_object = attacks._raw_frame(wire.Kind.CONTROL, b"[1, 2]")
    yield (
        "json-list",
        lambda b: attacks.send_frame_bytes(b.address, TOKEN.encode(), not_an_object),
        "must hold a JSON object, got list",
    )
    unknown_op = attacks._raw_frame(wire.Kind.CONTROL, b'{"op": "dance"}')
    yield (
        "unknown-op",
        lambda b: attacks.send_frame_bytes(b.address, TOKEN.encode(), unknown_op, True),
        "unknown op 'dance'",
    )


ATTACK_NAMES = [name for name, _, _ in _attacks("")]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """One broker with one member for all the attacks: each must leave both unharmed."""
    path = tmp_path_factory.mktemp("attacks")
    broker = BrokerProcess(path / "broker.log", ["--port", "0", *FAST]).ready()
    member = GroupClient(broker.address, "g", "member", "member:1", token=TOKEN, reconnect_max_s=0.2).start()
    try:
        wait_names(member, ["member"])
        yield broker, member, str(path / "unpickled")
    finally:
        member.close()
        kill_and_reap(broker.proc)


@pytest.mark.parametrize("name", ATTACK_NAMES)
def test_bad_input_is_refused_and_harms_no_one(target, name):
    broker, member, marker = target
    attack, text = next((a, t) for n, a, t in _attacks(marker) if n == name)
    before = member.membership()
    port = attack(broker)
    line = broker.log_line(text, port)
    assert "WARNING" in line
    assert broker.proc.poll() is None and member.connected
    assert not os.path.exists(marker), "the broker unpickled a payload"
    newcomer = GroupClient(broker.address, "g", "newcomer", "n:2", token=TOKEN).start()
    try:
        wait_names(member, ["member", "newcomer"])
    finally:
        newcomer.close()
    wait_names(member, ["member"])
    assert member.membership().epoch > before.epoch and member.connected


# ---------------------------------------------------------------- broker lifetime


def test_broker_killed_and_restarted_on_the_same_port(start_broker, clients):
    broker = start_broker(*FAST)
    a, b = clients(broker, "g", "a"), clients(broker, "g", "b")
    old = wait_for(a, lambda m: set(m.names) == {"a", "b"}, "a list of a and b")
    kill_and_reap(broker.proc)
    assert wait_until(lambda: not a.connected and not b.connected, 60)
    restarted = start_broker("--port", str(broker.port), *FAST)
    assert restarted.address == broker.address
    for client in (a, b):
        new = wait_for(client, lambda m: m.broker_id != old.broker_id and set(m.names) == {"a", "b"}, "a new list", 30)
        # epoch 1, or 2 when the two rejoin more than a settle apart
        assert new.epoch >= 1 and restarted.log_line(f"'{client.name}' joined")
    assert a.connected and b.connected and a.last_error is None


def test_wrong_token_surfaces_and_the_client_keeps_trying(start_broker, clients):
    broker = start_broker(*FAST, token="another-token")
    client = clients(broker, "g", "a")
    assert wait_until(lambda: client.last_error is not None, 60)
    assert "refused our token" in client.last_error and broker.address in client.last_error
    assert client.wait_membership(timeout=0.3) is None and not client.connected
    broker.log_line("wrong token")
    kill_and_reap(broker.proc)
    right = start_broker("--port", str(broker.port), *FAST)  # restarted with the right token
    wait_names(client, ["a"], timeout=10)
    assert client.last_error is None and right.log_line("'a' joined")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_signal_stops_the_broker_cleanly(start_broker, clients, sig):
    broker = start_broker(*FAST)
    client = clients(broker, "g", "a")
    wait_names(client, ["a"])
    assert broker.signal(sig) == 0
    assert f"stopping on {sig.name}" in broker.log()
    assert wait_until(lambda: not client.connected, 60)


def test_binds_loopback_by_default(start_broker):
    broker = start_broker(*FAST)
    host, port = wire.parse_address(broker.address)
    assert host == "127.0.0.1"
    with open(f"/proc/{broker.proc.pid}/net/tcp") as f:
        listening = [line.split()[1] for line in f.readlines()[1:] if line.split()[3] == "0A"]
    assert f"0100007F:{port:04X}" in listening


def test_token_file(start_broker, clients, tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    broker = start_broker("--token-file", str(path), *FAST, token=None)
    wait_names(clients(broker, "g", "a"), ["a"])


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "cannot read token file '{path}': No such file or directory"),
        ("empty", "token file '{path}' is empty"),
        ("none", "no token: set $SHMPAD_TOKEN"),
    ],
    ids=["missing", "empty", "none"],
)
def test_broker_without_a_usable_token_exits(start_broker, tmp_path, case, message):
    path = tmp_path / "token"
    if case == "empty":
        path.write_text(" \n")
    broker = start_broker(*(["--token-file", str(path)] if case != "none" else []), token=None, ready=False)
    assert broker.proc.wait(30) == 2
    assert message.format(path=path) in broker.log()
    assert broker.proc.stdout.read() == b""  # it never said it was listening


def test_bad_settings_exit_with_a_message(start_broker):
    broker = start_broker("--heartbeat", "2", "--timeout", "1", ready=False)
    assert broker.proc.wait(30) == 2
    assert "timeout_s must exceed heartbeat_s (2.0), got 1.0" in broker.log()


def test_a_full_group_refuses_joins(monkeypatch):
    monkeypatch.setattr(broker_module, "LIST_ROOM", 100)
    with broker_module.Broker(port=0, token=TOKEN) as broker:
        members = [raw_join(broker, "g", name, "a:1") for name in ("first", "second")]
        try:
            with auth.connect(broker.address, TOKEN) as conn:
                conn.send_json({"op": "join", "group": "g", "name": "third", "address": "a:1"})
                assert conn.recv_json() == {
                    "op": "error",
                    "message": "group 'g' is full: its member list would exceed 100 bytes",
                }
            assert all(not m.closed for m in members)
        finally:
            for m in members:
                m.close()


def test_listeners_get_every_new_list(caplog):
    with broker_module.Broker(port=0, token=TOKEN, heartbeat_s=0.1, settle_s=0.05) as broker:
        seen: list[Membership] = []

        def failing(m: Membership) -> None:
            raise RuntimeError("a listener that fails")

        with GroupClient(broker.address, "g", "a", "a:1", token=TOKEN) as a:
            a.add_listener(failing)
            a.add_listener(seen.append)
            wait_names(a, ["a"])
            with GroupClient(broker.address, "g", "b", "b:1", token=TOKEN):
                wait_names(a, ["a", "b"])
            last = wait_names(a, ["a"])
            assert wait_until(lambda: seen and seen[-1] is last, 60)  # listeners run after the list is stored
            assert [m.names for m in seen] == [("a",), ("a", "b"), ("a",)]
            assert [m.epoch for m in seen] == [1, 2, 3]
        assert "membership listener" in caplog.text and "a listener that fails" in caplog.text


def test_a_new_member_pings_from_its_join_and_is_not_dropped_under_the_default_timeout():
    """The broker's defaults (a ping every 0.1 s, dropped after 0.6 s of silence): a client's
    first ping goes out when it joins. Before, its ping thread first slept the client's own
    default interval (1 s), so every new member was dropped once about 0.6 s after its join
    and joined again, abandoning the group's reduction in flight."""
    with broker_module.Broker(
        port=0,
        token=TOKEN,
        heartbeat_s=broker_module.HEARTBEAT_S,
        timeout_s=broker_module.TIMEOUT_S,
        settle_s=broker_module.SETTLE_S,
    ) as broker:
        with GroupClient(broker.address, "g", "a", "a:1", token=TOKEN) as a:
            epochs: list[int] = []
            a.add_listener(lambda m: epochs.append(m.epoch))
            first = wait_names(a, ["a"])
            # past the old first ping (1 s after the start) and the timeout after it: the
            # absence of a drop can only be seen by letting that time pass
            time.sleep(2 * (1.0 + broker_module.TIMEOUT_S))
            assert a.membership().epoch == first.epoch == 1, f"epochs seen: {epochs}"
            assert a.connected


def test_close_does_not_wait_for_a_mute_broker():
    joined = threading.Event()

    def mute(conn: wire.Connection) -> None:
        conn.recv_json()
        joined.set()
        conn.recv()  # and never answer

    with auth.Listener(mute, token=TOKEN) as listener:
        client = GroupClient(listener.address, "g", "a", "a:1", token=TOKEN).start()
        assert joined.wait(10)
        waited: list = []
        waiter = threading.Thread(target=lambda: waited.append(client.wait_membership(timeout=600)))
        waiter.start()
        client.close()
        waiter.join(60)  # hang guard: only close() can end a 600 s wait this soon
        assert not waiter.is_alive() and waited == [None]
        assert client.membership() is None and not client.connected
        client.close()  # idempotent


def test_client_arguments_are_checked():
    with pytest.raises(ValueError, match="join: name must be at most 128 characters, got 200"):
        GroupClient("127.0.0.1:1", "g", "n" * 200, "a:1", token=TOKEN)
    with pytest.raises(TypeError, match="join: address must be a string, got 7"):
        GroupClient("127.0.0.1:1", "g", "n", 7, token=TOKEN)
    with pytest.raises(ValueError, match="address 'nowhere' has no port"):
        GroupClient("nowhere", "g", "n", "a:1", token=TOKEN)
    with pytest.raises(ValueError, match="join: address '' has no port; use HOST:PORT"):
        GroupClient("127.0.0.1:1", "g", "n", "", token=TOKEN)
    with pytest.raises(ValueError, match="join: address 'a:70000': port must be in 0..65535, got 70000"):
        GroupClient("127.0.0.1:1", "g", "n", "a:70000", token=TOKEN)


def test_an_unexpected_error_in_the_client_thread_reconnects(monkeypatch, caplog):
    """A bug while taking a member list is logged and recorded, and the client joins again
    (its thread does not die while the ping thread lives on)."""
    real = group_module._parse_members
    broken = threading.Event()
    broken.set()

    def buggy(msg: dict) -> Membership:
        if broken.is_set():
            raise RuntimeError("a bug in the client")
        return real(msg)

    monkeypatch.setattr(group_module, "_parse_members", buggy)
    with broker_module.Broker(port=0, token=TOKEN, heartbeat_s=0.1, settle_s=0.05) as broker:
        with GroupClient(broker.address, "g", "a", "a:1", token=TOKEN, reconnect_max_s=0.2) as client:
            failed = "group client 'a' failed and reconnects: RuntimeError: a bug in the client"
            assert wait_until(lambda: client.last_error == failed, 60), client.last_error
            assert failed in caplog.text
            broken.clear()
            wait_names(client, ["a"])
            assert client.connected and client.last_error is None


# ---------------------------------------------------------------- separate hosts


def test_peers_in_separate_network_namespaces(start_broker, netns, tmp_path):  # noqa: F811
    one, two = netns(2)
    broker = start_broker("--host", one.gateway, *FAST)
    assert broker.address == f"{one.gateway}:{broker.port}"
    env = dict(os.environ, **{auth.TOKEN_ENV: TOKEN})
    peers = [
        ns.popen(
            [sys.executable, "-c", PEER, broker.address, "g", name, f"{ns.ip}:7000"],
            stdout=subprocess.PIPE,
            bufsize=0,
            cwd=REPO,
            env=env,
        )
        for ns, name in ((one, "one"), (two, "two"))
    ]
    for proc in peers:
        peer_sees(proc, {f"one@{one.ip}:7000", f"two@{two.ip}:7000"}, timeout=20)
    assert f"from {one.ip}:" in broker.log_line("'one' joined")
    assert f"from {two.ip}:" in broker.log_line("'two' joined")
    with pytest.raises(OSError):  # the broker is not on loopback
        socket.create_connection(("127.0.0.1", broker.port), timeout=2).close()
