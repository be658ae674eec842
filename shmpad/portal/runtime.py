"""What every process of a portal program shares: the context (``setup``'s options,
the init functions, the error file) and how a process ends on an error.

``setup(errfile=...)`` makes the error file a program-wide stop: a worker that fails
writes its traceback there (``error``), and every process that watches it (each one
started after ``setup``, checking every ``interval`` s) ends with exit code 2 when it
appears. A process ends through ``shutdown``: its whole subtree first, then the
shared-memory segments it made, then ``os._exit`` (no atexit handler or thread of a
failed process gets to run on).

The context travels to a process with its function (``process``), and the process
runs the init functions again, as portal's spawned children do (an init function sets
up per-process state: a seed, a logger, a device). ``context.mp`` is the spawn context
of ``multiprocessing``, as on portal: the events, barriers, queues and pipes a program
makes with it travel to its processes as their arguments (see docs/portal.md).
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import sys
import threading
import traceback
import warnings
from typing import Any, Callable

import cloudpickle

from shmpad._checks import check_number, type_name
from shmpad.portal.proctree import children, kill_tree
from shmpad.shm.segment import unlink_owned

__all__ = ["Context", "context", "current", "setup", "initfn", "reset"]

_COLORS = {"black": 30, "red": 31, "green": 32, "yellow": 33, "blue": 34, "magenta": 35, "cyan": 36, "white": 37}


class Context:
    """The options ``setup`` sets; one per process (``current()``)."""

    def __init__(self):
        self.initfns: list[bytes] = []
        self.resolver: Callable | None = None
        self.errfile: pathlib.Path | None = None
        self.interval = 20.0
        self.clientkw: dict = {}
        self.serverkw: dict = {}
        self.printlock = threading.Lock()
        self.done = threading.Event()
        self.watcher: threading.Thread | None = None

    @property
    def mp(self) -> Any:
        """The ``multiprocessing`` context whose objects (``Event``, ``Barrier``, ``Queue``,
        ``Pipe``) this program's processes share: spawn's, as on portal, since a
        ``Process``'s arguments travel pickled as a spawned process's do (``forkserver``)."""
        return multiprocessing.get_context("spawn")

    def options(self) -> dict:
        return {
            "resolver": self.resolver and cloudpickle.dumps(self.resolver),
            "errfile": self.errfile,
            "interval": self.interval,
            "initfns": self.initfns,
            "clientkw": self.clientkw,
            "serverkw": self.serverkw,
        }

    def setup(
        self,
        resolver: Callable | bytes | None = None,
        errfile: str | os.PathLike | None = None,
        interval: float | None = None,
        initfns: list | None = None,
        clientkw: dict | None = None,
        serverkw: dict | None = None,
        host: str | None = None,
        ipv6: bool | None = None,
    ) -> None:
        if resolver:
            if isinstance(resolver, bytes):
                resolver = cloudpickle.loads(resolver)
            if not callable(resolver):
                raise TypeError(f"resolver must be callable, got {type_name(resolver)}")
            self.resolver = resolver
        if errfile:
            if not isinstance(errfile, (str, os.PathLike)):
                raise TypeError(f"errfile must be a path, got {type_name(errfile)}")
            self.errfile = pathlib.Path(errfile)
            self.check_errfile()
            _install_excepthook()
        if interval:
            self.interval = check_number("interval", interval, 1e-3)
        if initfns:
            self.initfns = []
            for fn in initfns:
                self.initfn(fn, call_now=True)
        for name, kw in (("clientkw", clientkw), ("serverkw", serverkw)):
            if kw is not None and not isinstance(kw, dict):
                raise TypeError(f"{name} must be a dict, got {type_name(kw)}")
        if clientkw is not None:
            self.clientkw = dict(clientkw)
        if serverkw is not None:
            self.serverkw = dict(serverkw)
        if host is not None:
            self.serverkw["host"] = host
        if ipv6 is not None:
            self.clientkw["ipv6"] = ipv6
            self.serverkw["ipv6"] = ipv6
        if self.errfile and not self.watcher:
            self.watcher = threading.Thread(target=self._watch, name="portal-errfile", daemon=True)
            self.watcher.start()

    def initfn(self, fn: Callable | bytes, call_now: bool = True) -> None:
        if isinstance(fn, bytes):
            pickled, fn = fn, cloudpickle.loads(fn)
        else:
            if not callable(fn):
                raise TypeError(f"an init function must be callable, got {type_name(fn)}")
            pickled = cloudpickle.dumps(fn)
        self.initfns.append(pickled)
        if call_now:
            fn()

    def print(self, name: str, *args: Any, color: str | None = None) -> None:
        """Print ``[name] args``, the name in ``color`` (a terminal colour's name, as
        portal's ``logging_color``) when the output is a terminal."""
        code = _COLORS.get(color or "")
        label = f"[{name}]"
        if code and sys.stdout.isatty():
            label = f"\033[{code}m{label}\033[0m"
        with self.printlock:
            print(label, *args, flush=True)

    def error(self, e: BaseException, name: str | None = None) -> None:
        """Report ``e`` as the failure of worker ``name``, in the error file too."""
        summary = traceback.format_exception_only(type(e), e)[0].strip("\n")
        long = "".join(traceback.format_exception(type(e), e, e.__traceback__)).strip("\n")
        message = f"Error in '{name}' ({summary}):\n{long}"
        with self.printlock:
            print("\n---\n" + message, file=sys.stderr, flush=True)
        if self.errfile:
            _write_errfile(self.errfile, message)

    def shutdown(self, exitcode: int) -> None:
        """End this process: its subtree, then its segments, then itself."""
        kill_tree(children(os.getpid()), timeout=1.0)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        unlink_owned()
        os._exit(exitcode)

    def close(self) -> None:
        self.done.set()
        if self.watcher and self.watcher is not threading.current_thread():
            self.watcher.join()

    def add_worker(self, worker: Any) -> None:
        """Count ``worker`` as a child of the portal ``Thread`` that makes it, so that
        killing the thread kills it too (the main thread keeps no list)."""
        current = threading.current_thread()
        if current is threading.main_thread():
            return
        children = getattr(current, "children", None)
        if children is None:
            warnings.warn(
                "Using portal from plain Python threads is discouraged: their workers are not ended with them",
                stacklevel=3,
            )
            return
        children.append(worker)

    def children(self, thread: threading.Thread | None) -> list:
        thread = thread or threading.current_thread()
        if thread is threading.main_thread():
            return []
        return getattr(thread, "children", [])

    def check_errfile(self) -> None:
        if self.errfile and self.errfile.exists():
            print(f"Shutting down due to error file: {self.errfile}", file=sys.stderr, flush=True)
            self.shutdown(exitcode=2)

    def _watch(self) -> None:
        while not self.done.wait(self.interval):
            self.check_errfile()

    def restart_in_child(self) -> None:
        """In a forked child: the parent's watcher thread and locks are not ours."""
        self.printlock = threading.Lock()
        self.done = threading.Event()
        self.watcher = None


def _write_errfile(path: pathlib.Path, message: str) -> None:
    # written whole under another name, then renamed: a watcher never reads half a message
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(message)
    os.replace(tmp, path)
    print(f"Wrote errorfile: {path}", file=sys.stderr, flush=True)


_hooked = False


def _install_excepthook() -> None:
    """An exception that ends the main thread writes the error file too."""
    global _hooked
    if _hooked:
        return
    _hooked = True
    existing = sys.excepthook

    def hook(typ: type, value: BaseException, tb: Any) -> None:
        errfile = context.errfile
        if errfile:
            _write_errfile(errfile, "".join(traceback.format_exception(typ, value, tb)).strip("\n"))
        existing(typ, value, tb)

    sys.excepthook = hook


context = Context()


def current() -> Context:
    """This process's context (``reset`` replaces it)."""
    return context


def setup(**kwargs: Any) -> None:
    """Set the program's options (see ``Context.setup``) in this process and the
    processes it starts after."""
    context.setup(**kwargs)


def initfn(fn: Callable | bytes, call_now: bool = True) -> None:
    """Run ``fn`` in this process now (unless ``call_now`` is false) and in every
    process started after."""
    context.initfn(fn, call_now)


def reset() -> None:
    """Forget every option: a new, empty context."""
    global context
    context.close()
    context = Context()
