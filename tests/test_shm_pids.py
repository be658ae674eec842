"""shmpad.shm.pids: the one pid every claim in shared memory carries, current across fork."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import run_forked

from shmpad.shm import pids


def _seen_in_child() -> tuple[int, int, int]:
    return pids.current_pid(), pids.pid, os.getpid()


def test_current_pid_follows_fork():
    assert pids.current_pid() == pids.pid == os.getpid()
    current, attribute, real = run_forked(_seen_in_child)
    assert current == attribute == real != os.getpid()


def test_pid_alive_of_this_process_a_zombie_and_a_reaped_child():
    assert pids.pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        assert not pids.pid_alive(child.pid)
    finally:
        child.wait()
    assert not pids.pid_alive(child.pid)
