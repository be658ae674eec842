"""Named shared-memory segments: layout, attach checks, pickling, and cleanup after any exit."""

from __future__ import annotations

import json
import mmap
import os
import pickle
import re
import signal

import helpers
import numpy as np
import posix_ipc
import pytest

from shmpad.errors import SegmentError
from shmpad.shm.segment import LAYOUT_VERSION, PREFIX, Segment

PAGE = 4096
# Generous: the janitor reacts within milliseconds of the last holder's exit.
JANITOR_DEADLINE = 5.0


# --- create / attach -----------------------------------------------------------------------


def test_create_attach_round_trip(make_segment):
    meta = {"capacity": 8, "spec": {"obs": [[4, 84, 84], "uint8"]}, "name": "actor/3"}
    seg = make_segment("spsc", meta, 10_000)

    assert seg.name.startswith("/" + PREFIX)
    assert helpers.shm_exists(seg.name)
    assert (seg.kind, seg.meta, seg.creator_pid, seg.owned) == ("spsc", meta, os.getpid(), True)
    assert seg.data_offset % PAGE == 0 and seg.data_offset >= 64
    assert seg.data.ctypes.data % PAGE == 0
    assert seg.data.dtype == np.uint8 and seg.data.size >= 10_000
    assert seg.size == seg.data_offset + seg.data.size == seg.words.size * 8
    assert seg.size == os.stat(os.path.join(helpers.SHM_DIR, seg.name[1:])).st_size
    assert seg.words[:1].tobytes() == b"SHMPAD\x00\x01"
    assert list(seg.words[1:7]) == [
        LAYOUT_VERSION,
        int.from_bytes(b"spsc".ljust(8, b"\x00"), "little"),
        seg.size,
        os.getpid(),
        seg.words[5],
        seg.data_offset,
    ]
    assert json.loads(seg.words.view(np.uint8)[64 : 64 + seg.words[5]].tobytes().decode()) == meta

    other = Segment.attach(seg.name, "spsc")
    assert (other.name, other.kind, other.meta, other.size) == (seg.name, "spsc", meta, seg.size)
    assert (other.creator_pid, other.data_offset) == (seg.creator_pid, seg.data_offset)
    assert other.data.ctypes.data % PAGE == 0

    seg.data[:5] = [1, 2, 3, 4, 5]  # one memory, two mappings
    assert list(other.data[:5]) == [1, 2, 3, 4, 5]
    other.words[-1] = -17
    assert seg.words[-1] == -17


def test_attach_accepts_a_name_without_the_leading_slash(make_segment):
    seg = make_segment("test", {"a": 1})
    assert Segment.attach(seg.name.lstrip("/"), "test").meta == {"a": 1}


def test_large_metadata_pushes_the_data_area_to_a_later_page(make_segment):
    meta = {"blob": "x" * 5000}
    seg = make_segment("test", meta, 1)
    assert seg.data_offset == 2 * PAGE
    assert seg.data.ctypes.data % PAGE == 0
    assert Segment.attach(seg.name, "test").meta == meta


def test_zero_data_bytes_still_gets_a_data_page(make_segment):
    seg = make_segment("test", {}, 0)
    assert seg.data.size == PAGE


def test_create_rejects_bad_sizes():
    with pytest.raises(ValueError, match=r"^data_bytes must be >= 0, got -1$"):
        Segment.create("test", {}, -1)
    big = {"x": "y" * (1 << 20)}
    with pytest.raises(
        ValueError, match=rf"^segment metadata holds at most 1048576 bytes, got {len(json.dumps(big))}$"
    ):
        Segment.create("test", big, 1)


@pytest.mark.parametrize(
    "kind", ["", "ninechars", "weights-v2", "spé"], ids=["empty", "9-chars", "10-chars", "non-ascii"]
)
def test_create_rejects_a_bad_kind_name(kind):
    with pytest.raises(ValueError, match=re.escape(f"segment kind must be 1 to 8 ASCII characters, got {kind!r}")):
        Segment.create(kind, {}, 1)


@pytest.mark.parametrize("kind", ["", "ninechars", "spé"], ids=["empty", "9-chars", "non-ascii"])
def test_attach_rejects_a_bad_kind_name(make_segment, kind):
    seg = make_segment("test")
    with pytest.raises(ValueError, match=re.escape(f"segment kind must be 1 to 8 ASCII characters, got {kind!r}")):
        Segment.attach(seg.name, kind)


def test_attach_missing_name():
    name = helpers.unique_segment_name("missing")
    with pytest.raises(SegmentError, match=re.escape(f"no shared-memory segment named {name!r}")):
        Segment.attach(name, "test")
    with pytest.raises(SegmentError, match=re.escape(f"no shared-memory segment named {name!r}")):
        Segment.attach(name.lstrip("/"), "test")


