"""The one codec of shmpad's RPC: how a call, its result and its failure are pickled,
for both transports.

Shared memory (``shm_server``, ``shm_client``). A request is one ring message::

    pickle((call_id, reply_ring_name, method, args, kwargs, sent_ns))

where ``sent_ns`` is the caller's ``time.monotonic_ns()`` when it sent the call
(CLOCK_MONOTONIC, one clock for the host: the server's latency statistics start there).

A reply is the header ``REPLY`` ``(call_id, ok)`` then ``pickle(value)``, where
``value`` is the result, or ``(exception, remote traceback)``: the call a reply answers
is known before anything is unpickled, so a result that cannot be unpickled fails that
call, not whoever reads it. A message larger than a slot travels in a one-off segment
that the receiver unlinks; the slot carries a ``Spill`` naming it.

TCP (``tcp_server``, ``tcp_client``). A message is a pickle that travels with its large
buffers (numpy arrays: pickle protocol 5), sent from where they lie and received into
one buffer that the arrays then view, no copies::

    u32 n | n x u64 buffer sizes | pickle bytes | buffer 0 | ... | buffer n-1

Failures travel the same way on both: ``failure`` makes what a reply carries for an
exception (a ``RemoteError`` in place of one that cannot be pickled), and
``unpack_reply`` raises it again in the caller with the server's traceback attached as
its ``__cause__`` (a ``RemoteTraceback``).
"""

from __future__ import annotations

import pickle
import struct
import traceback
from typing import Any, Callable

import cloudpickle

from shmpad.errors import FrameError, RemoteError
from shmpad.shm.segment import Segment

__all__ = [
    "RemoteTraceback",
    "dumps",
    "encode",
    "decode",
    "encode_reply",
    "unpack_reply",
    "failure",
    "unpicklable_result",
    "encode_message",
    "split_message",
    "load_message",
    "message_size",
]

SPILL_KIND = "rpcspill"
MAX_BUFFERS = 4096
"""the most out-of-band buffers one TCP message may carry"""


class RemoteTraceback(Exception):
    """Set as ``__cause__`` of an exception re-raised from a server: its text is the
    traceback in the server process."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n\n" + self.tb


class Spill:
    """A message too large for a slot, left in segment ``name`` (``size`` bytes)."""

    __slots__ = ("name", "size")

    def __init__(self, name: str, size: int):
        self.name = name
        self.size = size

    def __reduce__(self):
        return (Spill, (self.name, self.size))


def dumps(obj: Any, buffers: list | None = None) -> bytes:
    """``obj`` pickled (protocol 5), by cloudpickle if pickle cannot. With ``buffers``,
    large contiguous buffers (numpy arrays) are appended to it instead of copied in."""
    callback = None if buffers is None else buffers.append
    try:
        return pickle.dumps(obj, protocol=5, buffer_callback=callback)
    except (pickle.PicklingError, AttributeError, TypeError):
        # lambdas, local classes: cloudpickle pickles them by value
        if buffers is not None:
            buffers.clear()
        return cloudpickle.dumps(obj, protocol=5, buffer_callback=callback)


def encode(obj: Any, slot_size: int) -> bytes:
    data = dumps(obj)
    return data if len(data) <= slot_size else spill(data)


# A reply is this header (call id, 1 if the call returned) then the pickled result or
# (exception, traceback): the call it answers is known before anything is unpickled,
# so a result that cannot be unpickled fails that call, not whoever reads it.
REPLY = struct.Struct("<qB")


def encode_reply(call_id: int, ok: bool, value: Any, slot_size: int) -> bytes:
    body = dumps(value)
    if REPLY.size + len(body) > slot_size:
        body = spill(body)
    return REPLY.pack(call_id, ok) + body


def unpack_reply(ok: int, body: Any, loads: Callable[[Any], Any] | None = None) -> Any:
    """The result of a reply's body, or its exception raised (``loads`` unpickles the
    body; by default ``decode``: a shared-memory reply, spills included)."""
    try:
        value = (loads or decode)(body)
    except Exception as e:
        raise RemoteError(f"the reply could not be unpickled here: {type(e).__name__}: {e}") from None
    if ok:
        return value
    exc, tb = value
    if not isinstance(exc, BaseException):
        exc = RemoteError(repr(exc))
    exc.__cause__ = RemoteTraceback(tb)
    raise exc


def drop(body: bytes) -> None:
    """Consume an unwanted reply's body (a spilled one owns a segment)."""
    try:
        decode(body)
    except Exception:
        pass


