"""``python -m shmpad.top`` against launched programs: one JSON sample whose numbers agree
with what the program did, a SIGKILLed node shown dead with how it ended, the live view
in a real terminal (tmux), and the registry gone after a SIGKILL of the launcher."""

from __future__ import annotations

import io
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from helpers import Tmux, pid_alive, run_command, shm_exists, spawn_python, wait_until
from rich.console import Console

import shmpad as lp
from shmpad.launch import output
from shmpad.launch.live import LiveView
from shmpad.rpc.stats import stats_name
from shmpad.top import registry
from shmpad.top.sample import Sampler, find_program
from shmpad.top.view import render

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = {"x": (np.int64, ())}
DEADLINE_S = 60.0


def top(*args: str, timeout: float = 60.0) -> tuple[int, str]:
    code, out, err = run_command(
        [sys.executable, "-m", "shmpad.top", *args], timeout, "python -m shmpad.top", cwd=ROOT, split=True
    )
    return code, out + err


def sample(which: str, interval: float = 0.2) -> dict:
    code, out = top(which, "--once", "--json", "--interval", str(interval))
    assert code == 0, out
    return json.loads(out)


# -- nodes (module level: forked, they run in the node's process) -------------------------


def still_producer(ring) -> None:
    for i in range(10):
        ring.put({"x": i}, timeout=DEADLINE_S)
    lp.publish_counter("items", 10)
    lp.wait_for_stop(DEADLINE_S)


def still_consumer(ring) -> None:
    for _ in range(4):
        ring.get(timeout=DEADLINE_S)
        ring.release()
    lp.publish_counter("taken", 4)
    lp.wait_for_stop(DEADLINE_S)


def flow(ring) -> None:
    """Puts and gets as fast as it can until the stop (the ring's rates are not zero)."""
    i = 0
    while not lp.stop_event().is_set():
        ring.put({"x": i}, timeout=DEADLINE_S)
        ring.get(timeout=DEADLINE_S)
        ring.release()
        i += 1


class Counter:
    def __init__(self):
        self.n = 0

    def add(self, k):
        self.n += k
        return self.n


def learner(store, counter) -> None:
    for v in range(3):
        store.publish({"w": np.full(4, v, np.float32)})
    for _ in range(5):
        counter.add(1)
    lp.publish_counter("calls made", 5)
    lp.wait_for_stop(DEADLINE_S)


def actor(store) -> None:
    out = {"w": np.zeros(4, np.float32)}
    assert store.wait_for_version(2, timeout=DEADLINE_S) == 3
    for _ in range(2):
        store.pull(out, newer_than=None)
    lp.publish_counter("pulled", 2)
    lp.wait_for_stop(DEADLINE_S)


