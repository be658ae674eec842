"""Launching programs under every launch type: data through ring nodes, calls through
courier nodes, stop from any thread, failures that stop the program and come back
from ``wait()``, labels, exit codes, the termination notice, per-group resources."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
import zlib

import numpy as np
import pytest
from helpers import pid_alive, track_pid, wait_until

import shmpad as lp
from shmpad import NodeFailed

ALL_TYPES = ["test_mp", "test_mt", "local_mp", "local_mt"]
MP = ["test_mp", "local_mp"]
SPEC = {"producer": (np.int64, ()), "seq": (np.int64, ()), "payload": (np.float32, (16,)), "crc": (np.int64, ())}
N_ITEMS = 300


def _payload(p: int, i: int) -> np.ndarray:
    return np.arange(16, dtype=np.float32) * (p + 1) + i


class Counter:
    """A courier node that producers report to."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}

    def report(self, producer, n):
        with self.lock:
            self.counts[producer] = self.counts.get(producer, 0) + n
        return True

    def total(self):
        with self.lock:
            return dict(self.counts)


def producer(p, queue, counter):
    for i in range(N_ITEMS):
        item = queue.reserve(timeout=30)
        item["producer"][...] = p
        item["seq"][...] = i
        item["payload"][...] = _payload(p, i)
        item["crc"][...] = zlib.crc32(_payload(p, i).tobytes())
        queue.commit()
    assert counter.futures.report(p, N_ITEMS).result(30) is True


def consumer(n_producers, queue, counter, results):
    seen = {p: -1 for p in range(n_producers)}
    bad = 0
    for _ in range(n_producers * N_ITEMS):
        item = queue.get(timeout=30)
        p, i = int(item["producer"]), int(item["seq"])
        if zlib.crc32(np.asarray(item["payload"]).tobytes()) != int(item["crc"]) or i != seen[p] + 1:
            bad += 1
        seen[p] = i
        queue.release()
    deadline = time.monotonic() + 30
    while sum(counter.total().values()) < n_producers * N_ITEMS and time.monotonic() < deadline:
        time.sleep(0.01)
    results.put(repr((bad, seen, counter.total(), os.getpid())).encode())
    lp.stop()


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_producers_consumer_program(launch_type, shm_leak_check):
    program = lp.Program("produce_consume")
    queue = program.add_node(lp.RingNode(64, spec=SPEC), "queue")
    results = program.add_node(lp.RingNode(4, slot_size=4096), "results")
    counter = program.add_node(lp.CourierNode(Counter), "counter")
    with program.group("producer"):
        for p in range(3):
            program.add_node(lp.PyNode(producer, p, queue, counter))
    program.add_node(lp.PyNode(consumer, 3, queue, counter, results), "consumer")
    manager = lp.launch(program, launch_type=launch_type)
    for pid in manager.pids().values():
        track_pid(pid)
    try:
        out = results.dereference().get_bytes(timeout=60)
        manager.wait()
    finally:
        manager.stop_and_wait()
    bad, seen, counts, consumer_pid = eval(out.decode())
    assert bad == 0
    assert seen == {p: N_ITEMS - 1 for p in range(3)}
    assert counts == {p: N_ITEMS for p in range(3)}
    assert (consumer_pid != os.getpid()) == (launch_type in MP)
    if launch_type in MP:
        assert set(manager.exit_codes().values()) == {0}


def failing():
    time.sleep(0.1)
    raise ValueError("boom in a node")


def waiter(results):
    lp.register_stop_handler(lambda: results.put(b"handler ran"))
    assert lp.wait_for_stop(60)
    results.put(b"stopped")


@pytest.mark.parametrize("launch_type", ["test_mp", "test_mt"])
def test_first_failure_stops_the_program_and_is_raised(launch_type, capfd, shm_leak_check):
    program = lp.Program("fails")
    results = program.add_node(lp.RingNode(4, slot_size=64), "results")
    program.add_node(lp.PyNode(failing), "bad")
    program.add_node(lp.PyNode(waiter, results), "waiter")
    manager = lp.launch(program, launch_type=launch_type)
    ring = results.dereference()
    got = {ring.get_bytes(timeout=30), ring.get_bytes(timeout=30)}
    assert got == {b"handler ran", b"stopped"}
    if launch_type == "test_mp":
        with pytest.raises(NodeFailed) as info:
            manager.wait()
        assert info.value.label == "bad" and info.value.index == 0 and info.value.exit_code == 1
        assert "ValueError: boom in a node" in info.value.node_traceback
        assert "in failing" in str(info.value)
    else:
        with pytest.raises(ValueError, match="boom in a node"):  # the node's own exception
            manager.wait()
    manager.stop_and_wait()
    err = capfd.readouterr().err
    assert "Error in node 'bad/0'" in err and "ValueError: boom in a node" in err
    assert manager.exit_codes()["waiter/0"] == 0


