"""No process outlives the program: not the nodes, and not what they started.

A node here starts a grandchild that ignores SIGTERM (as a careless subprocess would)
and then returns, raises, or waits for the stop. When the program has ended, the
grandchild is gone; the same when the launcher itself is SIGKILLed while such a node
runs (its janitor ends the node's process group)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import FORK, start_session

import shmpad as lp

DEADLINE_S = 15.0

_STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting for its new parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + DEADLINE_S
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _start_stubborn(pid_file: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", _STUBBORN])
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(child.pid))
    os.replace(pid_file + ".tmp", pid_file)


def _read_pid(pid_file: str) -> int:
    deadline = time.monotonic() + DEADLINE_S
    while not os.path.exists(pid_file):
        assert time.monotonic() < deadline, "the node did not start its grandchild"
        time.sleep(0.02)
    with open(pid_file) as f:
        return int(f.read())


def returns(pid_file: str) -> None:
    _start_stubborn(pid_file)


def raises(pid_file: str) -> None:
    _start_stubborn(pid_file)
    raise RuntimeError("the node failed after starting a grandchild")


def waits(pid_file: str) -> None:
    _start_stubborn(pid_file)
    lp.wait_for_stop()


def stops(pid_file: str) -> None:
    _read_pid(pid_file)  # once the other node has started its grandchild
    lp.stop()


@pytest.mark.parametrize("node", [returns, raises, waits])
def test_a_grandchild_that_ignores_sigterm_ends_with_the_program(node, tmp_path):
    pid_file = str(tmp_path / "grandchild")
    program = lp.Program("orphans")
    program.add_node(lp.PyNode(node, pid_file), "node")
    if node is waits:
        program.add_node(lp.PyNode(stops, pid_file), "stopper")
    manager = lp.launch(program, launch_type="test_mp", termination_notice_secs=1)
    grandchild = None
    try:
        if node is raises:
            with pytest.raises(lp.NodeFailed):
                manager.wait()
        else:
            manager.wait()
        grandchild = _read_pid(pid_file)
        assert _wait_gone(grandchild), f"grandchild {grandchild} outlived the program"
    finally:
        manager.stop_and_wait()
        if grandchild is not None and not _gone(grandchild):
            os.kill(grandchild, signal.SIGKILL)


_LAUNCHER = """
import sys
import shmpad as lp
sys.path.insert(0, {tests!r})
from test_launch_orphans import waits
program = lp.Program("orphans")
program.add_node(lp.PyNode(waits, {pid_file!r}), "node")
lp.launch(program, launch_type="local_mp").wait()
"""


def test_a_grandchild_ends_when_the_launcher_is_sigkilled(tmp_path):
    pid_file = str(tmp_path / "grandchild")
    code = textwrap.dedent(_LAUNCHER.format(tests=os.path.dirname(__file__), pid_file=pid_file))
    launcher = start_session([sys.executable, "-c", code])
    grandchild = None
    try:
        grandchild = _read_pid(pid_file)
        assert not _gone(grandchild)
        launcher.kill()  # SIGKILL: no cleanup runs in the launcher
        launcher.wait(DEADLINE_S)
        assert _wait_gone(grandchild), f"grandchild {grandchild} outlived its SIGKILLed launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(DEADLINE_S)
        if grandchild is not None and not _gone(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def _start_a_session_and_wait(conn) -> None:
    """Plays the test runner: starts a child the tests' way, says its pid, waits to be killed."""
    child = start_session([sys.executable, "-c", _STUBBORN])
    conn.send(child.pid)
    conn.poll(600)


def test_a_process_a_test_starts_ends_when_the_test_runner_is_sigkilled():
    conn, child_conn = FORK.Pipe(duplex=False)
    runner = FORK.Process(target=_start_a_session_and_wait, args=(child_conn,), daemon=True)
    runner.start()
    child = None
    try:
        assert conn.poll(DEADLINE_S), "the runner never started its child"
        child = conn.recv()
        assert not _gone(child)
        runner.kill()  # SIGKILL: the runner's own cleanup never runs
        runner.join(DEADLINE_S)
        assert _wait_gone(child), f"child {child} outlived the SIGKILLed runner that started it"
    finally:
        runner.kill()
        runner.join(DEADLINE_S)
        if child is not None and not _gone(child):
            os.kill(child, signal.SIGKILL)
