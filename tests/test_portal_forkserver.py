"""shmpad.portal's processes come from a fork server made before the program's threads:
a worker started while another thread holds a lock it needs does not inherit that lock
held, where a plain fork of the same moment does."""

from __future__ import annotations

import os
import signal
import threading

from helpers import wait_until

import shmpad.portal as portal
from shmpad.launch.process import fork
from shmpad.portal import forkserver
from shmpad.shm.pids import proc_stat

HANG_S = 60.0  # a hang guard, never a timing assertion

_needed = threading.Lock()  # a lock of the program that a worker takes


def _take_the_lock() -> int:
    # a worker that inherited _needed held would wait here for ever: the bound makes
    # that an exit code instead
    if not _needed.acquire(timeout=HANG_S):
        return 3
    _needed.release()
    return 0


class _Holder:
    """Another thread of the program, holding ``_needed`` until released."""

    def __enter__(self):
        self.taken, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold)
        self.thread.start()
        assert self.taken.wait(HANG_S)
        return self

    def _hold(self):
        with _needed:
            self.taken.set()
            self.release.wait(HANG_S)

    def __exit__(self, *exc):
        self.release.set()
        self.thread.join(HANG_S)


def test_a_process_started_while_another_thread_holds_a_lock_takes_it():
    proc = portal.Process(_take_the_lock, name="taker")  # the fork server exists from here on
    with _Holder():
        proc.start()
        assert proc.join(HANG_S).exitcode == 0  # while the holder still holds it


def test_a_plain_fork_at_that_moment_inherits_the_lock_held():
    """The hazard the fork server removes is real: the same fork from this process gives
    a child whose copy of the lock is held by a thread that does not exist there."""

    def child():
        os._exit(0 if not _needed.acquire(timeout=0.0) else 1)

    with _Holder():
        pid = fork(child)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_workers_are_forked_by_the_server_and_end_with_it():
    server = forkserver.server()
    proc = portal.Process(lambda: threading.Event().wait(), name="sleeper", start=True)
    assert proc_stat(proc.pid).ppid == server.pid
    proc.kill(HANG_S)
    assert proc.exitcode is not None and not proc.running


def test_arguments_travel_as_to_a_spawned_process(tmp_path):
    """Pipes, queues, events and barriers of context.mp, bytes and a socket arrive; the
    environment and working directory are the launching process's at start()."""
    import socket

    a, b = portal.context.mp.Pipe()
    queue = portal.context.mp.Queue()
    barrier = portal.context.mp.Barrier(2)
    left, right = socket.socketpair()

    def child(pipe, queue, barrier, sock, data):
        barrier.wait(HANG_S)
        queue.put(os.environ.get("SHMPAD_PORTAL_TEST"))
        queue.close()
        queue.join_thread()
        sock.sendall(data)
        pipe.send(os.getcwd())

    os.environ["SHMPAD_PORTAL_TEST"] = "set after the server"
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        proc = portal.Process(child, b, queue, barrier, right, b"bytes", start=True)
    finally:
        os.chdir(cwd)
        del os.environ["SHMPAD_PORTAL_TEST"]
    barrier.wait(HANG_S)
    assert queue.get(timeout=HANG_S) == "set after the server"
    assert left.recv(5) == b"bytes"
    assert a.recv() == str(tmp_path)
    assert proc.join(HANG_S).exitcode == 0
    left.close()
    right.close()


def _server_killed_then_replaced() -> int:
    first = forkserver.server()
    os.kill(first.pid, signal.SIGKILL)
    if not wait_until(lambda: not first.alive(), HANG_S):
        return 2
    proc = portal.Process(_returns_seven, start=True)  # a new server forks it
    proc.join(HANG_S)
    return 0 if proc.exitcode == 7 and forkserver.server() is not first else 1


def _returns_seven() -> int:
    return 7


def test_a_dead_server_is_replaced():
    """(In a worker, whose server is its own: this process's stays.)"""
    proc = portal.Process(_server_killed_then_replaced, start=True)
    assert proc.join(HANG_S).exitcode == 0
