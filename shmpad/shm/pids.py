"""Process ids as the shared-memory structures use them: every claim a process makes in
shared memory carries its pid, so that a dead claimant can be found and its claim undone.

``current_pid()`` is this process's pid, kept current across ``fork`` by an at-fork hook
rather than asked of the kernel on every call. Hot paths read the module attribute
``pids.pid`` directly (one attribute load instead of a call); never bind it with
``from shmpad.shm.pids import pid``, which copies the value and goes stale in a forked
child. ``pid_alive`` says whether a claimant still runs; it reads ``/proc``, so callers
use it off the fast path, when a claim has stood too long.

``proc_stat`` is the one reader of ``/proc/<pid>/stat`` (proc(5)): whoever needs a
process's state, parent, group, session or CPU time asks it, so that the one subtle
step, the process name in parentheses that may itself hold spaces and ``)``, is
written once.
"""

from __future__ import annotations

import os
from typing import NamedTuple

__all__ = ["ProcStat", "current_pid", "pid", "pid_alive", "proc_stat"]

pid = os.getpid()


def _after_fork() -> None:
    global pid
    pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork)


def current_pid() -> int:
    """This process's pid, kept current across fork without a system call."""
    return pid


class ProcStat(NamedTuple):
    """The fields of ``/proc/<pid>/stat`` shmpad reads (proc(5) numbers them from 1)."""

    state: str  # field 3: R running, S sleeping, D disk wait, Z zombie, X dead, T stopped, ...
    ppid: int  # field 4
    pgrp: int  # field 5
    session: int  # field 6
    utime: int  # field 14: user time, in clock ticks (os.sysconf("SC_CLK_TCK") a second)
    stime: int  # field 15: system time, in clock ticks


def proc_stat(pid: int, thread: int | None = None) -> ProcStat | None:
    """Process ``pid``'s stat (or that of its thread ``thread``), or None when there is no
    such process or thread (or ``/proc`` does not show it to this process)."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:  # gone (ENOENT, or ESRCH when it ends during the read), or hidden
        return None
    # field 2, the name, is in parentheses and may hold spaces and ')': the fields that
    # follow start after the last ')'
    fields = raw[raw.rindex(b")") + 2 :].split()  # from field 3 on
    state, ppid, pgrp, session = fields[0:4]
    utime, stime = fields[11:13]
    return ProcStat(state.decode(), int(ppid), int(pgrp), int(session), int(utime), int(stime))


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie (an exited process its parent
    has not reaped yet: it runs nothing and holds no files or memory any more)."""
    if pid <= 0:  # not a process: /proc has no such entry, and os.kill would signal a group
        return False
    stat = proc_stat(pid)
    return stat is not None and stat.state not in ("Z", "X")