def stop_from_thread(results):
    def later():
        time.sleep(0.1)
        lp.stop()

    threading.Thread(target=later).start()
    stopped = threading.Event()
    lp.register_stop_handler(stopped.set)
    assert lp.stop_event().wait(60)
    assert stopped.wait(10)
    results.put(b"ok")


def blocks_until_stop():
    lp.wait_for_stop()


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_stop_from_a_non_main_thread(launch_type):
    program = lp.Program("stops")
    results = program.add_node(lp.RingNode(4, slot_size=64), "results")
    program.add_node(lp.PyNode(stop_from_thread, results), "stopper")
    program.add_node(lp.PyNode(blocks_until_stop), "blocker")
    manager = lp.launch(program, launch_type=launch_type)
    try:
        assert results.dereference().get_bytes(timeout=60) == b"ok"
        manager.wait()
        assert manager.stop_event().is_set()
    finally:
        manager.stop_and_wait()


def quick():
    pass


def daemon():
    lp.wait_for_stop()


def daemon_fails():
    time.sleep(0.2)
    raise RuntimeError("daemon broke")


@pytest.mark.parametrize("launch_type", ["test_mp", "test_mt"])
def test_wait_for_some_labels_only(launch_type):
    program = lp.Program("labels")
    program.add_node(lp.PyNode(quick), "main")
    program.add_node(lp.PyNode(daemon), "daemon")
    manager = lp.launch(program, launch_type=launch_type)
    try:
        manager.wait(["main"])
        assert not manager.stop_event().is_set()
        assert manager.wait_for_stop(0.05) is False
        with pytest.raises(
            ValueError, match=r"no running nodes labelled \['nope'\]; labels with nodes: \['daemon', 'main'\]"
        ):
            manager.wait(["nope"])
    finally:
        manager.stop_and_wait()
    assert manager.wait_for_stop(0) is True


@pytest.mark.parametrize("launch_type", ["test_mp", "test_mt"])
def test_wait_for_some_detects_a_failure_in_any_group(launch_type, capfd):
    program = lp.Program("labels")
    program.add_node(lp.PyNode(daemon), "main")
    program.add_node(lp.PyNode(daemon_fails), "daemon")
    manager = lp.launch(program, launch_type=launch_type)
    with pytest.raises(RuntimeError, match="daemon broke"):
        manager.wait(["main"])
    manager.stop_and_wait()  # raise_error=False: does not raise again
    capfd.readouterr()


def test_return_on_first_completed():
    program = lp.Program("first")
    program.add_node(lp.PyNode(quick), "quick")
    program.add_node(lp.PyNode(daemon), "slow")
    manager = lp.launch(program, launch_type="test_mp")
    try:
        manager.wait(return_on_first_completed=True)
        assert manager.exit_codes()["quick/0"] == 0 and manager.exit_codes()["slow/0"] is None
    finally:
        manager.stop_and_wait()


def exits_with(code):
    sys.stdout.flush()
    os._exit(code)


def kills_itself():
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize(
    ("fn", "expected"), [(exits_with, "exited with code 3"), (kills_itself, "was killed by signal 9 (SIGKILL)")]
)
def test_nonzero_exit_and_death_by_signal_are_failures(fn, expected, capfd):
    program = lp.Program("exits")
    program.add_node(lp.PyNode(fn, 3) if fn is exits_with else lp.PyNode(fn), "dies")
    program.add_node(lp.PyNode(daemon), "daemon")
    manager = lp.launch(program, launch_type="test_mp")
    with pytest.raises(NodeFailed, match=re.escape(f"Error in node 'dies/0': it {expected}")):
        manager.wait()
    assert f"Error in node 'dies/0': it {expected}" in capfd.readouterr().err


def system_exit_zero():
    sys.exit(0)


