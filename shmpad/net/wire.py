"""The TCP wire format: an authenticated connection carrying length-prefixed frames.

Every connection first passes the handshake of ``shmpad.net.auth``; only then
are frames read.

Frame, after the handshake (little endian)::

    offset  size  field
         0     4  magic b"SHPF"
         4     1  version (1)
         5     1  kind (Kind)
         6     2  flags (free for the layer above)
         8     8  tag (u64, free for the layer above: a call id, a chunk index...)
        16     8  length of the payload in bytes, at most the connection's max_frame
        24     *  payload

A ``PICKLE`` frame ends with a 32-byte tag, HMAC-SHA256 under this direction's
session key (derived from the token and both nonces) of its sequence number on the
connection, its header and its payload; the receiver checks it before handing the
payload on. Bytes injected into an authenticated connection by someone on the path
therefore can never reach an unpickler, and a replayed or reordered frame is
refused. (Control and byte frames carry no tag: their worst case is wrong
data, not code execution, and hashing would cost allreduce half its bandwidth.)

Payload kinds: ``CONTROL`` is a JSON object (UTF-8, at most ``MAX_CONTROL`` bytes);
``BYTES`` is opaque (allreduce sends arrays as bytes straight from their memory and
receives them straight into place, with ``recv_into``); ``PICKLE`` is a pickle
that only an authenticated connection may decode (and only the layers that need
objects do: cross-host RPC).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import hmac
import json
import logging
import socket
import struct
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from shmpad.errors import FrameError

__all__ = [
    "MAX_FRAME",
    "Connection",
    "Frame",
    "Kind",
    "join_address",
    "parse_address",
]

log = logging.getLogger("shmpad.net")

VERSION = 1
FRAME_MAGIC = b"SHPF"
MAC = 32
HEADER = struct.Struct("<4sBBHQQ")  # 24 B

MAX_FRAME = 256 << 20  # default bound of one frame's payload; allreduce sends its arrays in chunks below it
MAX_CONTROL = 1 << 20
RECV_CHUNK = 1 << 20  # a frame's buffer starts this large and doubles as its bytes arrive


class Kind(enum.IntEnum):
    CONTROL = 1
    # 2 was TENSOR (a dtype/shape header, then the bytes): nothing sent it, so it went;
    # the number stays unused, so an old peer's frame of that kind is refused as unknown
    BYTES = 3
    PICKLE = 4


# ---------------------------------------------------------------- addresses


def parse_address(address: str | int | tuple[str, int], default_host: str | None = None) -> tuple[str, int]:
    """``"HOST:PORT"`` (``"[V6]:PORT"`` for an IPv6 host) or a ``(host, port)`` pair, as
    ``(host, port)``, the port in 0..65535 (0: a listener picks a free one). Given
    ``default_host``, a port alone (``"PORT"``, ``":PORT"`` or an int) is at that host.
    Every refusal is a ``ValueError`` (``TypeError`` for a wrong type) naming ``address``."""
    if isinstance(address, tuple):
        if len(address) != 2 or not isinstance(address[0], str):
            raise TypeError(f"address {address!r} must be a (host: str, port: int) pair")
        host, port = address
        if isinstance(port, bool) or not isinstance(port, int):
            raise TypeError(f"address {address!r}: port must be an int, got {type(port).__name__}")
    elif isinstance(address, int) and not isinstance(address, bool) and default_host is not None:
        host, port = "", address
    elif isinstance(address, str):
        host, port = _split(address, default_host is not None)
    else:
        port_alone = " or a port number" if default_host is not None else ""
        raise TypeError(f"address must be 'HOST:PORT', a (host, port) pair{port_alone}, got {type(address).__name__}")
    host = host or default_host or ""
    if not host:
        raise ValueError(f"address {address!r} has no host; use HOST:PORT")
    if any(c.isspace() for c in host):
        raise ValueError(f"address {address!r}: host {host!r} holds a space; use HOST:PORT")
    if not 0 <= port <= 65535:
        raise ValueError(f"address {address!r}: port must be in 0..65535, got {port!r}")
    return host, port


def _split(address: str, port_alone: bool) -> tuple[str, int]:
    """``address``'s host (``""`` when it has none) and port; ``port_alone``: ``"PORT"`` is
    a port without a host."""
    if "://" in address:
        raise ValueError(f"address {address!r}: no scheme here; use HOST:PORT")
    if address.startswith("["):
        host, sep, port_text = address[1:].partition("]:")
        if not sep:
            raise ValueError(f"address {address!r}: an IPv6 host in brackets takes a port, as [::1]:4431")
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep:
            if not (port_alone and address.isascii() and address.isdigit()):
                raise ValueError(f"address {address!r} has no port; use HOST:PORT")
            host, port_text = "", address
        elif ":" in host:
            raise ValueError(f"address {address!r}: an IPv6 host goes in brackets, as [::1]:4431")
    if not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"address {address!r}: port {port_text!r} is not a number; use HOST:PORT")
    return host, int(port_text)


def join_address(host: str, port: int) -> str:
    """``"HOST:PORT"`` (``"[V6]:PORT"``): what ``parse_address`` reads back as ``(host, port)``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---------------------------------------------------------------- connections


