"""Colocation: nodes as threads of one node (first exception re-raised, first/all
completed, stop inside) and as child processes of one node (restarts within a
shared budget, the budget's error, stop reaching the children)."""

from __future__ import annotations

import os
import threading
import time

import pytest
from helpers import pid_alive, wait_until

import shmpad as lp


def test_only_pynodes_and_at_least_one():
    for kind in (lp.MultiThreadingColocation, lp.MultiProcessingColocation):
        with pytest.raises(ValueError, match=f"{kind.__name__} only works with PyNodes, got RingNode"):
            kind([lp.RingNode(4, slot_size=8)])
        program = lp.Program("p")
        program.add_node(kind([]), "empty")
        manager = lp.launch(program, launch_type="test_mt")
        with pytest.raises(ValueError, match=f"{kind.__name__} requires at least one node."):
            manager.wait()
    with pytest.raises(ValueError, match="num_retries_on_failure must be >= 0, got -1"):
        lp.MultiProcessingColocation([lp.PyNode(print)], num_retries_on_failure=-1)


def put(results, msg, delay=0.0):
    time.sleep(delay)
    results.put(msg)


def raise_foo():
    raise RuntimeError("Foo")


@pytest.mark.parametrize("launch_type", ["test_mt", "test_mp"])
def test_threads_ping_a_colocated_courier(launch_type):
    class Server:
        def ping(self):
            return os.getpid()

    def client(server, results):
        results.put(str(server.ping() == os.getpid()).encode())
        lp.stop()

    program = lp.Program("p")
    results = program.add_node(lp.RingNode(4, slot_size=64), "results")
    server_node = lp.CourierNode(Server)
    server = server_node.create_handle()
    colo = lp.MultiThreadingColocation([server_node, lp.PyNode(client, server, results)])
    program.add_node(colo, "colocated")
    program.add_node(lp.PyNode(lp.wait_for_stop), "keeps_the_program_running")
    manager = lp.launch(program, launch_type=launch_type)
    try:
        assert results.dereference().get_bytes(timeout=30) == b"True"  # same process
        manager.wait()
    finally:
        manager.stop_and_wait()


def test_thread_colocation_reraises_the_first_exception(capfd):
    program = lp.Program("p")
    colo = lp.MultiThreadingColocation([lp.PyNode(raise_foo), lp.PyNode(lp.wait_for_stop)])
    program.add_node(colo, "colocated")
    manager = lp.launch(program, launch_type="test_mt")
    with pytest.raises(RuntimeError, match="^Foo$"):
        manager.wait()
    assert "Error in node 'colocated/0'" in capfd.readouterr().err


@pytest.mark.parametrize("first", [True, False])
def test_thread_colocation_first_or_all_completed(first):
    program = lp.Program("p")
    results = program.add_node(lp.RingNode(4, slot_size=64), "results")
    colo = lp.MultiThreadingColocation(
        [lp.PyNode(put, results, b"quick"), lp.PyNode(put, results, b"slow", 1.0)], return_on_first_completed=first
    )
    program.add_node(colo, "colocated")
    program.add_node(lp.PyNode(lp.wait_for_stop), "keeps_the_program_running")
    manager = lp.launch(program, launch_type="test_mt")
    ring = results.dereference()
    try:
        manager.wait(["colocated"])
        got = []
        while True:
            try:
                got.append(ring.get_bytes_nowait())
            except lp.WouldBlock:
                break
    finally:
        manager.stop_and_wait()
    assert got == ([b"quick"] if first else [b"quick", b"slow"])


def stop_soon():
    time.sleep(0.1)
    lp.stop()


@pytest.mark.parametrize("launch_type", ["test_mt", "test_mp"])
def test_stop_inside_nested_colocation(launch_type):
    inner = lp.MultiThreadingColocation([lp.PyNode(stop_soon), lp.PyNode(lp.wait_for_stop)])
    program = lp.Program("p")
    program.add_node(lp.MultiThreadingColocation([inner, lp.PyNode(lp.wait_for_stop)]), "colocated")
    manager = lp.launch(program, launch_type=launch_type)
    manager.wait()
    assert manager.stop_event().is_set()


def fail_until(marker_dir, fail_times):
    """Fails the first ``fail_times`` runs (counted in files, since each run is a new process)."""
    runs = len(os.listdir(marker_dir))
    open(os.path.join(marker_dir, f"run{runs}"), "w").close()
    if runs < fail_times:
        raise RuntimeError(f"failure number {runs}")


@pytest.mark.parametrize(("fails", "retries", "ok"), [(1, 1, True), (2, 1, False), (1, 0, False), (0, 0, True)])
def test_process_colocation_retries(tmp_path, fails, retries, ok, capfd):
    program = lp.Program("p")
    colo = lp.MultiProcessingColocation(
        [lp.PyNode(fail_until, str(tmp_path), fails), lp.PyNode(time.sleep, 0.2)], num_retries_on_failure=retries
    )
    program.add_node(colo, "colocated")
    manager = lp.launch(program, launch_type="test_mp")
    if ok:
        manager.wait()
        assert len(os.listdir(tmp_path)) == fails + 1
    else:
        with pytest.raises(lp.NodeFailed) as info:
            manager.wait()
        assert f"num_retries_on_failure (={retries}) is reached" in info.value.node_traceback
        assert "RuntimeError: failure number" in info.value.node_traceback
        assert len(os.listdir(tmp_path)) == retries + 1
    capfd.readouterr()


def report_and_wait(results):
    stopped = threading.Event()
    lp.register_stop_handler(stopped.set)
    results.put(str(os.getpid()).encode())
    assert stopped.wait(60)
    results.put(b"handler " + str(os.getpid()).encode())


def test_process_colocation_children_stop_with_the_program():
    program = lp.Program("p")
    results = program.add_node(lp.RingNode(8, slot_size=64), "results")
    colo = lp.MultiProcessingColocation([lp.PyNode(report_and_wait, results) for _ in range(2)])
    program.add_node(colo, "colocated")
    manager = lp.launch(program, launch_type="test_mp")
    ring = results.dereference()
    pids = {int(ring.get_bytes(timeout=30)) for _ in range(2)}
    assert manager.pids()["colocated/0"] not in pids and len(pids) == 2
    manager.stop()
    handlers = {ring.get_bytes(timeout=30) for _ in range(2)}
    manager.wait()
    assert handlers == {b"handler " + str(p).encode() for p in pids}
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), 60)
    assert manager.exit_codes() == {"colocated/0": 0}