def test_system_exit_zero_is_a_clean_end():
    program = lp.Program("exits")
    program.add_node(lp.PyNode(system_exit_zero), "a")
    manager = lp.launch(program, launch_type="test_mp")
    manager.wait()
    assert manager.exit_codes() == {"a/0": 0}


def ignores_stop(results):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    results.put(str(os.getpid()).encode())
    while True:
        time.sleep(1)


def test_termination_notice_then_kill(capfd):
    program = lp.Program("stubborn")
    results = program.add_node(lp.RingNode(4, slot_size=64), "results")
    program.add_node(lp.PyNode(ignores_stop, results), "stubborn")
    manager = lp.launch(program, launch_type="test_mp", termination_notice_secs=0.5)
    pid = int(results.dereference().get_bytes(timeout=30))
    manager.stop_and_wait()
    assert not pid_alive(pid)
    assert manager.exit_codes()["stubborn/0"] == -signal.SIGKILL
    assert "did not stop within the termination notice (0.5 s): ['stubborn/0']" in capfd.readouterr().err


def report_environment(results):
    results.put(repr((os.environ.get("SHMPAD_TEST_VAR"), sys.argv[1:])).encode())


def test_local_resources_env_and_args():
    program = lp.Program("resources")
    results = program.add_node(lp.RingNode(4, slot_size=4096), "results")
    program.add_node(lp.PyNode(report_environment, results), "configured")
    program.add_node(lp.PyNode(blocks_until_stop), "keeps_the_program_running")
    resources = {
        "configured": lp.PythonProcess(env={"SHMPAD_TEST_VAR": "42"}, args={"lr": 0.5, "debug": True, "cuda": False})
    }
    manager = lp.launch(program, launch_type="test_mp", local_resources=resources)
    try:
        env, argv = eval(results.dereference().get_bytes(timeout=30).decode())
        manager.wait(["configured"])
    finally:
        manager.stop_and_wait()
    assert env == "42"
    assert argv == ["--lr=0.5", "--debug", "--nocuda"]
    assert "SHMPAD_TEST_VAR" not in os.environ


def report_affinity(results):
    """This node's CPUs, and those of a process it forks (env workers inherit them)."""
    child = os.fork()
    if child == 0:
        results.put(repr(("child", sorted(os.sched_getaffinity(0)))).encode())
        os._exit(0)
    os.waitpid(child, 0)
    results.put(repr(("node", sorted(os.sched_getaffinity(0)))).encode())


def test_local_resources_pin_a_group_and_what_it_forks_to_its_cpus():
    allowed = sorted(os.sched_getaffinity(0))
    pinned = allowed[-1:]
    program = lp.Program("pinned")
    results = program.add_node(lp.RingNode(8, slot_size=256), "results")
    program.add_node(lp.PyNode(report_affinity, results), "pinned")
    program.add_node(lp.PyNode(report_affinity, results), "free")
    manager = lp.launch(program, launch_type="test_mp", local_resources={"pinned": lp.PythonProcess(cpus=pinned)})
    try:
        ring = results.dereference()
        seen = sorted(eval(ring.get_bytes(timeout=30).decode()) for _ in range(4))
        manager.wait()
    finally:
        manager.stop_and_wait()
    assert sorted(cpus for _, cpus in seen) == sorted([pinned, pinned, allowed, allowed])  # each node and its child
    assert sorted(os.sched_getaffinity(0)) == allowed  # the launcher itself is untouched


def test_bad_cpus_are_refused_by_name():
    # a wrong type (not an iterable of ints) is a TypeError, a bad value a ValueError
    bad_values = [[], [-1], [0, 0]]
    bad_types = [["0"], 3, [True]]
    for bad, error in [(b, ValueError) for b in bad_values] + [(b, TypeError) for b in bad_types]:
        with pytest.raises(error, match=r"cpus must be distinct CPU numbers \(ints >= 0\), at least one, got"):
            lp.PythonProcess(cpus=bad)
    assert lp.PythonProcess(cpus={1, 0}).cpus == (0, 1)
    missing = max(os.sched_getaffinity(0)) + 1
    program = lp.Program("unpinnable")
    program.add_node(lp.PyNode(blocks_until_stop), "node")
    with pytest.raises(
        ValueError, match=rf"local_resources\['node'\] pins to cpus \[{missing}\], but this process may run only on"
    ):
        lp.launch(program, launch_type="test_mp", local_resources={"node": lp.PythonProcess(cpus=[missing])})