def spill(data: bytes) -> bytes:
    """``data`` moved to a one-off segment; returns the slot message that names it."""
    seg = Segment.create(SPILL_KIND, {}, len(data))
    seg.data[: len(data)] = memoryview(data).cast("B")
    name = seg.name
    seg.disown()  # the receiver unlinks it; the janitor does if nobody reads it
    seg.close()
    return pickle.dumps(Spill(name, len(data)), protocol=5)


def decode(data: bytes) -> Any:
    obj = pickle.loads(data)
    if type(obj) is Spill:
        seg = Segment.attach(obj.name, SPILL_KIND)
        try:
            raw = bytes(seg.data[: obj.size])
        finally:
            seg.unlink()
            seg.close()
        obj = pickle.loads(raw)
    return obj


def failure(exc: BaseException) -> tuple[BaseException, str]:
    """What the reply of a call that raised ``exc`` carries (call it in the ``except``
    block): ``exc`` and the traceback; a ``RemoteError`` in place of an exception that
    cannot be pickled or is not for the caller to re-raise."""
    if not isinstance(exc, Exception):  # SystemExit, KeyboardInterrupt
        exc = RemoteError(f"the handler raised {type(exc).__name__}: {exc}")
    return _portable(exc), traceback.format_exc()


def unpicklable_result(exc: Exception) -> tuple[RemoteError, str]:
    """The failure a reply carries instead of a result that could not be pickled."""
    err = RemoteError(f"the server could not pickle the result of the call: {type(exc).__name__}: {exc}")
    return err, traceback.format_exc()


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a ``RemoteError`` carrying its type and message."""
    try:
        pickle.loads(dumps(exc))
        return exc
    except Exception:
        return RemoteError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")


# ---------------------------------------------------------------- TCP messages


def encode_message(obj: Any) -> list:
    """The parts of a payload carrying ``obj`` (see the module docstring)."""
    buffers: list[pickle.PickleBuffer] = []
    body = dumps(obj, buffers)
    if len(buffers) > MAX_BUFFERS:
        buffers = []
        body = dumps(obj)
    raws = [b.raw() for b in buffers]
    head = struct.pack(f"<I{len(raws)}Q", len(raws), *(r.nbytes for r in raws))
    return [head, body, *raws]


def split_message(payload: bytearray) -> tuple[memoryview, list[memoryview]]:
    """The pickle and buffers of a payload; ``FrameError`` if its layout does not add up."""
    view = memoryview(payload)
    if len(view) < 4:
        raise FrameError(f"RPC payload of {len(view)} bytes is shorter than its 4-byte header")
    (n,) = struct.unpack_from("<I", view)
    if n > MAX_BUFFERS:
        raise FrameError(f"RPC payload claims {n} buffers, at most {MAX_BUFFERS} allowed")
    head = 4 + 8 * n
    if len(view) < head:
        raise FrameError(f"RPC payload of {len(view)} bytes is shorter than its {head}-byte header")
    sizes = struct.unpack_from(f"<{n}Q", view, 4)
    at = len(view) - sum(sizes)
    if at < head:
        raise FrameError(
            f"RPC payload of {len(view)} bytes cannot hold the {sum(sizes)} buffer bytes its header claims"
        )
    body, buffers = view[head:at], []
    for size in sizes:
        buffers.append(view[at : at + size])
        at += size
    return body, buffers


def load_message(parts: tuple[memoryview, list[memoryview]]) -> Any:
    body, buffers = parts
    return pickle.loads(body, buffers=buffers)


def message_size(parts: list) -> int:
    return sum(memoryview(p).nbytes for p in parts)
