"""Starting one node of a launched program, as a thread of the launcher (``local_mt``,
``test_mt``) or as a forked process (``local_mp``, ``test_mp``), and what the
supervisor keeps about it while it runs (``NodeRun``).

A node process gets three pipes (stdout, stderr, and an error pipe for the traceback
it dies with), its own ``NodeContext`` (stop pipe, request pipe), a title that names it
in ps and top, its group's ``PythonProcess`` environment and flags, and closes every
descriptor only a launcher may hold.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Callable

import setproctitle

from shmpad import context
from shmpad.errors import Closed
from shmpad.launch.output import Lines
from shmpad.launch.process import fork
from shmpad.launch.resources import PythonProcess
from shmpad.nodes.base import Node
from shmpad.shm import janitor

__all__ = ["NodeRun", "launcher_fds", "start_process", "start_thread"]

# setproctitle finds the process's original command line on its first call, by matching
# it against sys.argv: do that now, before a launcher parses or rewrites sys.argv (absl
# apps do), or a forked node could not be titled later.
setproctitle.getproctitle()

# Descriptors only a launcher may hold (stop pipes' write ends, request pipes' read
# ends, node pipes and pidfds of every program this process launched): a forked
# node closes them all, or a program's nodes would keep another's stop pipe open.
launcher_fds: set[int] = set()
READ_BYTES = 1 << 16  # what one read of a node's pipe takes at most


@dataclass
class NodeRun:
    """One node of a launched program while it runs: as a thread of the launcher or as
    a forked process, with the pipes the supervisor reads and how it ended."""

    label: str
    index: int
    node: Node
    resources: PythonProcess | None = None
    pid: int | None = None
    pidfd: int | None = None
    thread: threading.Thread | None = None
    fds: dict = field(default_factory=dict)  # read fd -> "out" | "err" | "error"
    lines: dict = field(default_factory=dict)  # read fd of stdout/stderr -> Lines
    error_text: bytearray = field(default_factory=bytearray)
    exception: BaseException | None = None
    exit_code: int | None = None
    done: bool = False
    reported: bool = False
    row: int = -1  # the node's row in the program's registry

    @property
    def name(self) -> str:
        return f"{self.label}/{self.index}"

    def forward(self, fd: int) -> bool | None:
        """Forward what the pipe ``fd`` has: stdout/stderr line by line with this node's
        prefix, the error pipe into ``error_text``. True if it had data, False if none
        yet, None at its end (``close_fd`` it then)."""
        try:
            data = os.read(fd, READ_BYTES)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            return None
        kind = self.fds[fd]
        if kind == "error":
            self.error_text += data
        else:
            lines = self.lines.get(fd)
            if lines is None:
                lines = self.lines[fd] = Lines(self.name, kind)
            lines.feed(data)
        return True

    def close_fd(self, fd: int) -> None:
        """Flush the unfinished line of ``fd``, and close it."""
        lines = self.lines.pop(fd, None)
        if lines is not None:
            lines.flush()
        self.fds.pop(fd, None)
        launcher_fds.discard(fd)
        os.close(fd)

    def close_pidfd(self) -> None:
        launcher_fds.discard(self.pidfd)
        os.close(self.pidfd)
        self.pidfd = None

    def ended(self) -> bool:
        """A node has ended once the supervisor has looked at how (a thread sets ``done``
        itself; its failure is recorded a moment later)."""
        return self.done and (self.thread is None or self.reported)


def start_thread(
    w: NodeRun,
    program: str,
    launch_type: str,
    stopper: context.StopController,
    ended: Callable[[], None],
    extra: dict | None = None,
) -> None:
    """Run ``w``'s node in a thread of this process; ``ended()`` is called when it returns.
    ``extra`` goes into the node's context (the program's registry)."""
    ctx = context.NodeContext(program, launch_type, stopper, w.label, w.index)
    ctx.extra.update(extra or {})

    def run() -> None:
        context.set_thread_context(ctx)
        try:
            w.node.run()
        except BaseException as e:  # noqa: BLE001 - reported by the supervisor
            if not (stopper.event.is_set() and isinstance(e, Closed)):
                w.exception = e
                w.error_text = bytearray(traceback.format_exc().encode())
        finally:
            w.done = True
            ended()

    w.thread = threading.Thread(target=run, name=f"shmpad-node-{w.name}", daemon=True)
    w.thread.start()


def start_process(
    w: NodeRun, program: str, launch_type: str, stop_r: int, req_w: int, extra: dict | None = None
) -> list[int]:
    """Fork ``w``'s node; returns the descriptors the supervisor watches: its pipes
    (``w.fds`` says which is which) and its pidfd. ``extra`` goes into the node's context."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    xr, xw = os.pipe()
    others = [fd for fd in tuple(launcher_fds) if fd >= 0]  # other supervisors change the set
    body = _child_body(w, program, launch_type, stop_r, req_w, extra or {})
    try:
        w.pid = fork(
            body,
            stdout_fd=out_w,
            stderr_fd=err_w,
            error_fd=xw,
            close_fds=tuple(others + [out_r, err_r, xr]),
            clean_exit=lambda exc: isinstance(exc, Closed) and _child_stopping(),
        )
    except BaseException:
        for fd in (out_r, err_r, xr):
            os.close(fd)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
        os.close(xw)
    try:
        w.pidfd = os.pidfd_open(w.pid)
    except BaseException:
        os.kill(w.pid, signal.SIGKILL)  # a child we could not watch must not run
        os.waitpid(w.pid, 0)
        w.exit_code, w.done = -signal.SIGKILL, True
        for fd in (out_r, err_r, xr):
            os.close(fd)
        raise
    janitor.register_group(w.pid)  # if the launcher is SIGKILLed, the janitor ends the node's group
    launcher_fds.update((w.pidfd, out_r, err_r, xr))
    for fd, kind in ((out_r, "out"), (err_r, "err"), (xr, "error")):
        os.set_blocking(fd, False)
        w.fds[fd] = kind
    return [out_r, err_r, xr, w.pidfd]


def _child_body(w: NodeRun, program: str, launch_type: str, stop_r: int, req_w: int, extra: dict) -> Callable[[], None]:
    """What a forked node process runs: its context, title, stop watcher and flags, then the node."""

    def body() -> None:
        janitor.mark_environment()  # what the node execs, in whatever session, the janitor can find
        stopper = context.StopController(request_fd=req_w)
        context.set_thread_context(None)
        ctx = context.NodeContext(program, launch_type, stopper, w.label, w.index, launch_config=w.resources)
        ctx.extra.update(extra, stop_fd=stop_r, request_fd=req_w)
        context.set_process_context(ctx)
        set_node_title(w.label, w.index)
        signal.signal(signal.SIGTERM, lambda s, f: threading.Thread(target=stopper.trigger, daemon=True).start())
        stopper.watch(stop_r)
        if w.resources is not None:
            os.environ.update({k: str(v) for k, v in w.resources.env.items()})
            sys.argv[1:] = w.resources.argv()
            if w.resources.cpus is not None:
                os.sched_setaffinity(0, w.resources.cpus)
        w.node.run()

    return body


def set_node_title(label: str, index: int) -> None:
    """Rewrite this process's command line (``/proc/self/cmdline``, what ps shows) and
    its 15-character thread name (``comm``, what top shows) to name the node: ``shmpad:
    learner/0``, where every forked node would otherwise show the launcher's own command
    line (``python -m bench.impala ...``)."""
    setproctitle.setproctitle(f"shmpad: {label}/{index}")


def _child_stopping() -> bool:
    ctx = context.current_or_none()
    return ctx is not None and ctx.stopper.event.is_set()