def test_a_json_sample_agrees_with_what_the_program_did():
    program = lp.Program("top-json")
    still = program.add_node(lp.RingNode(16, spec=SPEC), "still")
    moving = program.add_node(lp.RingNode(8, spec=SPEC), "moving")
    store = program.add_node(lp.WeightStoreNode({"w": np.zeros(4, np.float32)}), "weights")
    counter = program.add_node(lp.CourierNode(Counter), "counter")
    program.add_node(lp.PyNode(still_producer, still), "producer")
    program.add_node(lp.PyNode(still_consumer, still), "consumer")
    program.add_node(lp.PyNode(flow, moving), "flow")
    program.add_node(lp.PyNode(learner, store, counter), "learner")
    program.add_node(lp.PyNode(actor, store), "actor")
    manager = lp.launch(program, launch_type="test_mp", termination_notice_secs=10)
    try:
        assert wait_until(lambda: len(lp.counters()) == 4, DEADLINE_S), lp.counters()
        s = sample(str(os.getpid()))
        assert (s["program"], s["launcher_pid"], s["phase"]) == ("top-json", os.getpid(), "running")
        pids = manager.pids()
        nodes = {n["name"]: n for n in s["nodes"]}
        assert sorted(nodes) == sorted(pids)
        for name, n in nodes.items():
            assert (n["pid"], n["state"], n["restarts"], n["exit_code"]) == (pids[name], "running", 0, None)
            assert n["rss_bytes"] > 1 << 20 and 0 <= n["cpu_percent"] <= 100 * os.cpu_count()
        rings = {r["label"]: r for r in s["rings"]}
        assert set(rings) == {"still", "moving"}  # a courier's request ring is under rpc
        r = rings["still"]  # quiet since its nodes published their counters: exact numbers
        assert (r["kind"], r["capacity"], r["puts"], r["gets"], r["size"]) == ("typed", 16, 10, 4, 6)
        assert (r["fill"], r["puts_per_s"], r["gets_per_s"], r["waits_full"], r["dead_claims"]) == (6 / 16, 0, 0, 0, 0)
        m = rings["moving"]
        assert m["puts_per_s"] > 0 and m["gets_per_s"] > 0 and m["puts"] >= m["gets"] > 0
        assert m["size"] <= m["capacity"]
        (w,) = s["weights"]
        assert (w["label"], w["version"], w["pulls"], w["pulls_per_s"]) == ("weights", 3, 2, 0)
        (c,) = s["rpc"]
        assert (c["label"], c["calls"], c["calls_per_s"], c["queued"], c["answered"]) == ("counter", 5, 0, 0, 5)
        assert (c["ms_per_call"], c["latency_ms"]) == (None, None)  # no call answered in the interval
        published = {(c["node"], c["name"]): (c["value"], c["per_s"]) for c in s["counters"]}
        assert published == {
            ("producer/0", "items"): (10, 0),
            ("consumer/0", "taken"): (4, 0),
            ("learner/0", "calls made"): (5, 0),
            ("actor/0", "pulled"): (2, 0),
        }
    finally:
        manager.stop_and_wait()


def fills_then_waits(ring) -> None:
    """Puts 3 items into a ring of 2: the third needs the slot of the first, which the holder holds."""
    for i in range(3):
        ring.put({"x": i}, timeout=DEADLINE_S)
    lp.wait_for_stop(DEADLINE_S)


def holds(ring) -> None:
    ring.get(timeout=DEADLINE_S)  # a view, not released until the stop
    lp.wait_for_stop(DEADLINE_S)
    ring.release()


def test_a_producer_waiting_on_a_held_slot_shows_the_holders_pid():
    program = lp.Program("top-held")
    ring = program.add_node(lp.RingNode(2, spec=SPEC), "held")
    program.add_node(lp.PyNode(fills_then_waits, ring), "producer")
    program.add_node(lp.PyNode(holds, ring), "holder")
    manager = lp.launch(program, launch_type="test_mp", termination_notice_secs=10)
    try:
        sampler = Sampler(find_program(str(os.getpid())))
        assert wait_until(lambda: sampler.sample()["rings"][0]["producers_waiting"] == 1, DEADLINE_S)
        holder = manager.pids()["holder/0"]
        (r,) = sample(str(os.getpid()))["rings"]  # what python -m shmpad.top --json says
        assert (r["label"], r["producers_waiting"], r["held_by"]) == ("held", 1, holder)
        shown = io.StringIO()
        Console(file=shown, width=250).print(render(sampler.sample()))
        (line,) = [ln for ln in shown.getvalue().splitlines() if ln.strip().startswith("held ")]
        assert line.rstrip().endswith(f"pid {holder} (1 waiting)"), shown.getvalue()
    finally:
        manager.stop_and_wait()


def test_without_a_program_it_lists_the_running_ones_and_refuses_an_unknown_one():
    program = lp.Program("top-list")
    program.add_node(lp.PyNode(lp.wait_for_stop, DEADLINE_S), "idle")
    manager = lp.launch(program, launch_type="test_mp")
    try:
        code, out = top("--json")
        assert code == 0, out
        mine = [p for p in json.loads(out) if p["launcher_pid"] == os.getpid()]
        assert [(p["program"], p["nodes"]) for p in mine] == [("top-list", 1)]
        code, out = top("no-such-program", "--once")
        assert code == 2 and "no running shmpad program is named 'no-such-program'" in out, out
    finally:
        manager.stop_and_wait()


def victim() -> None:
    lp.wait_for_stop(DEADLINE_S)


def lingerer(release_fd: int) -> None:
    """Outlives the stop until the test says so: the program stays up to be looked at."""
    lp.wait_for_stop(DEADLINE_S)
    select.select([release_fd], [], [], DEADLINE_S)


def test_a_zombie_launcher_counts_as_gone():
    reg = registry.Registry.create("zombie-launcher", "local_mp", [("idle", 0)], [], [], [])
    sampler = Sampler(reg.name)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        assert sampler.launcher_alive  # this process made the registry
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        sampler.registry.meta["launcher_pid"] = child.pid
        assert not sampler.launcher_alive
        assert sampler.sample()["phase"] == "launcher gone"
    finally:
        child.wait()
        sampler.close()
        reg.close()


def test_a_sigkilled_node_shows_as_dead_with_its_exit_status():
    release_r, release_w = os.pipe()
    program = lp.Program("top-kill")
    program.add_node(lp.PyNode(victim), "victim")
    program.add_node(lp.PyNode(lingerer, release_r), "lingerer")
    manager = lp.launch(program, launch_type="test_mp", termination_notice_secs=DEADLINE_S)
    try:
        os.kill(manager.pids()["victim/0"], signal.SIGKILL)
        assert wait_until(lambda: manager.exit_codes()["victim/0"] is not None, DEADLINE_S)
        s = sample(str(os.getpid()))
        nodes = {n["name"]: n for n in s["nodes"]}
        dead, alive = nodes["victim/0"], nodes["lingerer/0"]
        assert (dead["state"], dead["exit_code"], dead["exit"]) == ("dead", -9, "was killed by signal 9 (SIGKILL)")
        assert (dead["cpu_percent"], dead["rss_bytes"]) == (None, None)
        assert (alive["state"], alive["exit_code"]) == ("running", None)
        assert s["phase"] == "stopping"  # the failure stops the program
    finally:
        os.write(release_w, b"x")
        with pytest.raises(lp.NodeFailed):
            manager.wait()
        os.close(release_r)
        os.close(release_w)


NAP_S = 0.02


class Sleeper:
    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


def test_a_courier_shows_its_time_per_call_and_keeps_its_counts_when_sigkilled(shm_leak_check):
    release_r, release_w = os.pipe()
    program = lp.Program("top-latency")
    sleeper = program.add_node(lp.CourierNode(Sleeper), "sleeper")
    program.add_node(lp.PyNode(lingerer, release_r), "lingerer")
    manager = lp.launch(program, launch_type="test_mp", termination_notice_secs=DEADLINE_S)
    client = sleeper.dereference()
    sampler = Sampler(find_program(str(os.getpid())))
    try:
        assert client.nap(0) == 0  # the server is up
        (before,) = sampler.sample()["rpc"]
        assert (before["answered"], before["ms_per_call"], before["latency_ms"]) == (1, None, None)  # one sample
        for _ in range(3):
            client.nap(NAP_S)
        after = sampler.sample()
        (row,) = after["rpc"]
        assert (row["label"], row["calls"], row["answered"]) == ("sleeper", 4, 4)
        assert row["ms_per_call"] >= NAP_S * 1000  # a lower bound: each of the 3 slept this long
        assert row["latency_ms"] >= row["ms_per_call"]
        shown = io.StringIO()
        Console(file=shown, width=150).print(render(after))
        (line,) = [ln for ln in shown.getvalue().splitlines() if ln.strip().startswith("sleeper ")]
        shown_ms = [float(x.replace(",", "")) for x in line.split()[2:4]]
        assert shown_ms == [row["ms_per_call"], row["latency_ms"]], shown.getvalue()
        stats = stats_name(row["segment"])
        os.kill(manager.pids()["sleeper/0"], signal.SIGKILL)
        assert wait_until(lambda: manager.exit_codes()["sleeper/0"] is not None, DEADLINE_S)
        s = sample(str(os.getpid()))
        (node,) = [n for n in s["nodes"] if n["name"] == "sleeper/0"]
        assert (node["state"], node["exit"]) == ("dead", "was killed by signal 9 (SIGKILL)")
        (row,) = s["rpc"]  # the counts outlive the server
        assert (row["calls"], row["answered"], row["ms_per_call"], row["latency_ms"]) == (4, 4, None, None)
        assert shm_exists(stats)
    finally:
        client.close()
        sampler.close()
        os.write(release_w, b"x")
        with pytest.raises(lp.NodeFailed):
            manager.wait()
        os.close(release_r)
        os.close(release_w)
    assert not shm_exists(stats)


