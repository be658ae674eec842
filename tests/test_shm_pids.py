"""shmpad.shm.pids: the one pid every claim in shared memory carries, current across fork."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from helpers import run_forked, wait_until

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


def test_pid_alive_of_no_process():
    assert not pids.pid_alive(0)  # os.kill(0, 0) would have signalled this process's group
    assert not pids.pid_alive(-1)


def test_proc_stat_of_this_process_and_of_a_sleeping_thread():
    stat = pids.proc_stat(os.getpid())
    assert stat.state == "R"  # it is reading its own stat
    assert (stat.ppid, stat.pgrp, stat.session) == (os.getppid(), os.getpgrp(), os.getsid(0))
    times = os.times()
    assert stat.utime + stat.stime <= (times.user + times.system) * os.sysconf("SC_CLK_TCK") + 2
    release, started = threading.Event(), threading.Event()
    tid = []

    def sleeper():
        tid.append(threading.get_native_id())
        started.set()
        release.wait(60)

    thread = threading.Thread(target=sleeper)
    thread.start()
    try:
        started.wait(60)
        assert wait_until(lambda: pids.proc_stat(os.getpid(), tid[0]).state == "S", 60)
        assert pids.proc_stat(os.getpid(), tid[0])[1:4] == stat[1:4]  # ppid, group and session are the process's
    finally:
        release.set()
        thread.join()
    assert pids.proc_stat(os.getpid(), tid[0]) is None  # ended


_NAMED = "import sys, time; open('/proc/self/comm', 'w').write(') Z 1 1 1 ('); print(flush=True); time.sleep(60)"


def test_proc_stat_reads_past_a_name_that_holds_a_parenthesis_and_spaces():
    child = subprocess.Popen([sys.executable, "-c", _NAMED], stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # the name is set
        with open(f"/proc/{child.pid}/comm") as f:
            assert f.read() == ") Z 1 1 1 (\n"
        stat = pids.proc_stat(child.pid)
        assert stat.state in ("S", "R") and stat.ppid == os.getpid()
        assert pids.pid_alive(child.pid)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