def test_attach_rejects_a_non_str_name():
    with pytest.raises(TypeError, match=r"^segment name must be a str, got int$"):
        Segment.attach(42, "test")


@pytest.fixture
def foreign_segment():
    """``make(size, content)``: a raw POSIX segment not made by shmpad, unlinked at the end."""
    made = []

    def make(size: int, content: bytes = b"") -> str:
        name = helpers.unique_segment_name("foreign")
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        made.append(name)
        try:
            if content:
                with mmap.mmap(shm.fd, size) as mm:
                    mm[: len(content)] = content
        finally:
            shm.close_fd()
        return name

    yield make
    for name in made:
        posix_ipc.unlink_shared_memory(name)


def test_attach_rejects_a_foreign_segment(foreign_segment):
    content = os.urandom(PAGE)
    name = foreign_segment(PAGE, content)
    magic = int.from_bytes(content[:8], "little")
    expected = (
        f"segment {name!r} is not a shmpad segment (magic {magic:#018x}, expected "
        f"{int.from_bytes(b'SHMPAD' + bytes([0, 1]), 'little'):#018x})"
    )
    with pytest.raises(SegmentError, match=re.escape(expected)):
        Segment.attach(name, "test")


@pytest.mark.parametrize("size", [0, 16, 63])
def test_attach_rejects_a_foreign_segment_smaller_than_the_header(foreign_segment, size):
    name = foreign_segment(size)
    expected = f"segment {name!r} is not a shmpad segment: {size} bytes, smaller than the 64-byte header"
    with pytest.raises(SegmentError, match=re.escape(expected)):
        Segment.attach(name, "test")


def test_attach_rejects_a_half_made_segment(make_segment):
    seg = make_segment("test")
    seg.words[0] = 0  # the magic is written last
    with pytest.raises(SegmentError, match=re.escape(f"segment {seg.name!r} is not a shmpad segment (magic 0x0000")):
        Segment.attach(seg.name, "test")


def test_attach_rejects_another_kind(make_segment):
    seg = make_segment("spsc")
    with pytest.raises(SegmentError, match=re.escape(f"segment {seg.name!r} holds a 'spsc', not a 'mpmc'")):
        Segment.attach(seg.name, "mpmc")
    with pytest.raises(SegmentError, match=re.escape(f"segment {seg.name!r} holds a 'spsc', not a 'spsc2'")):
        Segment.attach(seg.name, "spsc2")


def test_attach_rejects_another_layout_version(make_segment):
    seg = make_segment("test")
    seg.words[1] = LAYOUT_VERSION + 1
    expected = (
        f"segment {seg.name!r} has layout version {LAYOUT_VERSION + 1}, this shmpad reads version {LAYOUT_VERSION}"
    )
    with pytest.raises(SegmentError, match=re.escape(expected)):
        Segment.attach(seg.name, "test")


def test_attach_rejects_a_damaged_header(make_segment):
    seg = make_segment("test")
    seg.words[3] = seg.size + PAGE
    expected = (
        f"segment {seg.name!r} is damaged: header says {seg.size + PAGE} bytes with data at "
        f"{seg.data_offset}, mapping has {seg.size}"
    )
    with pytest.raises(SegmentError, match=re.escape(expected)):
        Segment.attach(seg.name, "test")


def test_create_with_a_duplicate_explicit_name(make_segment):
    name = helpers.unique_segment_name("dup")
    first = make_segment("test", {"n": 1}, name=name)
    assert first.name == name
    first.data[0] = 7
    with pytest.raises(SegmentError, match=re.escape(f"shared-memory segment {name!r} already exists")):
        Segment.create("test", {"n": 2}, 1, name=name)
    with pytest.raises(SegmentError, match=re.escape(f"shared-memory segment {name!r} already exists")):
        Segment.create("test", {"n": 2}, 1, name=name.lstrip("/"))
    again = Segment.attach(name, "test")  # the first one is untouched
    assert again.meta == {"n": 1} and again.data[0] == 7


# --- pickling -----------------------------------------------------------------------------


def test_pickle_reattaches_in_the_same_process(make_segment):
    seg = make_segment("test", {"k": [1, 2]}, 100)
    copy = pickle.loads(pickle.dumps(seg))
    assert copy is not seg
    assert (copy.name, copy.kind, copy.meta, copy.size, copy.creator_pid) == (
        seg.name,
        "test",
        {"k": [1, 2]},
        seg.size,
        os.getpid(),
    )
    copy.data[3] = 99
    assert seg.data[3] == 99


