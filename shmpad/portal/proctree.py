"""A process and everything it started: whether a pid is alive, its descendants,
ending the whole subtree (SIGTERM, then SIGKILL for what is left after a grace period),
and removing the shared-memory segments of a process that died without removing them.

Linux only, from ``/proc`` (read by ``shmpad.shm.pids``, the one reader of a process's
stat), with no dependency (portal uses psutil for the same). The
subtree is read before any signal is sent: a child whose parent died is re-parented to
init and could no longer be found by walking down from it. Every process forked here
also dies with its parent (``shmpad.launch.process.fork``), so one missed by the walk
(forked during it) still goes with its parent.
"""

from __future__ import annotations

import os
import signal
import time

from shmpad.shm.pids import pid_alive, proc_stat
from shmpad.shm.segment import PREFIX, SHM_DIR

__all__ = ["proc_alive", "children", "descendants", "kill_tree", "remove_segments_of"]


def proc_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (portal's name for ``pid_alive``)."""
    return pid_alive(pid)


def _parents(session: int | None = None) -> dict[int, list[int]]:
    """Every process's children, by parent pid (only those of ``session`` if given)."""
    found: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = proc_stat(int(entry))
            if stat is not None and (session is None or stat.session == session):
                found.setdefault(stat.ppid, []).append(int(entry))
    return found


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``, in this process's session: not the program's
    janitor, which runs in a session of its own and must outlive every other process."""
    return _parents(os.getsid(0)).get(pid, [])


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first, then theirs)."""
    below = _parents()
    found, todo = [], [pid]
    while todo:
        for child in below.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(pids: list[int], timeout: float = 1.0) -> None:
    """End ``pids`` and all their descendants: SIGTERM, then SIGKILL for any still alive
    after ``timeout`` s (a zombie counts as ended: reaping it is its parent's business)."""
    everyone = list(dict.fromkeys([p for pid in pids for p in (pid, *descendants(pid))]))
    _signal(everyone, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    delay = 0.001
    alive = everyone
    while alive and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
        alive = [p for p in alive if pid_alive(p)]
    _signal(alive, signal.SIGKILL)


def remove_segments_of(pid: int) -> list[str]:
    """Remove the shared-memory segments that the dead process ``pid`` made (shmpad names
    every segment ``shmpad.<creator pid>.<...>``); the names removed."""
    mark = f"{PREFIX}{pid}."
    removed = []
    for name in os.listdir(SHM_DIR):
        if name.startswith(mark):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed
