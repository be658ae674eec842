"""``MultiProcessingColocation``: several PyNodes as child processes of one node,
restarted when they fail (up to a budget shared by all of them)."""

from __future__ import annotations

import os
import select
import signal
import threading
from typing import Sequence

from shmpad import context
from shmpad._checks import check_int
from shmpad.colocation.multi_threading import Colocation
from shmpad.errors import Closed, describe_exit
from shmpad.launch.process import Restarts, fork
from shmpad.nodes.python import PyNode

__all__ = ["MultiProcessingColocation"]

_POLL_MS = 100


class MultiProcessingColocation(Colocation):
    """Runs each of ``nodes`` in its own child process of this node. A child that exits
    non-zero is restarted while fewer than ``num_retries_on_failure`` restarts were
    made (one budget for all children); past that the node kills the others and
    raises. When the program stops, the children get SIGTERM (their stop handlers
    run) and are killed with the node."""

    def __init__(self, nodes: Sequence[PyNode], num_retries_on_failure: int = 0):
        check_int("num_retries_on_failure", num_retries_on_failure, minimum=0)
        self._num_retries = num_retries_on_failure
        super().__init__(nodes, self._run_all)

    def _spawn(self, i: int, ctx: context.NodeContext | None) -> tuple[int, int, int]:
        """Fork child ``i``; returns (pid, pidfd, read end of its error pipe)."""
        node = self._nodes[i]
        xr, xw = os.pipe()

        def body() -> None:
            extra = ctx.extra if ctx is not None else {}
            stopper = context.StopController(request_fd=extra.get("request_fd"))
            if ctx is not None:
                child = context.NodeContext(
                    ctx.program, ctx.launch_type, stopper, ctx.label, ctx.index, launch_config=ctx.launch_config
                )
                child.extra.update(extra)
                context.set_thread_context(None)
                context.set_process_context(child)
            signal.signal(signal.SIGTERM, lambda s, f: threading.Thread(target=stopper.trigger, daemon=True).start())
            if "stop_fd" in extra:
                stopper.watch(extra["stop_fd"])
            node.run()

        def clean(exc: BaseException) -> bool:
            c = context.current_or_none()
            return isinstance(exc, Closed) and c is not None and c.stopper.event.is_set()

        try:
            pid = fork(body, error_fd=xw, close_fds=(xr,), clean_exit=clean, new_group=False)
        finally:
            os.close(xw)
        os.set_blocking(xr, False)
        return pid, os.pidfd_open(pid), xr

    def _run_all(self) -> None:
        if not self._nodes:
            raise ValueError("MultiProcessingColocation requires at least one node.")
        ctx = context.current_or_none()
        stopping = ctx.stopper.event if ctx is not None else threading.Event()
        children: dict[int, tuple[int, int, int, bytearray]] = {}  # i -> pid, pidfd, err fd, text
        restarts = Restarts(self._num_retries, "num_retries_on_failure")
        terminated = False
        try:
            for i in range(len(self._nodes)):
                pid, pidfd, xr = self._spawn(i, ctx)
                children[i] = (pid, pidfd, xr, bytearray())
            while children:
                if stopping.is_set() and not terminated:
                    terminated = True
                    for pid, *_ in children.values():
                        _signal(pid, signal.SIGTERM)
                poller = select.poll()
                for _, pidfd, xr, _ in children.values():
                    poller.register(pidfd, select.POLLIN)
                    poller.register(xr, select.POLLIN)
                ready = {fd for fd, _ in poller.poll(_POLL_MS)}
                for i, (pid, pidfd, xr, text) in list(children.items()):
                    if xr in ready:
                        _drain(xr, text)
                    if pidfd not in ready:
                        continue
                    _, status = os.waitpid(pid, 0)
                    code = os.waitstatus_to_exitcode(status)
                    _drain(xr, text)
                    os.close(pidfd)
                    os.close(xr)
                    del children[i]
                    if code == 0 or stopping.is_set():
                        continue
                    if not restarts.take():
                        detail = text.decode("utf-8", "replace").rstrip()
                        raise RuntimeError(
                            f"num_retries_on_failure (={self._num_retries}) is reached: colocated node {i} "
                            f"{describe_exit(code)}" + (f"\n{detail}" if detail else "")
                        )
                    print(
                        f"colocated node {i} {describe_exit(code)}; restarting it ({restarts.used}/{restarts.allowed})",
                        flush=True,
                    )
                    _count_restart(ctx)
                    pid, pidfd, xr = self._spawn(i, ctx)
                    children[i] = (pid, pidfd, xr, bytearray())
        finally:
            for pid, pidfd, xr, _ in children.values():
                _signal(pid, signal.SIGKILL)
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
                os.close(pidfd)
                os.close(xr)


def _count_restart(ctx: context.NodeContext | None) -> None:
    """Count the restart in this node's row of the program's registry (``shmpad.top`` shows it)."""
    registry = None if ctx is None else ctx.extra.get("registry")
    if registry is not None:
        registry.node_restarted(registry.row_of(ctx.label, ctx.index))


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _drain(fd: int, into: bytearray) -> None:
    while True:
        try:
            data = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            return
        if not data:
            return
        into += data
