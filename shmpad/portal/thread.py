"""``Thread``: a daemon thread that can be killed from outside, ends with it the
workers it started, and stops its whole process when it raises.

An exception that escapes the thread's function is reported (``Error in 'name' ...``,
and in the error file) and ends the process with exit code 1, as in portal: a failing
thread is a failing process, which its supervisor (``run``) sees. ``kill`` raises
``SystemExit`` inside the thread (at its next Python bytecode; a thread blocked in
native code sees it when it returns) after killing the workers it made.
"""

from __future__ import annotations

import ctypes
import threading
import traceback
from typing import Any, Callable

from shmpad.portal import runtime

__all__ = ["Thread"]


class Thread:
    def __init__(self, fn: Callable, *args: Any, name: str | None = None, start: bool = False):
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.excode: int | None = None
        name = name or getattr(fn, "__name__", "thread")
        self.thread = threading.Thread(target=self._wrapper, args=args, name=name, daemon=True)
        self.thread.children = []  # the workers it makes (Context.add_worker)
        self.started = False
        runtime.current().add_worker(self)
        if start:
            self.start()

    @property
    def name(self) -> str:
        return self.thread.name

    @property
    def ident(self) -> int | None:
        return self.thread.ident

    @property
    def running(self) -> bool:
        return self.started and self.thread.is_alive()

    @property
    def exitcode(self) -> int | None:
        return self.excode

    def start(self) -> Thread:
        if self.started:
            raise RuntimeError(f"thread {self.name!r} was started already")
        self.started = True
        self.thread.start()
        return self

    def join(self, timeout: float | None = None) -> Thread:
        self.thread.join(timeout)
        return self

    def kill(self, timeout: float = 1.0) -> Thread:
        if self.thread is threading.current_thread():
            raise RuntimeError(f"thread {self.name!r} cannot kill itself; raise SystemExit instead")
        for child in runtime.current().children(self.thread):
            child.kill(timeout)
        if self.thread.is_alive() and self.thread.ident is not None:
            ident = ctypes.c_ulong(self.thread.ident)
            if ctypes.pythonapi.PyThreadState_SetAsyncExc(ident, ctypes.py_object(SystemExit)) > 1:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ident, None)
        self.thread.join(timeout)
        return self

    def __repr__(self) -> str:
        return f"Thread(name={self.name}, ident={self.ident}, running={self.running}, exitcode={self.exitcode})"

    def _wrapper(self, *args: Any) -> None:
        try:
            code = self.fn(*args)
            self.excode = code if isinstance(code, int) and not isinstance(code, bool) else 0
        except (SystemExit, KeyboardInterrupt) as e:
            where = "\n".join(line.split("\n", 1)[0] for line in traceback.format_tb(e.__traceback__))
            print(f"Killed thread '{self.name}' at:\n{where}", flush=True)
            for child in runtime.current().children(self.thread):
                child.kill(0.1)
            self.excode = 2
        except Exception as e:
            ctx = runtime.current()
            ctx.error(e, self.name)
            ctx.shutdown(exitcode=1)
