"""Forking a node process: what the child sets up before it runs anything.

The child dies with its parent (``PR_SET_PDEATHSIG``, plus a check that closes the
race with a parent that died before the call), leads its own process group (so
that killing the group ends everything the node started, and a terminal's Ctrl+C
reaches only the launcher, which then stops the program in order), ignores
SIGINT, and writes its output to the pipes the launcher reads.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import traceback
from typing import Callable

import numba

from shmpad.ringbuf import segment

__all__ = ["fork", "die_with_parent"]

# numba picks GNU OpenMP for parallel=True code when it can, and a child forked
# after the parent ran such code gets no result: it prints "fork() called from a
# process already using GNU OpenMP, this is unsafe" and stops. shmpad forks every
# node, so unless the user chose a threading layer, it asks numba for one that
# survives fork (tbb if installed, else numba's workqueue).
if "NUMBA_THREADING_LAYER" not in os.environ and numba.config.THREADING_LAYER == "default":
    numba.config.THREADING_LAYER = "forksafe"

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the thread that forked it exits; exit now if the
    parent is already gone."""
    if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    if os.getppid() != parent_pid:
        os._exit(1)


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
) -> int:
    """Fork a child that runs ``body()`` and exits: 0 when it returns, 1 (or the
    ``SystemExit`` code) when it raises, after writing the traceback to ``error_fd``
    (or to its stderr if there is none). An exception for which ``clean_exit`` is true
    (say ``Closed`` during a stop) exits 0. Returns the child's pid in the parent."""
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
        # the forking thread may block signals (the launcher's supervisor does): a node must not
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
                    os.write(error_fd, text.encode("utf-8", "replace"))
            except (OSError, ValueError):
                pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        segment.unlink_owned()  # os._exit skips atexit: remove the segments this node made
        os._exit(code)
