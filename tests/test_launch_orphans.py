"""No process outlives the program: not the nodes, and not what they started.

A node here starts a grandchild that ignores SIGTERM (as a careless subprocess would)
and then returns, raises, or waits for the stop. When the program has ended, the
grandchild is gone; the same when the launcher itself is SIGKILLed while such a node
runs (its janitor ends the node's process group), and for helpers that leave the
node's group (new sessions, daemons, forked workers): see shmpad/ringbuf/janitor.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import FORK, pid_alive, start_session

import shmpad as lp

DEADLINE_S = 15.0

_STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting for its new parent counts as gone)."""
    return not pid_alive(pid)


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


# What a node may start that leaves its process group, each ignoring SIGTERM: a helper
# in a session of its own, a daemon (double fork, new session, its parent gone), and a
# forked (never exec'd) worker in a new session, which also holds every descriptor the
# node had. A polite helper in its own session exits on SIGTERM and says so.
_HELPER = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
_DAEMON = (
    "import os, signal, time\n"
    "if os.fork():\n    os._exit(0)\n"
    "os.setsid()\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print(os.getpid(), flush=True)\n"
    "os.close(1)\n"
    "time.sleep(600)\n"
)
_POLITE = (
    "import signal, sys, time\n"
    "def on_term(signum, frame):\n"
    "    open(sys.argv[1], 'w').close()\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "time.sleep(600)\n"
)


def _forked_helper() -> int:
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(600)
        finally:
            os._exit(0)
    return pid


HELPER_KINDS = ("group", "session", "polite", "forked", "daemon")


def starts_helpers(pid_file: str, kinds: tuple[str, ...] = HELPER_KINDS) -> None:
    """A node that starts the helpers of ``kinds`` (all by default), writes their pids, and waits."""
    start = {
        "group": lambda: subprocess.Popen([sys.executable, "-c", _HELPER]).pid,
        "session": lambda: subprocess.Popen([sys.executable, "-c", _HELPER], start_new_session=True).pid,
        "polite": lambda: (
            subprocess.Popen([sys.executable, "-c", _POLITE, pid_file + ".term"], start_new_session=True).pid
        ),
        "forked": _forked_helper,
        "daemon": lambda: int(
            subprocess.run([sys.executable, "-c", _DAEMON], stdout=subprocess.PIPE, check=True).stdout
        ),
    }
    helpers = {kind: start[kind]() for kind in kinds}
    with open(pid_file + ".tmp", "w") as f:
        json.dump(helpers, f)
    os.replace(pid_file + ".tmp", pid_file)
    lp.wait_for_stop()


def stops_once_written(path: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not os.path.exists(path):
        assert time.monotonic() < deadline, "the other node did not start its helpers"
        time.sleep(0.02)
    lp.stop()


def test_what_a_node_execd_in_new_sessions_ends_when_the_node_ends(tmp_path):
    """The launcher lives on (it is this process): the node's end is what ends its helpers."""
    pid_file = str(tmp_path / "helpers")
    program = lp.Program("orphans")
    program.add_node(lp.PyNode(starts_helpers, pid_file, ("session", "daemon")), "node")
    program.add_node(lp.PyNode(stops_once_written, pid_file), "stopper")
    manager = lp.launch(program, launch_type="test_mp", termination_notice_secs=1)
    helpers: dict[str, int] = {}
    try:
        manager.wait()
        with open(pid_file) as f:
            helpers = json.load(f)
        assert {kind: pid for kind, pid in helpers.items() if not _wait_gone(pid)} == {}
    finally:
        manager.stop_and_wait()
        for pid in helpers.values():
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


_HELPERS_LAUNCHER = """
import sys
import shmpad as lp
sys.path.insert(0, {tests!r})
from test_launch_orphans import starts_helpers
program = lp.Program("orphans")
program.add_node(lp.PyNode(starts_helpers, {pid_file!r}, {kinds!r}), "node")
lp.launch(program, launch_type="local_mp", termination_notice_secs=1).wait()
"""


def helpers_survive_a_killed_launcher(directory: str, kinds: tuple[str, ...] = HELPER_KINDS) -> dict[str, int]:
    """Launch a program whose node starts the helpers, SIGKILL the launcher, and return
    the helpers still running after the deadline (ending them)."""
    pid_file = os.path.join(directory, "helpers")
    code = textwrap.dedent(_HELPERS_LAUNCHER.format(tests=os.path.dirname(__file__), pid_file=pid_file, kinds=kinds))
    launcher = start_session([sys.executable, "-c", code])
    helpers: dict[str, int] = {}
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not os.path.exists(pid_file):
            assert launcher.poll() is None, f"the launcher exited with {launcher.returncode}"
            assert time.monotonic() < deadline, "the node did not start its helpers"
            time.sleep(0.02)
        with open(pid_file) as f:
            helpers = json.load(f)
        launcher.kill()  # SIGKILL: no cleanup runs in the launcher
        launcher.wait(DEADLINE_S)
        return {kind: pid for kind, pid in helpers.items() if not _wait_gone(pid)}
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(DEADLINE_S)
        for pid in helpers.values():
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_what_a_node_started_in_new_sessions_ends_when_the_launcher_is_sigkilled(tmp_path):
    assert helpers_survive_a_killed_launcher(str(tmp_path)) == {}
    assert os.path.exists(str(tmp_path / "helpers.term")), "the polite helper was not sent SIGTERM first"


@pytest.mark.slow
def test_no_helper_survives_20_launcher_kills(tmp_path):
    survivors = []
    for trial in range(20):
        directory = tmp_path / str(trial)
        directory.mkdir()
        survivors += [f"trial {trial}: {kind}" for kind in helpers_survive_a_killed_launcher(str(directory))]
    assert survivors == []
