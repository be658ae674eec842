"""Where portal's processes are forked from: a small server process, made by a process's
first ``Process``, that forks every later one, so that no worker inherits a lock another
thread of the program held at the moment it started.

Why: a fork copies the memory of the whole process but only the forking thread. A lock
that another thread held at that moment (the allocator's, logging's, JAX's while it
initialises) stays held in the child for ever, and the child hangs when it takes it.
DreamerV3's launcher starts its replay and logger processes after its agent thread has
begun initialising JAX. The server is forked while the program still has one thread (a
program constructs its ``Process`` objects before ``run`` starts any worker), and it
runs only the loop below, so every fork it makes is a fork of a one-thread process. A
worker still starts in the time of a fork: the server holds every module the program
had imported when it was made.

What a worker gets, then, is what a spawned process of portal gets, not the launching
process's memory: its function travels cloudpickled and its arguments pickled as
``multiprocessing`` pickles them for a spawned process (``context.mp`` objects, pipe
ends and sockets travel as file descriptors, passed over a Unix socket), with the
launching process's environment, working directory, ``sys.path`` and portal context.

::

    launching process                    server (one thread)              worker
    Process.start --- request + fds --->  fork (shmpad.launch.process.fork) ---> runs fn
                  <-- pid --------------
    join/exitcode <-- wait status ------  (pidfd readable: waitpid)

Each worker's wait status comes back on a socket of its own (the worker's *sentinel*).
The server leads its own process group and dies with the thread that made it (the
parent-death signal of ``fork``; and when its socket to the launching process closes, it
ends its workers and exits), and each worker dies with the server, so that the chain
ends with the launching process however it ends. A forked child of a process
has no server of its own until it starts a ``Process`` itself.

A process that has other threads when it makes its server makes it anyway (its first
``Process`` comes late): the server then forks from a snapshot taken with threads, as a
plain fork would, and docs/portal.md says so.
"""

from __future__ import annotations

import functools
import io
import multiprocessing.context
import multiprocessing.reduction
import os
import select
import socket
import struct
import sys
import threading
from typing import Any

from shmpad.launch.process import fork
from shmpad.shm import janitor

__all__ = ["ForkServer", "server", "Sentinel", "inherited_fd"]

_SIZE = struct.Struct("<Q")
_STATUS = struct.Struct("<q")
_MAX_FDS = 253  # SCM_RIGHTS carries at most this many (SCM_MAX_FD)

_inherited: list[int] = []  # in a worker: the file descriptors its arguments arrived with


def inherited_fd(index: int) -> int:
    return _inherited[index]


class _DupFd:
    """A file descriptor in a pickled argument, found again in the worker."""

    def __init__(self, index: int):
        self.index = index

    def detach(self) -> int:
        return inherited_fd(self.index)


class _Pickling:
    """What ``multiprocessing`` asks of a process being spawned while it pickles its
    arguments: where each file descriptor goes (``duplicate_for_child``)."""

    DupFd = _DupFd

    def __init__(self):
        self.fds: list[int] = []

    def duplicate_for_child(self, fd: int) -> int:
        self.fds.append(fd)
        return len(self.fds) - 1


def dumps(obj: Any) -> tuple[bytes, list[int]]:
    """``obj`` pickled as ``multiprocessing`` pickles a spawned process's arguments, and
    the file descriptors that travel beside it."""
    pickling = _Pickling()
    buf = io.BytesIO()
    multiprocessing.context.set_spawning_popen(pickling)
    try:
        multiprocessing.reduction.ForkingPickler(buf).dump(obj)
    finally:
        multiprocessing.context.set_spawning_popen(None)
    if len(pickling.fds) > _MAX_FDS:
        raise ValueError(
            f"a process's arguments may hold at most {_MAX_FDS} pipes and sockets, got {len(pickling.fds)}"
        )
    return buf.getvalue(), pickling.fds


class Sentinel:
    """The launching side's end of one worker: its exit status, once it ended."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.status: int | None = None

    def fileno(self) -> int:
        return self.sock.fileno()

    def poll(self, timeout: float | None = 0.0) -> int | None:
        """The worker's wait status once it ended (waiting up to ``timeout`` s), else None."""
        if self.status is None and select.select([self.sock], [], [], timeout)[0]:
            data = _recv_exact(self.sock, _STATUS.size)
            # no status: the server died (SIGKILL), and its workers with it
            self.status = _STATUS.unpack(data)[0] if data else 9  # a wait status "killed by SIGKILL"
            self.sock.close()
        return self.status


