"""Authentication of every connection, before a single frame is read: the shared
token, the handshake, and the listener that runs it.

Handshake (fixed sizes, read before any frame; a connection that fails it is closed
and logged, nothing it sent is decoded)::

    server -> client   b"SHPD" | version u8 | nonce_s (32 B)                      37 B
    client -> server   b"SHPD" | version u8 | nonce_c (32 B) | mac_c (32 B)       69 B
    server -> client   mac_s (32 B)                                               32 B

    mac_c = HMAC-SHA256(token, b"shmpad client" | nonce_s | nonce_c)
    mac_s = HMAC-SHA256(token, b"shmpad server" | nonce_c | nonce_s)

Both sides prove they hold the token without sending it, and each side's nonce
makes a recorded handshake useless for a replay. The whole handshake has a deadline
(``SERVER_HANDSHAKE_TIMEOUT_S`` on the listener's side), so a silent client cannot hold
a listener's thread for long; and a listener runs at most ``MAX_HANDSHAKES`` at once, at
most ``MAX_HANDSHAKES_PER_IP`` of them from one source address, so idle sockets from one
host cannot lock everyone else out. A connection over either limit is reset unread.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import socket
import struct
import threading
import time
from typing import Any

from shmpad.errors import AuthError, FrameError
from shmpad.net.wire import MAC, MAX_FRAME, VERSION, Connection, join_address, parse_address

__all__ = ["Listener", "accept", "connect", "load_token"]

log = logging.getLogger("shmpad.net")

HELLO_MAGIC = b"SHPD"
NONCE = 32
SERVER_HELLO = struct.Struct("<4sB32s")  # 37 B
CLIENT_HELLO = struct.Struct("<4sB32s32s")  # 69 B
MAX_HANDSHAKES = 64
"""connections a listener authenticates at once; more are closed unread (a flood of
silent clients cannot turn into a flood of threads)"""
MAX_HANDSHAKES_PER_IP = 8
"""of those, from one source address (a listener's default)"""
HANDSHAKE_TIMEOUT_S = 10.0  # the client's; a listener waits SERVER_HANDSHAKE_TIMEOUT_S
SERVER_HANDSHAKE_TIMEOUT_S = 5.0
EVICT_AFTER_S = 1.0  # a handshake still pending after this long may be ended to admit a newcomer

TOKEN_ENV = "SHMPAD_TOKEN"


def load_token(token: str | bytes | None = None, token_file: str | os.PathLike | None = None) -> bytes:
    """The shared secret: ``token`` if given, else the contents of ``token_file``, else
    ``$SHMPAD_TOKEN``. Surrounding whitespace is stripped; an empty token is an error."""
    if token is not None:
        source = "the token argument"
        value = token.encode() if isinstance(token, str) else bytes(token)
    elif token_file is not None:
        source = f"token file {os.fspath(token_file)!r}"
        try:
            with open(token_file, "rb") as f:
                value = f.read()
        except OSError as e:
            raise AuthError(f"cannot read {source}: {e.strerror}") from None
    elif os.environ.get(TOKEN_ENV) is not None:
        source = f"${TOKEN_ENV}"
        value = os.environ[TOKEN_ENV].encode()
    else:
        raise AuthError(
            f"no token: set ${TOKEN_ENV} or pass a token file (every host of a group needs the same secret, "
            f"e.g. from `python -c 'import secrets; print(secrets.token_hex(16))'`)"
        )
    value = value.strip()
    if not value:
        raise AuthError(f"{source} is empty; a token must be a non-empty secret")
    return value


def _configure(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        sock.settimeout(remaining)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("the connection closed")
        got += k
    return bytes(buf)


def _mac(token: bytes, label: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(token, label + a + b, hashlib.sha256).digest()


def connect(
    address: str | tuple[str, int],
    token: bytes | str | None = None,
    timeout: float = HANDSHAKE_TIMEOUT_S,
    max_frame: int = MAX_FRAME,
) -> Connection:
    """Open an authenticated connection to ``address`` (``"host:port"``).

    ``token`` defaults to ``load_token()``. Raises ``AuthError`` if the server does not
    hold the same token, ``ConnectionError``/``OSError`` if it cannot be reached."""
    key = load_token(token)
    host, port = parse_address(address)
    sock = socket.create_connection((host, port), timeout=timeout)
    peer = f"{host}:{port}"
    try:
        _configure(sock)
        deadline = time.monotonic() + timeout
        magic, version, nonce_s = SERVER_HELLO.unpack(_recv_exact(sock, SERVER_HELLO.size, deadline))
        if magic != HELLO_MAGIC:
            raise AuthError(f"{peer} is not a shmpad endpoint (it greeted with {magic!r})")
        if version != VERSION:
            raise AuthError(f"{peer} speaks wire version {version}, this side speaks {VERSION}")
        nonce_c = secrets.token_bytes(NONCE)
        sock.sendall(CLIENT_HELLO.pack(HELLO_MAGIC, VERSION, nonce_c, _mac(key, b"shmpad client", nonce_s, nonce_c)))
        try:
            mac_s = _recv_exact(sock, MAC, deadline)
        except ConnectionError:
            raise AuthError(f"{peer} refused our token (it closed the connection during the handshake)") from None
        if not hmac.compare_digest(mac_s, _mac(key, b"shmpad server", nonce_c, nonce_s)):
            raise AuthError(f"{peer} does not hold our token (its proof did not match)")
        keys = _session_keys(key, nonce_s, nonce_c)
        sock.settimeout(None)
    except TimeoutError:
        sock.close()
        raise AuthError(f"{peer} did not complete the handshake within {timeout} s") from None
    except BaseException:
        sock.close()
        raise
    return Connection(sock, peer, max_frame, keys)


def _session_keys(token: bytes, nonce_s: bytes, nonce_c: bytes) -> tuple[bytes, bytes]:
    """(client to server, server to client) keys of PICKLE frames' integrity tags."""
    return _mac(token, b"shmpad c2s", nonce_s, nonce_c), _mac(token, b"shmpad s2c", nonce_s, nonce_c)


def accept(
    sock: socket.socket,
    peer: str,
    token: bytes,
    timeout: float = SERVER_HANDSHAKE_TIMEOUT_S,
    max_frame: int = MAX_FRAME,
) -> Connection:
    """Run the server side of the handshake on a freshly accepted socket.

    On failure the socket is closed, the reason logged, and ``AuthError`` raised; not a
    byte the client sent is interpreted beyond the fixed-size hello."""
    try:
        _configure(sock)
        deadline = time.monotonic() + timeout
        nonce_s = secrets.token_bytes(NONCE)
        sock.settimeout(timeout)
        sock.sendall(SERVER_HELLO.pack(HELLO_MAGIC, VERSION, nonce_s))
        magic, version, nonce_c, mac_c = CLIENT_HELLO.unpack(_recv_exact(sock, CLIENT_HELLO.size, deadline))
        if magic != HELLO_MAGIC:
            raise AuthError(f"refused {peer}: not a shmpad client (it sent {magic!r}...)")
        if version != VERSION:
            raise AuthError(f"refused {peer}: it speaks wire version {version}, this side speaks {VERSION}")
        if not hmac.compare_digest(mac_c, _mac(token, b"shmpad client", nonce_s, nonce_c)):
            raise AuthError(f"refused {peer}: wrong token")
        sock.sendall(_mac(token, b"shmpad server", nonce_c, nonce_s))
        c2s, s2c = _session_keys(token, nonce_s, nonce_c)
        sock.settimeout(None)
    except TimeoutError:
        sock.close()
        log.warning("refused %s: no complete handshake within %s s", peer, timeout)
        raise AuthError(f"refused {peer}: no complete handshake within {timeout} s") from None
    except AuthError as e:
        sock.close()
        log.warning("%s", e)
        raise
    except OSError as e:
        sock.close()
        log.warning("refused %s: %s during the handshake", peer, e)
        raise AuthError(f"refused {peer}: {e} during the handshake") from None
    return Connection(sock, peer, max_frame, (s2c, c2s))


class Listener:
    """A listening socket that authenticates every connection before handing it on.

    ``handler(conn)`` runs in a thread of its own per authenticated connection; a client
    that fails the handshake is logged and dropped without reaching it. Binds to
    loopback unless ``host`` says otherwise; ``port=0`` picks a free port
    (``address`` tells which). At most ``max_handshakes_per_ip`` handshakes from one
    source address run at once (and ``MAX_HANDSHAKES`` in all). A connection that comes
    when they do evicts the oldest of them if that one has been at it for
    ``EVICT_AFTER_S`` (an honest handshake takes milliseconds: a slow one is a
    trickling socket), so sockets that trickle bytes cannot keep members out; otherwise
    it is reset unread."""

    def __init__(
        self,
        handler,
        host: str = "127.0.0.1",
        port: int = 0,
        token: bytes | str | None = None,
        max_frame: int = MAX_FRAME,
        name: str = "shmpad-listener",
        max_handshakes_per_ip: int = MAX_HANDSHAKES_PER_IP,
    ):
        if isinstance(max_handshakes_per_ip, bool) or not isinstance(max_handshakes_per_ip, int):
            raise TypeError(f"max_handshakes_per_ip must be an int, got {type(max_handshakes_per_ip).__name__}")
        if max_handshakes_per_ip < 1:
            raise ValueError(f"max_handshakes_per_ip must be >= 1, got {max_handshakes_per_ip}")
        self._handler = handler
        self._max_per_ip = max_handshakes_per_ip
        self._token = load_token(token)
        self._max_frame = max_frame
        self._name = name
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as e:
            self._sock.close()
            raise OSError(e.errno, f"cannot listen on {host}:{port}: {e.strerror}") from None
        self._sock.listen(128)
        self.host, self.port = self._sock.getsockname()[:2]
        self._closed = threading.Event()
        self._max_handshakes = MAX_HANDSHAKES
        self._handshakes: dict[str, int] = {}  # source address -> handshakes in progress; under _lock
        self._pending: dict[socket.socket, tuple[str, float]] = {}  # handshaking socket -> (ip, start); under _lock
        self._conns: set[Connection] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name=name, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return join_address(self.host, self.port)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                sock, addr = self._sock.accept()
            except OSError:
                if self._closed.is_set():
                    return
                time.sleep(0.01)  # EMFILE and friends: do not spin
                continue
            ip = addr[0]
            peer = f"{ip}:{addr[1]}"
            with self._lock:
                refusal = None
                if sum(self._handshakes.values()) >= self._max_handshakes and not self._evict_oldest(None):
                    refusal = f"{self._max_handshakes} handshakes already in progress"
                elif self._handshakes.get(ip, 0) >= self._max_per_ip and not self._evict_oldest(ip):
                    refusal = f"{self._max_per_ip} handshakes from {ip} already in progress"
                if refusal is None:
                    self._handshakes[ip] = self._handshakes.get(ip, 0) + 1
                    self._pending[sock] = (ip, time.monotonic())
            if refusal is not None:
                log.warning("refused %s: %s", peer, refusal)
                # a reset, not a FIN: a client sees ConnectionResetError, which retrying clients retry
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
                continue
            threading.Thread(
                target=self._serve, args=(sock, ip, peer), name=f"{self._name}-{peer}", daemon=True
            ).start()

    def _evict_oldest(self, ip: str | None) -> bool:
        """Under ``_lock``: end the oldest handshake (from ``ip``, or from anyone) if it has
        run ``EVICT_AFTER_S``, making room; False when none has."""
        now = time.monotonic()
        candidates = [(start, s) for s, (i, start) in self._pending.items() if ip is None or i == ip]
        if not candidates:
            return False
        start, oldest = min(candidates, key=lambda c: c[0])
        if now - start < EVICT_AFTER_S:
            return False
        evicted_ip, _ = self._pending.pop(oldest)
        log.warning("evicted a handshake from %s after %.1f s to make room", evicted_ip, now - start)
        with contextlib.suppress(OSError):
            oldest.shutdown(socket.SHUT_RDWR)  # its handshake fails at once; its thread gives back the count
        return True

    def _serve(self, sock: socket.socket, ip: str, peer: str) -> None:
        try:
            conn = accept(sock, peer, self._token, timeout=SERVER_HANDSHAKE_TIMEOUT_S, max_frame=self._max_frame)
        except (AuthError, OSError):
            return
        finally:
            with self._lock:
                self._pending.pop(sock, None)
                left = self._handshakes.pop(ip) - 1
                if left:
                    self._handshakes[ip] = left
        with self._lock:
            if self._closed.is_set():
                conn.close()
                return
            self._conns.add(conn)
        try:
            self._handler(conn)
        except (ConnectionError, FrameError):
            pass
        except Exception:
            log.exception("handler for %s failed", peer)
        finally:
            conn.close()
            with self._lock:
                self._conns.discard(conn)

    def close(self) -> None:
        """Stop accepting and close every connection still open."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            conn.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
