"""Process ids as the shared-memory structures use them: every claim a process makes in
shared memory carries its pid, so that a dead claimant can be found and its claim undone.

``current_pid()`` is this process's pid, kept current across ``fork`` by an at-fork hook
rather than asked of the kernel on every call. Hot paths read the module attribute
``pids.pid`` directly (one attribute load instead of a call); never bind it with
``from shmpad.shm.pids import pid``, which copies the value and goes stale in a forked
child. ``pid_alive`` says whether a claimant still runs; it is a system call and a read
of ``/proc``, so callers use it off the fast path, when a claim has stood too long.
"""

from __future__ import annotations

import os

__all__ = ["current_pid", "pid", "pid_alive"]

pid = os.getpid()


def _after_fork() -> None:
    global pid
    pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork)


def current_pid() -> int:
    """This process's pid, kept current across fork without a system call."""
    return pid


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")
