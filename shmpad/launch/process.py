"""Starting a process: the one fork every node, colocated node, env worker and
benchmark child goes through, the parent's handle on such a child, how its end is
worded, and the restart budget of a group of children.

A forked child dies with its parent (``PR_SET_PDEATHSIG``, plus a check that closes
the race with a parent that died before the call), leads its own process group unless
told not to (so that killing the group ends everything a node started, and a
terminal's Ctrl+C reaches only the launcher, which then stops the program in order),
ignores SIGINT, and writes its output to the pipes its parent reads. It exits 0 when
its body returns and 1 (or the ``SystemExit`` code) when it raises, after writing the
traceback to its error pipe.

The start method is ``os.fork``, explicitly and always: shmpad never asks
``multiprocessing`` for its default start method, so Python 3.14's change of that default
(to forkserver) changes nothing here, and nodes may be closures, lambdas and objects that
do not pickle. The fork happens while the launcher runs threads (its supervisor thread
forks, on purpose: a child's parent-death signal fires when the *thread* that forked it
exits), and Python 3.12+ warns about any fork in a multi-threaded process
(``DeprecationWarning: This process ... is multi-threaded, use of fork() may lead to
deadlocks in the child``). The warning does not fit: the child runs only Python, whose
own locks (GIL, import lock, ``threading``, ``logging``) CPython resets after a fork, and
the native thread pools that could hold a lock across it are taken care of (numba's
fork-safe layer, below; torch's pool is tested in ``tests/test_launch_supervision.py``). That one
warning, raised by this module's ``os.fork``, is silenced; every other warning stays.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import select
import signal
import sys
import time
import traceback
import warnings
from typing import Callable

import numba

from shmpad._checks import check_int
from shmpad.errors import describe_exit
from shmpad.shm import segment

__all__ = ["fork", "die_with_parent", "spawn", "Child", "Restarts", "describe_status"]

# numba picks GNU OpenMP for parallel=True code when it can, and a child forked
# after the parent ran such code gets no result: it prints "fork() called from a
# process already using GNU OpenMP, this is unsafe" and stops. shmpad forks every
# node, so unless the user chose a threading layer, it asks numba for one that
# survives fork (tbb if installed, else numba's workqueue).
if "NUMBA_THREADING_LAYER" not in os.environ and numba.config.THREADING_LAYER == "default":
    numba.config.THREADING_LAYER = "forksafe"

warnings.filterwarnings(
    "ignore",
    message=r"This process \(pid=\d+\) is multi-threaded, use of fork\(\) may lead to deadlocks in the child",
    category=DeprecationWarning,
    module=__name__,
)

_PR_SET_PDEATHSIG = 1
_REPORT_LIMIT = 1 << 16
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the thread that forked it exits; exit now if the
    parent is already gone."""
    if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    if os.getppid() != parent_pid:
        os._exit(1)


def describe_status(status: int) -> str:
    """A ``waitpid`` status in the one wording (``shmpad.errors.describe_exit``)."""
    return describe_exit(os.waitstatus_to_exitcode(status))


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, SystemExit):
        if exc.code is None:
            return 0
        return exc.code if isinstance(exc.code, int) else 1
    return 1


def fork(
    body: Callable[[], None],
    *,
    stdout_fd: int | None = None,
    stderr_fd: int | None = None,
    error_fd: int | None = None,
    close_fds: tuple[int, ...] = (),
    clean_exit: Callable[[BaseException], bool] = lambda exc: False,
    new_group: bool = True,
    stacks_on_sigusr1: bool = False,
) -> int:
    """Fork a child that runs ``body()`` and exits: 0 when it returns, 1 (or the
    ``SystemExit`` code) when it raises, after writing the traceback to ``error_fd``
    (or to its stderr if there is none). An exception for which ``clean_exit`` is true
    (say ``Closed`` during a stop) exits 0. With ``stacks_on_sigusr1`` the child writes
    the Python stacks of its threads to ``error_fd`` on SIGUSR1 and when it crashes in
    native code. Returns the child's pid in the parent."""
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        die_with_parent(parent)
        if new_group:
            os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # the forking thread may block signals (the launcher's supervisor does): a child must not
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        for fd in close_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        for fd, target, stream in ((stdout_fd, 1, sys.stdout), (stderr_fd, 2, sys.stderr)):
            if fd is not None:
                os.dup2(fd, target)
                os.close(fd)
                try:
                    stream.reconfigure(line_buffering=True)
                except (AttributeError, ValueError):
                    pass
        if stacks_on_sigusr1 and error_fd is not None:
            faulthandler.enable(file=error_fd, all_threads=True)
            faulthandler.register(signal.SIGUSR1, file=error_fd, all_threads=True)
        body()
        code = 0
    except BaseException as exc:  # noqa: BLE001 - the child must report whatever ends it
        code = _exit_code(exc)
        if clean_exit(exc):
            code = 0
        elif not (isinstance(exc, SystemExit) and code == 0):
            text = traceback.format_exc()
            try:
                if error_fd is None:
                    sys.stderr.write(text)
                else:  # whoever reads error_fd reports it
                    _write_all(error_fd, text)
            except (OSError, ValueError):
                pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        segment.unlink_owned()  # os._exit skips atexit: remove the segments this process made
        os._exit(code)


def _write_all(fd: int, text: str) -> None:
    data = text.encode("utf-8", "replace")[:_REPORT_LIMIT]
    while data:
        n = os.write(fd, data)
        data = data[n:]


class Child:
    """The parent's handle on one child made by ``spawn``: its pid, whether and how it
    ended, and its report (the traceback it died with, or its stacks when asked)."""

    def __init__(self, index: int, generation: int, pid: int, report_fd: int):
        self.index = index
        self.generation = generation
        self.pid = pid
        self._report_fd = report_fd
        self._report = bytearray()
        self.status: int | None = None  # waitpid status once reaped

    def poll(self) -> bool:
        """True once the child has exited (it is reaped then)."""
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
        """Wait at most ``timeout`` s for the child to exit; True if it did."""
        deadline = time.monotonic() + timeout
        while not self.poll():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._drain(min(left, 0.05))
        return True

    def signal(self, sig: int) -> None:
        """Send ``sig`` unless the child was reaped already."""
        if self.status is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL and reap the child (idempotent)."""
        self.signal(signal.SIGKILL)
        self.wait(30.0)

    def describe(self) -> str:
        """How it ended (``exited with code 1``), or ``is running``."""
        return "is running" if self.status is None else describe_status(self.status)

    def dump_stack(self, timeout: float = 2.0, quiet: float = 0.2) -> None:
        """Ask a live child for the Python stack of its threads (into its report):
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
        """What the child wrote to its report pipe so far."""
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


def spawn(body: Callable[[], None], index: int = 0, generation: int = 0) -> Child:
    """``fork`` a child of this process's group that runs ``body()``, with a report pipe
    (its traceback if it raises, its stacks on ``Child.dump_stack``)."""
    read_fd, write_fd = os.pipe()
    try:
        pid = fork(body, error_fd=write_fd, close_fds=(read_fd,), new_group=False, stacks_on_sigusr1=True)
    finally:
        os.close(write_fd)
    os.set_blocking(read_fd, False)
    return Child(index, generation, pid, read_fd)


class Restarts:
    """How many failed children a group may replace, shared by all of them."""

    def __init__(self, allowed: int, name: str = "restarts"):
        self.allowed = check_int(name, allowed, minimum=0)
        self.used = 0

    @property
    def left(self) -> int:
        return self.allowed - self.used

    def take(self) -> bool:
        """Use one restart; False (and nothing used) when none is left."""
        if self.used >= self.allowed:
            return False
        self.used += 1
        return True

    def __repr__(self) -> str:
        return f"Restarts({self.used}/{self.allowed} used)"
