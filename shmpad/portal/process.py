"""``Process``: a forked worker process that ends with its whole subtree.

It is started with shmpad's one fork helper (``shmpad.launch.process.fork``): the
child dies with the thread that forked it (parent-death signal), leads its own process
group, and is registered with the program's janitor, which ends that group and removes
the program's shared-memory segments once every process of the program is gone, even
after a SIGKILL of the launcher. Arguments are inherited, not pickled: cloudpickled
bytes, ``context.mp`` events and pipe ends, sockets and closures all work.

In the child, the init functions run again and the error file is watched; the
function's return value (an int, else 0) is the exit code, an exception is reported
(``Error in 'name' ...``, and in the error file) and exits 1, ``SystemExit`` and
``KeyboardInterrupt`` exit 2, as in portal. SIGTERM (``kill``) ends the child's own
subtree and removes its segments before the child dies of it. However it ends, the
child ends its subtree first (``runtime.Context.shutdown``); a child that died of a
signal it could not handle (SIGKILL) has its segments removed by the parent that reaps it.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import time
import traceback
import weakref
from typing import Any, Callable

from shmpad.launch.process import fork
from shmpad.portal import runtime
from shmpad.portal.proctree import children, kill_tree, proc_alive, remove_segments_of
from shmpad.portal.transport import ensure_token
from shmpad.shm import janitor
from shmpad.shm.segment import unlink_owned

__all__ = ["Process"]


class Process:
    def __init__(self, fn: Callable, *args: Any, name: str | None = None, start: bool = False):
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.args = args
        self._name = name or getattr(fn, "__name__", "process")
        self.started = False
        self.killed = False
        self.thepid: int | None = None
        self._status: int | None = None
        self._pidfd = -1
        ref = weakref.ref(self)
        atexit.register(lambda: (p := ref()) is not None and p._atexit())
        runtime.current().add_worker(self)
        if start:
            self.start()

    @property
    def name(self) -> str:
        return self._name

    @property
    def pid(self) -> int | None:
        return self.thepid

    @property
    def running(self) -> bool:
        return self.started and self._poll() is None and proc_alive(self.thepid)

    @property
    def exitcode(self) -> int | None:
        """None while it runs; its exit code, or minus the signal that ended it."""
        if not self.started:
            return None
        status = self._poll()
        if status is None:
            return -signal.SIGKILL if self.killed and not proc_alive(self.thepid) else None
        return os.waitstatus_to_exitcode(status)

    def start(self) -> Process:
        if self.started:
            raise RuntimeError(f"process {self.name!r} was started already")
        self.started = True
        ensure_token()  # before the fork: every process of the program holds the same TCP token
        janitor.start()  # before the fork: the child holds the janitor's pipe
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            # the child reports its own errors (portal's wording); fork's traceback of the
            # SystemExit that carries the exit code goes nowhere
            self.thepid = fork(self._body, error_fd=devnull)
        finally:
            os.close(devnull)
        janitor.register_group(self.thepid)
        try:
            self._pidfd = os.pidfd_open(self.thepid)
        except (AttributeError, OSError):
            self._pidfd = -1  # older kernels: join polls
        return self

    def join(self, timeout: float | None = None) -> Process:
        if not self.started:
            raise RuntimeError(f"process {self.name!r} was not started")
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            if self._pidfd >= 0:
                select.select([self._pidfd], [], [], left)
            else:
                time.sleep(0.01 if left is None else min(0.01, left))
        return self

    def kill(self, timeout: float = 1.0) -> Process:
        """End the process and its whole subtree: SIGTERM, then SIGKILL after ``timeout`` s."""
        if not self.started:
            raise RuntimeError(f"process {self.name!r} was not started")
        if self._poll() is None:
            kill_tree([self.thepid], timeout)
            self.join(10.0)  # SIGKILLed by now: this is the kernel's time to end it
        else:
            kill_tree(children(self.thepid), timeout)  # what an exited child may have left
        self.killed = True
        return self

    def __repr__(self) -> str:
        return f"Process(name={self.name}, pid={self.pid}, running={self.running}, exitcode={self.exitcode})"

    def _poll(self) -> int | None:
        if self._status is None and self.thepid is not None:
            try:
                pid, status = os.waitpid(self.thepid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.thepid, 0  # reaped elsewhere (forked from another thread's view)
            if pid == self.thepid:
                self._status = status
                if os.WIFSIGNALED(status):
                    remove_segments_of(self.thepid)  # it could not remove them itself
                janitor.unregister_group(self.thepid)
                if self._pidfd >= 0:
                    os.close(self._pidfd)
                    self._pidfd = -1
        return self._status

    def _atexit(self) -> None:
        if self.started and self._poll() is None:
            self.kill()

    def _body(self) -> None:
        ctx = runtime.current()
        ctx.restart_in_child()
        signal.signal(signal.SIGTERM, _terminated)
        code = 0
        try:
            ctx.setup(**ctx.options())  # the init functions again, the error file watched
            result = self.fn(*self.args)
            code = result if isinstance(result, int) and not isinstance(result, bool) else 0
        except (SystemExit, KeyboardInterrupt) as e:
            where = "\n".join(line.split("\n", 1)[0] for line in traceback.format_tb(e.__traceback__))
            print(f"Killed process '{self.name}' at:\n{where}", flush=True)
            code = 2
        except Exception as e:
            ctx.error(e, self.name)
            code = 1
        finally:
            ctx.shutdown(code)


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM in a child: end its subtree and remove its segments, then die of the signal."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    kill_tree(children(os.getpid()), timeout=1.0)
    unlink_owned()
    os.kill(os.getpid(), signal.SIGTERM)