class WithRun:
    def __init__(self, results, tag):
        self.results = results
        self.tag = tag
        results.put(b"built " + tag)

    def run(self):
        self.results.put(b"ran " + self.tag)


@pytest.mark.parametrize("launch_type", ["test_mp", "test_mt"])
def test_pyclassnode_run_and_disable_run(launch_type):
    program = lp.Program("classes")
    results = program.add_node(lp.RingNode(8, slot_size=64), "results")
    program.add_node(lp.PyClassNode(WithRun, results, b"a"), "runs")
    silent = lp.PyClassNode(WithRun, results, b"b")
    silent.disable_run()
    program.add_node(silent, "silent")
    program.add_node(lp.PyNode(blocks_until_stop), "keeps_the_program_running")
    manager = lp.launch(program, launch_type=launch_type)
    ring = results.dereference()
    try:
        got = sorted(ring.get_bytes(timeout=30) for _ in range(3))
        manager.wait(["runs", "silent"])
        assert ring.statistics().size == 0
    finally:
        manager.stop_and_wait()
    assert got == [b"built a", b"built b", b"ran a"]


class SlowToStart:
    def __init__(self):
        time.sleep(0.5)

    def ping(self):
        return os.getpid()

    def fail(self):
        raise KeyError("missing thing")

    def slow(self):
        time.sleep(5)


def courier_caller(server, results):
    server_pid = server.ping()  # made before the server is up: waits for it
    try:
        server.fail()
    except KeyError as e:
        remote = repr(e)
    fast = server  # a second handle-derived client with a deadline
    results.put(repr((server_pid, remote)).encode())
    del fast
    lp.stop()


def courier_deadline(server, results):
    try:
        server.slow()
        outcome = "no timeout"
    except TimeoutError as e:
        outcome = str(e)
    results.put(outcome.encode())


@pytest.mark.parametrize("launch_type", ["test_mp", "test_mt"])
def test_courier_node_in_a_program(launch_type):
    program = lp.Program("courier")
    results = program.add_node(lp.RingNode(4, slot_size=4096), "results")
    server = program.add_node(lp.CourierNode(SlowToStart), "server")
    program.add_node(lp.PyNode(courier_caller, server, results), "caller")
    manager = lp.launch(program, launch_type=launch_type)
    try:
        server_pid, remote = eval(results.dereference().get_bytes(timeout=30).decode())
        manager.wait()
    finally:
        manager.stop_and_wait()
    assert remote == "KeyError('missing thing')"
    assert (server_pid == os.getpid()) == (launch_type == "test_mt")


def test_courier_call_timeout_from_the_handle():
    program = lp.Program("courier")
    results = program.add_node(lp.RingNode(4, slot_size=4096), "results")
    server = program.add_node(lp.CourierNode(SlowToStart), "server")
    server.set_client_kwargs(call_timeout=1.0)
    program.add_node(lp.PyNode(courier_deadline, server, results), "caller")
    manager = lp.launch(program, launch_type="test_mp")
    try:
        outcome = results.dereference().get_bytes(timeout=30).decode()
    finally:
        manager.stop_and_wait()
    assert (
        "call to 'slow' on 'courier node CourierNode(SlowToStart)' did not complete within call_timeout=1.0 s"
        in outcome
    )


def learner(store):
    import torch

    model = torch.nn.Linear(4, 2)
    with torch.no_grad():
        for v in range(1, 4):
            model.weight.fill_(float(v))
            model.bias.fill_(float(-v))
            store.publish(model)


def actor(store, results):
    import torch

    model = torch.nn.Linear(4, 2)
    version = store.wait_for_version(newer_than=2, timeout=30)
    store.pull(model)
    results.put(repr((version, float(model.weight[0, 0]), float(model.bias[1]))).encode())


