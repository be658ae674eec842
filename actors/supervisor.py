"""Forked worker processes: start, die-with-parent, failure reports, liveness, ending.

A worker is ``os.fork()`` of the process that owns the pool, so it shares the pool's
mappings and needs nothing pickled. It reports through a pipe only the parent reads:
the traceback of the exception that ended it, or (``faulthandler``) the Python stack
of every thread when the parent sends ``SIGUSR1`` to a worker it thinks is hung, or
when the worker itself crashes in native code. The parent notices a death by
``waitpid`` and reads the pipe.

A worker dies with its parent: ``PR_SET_PDEATHSIG`` asks the kernel for a SIGKILL
when the thread that forked it exits, and the worker also checks its parent pid
whenever it wakes from a wait, which covers a parent that died before the
``prctl``. (So create a pool from a thread that outlives it.)
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import select
import signal
import sys
import time
from typing import Callable

__all__ = ["WorkerProcess", "fork_worker", "describe_status"]

_PR_SET_PDEATHSIG = 1
_REPORT_LIMIT = 1 << 16


def _die_with_parent(parent_pid: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the parent-pid checks remain
    if os.getppid() != parent_pid:
        os._exit(0)


class WorkerProcess:
    """The parent's handle on one forked worker."""

    def __init__(self, index: int, generation: int, pid: int, report_fd: int):
        self.index = index
        self.generation = generation
        self.pid = pid
        self._report_fd = report_fd
        self._report = bytearray()
        self.status: int | None = None  # waitpid status once reaped

    def poll(self) -> bool:
        """True once the worker has exited (it is reaped then)."""
        if self.status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid == self.pid:
                self.status = status
                self._drain()
        return self.status is not None

    def wait(self, timeout: float) -> bool:
        """Wait at most ``timeout`` s for the worker to exit; True if it did."""
        deadline = time.monotonic() + timeout
        while not self.poll():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._drain(min(left, 0.05))
        return True

    def kill(self) -> None:
        """SIGKILL and reap the worker (idempotent)."""
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.wait(30.0)

    def dump_stack(self, timeout: float = 2.0, quiet: float = 0.2) -> None:
        """Ask a live worker for the Python stack of its threads (into its report):
        read until it has written nothing for ``quiet`` s, at most ``timeout`` s."""
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGUSR1)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if not self._drain(min(quiet, max(0.0, deadline - time.monotonic()))):
                    return

    def report(self) -> str:
        """What the worker wrote to its report pipe so far."""
        self._drain()
        return self._report.decode(errors="replace").strip()

    def close(self) -> None:
        if self._report_fd >= 0:
            os.close(self._report_fd)
            self._report_fd = -1

    def _drain(self, wait: float = 0.0) -> bool:
        """Read what is in the pipe, waiting at most ``wait`` s for the first bytes;
        True if there were any."""
        if self._report_fd < 0:
            return False
        ready, _, _ = select.select([self._report_fd], [], [], wait)
        got = False
        while ready:
            try:
                chunk = os.read(self._report_fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            got = True
            if len(self._report) < _REPORT_LIMIT:
                self._report += chunk[: _REPORT_LIMIT - len(self._report)]
        return got


def fork_worker(index: int, generation: int, target: Callable[[int], None]) -> WorkerProcess:
    """Fork a worker running ``target(report_fd)``; it exits 0 when ``target`` returns and
    1 after writing the traceback when it raises."""
    parent_pid = os.getpid()
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the worker
        code = 1
        try:
            os.close(read_fd)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl+C and stops us
            _die_with_parent(parent_pid)
            faulthandler.enable(file=write_fd, all_threads=True)
            faulthandler.register(signal.SIGUSR1, file=write_fd, all_threads=True)
            target(write_fd)
            code = 0
        except BaseException:  # noqa: BLE001 - the report is the point
            import traceback

            _write_all(write_fd, traceback.format_exc())
        finally:
            os._exit(code)
    os.close(write_fd)
    os.set_blocking(read_fd, False)
    return WorkerProcess(index, generation, pid, read_fd)


def write_report(fd: int, text: str) -> None:
    """Write ``text`` to a report pipe (from the worker)."""
    _write_all(fd, text)


def _write_all(fd: int, text: str) -> None:
    data = text.encode(errors="replace")[:_REPORT_LIMIT]
    while data:
        try:
            n = os.write(fd, data)
        except OSError:
            return
        data = data[n:]


def describe_status(status: int) -> str:
    """``exited with code 1`` / ``was killed by signal 9 (SIGKILL)``."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "unknown"
        return f"was killed by signal {sig} ({name})"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"