def fails_once(marker: str) -> None:
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise SystemExit(3)
    lp.wait_for_stop(DEADLINE_S)


def test_restarts_of_a_colocated_child_show_in_its_nodes_row(tmp_path):
    marker = str(tmp_path / "failed")
    program = lp.Program("top-restarts")
    program.add_node(lp.MultiProcessingColocation([lp.PyNode(fails_once, marker)], num_retries_on_failure=1), "pool")
    manager = lp.launch(program, launch_type="test_mp")
    try:
        assert wait_until(lambda: sample(str(os.getpid()), 0.05)["nodes"][0]["restarts"] == 1, DEADLINE_S)
        (node,) = sample(str(os.getpid()), 0.05)["nodes"]
        assert (node["name"], node["state"], node["restarts"]) == ("pool/0", "running", 1)
    finally:
        manager.stop_and_wait()


_LAUNCHER = """
import sys
import numpy as np
import shmpad as lp
sys.path.insert(0, {tests!r})
from test_top import flow
program = lp.Program("top-tmux")
ring = program.add_node(lp.RingNode(8, spec={{"x": (np.int64, ())}}), "trajectories")
program.add_node(lp.PyNode(flow, ring), "actor")
manager = lp.launch(program, launch_type="local_mp")
print("launched", flush=True)
manager.wait()
"""


def _launcher() -> subprocess.Popen:
    code = textwrap.dedent(_LAUNCHER.format(tests=os.path.dirname(os.path.abspath(__file__))))
    proc = spawn_python(code)
    assert proc.stdout.readline() == b"launched\n"
    return proc


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(DEADLINE_S)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")
def test_the_live_view_in_a_terminal(tmp_path):
    launcher = _launcher()
    try:
        command = f"{sys.executable} -m shmpad.top {launcher.pid} --interval 0.2"
        with Tmux("top", command, ROOT) as tmux:
            tmux.run("set-option", "-t", "top", "remain-on-exit", "on")
            wanted = ("program 'top-tmux'", "actor/0", "running", "trajectories", "puts/s")
            assert wait_until(lambda: all(w in tmux.pane() for w in wanted), DEADLINE_S, 0.1), tmux.pane()
            # the rates show once there are two samples: a number, not '-', under puts/s
            line = lambda: next((ln for ln in tmux.pane().splitlines() if ln.strip().startswith("trajectories")), "")
            assert wait_until(lambda: line().split()[2].replace(",", "").isdigit(), DEADLINE_S, 0.1), tmux.pane()
            assert int(line().split()[2].replace(",", "")) > 0, tmux.pane()
            os.killpg(launcher.pid, signal.SIGTERM)  # the launcher stops the program in order
            assert wait_until(lambda: "program 'top-tmux' has ended" in tmux.pane(), DEADLINE_S, 0.1), tmux.pane()
    finally:
        _end(launcher)


