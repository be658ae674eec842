"""``Process``: a worker process that ends with its whole subtree.

It is forked by this process's fork server (``forkserver``), made by the first
``Process`` a process constructs: a worker never inherits a lock that another thread
held when it started, and still starts in the time of a fork. Its function travels
cloudpickled and its arguments pickled as ``multiprocessing`` pickles a spawned
process's, as on portal (``context.mp`` objects, pipe ends and sockets work), with this
process's environment, working directory, import path and portal context. The worker
leads its own process group, dies with the server, which dies with this process, and
is registered with the program's janitor, which ends that group and removes the
program's shared-memory segments once every process of the program is gone, even after
a SIGKILL of the launcher.

In the worker, the init functions run again and the error file is watched; the
function's return value (an int, else 0) is the exit code, an exception is reported
(``Error in 'name' ...``, and in the error file) and exits 1, ``SystemExit`` and
``KeyboardInterrupt`` exit 2, as in portal. SIGTERM (``kill``) ends the worker's own
subtree and removes its segments before the worker dies of it. However it ends, the
worker ends its subtree first (``runtime.Context.shutdown``); a worker that died of a
signal it could not handle (SIGKILL) has its segments removed by the process that
started it, when it learns of the end.
"""

from __future__ import annotations

import atexit
import os
import signal
import time
import traceback
import weakref
from typing import Any, Callable

import cloudpickle

from shmpad.portal import forkserver, runtime
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
        self._sentinel: forkserver.Sentinel | None = None
        forkserver.server()  # made now, before run() starts the program's threads
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
        ensure_token()  # every process of the program holds the same TCP token
        work = _Work(self.name, cloudpickle.dumps(self.fn), self.args, runtime.current().options())
        payload, fds = forkserver.dumps(work)
        self.thepid, self._sentinel = forkserver.server().start(payload, fds)
        self.started = True
        janitor.register_group(self.thepid)
        return self

    def join(self, timeout: float | None = None) -> Process:
        if not self.started:
            raise RuntimeError(f"process {self.name!r} was not started")
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self._poll(left)
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

    def _poll(self, timeout: float | None = 0.0) -> int | None:
        """The wait status once the worker ended (waiting up to ``timeout`` s), else None."""
        if self._sentinel is None:
            return None
        known = self._sentinel.status is not None
        status = self._sentinel.poll(timeout)
        if status is not None and not known:
            if os.WIFSIGNALED(status):
                remove_segments_of(self.thepid)  # it could not remove them itself
            janitor.unregister_group(self.thepid)
        return status

    def _atexit(self) -> None:
        if self.started and self._poll() is None:
            self.kill()


class _Work:
    """What a worker runs, as it travels to the fork server (``forkserver.dumps``)."""

    def __init__(self, name: str, fn: bytes, args: tuple, options: dict):
        self.name = name
        self.fn = fn
        self.args = args
        self.options = options
        self.state = forkserver.interpreter_state()

    def __call__(self) -> None:
        forkserver.restore_interpreter_state(self.state)
        runtime.current().restart_in_child()
        runtime.reset()  # the context is the launching process's (options), not the fork server's
        ctx = runtime.current()
        signal.signal(signal.SIGTERM, _terminated)
        code = 0
        try:
            ctx.setup(**self.options)  # the init functions again, the error file watched
            result = cloudpickle.loads(self.fn)(*self.args)
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
