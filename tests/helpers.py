"""Shared test utilities: /dev/shm listings, polling with a deadline, child processes.

Leak checks count only segments this test session made: a segment's default name is
``shmpad.<pid of its creator>.<n>.<hex>``, and the session records the pid of every
process its tests start (``track_pid``), so segments of another test run or benchmark
on the same machine are never blamed on this one. Tests that pick a name themselves
take it from ``unique_segment_name``, which follows the same pattern.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Callable, Iterable

SHM_DIR = "/dev/shm"
SHM_PREFIX = "shmpad."

_session_pids: set[int] = {os.getpid()}


def shm_entries(prefix: str = SHM_PREFIX) -> set[str]:
    """Names (without the leading slash) of the /dev/shm entries that start with ``prefix``."""
    return {name for name in os.listdir(SHM_DIR) if name.startswith(prefix)}


def shm_exists(name: str) -> bool:
    """True while the segment ``name`` (with or without its leading slash) has a /dev/shm entry."""
    return os.path.exists(os.path.join(SHM_DIR, name.lstrip("/")))


def track_pid(pid: int) -> None:
    """Count segments named after ``pid`` as this session's in leak checks."""
    _session_pids.add(pid)


def creator_pid_of(name: str) -> int | None:
    """The pid in a default segment name ``shmpad.<pid>.<n>.<hex>``, or None for other names."""
    parts = name.lstrip("/").split(".")
    if len(parts) >= 2 and parts[0] + "." == SHM_PREFIX and parts[1].isdigit():
        return int(parts[1])
    return None


def ours(names: Iterable[str]) -> set[str]:
    """The names among ``names`` that this session made (explicit names in tests come from
    ``unique_segment_name``, which puts this process's pid where a default name has it)."""
    return {name for name in names if creator_pid_of(name) in _session_pids}


def unique_segment_name(tag: str) -> str:
    """An explicit segment name the leak checks attribute to this process."""
    return f"/{SHM_PREFIX}{os.getpid()}.{tag}.{os.urandom(4).hex()}"


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.005) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead: it holds no files any more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a live process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def current_syscall(pid: int) -> int | None:
    """The number of the system call ``pid`` is blocked in, or None if it is running."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            first = f.read().split()[0]
    except (FileNotFoundError, PermissionError, IndexError):
        return None
    return int(first) if first.lstrip("-").isdigit() else None


def spawn_python(code: str) -> subprocess.Popen:
    """Start ``python -c code`` with an unbuffered stdout pipe; its pid counts in the leak checks.

    It leads a new process group, so that ``kill_and_reap`` also ends the processes it forks
    (the janitor it may start leads a session of its own and ends by itself).
    """
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, bufsize=0, start_new_session=True)
    track_pid(proc.pid)
    return proc


def read_line(proc: subprocess.Popen, timeout: float = 30.0) -> str:
    """The next line ``proc`` prints, without its newline; fails instead of blocking forever.

    Reads a byte at a time so that nothing beyond the line is taken from the pipe.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    line = bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                raise AssertionError(f"process {proc.pid} printed no whole line within {timeout} s: {bytes(line)!r}")
            byte = os.read(fd, 1)
            if not byte:
                raise AssertionError(f"process {proc.pid} closed its stdout (exit code {proc.poll()}): {bytes(line)!r}")
            if byte == b"\n":
                return line.decode()
            line += byte


def kill_and_reap(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every process left in its group (see ``spawn_python``), and reap ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(timeout=30)
    if proc.stdout is not None:
        proc.stdout.close()


def kill_pid(pid: int) -> None:
    """SIGKILL a process that is not our child (ignore it if it is gone already)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
