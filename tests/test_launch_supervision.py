"""The launcher as users run it, in a subprocess: output prefixed per node, the launch
type from the command line, exit status on failure, Ctrl+C (once: ordered stop;
twice: kill), SIGKILL of the launcher (no orphans, no segments left), and nodes
forked after the launcher used torch and numba threads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from helpers import (
    creator_pid_of,
    kill_and_reap,
    pid_alive,
    read_line,
    shm_entries,
    start_session,
    track_pid,
    wait_until,
)

PREAMBLE = """
import faulthandler
faulthandler.dump_traceback_later(40, exit=True)  # a hung launcher shows where
import os, sys, time, threading
import shmpad as lp
"""


def start(tmp_path, body: str, *args: str) -> subprocess.Popen:
    script = tmp_path / "program.py"
    script.write_text(PREAMBLE + textwrap.dedent(body))
    proc = start_session(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        cwd=str(tmp_path),
    )
    track_pid(proc.pid)
    return proc


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_and_reap(proc)
        raise AssertionError("launcher did not finish") from None
    return proc.returncode, out.decode(), err.decode()


def test_output_is_prefixed_and_the_launcher_waits_at_exit(tmp_path):
    proc = start(
        tmp_path,
        """
        def hello(i):
            print(f"hello from {i}")
            print(f"to stderr {i}", file=sys.stderr)
            sys.stdout.write("no newline at the end")
        program = lp.Program("p")
        with program.group("worker"):
            for i in range(2):
                program.add_node(lp.PyNode(hello, i))
        lp.launch(program)
        sys.stdout.write("launch returned" + chr(10))  # one write: print() makes two
        """,
    )
    code, out, err = finish(proc)
    assert code == 0, err
    lines = out.splitlines()
    assert "launch returned" in out
    for i in range(2):
        assert f"[worker/{i}] hello from {i}" in lines
        assert f"[worker/{i}] no newline at the end" in lines
        assert f"[worker/{i}] to stderr {i}" in err.splitlines()


def test_launch_type_flag_and_failure_exit_status(tmp_path):
    body = """
    def where():
        print("same process" if os.getpid() == LAUNCHER else "own process")
    def bad():
        raise ZeroDivisionError("division in node")
    LAUNCHER = os.getpid()
    program = lp.Program("p")
    program.add_node(lp.PyNode(where), "where")
    if "--fail" in sys.argv:
        program.add_node(lp.PyNode(bad), "bad")
    lp.launch(program)
    """
    code, out, err = finish(start(tmp_path, body, "--lp_launch_type=local_mt"))
    assert code == 0 and "same process" in out, err
    code, out, err = finish(start(tmp_path, body, "--lp_launch_type", "local_mp"))
    assert code == 0 and "[where/0] own process" in out, err
    code, out, err = finish(start(tmp_path, body, "--fail"))
    assert code == 1
    assert "Error in node 'bad/0': it exited with code 1" in err
    assert "ZeroDivisionError: division in node" in err
    code, out, err = finish(start(tmp_path, body, "--lp_launch_type=bogus"))
    assert code == 1 and "unknown launch type 'bogus'" in err


NODES_REPORT = """
def say(msg):  # one write per line: print() makes two, and other threads write between them
    sys.stdout.write(msg + chr(10))
    sys.stdout.flush()
def node(i):
    lp.register_stop_handler(lambda: say(f"stop handler {i}"))
    say(f"pid {os.getpid()}")
    lp.wait_for_stop()
    say(f"stopped {i}")
def stubborn():
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"pid {os.getpid()}", flush=True)
    while True:
        time.sleep(1)
program = lp.Program("p")
queue = program.add_node(lp.RingNode(8, slot_size=64), "queue")
server = program.add_node(lp.CourierNode(dict), "server")
with program.group("node"):
    for i in range(2):
        program.add_node(lp.PyNode(node, i))
notice = {}
if "--stubborn" in sys.argv:
    program.add_node(lp.PyNode(stubborn), "stubborn")
    notice = {"termination_notice_secs": 600}  # no test waits it out: ending sooner shows what ended it
