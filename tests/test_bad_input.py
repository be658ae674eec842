"""Bad input to the shared-memory layer: every case is a clear error naming the argument
and what is allowed, and none leaves a segment behind (no numba TypingError, no
OverflowError from C, no SIGSEGV, no SIGBUS, no other program's segment unlinked)."""

from __future__ import annotations

import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import posix_ipc
import pytest

from shmpad import MPMCRing, SegmentError, SPSCRing, Timeout, TypedRing, WeightStore
from shmpad.shm.segment import HEADER_BYTES, Segment

DEADLINE_S = 30.0


def _mine() -> set[str]:
    """This process's segments in /dev/shm."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"shmpad.{os.getpid()}.")}


@pytest.fixture
def no_new_segments():
    before = _mine()
    yield
    assert _mine() == before


@pytest.fixture
def store():
    with WeightStore.create({"w": np.zeros(2)}) as s:
        yield s


# -- the weight store's arguments -----------------------------------------------------


@pytest.mark.parametrize(
    ("newer_than", "error", "message"),
    [
        ("x", TypeError, "^newer_than must be an int, got str$"),
        (1.5, TypeError, "^newer_than must be an int, got float$"),
        (True, TypeError, "^newer_than must be an int, got bool$"),
        (2**70, ValueError, r"^newer_than must be between -\d+ and \d+, got 1180591620717411303424$"),
    ],
)
def test_pull_names_a_bad_newer_than(store, newer_than, error, message):
    with pytest.raises(error, match=message):
        store.pull({"w": np.zeros(2)}, newer_than=newer_than)
    with pytest.raises(error, match=message):
        store.pull_arrays(newer_than=newer_than)


def test_no_version_yet_is_none(store):
    # a reader that has pulled nothing yet says so with None (the default)
    assert store.pull({"w": np.zeros(2)}, newer_than=None) == 0
    store.publish({"w": np.ones(2)})
    into = {"w": np.zeros(2)}
    assert store.pull(into, newer_than=None) == 1 and into["w"].tolist() == [1.0, 1.0]
    assert store.pull(into, newer_than=np.int64(1)) == 1
    assert store.pull_arrays()[0] == 1
    assert store.wait_for_version(None, timeout=1) == 1


@pytest.mark.parametrize(
    ("timeout", "error", "message"),
    [
        (float("nan"), ValueError, "^timeout must be a finite number of seconds >= 0 or None, got nan$"),
        (math.inf, ValueError, "^timeout must be a finite number of seconds >= 0 or None, got inf$"),
        (-1, ValueError, "^timeout must be a finite number of seconds >= 0 or None, got -1$"),
        ("1", TypeError, "^timeout must be a number of seconds or None, got str$"),
        (True, TypeError, "^timeout must be a number of seconds or None, got bool$"),
    ],
)
def test_wait_for_version_names_a_bad_timeout(store, timeout, error, message):
    with pytest.raises(error, match=message):
        store.wait_for_version(0, timeout=timeout)


@pytest.mark.parametrize("timeout", [np.int64(0), np.float32(0.01), 0, 0.01])
def test_numpy_numbers_are_timeouts_too(store, timeout):
    with pytest.raises(Timeout):
        store.wait_for_version(0, timeout=timeout)


# -- sizes that cannot be had -----------------------------------------------------------


def test_a_typed_field_too_large_for_memory_is_a_segment_error_naming_the_capacity(no_new_segments):
    with pytest.raises(SegmentError, match=r"^a ring of capacity=4 .*not enough free space; /dev/shm has .* free"):
        TypedRing.create({"x": (np.uint8, (2**62,))}, 4)


@pytest.mark.parametrize("ring_cls", [SPSCRing, MPMCRing])
def test_a_ring_larger_than_dev_shm_names_the_sizes_and_the_fix(ring_cls, no_new_segments):
    with pytest.raises(SegmentError) as caught:
        ring_cls.create(1 << 20, 1 << 31)
    text = str(caught.value)
    assert text.startswith("a ring of capacity=1048576 (1048576 slots of 2147483648 bytes)")
    assert "/dev/shm has" in text and "--shm-size" in text


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root")
def test_a_small_dev_shm_is_an_error_at_create_not_a_sigbus_later():
    """A 16 MiB /dev/shm, as in a container given little shared memory: a 32 MiB ring is
    refused at create with the sizes; 12 MiB fits, and a second 12 MiB does not."""
    code = textwrap.dedent(
        """
        import os
        from shmpad import SPSCRing, SegmentError
        try:
            SPSCRing.create(32, 1 << 20)
        except SegmentError as e:
            print("REFUSED", "16.0 MiB" in str(e) and "--shm-size" in str(e))
        first = SPSCRing.create(12, 1 << 20)
        first._seg.data[:] = 1  # every page of it can be touched
        try:
            SPSCRing.create(12, 1 << 20)
        except SegmentError:
            print("SECOND REFUSED")
        first.close()
        print("LEFT", [n for n in os.listdir("/dev/shm") if n.startswith("shmpad.")])
        """
    )
    script = f"mount -t tmpfs -o size=16m tmpfs /dev/shm && exec {sys.executable} -c '{code}'"
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "REFUSED True" in out.stdout and "SECOND REFUSED" in out.stdout and "LEFT []" in out.stdout, out.stdout


# -- names ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a\x00b", "a/b", "", "/", "x\ny", "a" * 251, "dé"])
def test_a_bad_segment_name_is_refused_before_the_os_sees_it(name, no_new_segments):
    with pytest.raises(ValueError, match=r"^segment name .* is not allowed: after an optional leading '/', 1 to 250"):
        Segment.create("spsc", {}, 16, name=name)
    with pytest.raises(ValueError, match=r"^segment name .* is not allowed"):
        Segment.attach(name, "spsc")


@pytest.mark.parametrize("name", [5, None, b"abc"])
def test_a_segment_name_that_is_not_a_str_is_a_type_error(name):
    with pytest.raises(TypeError, match="^segment name must be a str, got "):
        Segment.attach(name, "spsc")


def test_damaged_metadata_is_a_segment_error():
    ring = MPMCRing.create(4, 64)
    try:
        view = ring._seg.words.view(np.uint8)
        view[HEADER_BYTES : HEADER_BYTES + 4] = [0xFF, 0xFE, 0xFD, 0xFC]
        with pytest.raises(SegmentError, match=r"is damaged: its metadata is not a JSON object"):
            MPMCRing.attach(ring.name)
    finally:
        ring.close()


_JANITOR_CHILD = """
import os, sys, time
from shmpad.shm import janitor
from shmpad.shm.segment import Segment
janitor.start()
children = open(f"/proc/self/task/{os.getpid()}/children").read().split()
canary = Segment.create("spsc", {}, 16)
janitor.register("/no-such-segment\\n+" + sys.argv[1])  # the old line protocol read a second name here
print(children[0], canary.name, flush=True)
time.sleep(60)
"""


def test_no_byte_of_a_registered_name_makes_the_janitor_unlink_another_segment():
    victim = f"other-program-{secrets.token_hex(4)}"
    other = posix_ipc.SharedMemory("/" + victim, posix_ipc.O_CREX, size=4096)
    other.close_fd()
    child = subprocess.Popen([sys.executable, "-c", _JANITOR_CHILD, victim], stdout=subprocess.PIPE, text=True)
    try:
        janitor_pid, canary = child.stdout.readline().split()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(DEADLINE_S)
        deadline = time.monotonic() + DEADLINE_S
        while os.path.exists(f"/proc/{janitor_pid}") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not os.path.exists(f"/proc/{janitor_pid}"), "the janitor did not finish"
        assert not os.path.exists("/dev/shm" + canary), "the janitor did not remove the killed process's segment"
        assert os.path.exists("/dev/shm/" + victim), "the janitor removed another program's segment"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(DEADLINE_S)
        posix_ipc.unlink_shared_memory("/" + victim)


# -- the non-blocking rule: X_nowait raises WouldBlock, X(timeout=...) raises Timeout ----


@pytest.mark.parametrize("multi", [False, True])
def test_every_blocking_call_of_a_byte_ring_has_a_nowait_twin(multi):
    from shmpad import WouldBlock

    ring = (MPMCRing if multi else SPSCRing).create(2, 16)
    try:
        out = bytearray(16)
        for call in (
            ring.get_nowait,
            ring.get_bytes_nowait,
            lambda: ring.get_into_nowait(out),
            lambda: ring.get_many_nowait(2),
        ):
            with pytest.raises(WouldBlock):
                call()
        ring.put_many_nowait([b"a", b"b"])
        with pytest.raises(WouldBlock):
            ring.put_nowait(b"c")
        with pytest.raises(WouldBlock):
            ring.reserve_nowait(4)
        with pytest.raises(WouldBlock, match="1 of 2"):
            ring.get_bytes()  # make one slot free again: then put_many_nowait puts one and says so
            ring.put_many_nowait([b"c", b"d"])
        with pytest.raises(Timeout):
            ring.put(b"e", timeout=0)
        assert ring.get_into_nowait(out) == 1 and bytes(out[:1]) == b"b"
    finally:
        ring.close()


@pytest.mark.parametrize("multi", [False, True])
def test_every_blocking_call_of_a_typed_ring_has_a_nowait_twin(multi):
    from shmpad import WouldBlock

    ring = TypedRing.create({"x": (np.int64, ())}, 2, multi=multi)
    try:
        with pytest.raises(WouldBlock):
            ring.get_nowait()
        with pytest.raises(WouldBlock):
            ring.get_batch_nowait(1)
        ring.put_nowait({"x": 1})
        slot = ring.reserve_nowait()
        slot["x"][...] = 2
        ring.commit()
        with pytest.raises(WouldBlock):
            ring.put_nowait({"x": 3})
        with pytest.raises(WouldBlock):
            ring.reserve_nowait()
        with pytest.raises(Timeout):
            ring.put({"x": 3}, timeout=0)
        assert ring.get_batch_nowait(2)["x"].tolist() == [1, 2]
        ring.release()
    finally:
        ring.close()


# -- the launcher's termination notice ---------------------------------------------------


@pytest.mark.parametrize(
    ("notice", "error", "message"),
    [
        (
            float("nan"),
            ValueError,
            "^termination_notice_secs must be a finite number of seconds >= 0 or None, got nan$",
        ),
        (-1, ValueError, "^termination_notice_secs must be a finite number of seconds >= 0 or None, got -1$"),
        (math.inf, ValueError, "^termination_notice_secs must be a finite number of seconds >= 0 or None, got inf$"),
        ("10", TypeError, "^termination_notice_secs must be a number of seconds or None, got str$"),
    ],
)
def test_a_bad_termination_notice_is_refused_before_anything_starts(notice, error, message):
    import shmpad as lp

    program = lp.Program("notice")
    program.add_node(lp.PyNode(print, "never runs"), "node")
    with pytest.raises(error, match=message):
        lp.launch(program, launch_type="test_mp", termination_notice_secs=notice)


@pytest.mark.parametrize("raw", ["nan", "-1", "inf"])
def test_a_bad_termination_notice_flag_is_refused(raw, monkeypatch):
    import shmpad as lp

    monkeypatch.setattr(sys, "argv", ["prog", f"--lp_termination_notice_secs={raw}"])
    program = lp.Program("notice")
    program.add_node(lp.PyNode(print, "never runs"), "node")
    with pytest.raises(
        ValueError, match=f"^--lp_termination_notice_secs must be a finite number of seconds >= 0, got '{raw}'$"
    ):
        lp.launch(program, launch_type="test_mp")


_CREATE_A_RING = """
from shmpad import SPSCRing, SegmentError
try:
    SPSCRing.create(4, 64)
except SegmentError as e:
    print("REFUSED", e)
"""


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root")
@pytest.mark.parametrize(
    "setup, why",
    [
        ("mount -t tmpfs -o size=16m,ro tmpfs /dev/shm", "Read-only file system"),
        ("umount /dev/shm; mount -t tmpfs -o size=1m tmpfs /dev", "/dev/shm does not exist"),  # no /dev/shm at all
    ],
    ids=["read-only", "missing"],
)
def test_a_dev_shm_that_cannot_be_written_is_an_error_saying_so(setup, why):
    script = f"{setup} && exec {sys.executable} -c '{_CREATE_A_RING}'"
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("REFUSED a ring of capacity=4 (4 slots of 64 bytes): cannot create"), out.stdout
    assert f": {why}. shmpad needs a writable tmpfs at /dev/shm" in out.stdout and "--shm-size" in out.stdout
