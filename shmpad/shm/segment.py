"""Named POSIX shared-memory segments with a checked header, and their cleanup.

Layout of every shmpad segment (little-endian 8-byte words)::

    offset  size  field
    0       8     magic, b"SHMPAD\\x00\\x01"; written last, so a half-made segment never attaches
    8       8     layout version (LAYOUT_VERSION)
    16      8     kind, 8 ASCII bytes padded with NUL (b"spsc", b"mpmc", b"weights", ...)
    24      8     total size in bytes
    32      8     pid of the creator
    40      8     length of the metadata in bytes
    48      8     offset of the data area (a multiple of 4096)
    56      8     reserved (0)
    64      meta  metadata: UTF-8 JSON of the kind's parameters (capacity, slot size, spec ...)
    data    ...   the kind's own layout, documented in the module that owns the kind

The data area starts on a page boundary, so every word and cache line the kinds lay
out is aligned. ``Segment.attach`` checks magic, version, kind and size and raises
``SegmentError`` naming what differs.

Names are ``/`` then 1 to 250 of ``A-Z a-z 0-9 . _ -``: a name that is not is refused
with a ``ValueError`` before the OS sees it. Creating a segment checks the size against
the free space of ``/dev/shm`` and reserves its memory (``posix_fallocate``), so a
segment that does not fit is a ``SegmentError`` naming the sizes and the fix, never a
SIGBUS at the first touch of a page. A ``/dev/shm`` that is missing or read-only is a
``SegmentError`` saying so, with the fix, too.

Cleanup: the creator unlinks its segments when it closes them and at interpreter
exit; a janitor process (see ``janitor.py``) unlinks whatever is left once every
process of the program has exited, including after SIGKILL.
"""

from __future__ import annotations

import atexit
import itertools
import json
import mmap
import os
import secrets
import threading
from typing import Any

import numpy as np
import posix_ipc

from shmpad.errors import SegmentError
from shmpad.shm import janitor

__all__ = ["Segment", "PREFIX", "LAYOUT_VERSION", "CACHE_LINE", "PAGE", "round_up"]

MAGIC = int.from_bytes(b"SHMPAD\x00\x01", "little")
LAYOUT_VERSION = 2  # 2: the weight store keeps three buffers with pin counts
PREFIX = "shmpad."
CACHE_LINE = 64
HEADER_BYTES = 64
PAGE = 4096
MAX_META_BYTES = 1 << 20

_W_MAGIC, _W_VERSION, _W_KIND, _W_SIZE, _W_PID, _W_META_LEN, _W_DATA_OFF = range(7)

_counter = itertools.count()
_owned_lock = threading.Lock()
_owned: dict[str, int] = {}  # name -> pid of the creating process


_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
MAX_NAME = 250
SHM_DIR = "/dev/shm"


def _checked_name(name: Any) -> str:
    """``name`` with its leading ``/``, if it is a segment name this module accepts."""
    if not isinstance(name, str):
        raise TypeError(f"segment name must be a str, got {type(name).__name__}")
    base = name[1:] if name.startswith("/") else name
    if not 1 <= len(base) <= MAX_NAME or not _NAME_CHARS.issuperset(base):
        raise ValueError(
            f"segment name {name!r} is not allowed: after an optional leading '/', 1 to {MAX_NAME} "
            "characters of A-Z, a-z, 0-9, '.', '_' and '-'"
        )
    return "/" + base