manager = lp.launch(program, **notice)
say(f"launcher {os.getpid()} {len(manager.pids())}")
manager.wait()
say("launcher done")
"""


def test_ctrl_c_once_stops_nodes_in_order(tmp_path):
    proc, pids = _start_and_get_pids(tmp_path)
    os.kill(proc.pid, signal.SIGINT)
    code, out, err = finish(proc)
    assert code == 0, err
    assert "User-requested termination. Asking nodes to stop." in err
    for i in range(2):
        assert f"[node/{i}] stop handler {i}" in out and f"[node/{i}] stopped {i}" in out
    assert "launcher done" in out
    assert not any(pid_alive(p) for p in pids)


def _start_and_get_pids(tmp_path, *args):
    """Start NODES_REPORT; returns once the launcher and every node reported."""
    proc = start(tmp_path, NODES_REPORT, *args)
    expected = 3 if "--stubborn" in args else 2
    pids: set[int] = set()
    launcher_seen = False
    seen = []
    try:
        while len(pids) < expected or not launcher_seen:
            line = read_line(proc, timeout=30)
            seen.append(line)
            if line.startswith("launcher"):
                launcher_seen = True
            elif " pid " in line:
                pids.add(int(line.rsplit(" ", 1)[1]))
    except AssertionError as e:
        kill_and_reap(proc)
        raise AssertionError(f"{e}\nread: {seen}\nlauncher stderr:\n{proc.stderr.read().decode()}") from None
    return proc, pids


def test_ctrl_c_twice_kills_at_once(tmp_path):
    proc, pids = _start_and_get_pids(tmp_path, "--stubborn")
    os.kill(proc.pid, signal.SIGINT)
    # a node's stop handler runs once the launcher has taken the first Ctrl+C and begun the stop
    while not read_line(proc, timeout=60).endswith("stop handler 0"):
        pass
    os.kill(proc.pid, signal.SIGINT)
    code, out, err = finish(proc)  # within its 60 s hang guard: not the 600 s termination notice
    assert "Killing every node now." in err
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), 60)


def test_launcher_sigkill_leaves_no_orphans_and_no_segments(tmp_path):
    proc, pids = _start_and_get_pids(tmp_path, "--stubborn")
    launcher = proc.pid
    assert wait_until(lambda: any(creator_pid_of(n) == launcher for n in shm_entries()), 60)
    os.kill(launcher, signal.SIGKILL)
    proc.wait(10)
    # PDEATHSIG ends the nodes with the launcher; the 60 s bound is only a hang guard
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), 60), "nodes outlived the launcher"
    assert wait_until(lambda: not any(creator_pid_of(n) in pids | {launcher} for n in shm_entries()), 60)
    proc.stdout.close()
    proc.stderr.close()


@pytest.mark.rl
def test_nodes_forked_after_torch_and_numba_threads_do_not_deadlock(tmp_path):
    proc = start(
        tmp_path,
        """
        import numpy as np
        import torch
        from numba import njit, prange

        @njit(parallel=True, cache=False)
        def total(x):
            s = 0.0
            for i in prange(x.shape[0]):
                s += x[i]
            return s

        torch.set_num_threads(2)
        a = torch.randn(256, 256)
        (a @ a).sum().item()            # the launcher uses torch's thread pool
        total(np.ones(100000))          # and numba's
        def work(i):
            b = torch.ones(256, 256)
            t = float((b @ b).sum())
            s = total(np.ones(100000))
            print(f"node {i} ok {s:.0f} {t:.0f}", flush=True)
        program = lp.Program("p")
        with program.group("worker"):
            for i in range(2):
                program.add_node(lp.PyNode(work, i))
        lp.launch(program, termination_notice_secs=5).wait()
        """,
    )
    code, out, err = finish(proc, timeout=120)
    assert code == 0, err
    assert "[worker/0] node 0 ok 100000 16777216" in out and "[worker/1] node 1 ok 100000 16777216" in out