def test_pickle_reattaches_in_another_process(shm_leak_check, make_segment):
    seg = make_segment("test", {"k": "v"}, 100)
    code = (
        "import pickle\n"
        f"seg = pickle.loads(bytes.fromhex({pickle.dumps(seg).hex()!r}))\n"
        "seg.words[seg.data_offset // 8] = -1234\n"
        "print(seg.kind, seg.meta['k'], seg.creator_pid, seg.owned, flush=True)\n"
    )
    proc = helpers.spawn_python(code)
    try:
        assert helpers.read_line(proc) == f"test v {os.getpid()} False"
        assert proc.wait(timeout=30) == 0
    finally:
        helpers.kill_and_reap(proc)
    assert seg.words[seg.data_offset // 8] == -1234
    assert helpers.shm_exists(seg.name), "a process that only attached must not unlink the segment"


# --- cleanup ------------------------------------------------------------------------------


def test_unlink_removes_the_entry_and_is_idempotent(shm_leak_check):
    seg = Segment.create("test", {}, 1)
    assert helpers.shm_exists(seg.name)
    seg.unlink()
    assert not helpers.shm_exists(seg.name)
    seg.unlink()
    seg.words[-1] = 5  # the mapping outlives the name
    assert seg.words[-1] == 5
    with pytest.raises(SegmentError, match="no shared-memory segment named"):
        Segment.attach(seg.name, "test")


def test_close_by_the_creator_removes_the_entry(shm_leak_check):
    seg = Segment.create("test", {}, 1)
    try:
        seg.close()
        assert not helpers.shm_exists(seg.name)
        seg.close()  # idempotent
    finally:
        seg.unlink()


def test_close_by_an_attacher_keeps_the_entry(make_segment):
    seg = make_segment("test")
    other = Segment.attach(seg.name, "test")
    other.close()
    assert helpers.shm_exists(seg.name)
    assert Segment.attach(seg.name, "test").size == seg.size


_CREATE = (
    "import os, sys, time\n"
    "from shmpad.shm.segment import Segment\n"
    "seg = Segment.create('test', {'who': 'child'}, 4096)\n"
    "other = Segment.create('test', {'who': 'child'}, 1)\n"
    "print(seg.name, other.name, flush=True)\n"
)


def _start_creator(tail: str):
    proc = helpers.spawn_python(_CREATE + tail)
    names = helpers.read_line(proc).split()
    assert len(names) == 2 and all(n.startswith("/" + PREFIX + f"{proc.pid}.") for n in names)
    return proc, names


def test_normal_exit_leaves_nothing(shm_leak_check):
    proc, names = _start_creator("")
    try:
        assert proc.wait(timeout=30) == 0
    finally:
        helpers.kill_and_reap(proc)
    # Unlinked at exit by the creator itself, not later by the janitor.
    assert [n for n in names if helpers.shm_exists(n)] == []


def test_exit_on_an_exception_leaves_nothing(shm_leak_check):
    proc, names = _start_creator("raise RuntimeError('boom')\n")
    try:
        assert proc.wait(timeout=30) == 1
    finally:
        helpers.kill_and_reap(proc)
    assert [n for n in names if helpers.shm_exists(n)] == []


def test_sigkill_leaves_nothing(shm_leak_check):
    proc, names = _start_creator("time.sleep(120)\n")
    try:
        assert all(helpers.shm_exists(n) for n in names)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert helpers.wait_until(lambda: not any(map(helpers.shm_exists, names)), JANITOR_DEADLINE), (
            f"still in /dev/shm {JANITOR_DEADLINE} s after SIGKILL: {[n for n in names if helpers.shm_exists(n)]}"
        )
    finally:
        helpers.kill_and_reap(proc)


def test_janitor_forgets_names_that_were_unlinked(shm_leak_check, make_segment):
    """A name the creator unlinked and someone else reused must survive the creator's janitor."""
    reused = helpers.unique_segment_name("reused")
    code = (
        "import time\n"
        "from shmpad.shm.segment import Segment\n"
        f"Segment.create('test', {{}}, 1, name={reused!r}).unlink()\n"
        "kept = Segment.create('test', {}, 1)\n"
        "print(kept.name, flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = helpers.spawn_python(code)
    try:
        kept = helpers.read_line(proc)
        mine = make_segment("test", {"owner": "test"}, name=reused)
        proc.kill()
        proc.wait(timeout=30)
        # ``kept`` gone means the janitor has run to its end.
        assert helpers.wait_until(lambda: not helpers.shm_exists(kept), JANITOR_DEADLINE)
        assert helpers.shm_exists(mine.name)
        assert Segment.attach(reused, "test").meta == {"owner": "test"}
    finally:
        helpers.kill_and_reap(proc)


# How long an entry must survive to count as "kept": far longer than the janitor needs to
# unlink after end-of-file (a few milliseconds), see test_sigkill_leaves_nothing.
STILL_THERE_FOR = 0.5


def _assert_stays(names, seconds: float) -> None:
    gone = not helpers.wait_until(lambda: not all(map(helpers.shm_exists, names)), seconds)
    assert gone, (
        f"unlinked while a process of the program still runs: {[n for n in names if not helpers.shm_exists(n)]}"
    )


def test_forked_child_keeps_the_segment_until_it_dies_too(shm_leak_check):
    code = _CREATE + (
        "pid = os.fork()\nif pid == 0:\n    time.sleep(120)\n    os._exit(0)\nprint(pid, flush=True)\ntime.sleep(120)\n"
    )
    proc = helpers.spawn_python(code)
    child = None
    try:
        names = helpers.read_line(proc).split()
        child = int(helpers.read_line(proc))
        helpers.track_pid(child)
        proc.kill()
        proc.wait(timeout=30)
        assert helpers.pid_alive(child)
        _assert_stays(names, STILL_THERE_FOR)

        helpers.kill_pid(child)
        assert helpers.wait_until(lambda: not helpers.pid_alive(child), 60)
        assert helpers.wait_until(lambda: not any(map(helpers.shm_exists, names)), JANITOR_DEADLINE)
    finally:
        if child is not None:
            helpers.kill_pid(child)
        helpers.kill_and_reap(proc)


def test_child_forked_before_the_first_segment_keeps_it_too(shm_leak_check):
    """The program's processes include those forked before its first segment was made
    (a launcher starts the janitor, forks its nodes, then one node creates a ring
    another node attaches)."""
    code = (
        "import os, time\n"
        "from shmpad.shm import janitor\n"
        "from shmpad.shm.segment import Segment\n"
        "janitor.start()\n"
        "r, w = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.close(w)\n"
        "    seg = Segment.attach(os.read(r, 200).decode(), 'test')\n"
        "    os.write(1, b'attached\\n')\n"
        "    time.sleep(120)\n"
        "    os._exit(0)\n"
        "os.close(r)\n"
        "seg = Segment.create('test', {}, 1)\n"
        "os.write(w, seg.name.encode())\n"
        "os.write(1, f'{seg.name} {pid}\\n'.encode())  # one write: the child prints too\n"
        "time.sleep(120)\n"
    )
    proc = helpers.spawn_python(code)
    child = None
    try:
        lines = sorted([helpers.read_line(proc), helpers.read_line(proc)])
        assert lines[1] == "attached"
        name, child_pid = lines[0].split()
        child = int(child_pid)
        helpers.track_pid(child)
        proc.kill()
        proc.wait(timeout=30)
        assert helpers.pid_alive(child)
        _assert_stays([name], STILL_THERE_FOR)

        helpers.kill_pid(child)
        assert helpers.wait_until(lambda: not helpers.pid_alive(child), 60)
        assert helpers.wait_until(lambda: not helpers.shm_exists(name), JANITOR_DEADLINE)
    finally:
        if child is not None:
            helpers.kill_pid(child)
        helpers.kill_and_reap(proc)


def test_a_generated_name_reaches_the_janitor_before_the_segment_exists(shm_leak_check, monkeypatch):
    # a SIGKILL between creating a segment and registering it would leak it: the janitor hears first
    from shmpad.shm import janitor, segment

    events = []
    real_register, real_unregister, real_open = janitor.register, janitor.unregister, posix_ipc.SharedMemory
    monkeypatch.setattr(janitor, "register", lambda name: (events.append(("register", name)), real_register(name)))
    monkeypatch.setattr(
        janitor, "unregister", lambda name: (events.append(("unregister", name)), real_unregister(name))
    )

    def shm_open(name, *a, **kw):
        events.append(("create", name))
        return real_open(name, *a, **kw)

    monkeypatch.setattr(segment.posix_ipc, "SharedMemory", shm_open)
    seg = Segment.create("raw", {}, 64)
    try:
        assert [e for e, n in events if n == seg.name] == ["register", "create"]
    finally:
        seg.close()
    events.clear()
    given = f"/{PREFIX}given.{os.getpid()}"
    seg = Segment.create("raw", {}, 64, name=given)
    try:  # a name given may be another program's: registered only once this process made it
        assert [e for e, n in events if n == given] == ["create", "register"]
        events.clear()
        with pytest.raises(SegmentError, match="already exists"):
            Segment.create("raw", {}, 64, name=given)
        assert [e for e, n in events if n == given] == ["create"]
    finally:
        seg.close()