def test_the_registry_is_removed_after_a_sigkill_of_the_launcher():
    launcher = _launcher()
    try:
        (name,) = [n for n in registry.running_programs() if f".{launcher.pid}." in n]
        node = json.loads(top(str(launcher.pid), "--once", "--json", "--interval", "0.1")[1])["nodes"][0]["pid"]
        launcher.kill()  # SIGKILL: no cleanup runs in the launcher
        launcher.wait(DEADLINE_S)
        assert wait_until(lambda: not shm_exists(name) and not pid_alive(node), DEADLINE_S), name
    finally:
        _end(launcher)


def test_publish_counter_checks_its_arguments_and_the_launcher_may_publish_too():
    with pytest.raises(RuntimeError, match=r"^shmpad\.publish_counter\(\) needs a launched program"):
        lp.publish_counter("frames", 1)
    program = lp.Program("top-counters")
    program.add_node(lp.PyNode(lp.wait_for_stop, DEADLINE_S), "idle")
    manager = lp.launch(program, launch_type="test_mt")
    try:
        with pytest.raises(ValueError, match=r"^a counter name is 1 to 32 UTF-8 bytes, got 'x{33}'$"):
            lp.publish_counter("x" * 33, 1)
        with pytest.raises(TypeError, match=r"^a counter name must be a str, got int$"):
            lp.publish_counter(7, 1)
        with pytest.raises(TypeError, match=r"^counter 'frames' takes a number, got str$"):
            lp.publish_counter("frames", "12")
        lp.publish_counter("frames", np.int64(12))
        lp.publish_counter("frames", 12.5)  # the same entry, a new value
        lp.publish_counter("é" * 16, -1)  # 32 bytes
        assert lp.counters() == {"": {"frames": 12.5, "é" * 16: -1.0}}
    finally:
        manager.stop_and_wait()


# -- the live view under a launched program (launch(..., top=True), bench.impala --top) --


def test_output_lines_go_whole_to_the_route_and_back_to_the_descriptors(capfd):
    taken: list[tuple[int, bytes]] = []

    def sink(fd: int, data: bytes) -> bool:
        if fd != 1:
            return False  # not ours: written to the descriptor as usual
        taken.append((fd, data))
        return True

    assert output.route(sink) is None
    try:
        child = os.fork()
        if child == 0:  # a forked child writes to its own descriptors, never to the parent's route
            output.write_fd(1, b"from a child\n")
            os._exit(0)
        assert os.waitpid(child, 0)[1] == 0
        out, err = output.Lines("talker/0", "out"), output.Lines("talker/0", "err")
        out.feed(b"par")
        assert taken == []  # no part of a line
        out.feed(b"tial\nwhole\nnex")
        err.feed(b"to stderr\n")
        out.flush()
        out.feed(b"t\n")
    finally:
        assert output.route(None) is sink
    assert taken == [(1, b"[talker/0] partial\n[talker/0] whole\n"), (1, b"[talker/0] nex\n"), (1, b"[talker/0] t\n")]
    output.write_fd(1, b"direct\n")
    captured = capfd.readouterr()
    assert (captured.out, captured.err) == ("from a child\ndirect\n", "[talker/0] to stderr\n")


def test_the_live_view_prints_the_lines_above_itself_and_lets_go_when_stopped(capfd):
    program = lp.Program("top-view")
    program.add_node(lp.PyNode(lp.wait_for_stop, DEADLINE_S), "idle")
    manager = lp.launch(program, launch_type="test_mp")
    screen = io.StringIO()
    try:
        console = Console(file=screen, force_terminal=True, width=120, color_system=None)
        view = LiveView(find_program(str(os.getpid())), interval=0.05, console=console, fds=(1,))
        output.write_fd(1, b"[idle/0] hello\n")
        output.write_fd(2, b"[idle/0] to a file\n")  # not the view's terminal: written as usual
        assert wait_until(lambda: "[idle/0] hello" in screen.getvalue(), DEADLINE_S)
        output.write_fd(1, b"[idle/0] last words\n")  # queued when the stop comes: printed, not lost
        view.stop()
        assert output.route(None) is None and not view._thread.is_alive()
        shown = screen.getvalue()
        assert "program 'top-view'" in shown and "idle/0" in shown
        assert shown.index("[idle/0] hello") < shown.rindex("[idle/0] last words") < shown.rindex("shmpad top")
        assert shown.endswith("\x1b[?25h")  # the cursor is shown again
        assert capfd.readouterr().err == "[idle/0] to a file\n"
        view.stop()  # idempotent
    finally:
        manager.stop_and_wait()


