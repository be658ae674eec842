"""The peer's side of the broker: join a group, keep the membership current.

``GroupClient(broker, group, name, address).start()`` runs a background thread that
connects to the broker, joins, sends heartbeats and receives member lists; when the
broker goes away it reconnects with backoff (0.1 s doubling to ``reconnect_max_s``),
joins again and goes on. A restarted broker has a new ``broker_id`` and epochs of its
own, so a list is named by ``Membership.key == (broker_id, epoch)``, never by the
epoch alone. See ``shmpad.net.broker`` for the protocol.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import NamedTuple

from shmpad.errors import AuthError, FrameError
from shmpad.net import auth, wire

__all__ = ["GroupClient", "Member", "Membership", "validate_join"]

log = logging.getLogger("shmpad.net.group")

CONNECT_TIMEOUT_S = 5.0
FIRST_BACKOFF_S = 0.1


MAX_NAME = 128
MAX_ADDRESS = 256


def validate_join(msg: dict) -> tuple[str, str, str]:
    """``(group, name, address)`` of a join message; ``TypeError``/``ValueError`` saying what is wrong."""
    if msg.get("op") != "join":
        raise ValueError(f"the first message must be a join, got op {show(msg.get('op'))}")
    for key, limit in (("group", MAX_NAME), ("name", MAX_NAME), ("address", MAX_ADDRESS)):
        value = msg.get(key)
        if not isinstance(value, str):
            raise TypeError(f"join: {key} must be a string, got {show(value)}")
        if key != "address" and not value:  # an empty address is refused by parse_address below
            raise ValueError(f"join: {key} must not be empty")
        if len(value) > limit:
            raise ValueError(f"join: {key} must be at most {limit} characters, got {len(value)}")
    try:  # the other members connect to it: a list with a malformed one would break them all
        wire.parse_address(msg["address"])
    except ValueError as e:
        raise ValueError(f"join: {e}") from None
    return msg["group"], msg["name"], msg["address"]


def show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Member(NamedTuple):
    name: str
    address: str


class Membership(NamedTuple):
    """One member list of a group, as the broker ``broker_id`` sent it at ``epoch``."""

    broker_id: str
    epoch: int
    members: tuple[Member, ...]

    @property
    def key(self) -> tuple[str, int]:
        """What names this list: a restarted broker starts its epochs again."""
        return (self.broker_id, self.epoch)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)

    def rank(self, name: str) -> int:
        """The position of ``name`` in the list (oldest join first)."""
        for i, member in enumerate(self.members):
            if member.name == name:
                return i
        raise ValueError(f"{name!r} is not a member at epoch {self.epoch} (members: {', '.join(self.names) or 'none'})")


def _parse_members(msg: dict) -> Membership:
    members = msg.get("members")
    if not isinstance(msg.get("broker_id"), str) or type(msg.get("epoch")) is not int or not isinstance(members, list):
        raise FrameError(f"malformed member list from the broker: {str(msg)[:200]}")
    parsed = []
    for m in members:
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not isinstance(m.get("address"), str):
            raise FrameError(f"malformed member in the broker's list: {str(m)[:200]}")
        parsed.append(Member(m["name"], m["address"]))
    return Membership(msg["broker_id"], msg["epoch"], tuple(parsed))


class GroupClient:
    """Membership of ``name`` (reachable at ``address``) in ``group`` at ``broker``
    (``"host:port"``). ``token`` defaults to ``$SHMPAD_TOKEN``. Thread-safe."""

    def __init__(
        self,
        broker: str,
        group: str,
        name: str,
        address: str,
        token: bytes | str | None = None,
        reconnect_max_s: float = 2.0,
    ):
        validate_join({"op": "join", "group": group, "name": name, "address": address})
        if not reconnect_max_s >= FIRST_BACKOFF_S:
            raise ValueError(f"reconnect_max_s must be at least {FIRST_BACKOFF_S}, got {reconnect_max_s}")
        wire.parse_address(broker)
        self.broker = broker
        self.group = group
        self.name = name
        self.address = address
        self._token = auth.load_token(token)
        self._reconnect_max_s = reconnect_max_s
        self._cond = threading.Condition()
        self._membership: Membership | None = None
        self._listeners: list[Callable[[Membership], None]] = []
        self._conn: wire.Connection | None = None  # set while joined
        self._open: wire.Connection | None = None  # the connection the client thread uses, joined or not
        self._heartbeat_s = 1.0  # until the broker's welcome gives its own
        self._joined = threading.Event()  # wakes the ping thread: the first ping goes out at the join
        self._last_error: str | None = None
        self._stop = threading.Event()
        self._replaced = False  # another client joined under our name: we stay out
        self._threads: list[threading.Thread] = []

    def __repr__(self) -> str:
        return f"GroupClient({self.name!r} in {self.group!r} at {self.broker})"

    # ---------------------------------------------------------------- public

    def start(self) -> GroupClient:
        """Start the background threads (once); returns ``self``."""
        with self._cond:
            if self._threads:
                raise RuntimeError(f"{self!r} was started already")
            if self._stop.is_set():
                raise RuntimeError(f"{self!r} is closed")
            self._threads = [
                threading.Thread(target=self._run, name=f"group-{self.name}", daemon=True),
                threading.Thread(target=self._heartbeat, name=f"group-{self.name}-ping", daemon=True),
            ]
        for thread in self._threads:
            thread.start()
        return self

    @property
    def connected(self) -> bool:
        """True while joined to the broker."""
        return self._conn is not None

    @property
    def last_error(self) -> str | None:
        """Why the last attempt to join failed (a wrong token, a refused join, no broker)
        or the connection ended; None once a join succeeds. A client whose name another
        client took over (the broker says ``replaced``) stops joining and says so here."""
        return self._last_error

    def membership(self) -> Membership | None:
        """The latest list received (None before the first)."""
        return self._membership

    def wait_membership(self, newer_than: tuple | None = None, timeout: float | None = None) -> Membership | None:
        """The latest list once its ``key`` differs from ``newer_than`` (any list if None);
        None on timeout or once the client is closed."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._stop.is_set() or (self._membership is not None and self._membership.key != newer_than),
                timeout,
            )
            m = self._membership
            return m if m is not None and m.key != newer_than and not self._stop.is_set() else None

    def add_listener(self, fn: Callable[[Membership], None]) -> None:
        """Call ``fn(membership)`` in the client's thread on every new list."""
        with self._cond:
            self._listeners.append(fn)

    def close(self) -> None:
        """Leave the group (if joined), stop the threads and close the connection. Idempotent."""
        with self._cond:
            self._stop.set()
            self._joined.set()
            joined, opened = self._conn, self._open
            self._cond.notify_all()
        if joined is not None:
            try:
                joined.send_json({"op": "leave"})
            except ConnectionError:
                pass
        if opened is not None:
            opened.close()  # wakes the client thread wherever it waits on the broker
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()

    def __enter__(self) -> GroupClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- the threads

    def _run(self) -> None:
        backoff = FIRST_BACKOFF_S
        while not self._stop.is_set() and not self._replaced:
            joined = False
            try:
                conn = auth.connect(self.broker, self._token, timeout=CONNECT_TIMEOUT_S, max_frame=wire.MAX_CONTROL)
            except AuthError as e:
                self._error(f"cannot join {self.group!r} at broker {self.broker}: {e}")
            except OSError as e:
                self._error(f"cannot reach broker {self.broker}: {e}", level=logging.INFO)
            else:
                try:
                    joined = self._session(conn)
                except Exception as e:  # a bug must not end the membership while the pings go on
                    message = f"group client {self.name!r} failed and reconnects: {type(e).__name__}: {e}"
                    if message != self._last_error:
                        log.exception("%s", message)
                    self._last_error = message
            if joined:
                backoff = FIRST_BACKOFF_S
            if self._replaced or self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, self._reconnect_max_s)

    def _session(self, conn: wire.Connection) -> bool:
        """Join over ``conn`` and take member lists until it ends; True if the join succeeded."""
        with self._cond:
            if self._stop.is_set():
                conn.close()
                return False
            self._open = conn
        try:
            conn.send_json({"op": "join", "group": self.group, "name": self.name, "address": self.address})
            conn.settimeout(CONNECT_TIMEOUT_S)  # a broker that accepts but never answers
            reply = conn.recv_json()
            conn.settimeout(None)
            if reply.get("op") != "welcome":
                self._refused(reply)
                return False
            heartbeat, timeout = reply.get("heartbeat_s"), reply.get("timeout_s")
            if isinstance(timeout, (int, float)) and timeout > 0 and hasattr(socket, "TCP_USER_TIMEOUT"):
                # A broker host that vanishes sends no FIN or RST; with this, a ping left
                # unacknowledged as long as the broker would wait for us ends the connection.
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, max(1, int(1000 * timeout)))
            with self._cond:
                if self._stop.is_set():
                    return True
                if isinstance(heartbeat, (int, float)) and heartbeat > 0:
                    self._heartbeat_s = float(heartbeat)
                self._conn = conn
                self._last_error = None
            self._joined.set()
            log.info("%r joined group %r at broker %s", self.name, self.group, self.broker)
            while True:
                msg = conn.recv_json()
                if msg.get("op") == "members" and msg.get("group") == self.group:
                    self._deliver(_parse_members(msg))
                elif msg.get("op") == "error":
                    self._refused(msg)
                    return True
        except ConnectionError as e:  # FrameError and AuthError too
            if not self._stop.is_set():
                was = " (it was joined)" if self._conn is conn else ""
                self._error(f"lost broker {self.broker}{was}: {e}", level=logging.WARNING)
            return self._conn is conn
        finally:
            with self._cond:
                self._open = None
                if self._conn is conn:
                    self._conn = None
            conn.close()

    def _refused(self, msg: dict) -> None:
        self._error(f"broker {self.broker} refused {self.name!r} in {self.group!r}: {msg.get('message', msg)}")
        if msg.get("replaced"):
            log.error("%r stops joining %r: another peer joined under the same name", self.name, self.group)
            self._replaced = True

    def _deliver(self, membership: Membership) -> None:
        with self._cond:
            self._membership = membership
            listeners = list(self._listeners)
            self._cond.notify_all()
        for fn in listeners:
            try:
                fn(membership)
            except Exception:
                log.exception("membership listener %r failed", fn)

    def _heartbeat(self) -> None:
        """A ping at every join, then every ``heartbeat_s`` (the broker's). Waiting first for an
        interval set before the welcome would leave a new member silent past the broker's
        timeout, and have it dropped once right after its join."""
        while True:
            self._joined.wait(self._heartbeat_s)
            self._joined.clear()
            if self._stop.is_set():
                return
            conn = self._conn
            if conn is not None:
                try:
                    conn.send_json({"op": "ping"})
                except ConnectionError:
                    pass  # the receiving thread sees the connection end and reconnects

    def _error(self, message: str, level: int = logging.ERROR) -> None:
        """Record ``message`` as ``last_error``; log it when it is news, not on every retry."""
        if message != self._last_error:
            log.log(level, "%s", message)
        self._last_error = message