class ForkServer:
    """The launching side of a server (module docstring)."""

    def __init__(self):
        janitor.start()  # before the fork: the server and its workers hold the janitor's pipe
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = ours
        self._lock = threading.Lock()
        self._status: int | None = None
        self.pid = fork(lambda: _serve(theirs), close_fds=(ours.fileno(),))
        theirs.close()
        janitor.register_group(self.pid)

    def alive(self) -> bool:
        """Whether the server still runs (it dies with the thread that made it)."""
        if self._status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid == self.pid:
                self._status = status
                self._sock.close()
        return self._status is None

    def start(self, payload: bytes, fds: list[int]) -> tuple[int, Sentinel]:
        """Fork a worker that runs ``payload`` (``_child``); its pid and sentinel."""
        mine, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._lock:
                socket.send_fds(self._sock, [_SIZE.pack(len(payload))], [worker.fileno(), *fds])
                self._sock.sendall(payload)
                answer = _recv_exact(self._sock, _STATUS.size)
        finally:
            worker.close()
        if not answer:
            mine.close()
            raise RuntimeError(f"the fork server (pid {self.pid}) is gone: no process can be started")
        pid = _STATUS.unpack(answer)[0]
        if pid < 0:
            mine.close()
            raise OSError(-pid, f"the fork server could not fork: {os.strerror(-pid)}")
        return pid, Sentinel(mine)


_server: ForkServer | None = None
_server_lock = threading.Lock()


def server() -> ForkServer:
    """This process's server, made now if it has none, or if the one it had is gone (it
    was killed, or the thread that made it exited)."""
    global _server
    with _server_lock:
        if _server is None or not _server.alive():
            _server = ForkServer()
        return _server


def _forget() -> None:
    global _server, _server_lock
    _server = None  # a forked child's servers are its own to make
    _server_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


# -- the server --------------------------------------------------------------------------


def _serve(sock: socket.socket) -> None:
    """The server's loop: fork a worker per request, send each its wait status."""
    workers: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, sentinel's other end)
    while True:
        ready = select.select([sock, *workers], [], [])[0]
        for pidfd in [fd for fd in ready if fd in workers]:
            pid, status_sock = workers.pop(pidfd)
            _, status = os.waitpid(pid, 0)
            os.close(pidfd)
            try:
                status_sock.sendall(_STATUS.pack(status))
            except OSError:
                pass  # nobody waits for it any more
            status_sock.close()
        if sock not in ready:
            continue
        try:
            header, fds, _, _ = socket.recv_fds(sock, _SIZE.size, _MAX_FDS + 1)
        except OSError:
            header, fds = b"", []
        if len(header) < _SIZE.size:
            # the launching process is gone: end every worker (their groups) and go
            for pid, _ in workers.values():
                try:
                    os.killpg(pid, 9)
                except OSError:
                    pass
            return
        payload = _recv_exact(sock, _SIZE.unpack(header)[0])
        status_sock = socket.socket(fileno=fds[0])
        arg_fds = fds[1:]
        others = [sock.fileno(), *workers, *(s.fileno() for _, s in workers.values())]
        try:
            pid = fork(functools.partial(_child, payload, arg_fds, status_sock), close_fds=tuple(others))
        except OSError as e:
            sock.sendall(_STATUS.pack(-e.errno))
            status_sock.close()
        else:
            workers[os.pidfd_open(pid)] = (pid, status_sock)
            sock.sendall(_STATUS.pack(pid))
        for fd in arg_fds:
            os.close(fd)


def _child(payload: bytes, fds: list[int], status_sock: socket.socket) -> None:
    status_sock.close()
    _inherited[:] = fds
    run = multiprocessing.reduction.ForkingPickler.loads(payload)
    run()


def interpreter_state() -> dict:
    """What a worker takes from the launching process beside its function: the
    environment, working directory and import path."""
    return {"environ": dict(os.environ), "cwd": os.getcwd(), "path": list(sys.path)}


def restore_interpreter_state(state: dict) -> None:
    os.environ.clear()
    os.environ.update(state["environ"])
    os.chdir(state["cwd"])
    sys.path[:] = state["path"]