@pytest.mark.rl
def test_weight_store_node():
    import torch

    program = lp.Program("weights")
    store = program.add_node(lp.WeightStoreNode(torch.nn.Linear(4, 2)), "weights")
    results = program.add_node(lp.RingNode(4, slot_size=4096), "results")
    program.add_node(lp.PyNode(learner, store), "learner")
    program.add_node(lp.PyNode(actor, store, results), "actor")
    program.add_node(lp.PyNode(blocks_until_stop), "keeps_the_program_running")
    manager = lp.launch(program, launch_type="test_mp")
    try:
        got = eval(results.dereference().get_bytes(timeout=60).decode())
        manager.wait(["learner", "actor"])
    finally:
        manager.stop_and_wait()
    assert got[1:] == (3.0, -3.0) and got[0] >= 3


def test_data_nodes_close_when_the_program_stops():
    """A consumer blocked on an empty ring wakes with Closed when the program stops,
    and that counts as a clean end."""
    program = lp.Program("close")
    queue = program.add_node(lp.RingNode(4, slot_size=64), "queue")
    program.add_node(lp.PyNode(lambda q: q.get_bytes(), queue), "consumer")
    manager = lp.launch(program, launch_type="test_mp")
    ring = queue.dereference()  # only read here: closing this handle would close the ring for the consumer too
    # the consumer counts a wait on the empty ring as it begins to block (60 s: a hang guard)
    assert wait_until(lambda: ring.statistics().waits_empty >= 1, 60), "the consumer never blocked on the ring"
    manager.stop_and_wait()
    assert manager.exit_codes() == {"consumer/0": 0}
    assert manager.failure is None


class _Case:
    def __init__(self):
        self.cleanups = []

    def addCleanup(self, fn, *args):
        self.cleanups.append((fn, args))

    def run_cleanups(self):
        for fn, args in reversed(self.cleanups):
            fn(*args)


@pytest.mark.parametrize("launch_type", ["test_mp", "test_mt"])
def test_test_case_cleanup_stops_and_raises(launch_type, capfd):
    case = _Case()
    program = lp.Program("cleanup")
    program.add_node(lp.PyNode(daemon), "blocker")
    lp.launch(program, launch_type=launch_type, test_case=case)
    case.run_cleanups()  # stops the blocker
    case2 = _Case()
    program2 = lp.Program("cleanup2")
    program2.add_node(lp.PyNode(daemon_fails), "broken")
    manager2 = lp.launch(program2, launch_type=launch_type, test_case=case2)
    assert wait_until(lambda: manager2.failure is not None, 60), "the node's failure was never recorded"
    with pytest.raises(RuntimeError, match="daemon broke"):
        case2.run_cleanups()
    capfd.readouterr()


def test_an_idle_program_sleeps_in_the_kernel():
    """A courier server with no calls, a node blocked on an empty ring and one waiting
    for stop do not burn a core: every thread of each is asleep in the kernel, woken at
    most by its polling slice (the ring's sleep chunk, the shortest any of them sleeps with)."""
    from helpers import assert_idle

    from shmpad.ringbuf.blocking import SLEEP_CHUNK_S

    program = lp.Program("idle")
    queue = program.add_node(lp.RingNode(4, slot_size=64), "queue")
    program.add_node(lp.CourierNode(Counter), "server")
    program.add_node(lp.PyNode(lambda q: q.get_bytes(), queue), "consumer")
    program.add_node(lp.PyNode(blocks_until_stop), "waiter")
    manager = lp.launch(program, launch_type="test_mp")
    try:
        assert_idle(list(manager.pids().values()), slice_s=SLEEP_CHUNK_S)
    finally:
        manager.stop_and_wait()


def report_pid_until_stop(results):
    results.put(str(os.getpid()).encode())
    lp.wait_for_stop()


def test_each_node_process_is_titled_with_its_label():
    program = lp.Program("titles")
    results = program.add_node(lp.RingNode(8, slot_size=64), "results")
    with program.group("learner"):
        program.add_node(lp.PyNode(report_pid_until_stop, results))
    with program.group("actor"):
        for _ in range(2):
            program.add_node(lp.PyNode(report_pid_until_stop, results))
    manager = lp.launch(program, launch_type="test_mp")
    try:
        pids = [int(results.dereference().get_bytes(timeout=30)) for _ in range(3)]
        titles = []
        for pid in pids:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                titles.append(f.read().rstrip(b"\0").decode())
            with open(f"/proc/{pid}/comm") as f:
                assert f.read().strip() == titles[-1][:15]  # what top shows
    finally:
        manager.stop_and_wait()
    assert sorted(titles) == ["shmpad: actor/0", "shmpad: actor/1", "shmpad: learner/0"]