def test_on_end_hooks_run_once_every_node_has_ended_and_before_wait_returns():
    program = lp.Program("top-hooks")
    program.add_node(lp.PyNode(lambda: None), "quick")
    manager = lp.launch(program, launch_type="test_mp")
    ran = []
    manager.on_end(lambda: ran.append(manager.exit_codes()["quick/0"]))
    manager.wait()
    assert ran == [0]
    manager.on_end(lambda: ran.append("late"))  # the program has ended: at once
    assert ran == [0, "late"]


def talker() -> None:
    i = 0
    while not lp.wait_for_stop(0.05):
        print(f"tick {i}", flush=True)
        i += 1


_TALKER = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
import shmpad as lp
from test_top import talker
program = lp.Program("top-talk")
program.add_node(lp.PyNode(talker), "talker")
lp.launch(program, launch_type="local_mp", top=True).wait()
print("after wait", flush=True)
"""


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")
def test_launch_with_top_draws_the_view_under_the_scrolling_output_until_ctrl_c(tmp_path):
    script = tmp_path / "talk.py"
    script.write_text(textwrap.dedent(_TALKER.format(root=ROOT, tests=os.path.dirname(os.path.abspath(__file__)))))
    # the shell stays after the program, so that the terminal's state can be read
    with Tmux("talk", f"{sys.executable} {script}; sleep {DEADLINE_S}", ROOT) as tmux:
        wanted = ("[talker/0] tick", "program 'top-talk'", "talker/0", "running")
        assert wait_until(lambda: all(w in tmux.pane() for w in wanted), DEADLINE_S, 0.1), tmux.pane()

        def output_above_view() -> bool:
            split = tmux.above_and_in_view()
            if split is None:
                return False
            above, view = split
            return any(ln.startswith("[talker/0] tick") for ln in above) and not any("tick" in ln for ln in view)

        # (polled: a capture may fall in the middle of a redraw)
        assert wait_until(output_above_view, DEADLINE_S, 0.1), tmux.pane()
        tmux.send_keys("C-c")
        assert wait_until(lambda: "after wait" in tmux.pane(), DEADLINE_S, 0.1), tmux.pane()
        assert "User-requested termination" in tmux.pane() and "ended" in tmux.pane(), tmux.pane()
        assert tmux.cursor_shown()  # the view gave the terminal back


def test_launch_with_top_and_no_terminal_says_so_and_runs_without_the_view(tmp_path):
    with pytest.raises(TypeError, match=r"^top must be a bool, got str$"):
        lp.launch(lp.Program("top-bad"), top="yes")
    script = tmp_path / "talk.py"
    code = _TALKER.replace("from test_top import talker", "from test_top import few_lines as talker")
    script.write_text(textwrap.dedent(code.format(root=ROOT, tests=os.path.dirname(os.path.abspath(__file__)))))
    code, out, err = run_command([sys.executable, str(script)], DEADLINE_S, "a launch with top=True", split=True)
    assert code == 0, out + err
    assert err == "shmpad: top=True draws the live view in a terminal, and stdout is not one: running without it\n"
    assert out == "[talker/0] line 0\n[talker/0] line 1\nafter wait\n"


def few_lines() -> None:
    for i in range(2):
        print(f"line {i}", flush=True)