def _free_bytes() -> tuple[int, int] | None:
    """(free, total) bytes of the file system behind shared memory, if it can be read."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def _does_not_fit(name: str, size: int, why: str) -> SegmentError:
    room = _free_bytes()
    free = "" if room is None else f"; {SHM_DIR} has {_mib(room[0])} free of {_mib(room[1])}"
    return SegmentError(
        f"cannot create shared-memory segment {name!r} of {size} bytes ({_mib(size)}): {why}{free}. "
        f"Ask for less, or give {SHM_DIR} more room (in Docker: docker run --shm-size=...; "
        f"on a host: mount -o remount,size=... {SHM_DIR})"
    )


def _no_room_at_all(name: str, why: str) -> SegmentError:
    return SegmentError(
        f"cannot create shared-memory segment {name!r}: {why}. shmpad needs a writable tmpfs at {SHM_DIR} "
        f"(in Docker there is one; give it room with docker run --shm-size=...; on a host: "
        f"mount -t tmpfs -o size=... tmpfs {SHM_DIR})"
    )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def round_up(n: int, to: int) -> int:
    """``n`` rounded up to a multiple of ``to``: where the next line or page begins."""
    return (n + to - 1) // to * to


def _kind_word(kind: str) -> int:
    if not isinstance(kind, str):
        raise TypeError(f"segment kind must be a str, got {type(kind).__name__}")
    try:
        raw = kind.encode("ascii")
    except UnicodeEncodeError:
        raw = b""
    if not 0 < len(raw) <= 8:
        raise ValueError(f"segment kind must be 1 to 8 ASCII characters, got {kind!r}")
    return int.from_bytes(raw.ljust(8, b"\x00"), "little")


def _kind_name(word: int) -> str:
    return (int(word) & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little").rstrip(b"\x00").decode("ascii", "replace")


def _unlink(name: str) -> None:
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        pass


@atexit.register
def unlink_owned() -> None:
    """Remove every segment this process created and still owns (run at exit; call
    it before ``os._exit``, which skips atexit)."""
    pid = os.getpid()
    with _owned_lock:
        mine = [n for n, p in _owned.items() if p == pid]
        for name in mine:
            del _owned[name]
    for name in mine:
        _unlink(name)
        janitor.unregister(name)


class Segment:
    """One mapping of a named shared-memory segment.

    ``words`` is the whole segment as a 1-D int64 array (for the atomics), ``data``
    the data area as bytes (uint8), ``meta`` the creator's metadata dict.
    """

    name: str
    kind: str
    size: int
    meta: dict[str, Any]
    creator_pid: int
    data_offset: int
    words: np.ndarray
    data: np.ndarray

    def __init__(
        self, name: str, mm: mmap.mmap, kind: str, meta: dict[str, Any], data_offset: int, created: bool = False
    ):
        self._created = created
        self.name = name
        self.kind = kind
        self.size = len(mm)
        self.meta = meta
        self.data_offset = data_offset
        self._mmap = mm
        self.words = np.frombuffer(mm, dtype=np.int64)
        self.data = np.frombuffer(mm, dtype=np.uint8, offset=data_offset)
        self.creator_pid = int(self.words[_W_PID])

    @classmethod
    def create(cls, kind: str, meta: dict[str, Any], data_bytes: int, name: str | None = None) -> "Segment":
        """Create and map a new segment whose data area holds ``data_bytes`` bytes."""
        kind_word = _kind_word(kind)
        if data_bytes < 0:
            raise ValueError(f"data_bytes must be >= 0, got {data_bytes}")
        meta_raw = json.dumps(meta, sort_keys=True).encode()
        if len(meta_raw) > MAX_META_BYTES:
            raise ValueError(f"segment metadata holds at most {MAX_META_BYTES} bytes, got {len(meta_raw)}")
        data_offset = round_up(HEADER_BYTES + len(meta_raw), PAGE)
        size = data_offset + round_up(max(data_bytes, 1), PAGE)
        pid = os.getpid()
        generated = name is None
        name = f"/{PREFIX}{pid}.{next(_counter)}.{secrets.token_hex(4)}" if generated else _checked_name(name)
        room = _free_bytes()
        if room is not None and size > room[0]:
            raise _does_not_fit(name, size, "not enough free space")
        if generated:  # before it exists: a SIGKILL between creating it and registering it must not leak it
            janitor.register(name)  # (a name given may be another program's, which the janitor must never unlink)
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600)
        except BaseException as e:
            if generated:
                janitor.unregister(name)
            if isinstance(e, posix_ipc.ExistentialError):
                if not os.path.isdir(SHM_DIR):  # shm_open says ENOENT, which posix_ipc words as "exists"
                    raise _no_room_at_all(name, f"{SHM_DIR} does not exist") from None
                raise SegmentError(f"shared-memory segment {name!r} already exists") from None
            if isinstance(e, (OSError, posix_ipc.Error)):  # read-only, not permitted, no tmpfs (ENOSYS)
                raise _no_room_at_all(name, getattr(e, "strerror", None) or str(e)) from None
            raise
        with _owned_lock:
            _owned[name] = pid
        if not generated:
            janitor.register(name)
        try:
            try:
                os.ftruncate(shm.fd, size)
                # reserve the pages now: on a full /dev/shm this fails here (ENOSPC), where
                # without it the first write to a page past the free space is a SIGBUS
                os.posix_fallocate(shm.fd, 0, size)
            except (OSError, OverflowError) as e:
                raise _does_not_fit(name, size, getattr(e, "strerror", None) or str(e)) from None
            mm = mmap.mmap(shm.fd, size)
        except BaseException:
            _unlink(name)
            with _owned_lock:
                _owned.pop(name, None)
            janitor.unregister(name)
            raise
        finally:
            shm.close_fd()
        words = np.frombuffer(mm, dtype=np.int64)
        words[_W_VERSION] = LAYOUT_VERSION
        words[_W_KIND] = np.int64(np.uint64(kind_word).astype(np.int64))
        words[_W_SIZE] = size
        words[_W_PID] = pid
        words[_W_META_LEN] = len(meta_raw)
        words[_W_DATA_OFF] = data_offset
        mm[HEADER_BYTES : HEADER_BYTES + len(meta_raw)] = meta_raw
        words[_W_MAGIC] = np.int64(np.uint64(MAGIC).astype(np.int64))
        del words
        return cls(name, mm, kind, meta, data_offset, created=True)

    @classmethod
    def attach(cls, name: str, kind: str) -> "Segment":
        """Map an existing segment, checking that it is a shmpad segment of ``kind``."""
        name = _checked_name(name)
        _kind_word(kind)
        try:
            shm = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError:
            raise SegmentError(f"no shared-memory segment named {name!r}") from None
        try:
            size = shm.size
            if size < HEADER_BYTES:
                raise SegmentError(
                    f"segment {name!r} is not a shmpad segment: {size} bytes, smaller than the {HEADER_BYTES}-byte header"
                )
            mm = mmap.mmap(shm.fd, size)
        finally:
            shm.close_fd()
        head = np.frombuffer(mm, dtype=np.uint64, count=HEADER_BYTES // 8)
        magic, version, kind_word, seg_size, _, meta_len, data_offset = (int(x) for x in head[:7])
        del head
        if magic != MAGIC:
            mm.close()
            raise SegmentError(
                f"segment {name!r} is not a shmpad segment (magic {magic:#018x}, expected {MAGIC:#018x})"
            )
        if version != LAYOUT_VERSION:
            mm.close()
            raise SegmentError(
                f"segment {name!r} has layout version {version}, this shmpad reads version {LAYOUT_VERSION}"
            )
        if _kind_name(kind_word) != kind:
            mm.close()
            raise SegmentError(f"segment {name!r} holds a {_kind_name(kind_word)!r}, not a {kind!r}")
        if seg_size != size or data_offset > size or HEADER_BYTES + meta_len > data_offset:
            mm.close()
            raise SegmentError(
                f"segment {name!r} is damaged: header says {seg_size} bytes with data at {data_offset}, mapping has {size}"
            )
        try:
            meta = json.loads(bytes(mm[HEADER_BYTES : HEADER_BYTES + meta_len]).decode("utf-8"))
            if not isinstance(meta, dict):
                raise ValueError(f"a {type(meta).__name__}, not an object")
        except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            mm.close()
            raise SegmentError(f"segment {name!r} is damaged: its metadata is not a JSON object ({e})") from None
        return cls(name, mm, kind, meta, data_offset)

    @property
    def owned(self) -> bool:
        """True for the handle ``create`` returned, in the process that created it
        (not for handles attached by name, nor in forked children)."""
        return self._created and self.creator_pid == os.getpid()

    def close(self) -> None:
        """Unmap this handle (and unlink the name if it is the owning handle).

        Views of the segment taken by the caller keep the mapping alive until they
        are garbage; the segment's own views are dropped here. Idempotent."""
        if self.owned:
            self.unlink()
        if self._mmap is None:
            return
        self.words = self.data = None
        try:
            self._mmap.close()
        except BufferError:
            pass  # exported views remain; the mapping goes when they do
        self._mmap = None

    def disown(self) -> None:
        """Give up ownership: this handle's close and this process's exit no longer
        remove the name; whoever attaches and calls ``unlink`` does (the janitor
        still removes it when the program ends). Used to hand a segment over."""
        with _owned_lock:
            _owned.pop(self.name, None)
        self._created = False

    def unlink(self) -> None:
        """Remove the name (the memory lives on while any process maps it). Idempotent."""
        with _owned_lock:
            _owned.pop(self.name, None)
        _unlink(self.name)
        janitor.unregister(self.name)

    def __reduce__(self):
        return (Segment.attach, (self.name, self.kind))

    def __repr__(self) -> str:
        return f"Segment({self.name!r}, kind={self.kind!r}, size={self.size})"