class Frame:
    """A received frame: ``kind``, ``flags``, ``tag`` and its ``payload`` bytes."""

    __slots__ = ("kind", "flags", "tag", "payload")

    def __init__(self, kind: int, flags: int, tag: int, payload: bytearray | memoryview):
        self.kind = kind
        self.flags = flags
        self.tag = tag
        self.payload = payload

    def json(self) -> dict:
        """The payload of a ``CONTROL`` frame as a dict (``FrameError`` if it is not one)."""
        if self.kind != Kind.CONTROL:
            raise FrameError(f"expected a CONTROL frame, got kind {self.kind}")
        try:
            value = json.loads(bytes(self.payload).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise FrameError(f"CONTROL frame is not valid UTF-8 JSON: {e}") from None
        except RecursionError:  # "[" * 200000 fits in MAX_CONTROL
            raise FrameError("CONTROL frame nests its JSON deeper than this side can decode") from None
        if not isinstance(value, dict):
            raise FrameError(f"CONTROL frame must hold a JSON object, got {type(value).__name__}")
        return value


class Connection:
    """One authenticated TCP connection. Sends are serialized by a lock (any thread may
    send); receives belong to one thread at a time. ``close()`` from any thread wakes a
    thread blocked in a receive, which then raises ``ConnectionError``."""

    def __init__(
        self, sock: socket.socket, peer: str, max_frame: int = MAX_FRAME, keys: tuple[bytes, bytes] = (b"", b"")
    ):
        self.sock = sock
        self.peer = peer
        self.max_frame = max_frame
        self._send_key, self._recv_key = keys  # session keys of PICKLE frames' tags, per direction
        self._send_seq = 0
        self._recv_seq = 0
        self._send_lock = threading.Lock()
        self._closed = False
        self._header = bytearray(HEADER.size)

    def __repr__(self) -> str:
        return f"Connection({self.peer}{', closed' if self._closed else ''})"

    @property
    def closed(self) -> bool:
        return self._closed

    def fileno(self) -> int:
        return self.sock.fileno()

    # -------------------------------------------------------------- send

    def send(self, kind: int, *parts: bytes | bytearray | memoryview, tag: int = 0, flags: int = 0) -> None:
        """Send one frame whose payload is the concatenation of ``parts`` (sent from
        where they lie, without joining them)."""
        length = sum(memoryview(p).nbytes for p in parts)
        sealed = kind == Kind.PICKLE
        if length + MAC * sealed > self.max_frame:
            raise FrameError(f"frame of {length} bytes exceeds this connection's limit of {self.max_frame} bytes")
        header = HEADER.pack(FRAME_MAGIC, VERSION, kind, flags, tag, length + MAC * sealed)
        with self._send_lock:
            if sealed:
                parts = (*parts, self._seal(self._send_key, self._send_seq, header, parts))
                self._send_seq += 1
            self._sendall([header, *parts])

    @staticmethod
    def _seal(key: bytes, seq: int, header: bytes, parts) -> bytes:
        mac = hmac.new(key, seq.to_bytes(8, "little") + header, hashlib.sha256)
        for part in parts:
            mac.update(part)
        return mac.digest()

    def send_json(self, obj: dict, tag: int = 0, flags: int = 0) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode()
        if len(data) > MAX_CONTROL:
            raise FrameError(f"control message of {len(data)} bytes exceeds {MAX_CONTROL} bytes")
        self.send(Kind.CONTROL, data, tag=tag, flags=flags)

    def _sendall(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        views = [memoryview(p).cast("B") for p in parts if memoryview(p).nbytes]
        try:
            while views:
                sent = self.sock.sendmsg(views[:64])
                while sent:
                    if sent >= views[0].nbytes:
                        sent -= views[0].nbytes
                        views.pop(0)
                    else:
                        views[0] = views[0][sent:]
                        sent = 0
        except OSError as e:
            self.close()
            raise ConnectionError(f"connection to {self.peer} broke while sending: {e}") from None

    # -------------------------------------------------------------- receive

    def recv_header(self) -> tuple[int, int, int, int]:
        """Read one frame header: ``(kind, flags, tag, length)``. The payload must then be
        read whole with ``recv_into``/``recv_payload`` before the next header."""
        self.recv_into(memoryview(self._header), what="a frame header")
        magic, version, kind, flags, tag, length = HEADER.unpack(self._header)
        if magic != FRAME_MAGIC:
            self._bad_frame(f"bad frame magic {bytes(magic)!r} (expected {FRAME_MAGIC!r})")
        if version != VERSION:
            self._bad_frame(f"frame version {version} (this side speaks {VERSION})")
        if kind not in Kind._value2member_map_:
            self._bad_frame(f"unknown frame kind {kind}")
        if length > self.max_frame:
            self._bad_frame(f"frame claims {length} bytes, the limit is {self.max_frame}")
        if kind == Kind.CONTROL and length > MAX_CONTROL:
            self._bad_frame(f"control frame claims {length} bytes, the limit is {MAX_CONTROL}")
        return kind, flags, tag, length

    def recv(self) -> Frame:
        """Read one whole frame into a fresh buffer (a ``PICKLE`` frame's tag checked
        and removed)."""
        kind, flags, tag, length = self.recv_header()
        if kind == Kind.PICKLE and length < MAC:
            self._bad_frame(f"PICKLE frame of {length} bytes is shorter than its {MAC}-byte integrity tag")
        payload = self._recv_payload(length)
        if kind != Kind.PICKLE:
            return Frame(kind, flags, tag, payload)
        body = memoryview(payload)[:-MAC]
        expected = self._seal(self._recv_key, self._recv_seq, bytes(self._header), (body,))
        if not hmac.compare_digest(expected, payload[-MAC:]):
            self._bad_frame(
                "PICKLE frame failed its integrity check (injected, replayed or corrupted); it was not decoded"
            )
        self._recv_seq += 1
        return Frame(kind, flags, tag, body)

    def recv_json(self) -> dict:
        """Read one ``CONTROL`` frame as a dict; any other frame closes the connection
        (``FrameError``) before its payload is read, so it costs no memory."""
        kind, flags, tag, length = self.recv_header()  # refuses a CONTROL frame over MAX_CONTROL
        if kind != Kind.CONTROL:
            self._bad_frame(f"expected a CONTROL frame, got kind {kind} ({length} bytes)")
        payload = self._recv_payload(length)
        frame = Frame(kind, flags, tag, payload)
        try:
            return frame.json()
        except FrameError as e:
            self._bad_frame(str(e))

    def _recv_payload(self, length: int) -> bytearray:
        """A payload of ``length`` bytes, in a buffer that grows as bytes arrive (the
        first ``RECV_CHUNK``, then doubling): memory follows the bytes a peer sent,
        never the length its header claimed."""
        buf = bytearray(min(length, RECV_CHUNK))
        got = 0
        while True:
            self.recv_into(memoryview(buf)[got:], what=f"a {length}-byte frame")
            got = len(buf)
            if got == length:
                return buf
            buf += bytes(min(got, length - got))

    def recv_into(self, view: memoryview, what: str = "data") -> None:
        """Fill ``view`` exactly from the socket."""
        view = view.cast("B")
        got, n = 0, view.nbytes
        try:
            while got < n:
                k = self.sock.recv_into(view[got:], n - got)
                if k == 0:
                    raise ConnectionError(
                        f"{self.peer} closed the connection in the middle of {what}"
                        if got
                        else f"{self.peer} closed the connection"
                    )
                got += k
        except TimeoutError:
            self.close()
            raise ConnectionError(
                f"{self.peer} sent nothing for {self.sock.gettimeout()} s while we waited for {what}"
            ) from None
        except OSError as e:
            self.close()
            if isinstance(e, ConnectionError) and not isinstance(e, (ConnectionResetError, BrokenPipeError)):
                raise
            raise ConnectionError(f"connection to {self.peer} broke while receiving {what}: {e}") from None

    def _bad_frame(self, reason: str) -> NoReturn:
        self.refuse(reason)
        raise FrameError(f"{self.peer}: {reason}")

    def refuse(self, reason: str, reply: dict | None = None) -> None:
        """Log why this connection is refused, send ``reply`` (a CONTROL frame telling
        the peer why) if given and the peer still listens, and close the connection."""
        log.warning("closing connection from %s: %s", self.peer, reason)
        if reply is not None:
            with contextlib.suppress(ConnectionError):  # the peer left already: nobody to tell
                self.send_json(reply)
        self.close()

    # -------------------------------------------------------------- lifetime

    def settimeout(self, seconds: float | None) -> None:
        self.sock.settimeout(seconds)

    def close(self) -> None:
        """Close the connection; a thread blocked receiving on it wakes with ConnectionError."""
        if self._closed:
            return
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
