"""shmpad.portal: portal's API and semantics, on both transports.

Servers run in this process (``errors=False``: with portal's default a failing method
ends its process) or in forked ``portal.Process`` workers where a test kills them.
Every test that makes a server or client closes it and checks that no thread, socket or
/dev/shm entry is left (``clean``)."""

from __future__ import annotations

import os
import pathlib
import signal
import threading
import time

import numpy as np
import pytest
from helpers import ours, shm_entries, track_pid, wait_until

import shmpad.portal as portal
from shmpad.portal import forkserver, proctree

HANG_S = 60.0  # a hang guard, never a timing assertion


@pytest.fixture(params=["shm", "tcp"])
def transport(request, monkeypatch):
    monkeypatch.setenv("SHMPAD_TRANSPORT", request.param)
    return request.param


def _fds() -> set[str]:
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if _readable(fd)}


def _readable(fd: str) -> bool:
    try:
        os.readlink(f"/proc/self/fd/{fd}")
        return True
    except OSError:
        return False


@pytest.fixture
def clean():
    """Nothing a test made outlives it: threads, sockets, /dev/shm entries. (The fork
    server lives as long as this process: it is made before the count.)"""
    forkserver.server()
    threads = set(threading.enumerate())
    sockets = {f for f in _fds() if f.startswith("socket:")}
    shm = ours(shm_entries())
    yield
    assert wait_until(lambda: set(threading.enumerate()) <= threads, HANG_S), set(threading.enumerate()) - threads
    assert wait_until(lambda: {f for f in _fds() if f.startswith("socket:")} <= sockets, HANG_S)
    assert wait_until(lambda: ours(shm_entries()) <= shm, HANG_S), ours(shm_entries()) - shm


def test_import_shmpad_does_not_import_portal():
    import subprocess
    import sys

    code = "import shmpad, sys; assert 'shmpad.portal' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- values


def test_pack_unpack_round_trip():
    value = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": [1, 2.5, "x", b"y", None], "c": (np.uint8(3),)}
    out = portal.unpack(b"".join(bytes(p) for p in portal.pack(value)))
    assert portal.tree_equals(out["a"], value["a"])
    assert out["b"][0] == np.array(1) and isinstance(out["b"][0], np.ndarray)  # numbers travel as arrays
    assert out["b"][2:] == ["x", b"y", None]
    assert isinstance(out["c"], list)  # tuples come back as lists, as on portal
    assert portal.tree_equals(out, portal.unpack(b"".join(bytes(p) for p in portal.pack(out))))


def test_pack_refuses_what_portal_refuses():
    with pytest.raises(NotImplementedError, match="cannot send a object"):
        portal.pack({"x": object()})
    with pytest.raises(TypeError, match="dtype object"):
        portal.pack(np.array([object()]))
    with pytest.raises(ValueError, match="not C-contiguous"):
        portal.pack(np.zeros((4, 4))[:, ::2])
    with pytest.raises(ValueError, match="cannot hold"):
        portal.unpack(b"\x05" + bytes(7))


def test_shared_array_travels_by_name(clean):
    arr = portal.SharedArray((3, 4), np.int32)
    arr.array[:] = 7
    out = portal.unpack(b"".join(bytes(p) for p in portal.pack({"x": arr})))["x"]
    assert out.name == arr.name and portal.tree_equals(out.array, arr.array)
    out.array[0, 0] = 1
    assert arr.array[0, 0] == 1  # one memory
    out.close()
    arr.close()


# ---------------------------------------------------------------- calls


def test_call_result_and_remote_error(transport, clean):
    port = portal.free_port()
    server = portal.Server(port, "S", errors=False)
    server.bind("add", lambda a, b: a + b)
    server.bind("fail", lambda: 1 / 0)
    server.start(block=False)
    client = portal.Client(port, "C", logging=False)
    assert client.connect(HANG_S)
    assert client.transport == transport
    result = client.add(np.arange(3), 2).result()
    assert isinstance(result, np.ndarray) and result.tolist() == [2, 3, 4]
    assert client.add(1, 2).result() == 3
    fut = client.fail()
    with pytest.raises(RuntimeError, match="Error in server method: division by zero"):
        fut.result()
    assert fut.result() is None  # an error is raised once
    with pytest.raises(RuntimeError, match="Unknown method nope"):
        client.nope().result()
    assert client.stats()["numsend"] == 4
    client.close()
    server.close()


def test_dropped_error_is_raised_by_the_next_call(clean):
    port = portal.free_port()
    server = portal.Server(port, "S", errors=False)
    server.bind("fail", lambda: 1 / 0)
    server.bind("ok", lambda: 1)
    server.start(block=False)
    client = portal.Client(port, "C", logging=False)
    fut = client.fail()
    fut.wait(HANG_S)
    del fut  # nobody raised its error
    with pytest.raises(RuntimeError, match="division by zero"):
        client.ok()
    assert client.ok().result() == 1
    client.close()
    server.close()


def test_maxinflight_holds_the_next_call_back(transport, clean):
    gate = threading.Event()
    port = portal.free_port()
    server = portal.Server(port, "S", workers=4, errors=False)
    server.bind("hold", lambda: gate.wait(HANG_S))
    server.start(block=False)
    client = portal.Client(port, "C", maxinflight=2, logging=False)
    first = [client.hold(), client.hold()]
    third: list = []
    caller = threading.Thread(target=lambda: third.append(client.hold()))
    caller.start()
    caller.join(0.5)
    assert not third  # two in flight: the third call waits (it cannot have been sent)
    gate.set()
    caller.join(HANG_S)
    assert third and all(f.result(HANG_S) for f in first + third)
    client.close()
    server.close()


def test_a_method_with_its_own_workers_does_not_stall_the_others(transport, clean):
    gate = threading.Event()
    port = portal.free_port()
    server = portal.Server(port, "S", errors=False)
    server.bind("sample", lambda: gate.wait(HANG_S), workers=1)
    server.bind("add", lambda x: x + 1)
    server.start(block=False)
    client = portal.Client(port, "C", logging=False)
    blocked = [client.sample(), client.sample()]
    assert [client.add(i).result(HANG_S) for i in range(20)] == list(range(1, 21))
    assert not any(f.done() for f in blocked)
    gate.set()
    assert all(f.result(HANG_S) for f in blocked)
    client.close()
    server.close()


def test_workers_bound_how_many_calls_of_a_pool_run_at_once(clean):
    running, most, lock = [0], [0], threading.Lock()

    def work(x):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.001)
        with lock:
            running[0] -= 1
        return x

    port = portal.free_port()
    server = portal.Server(port, "S", workers=2, errors=False)
    server.bind("a", work)
    server.bind("b", work)
    server.start(block=False)
    clients = [portal.Client(port, f"C{i}", maxinflight=8, logging=False) for i in range(4)]
    futures = [c.a(i) if i % 2 else c.b(i) for c in clients for i in range(16)]
    assert portal.futures.wait(futures, HANG_S)
    assert most[0] <= 2  # the two methods share the server's pool of 2
    [c.close() for c in clients]
    server.close()


def test_batch_server_stacks_splits_and_runs_donefn_in_order(transport, clean):
    done: list = []
    port = portal.free_port()
    server = portal.BatchServer(port, "B", errors=False)

    def act(obs):
        assert obs["image"].shape == (4, 8, 8, 3) and obs["envid"].shape == (4,)
        return {"action": obs["envid"] * 10, "mean": obs["image"].mean(axis=(1, 2, 3))}, obs["envid"].tolist()

    server.bind("act", act, done.append, batch=4)
    server.start(block=False)
    clients = [portal.Client(port, f"Env{i}", logging=False) for i in range(4)]
    for _ in range(3):
        futures = [c.act({"envid": i, "image": np.full((8, 8, 3), i, np.uint8)}) for i, c in enumerate(clients)]
        for i, fut in enumerate(futures):
            out = fut.result(HANG_S)
            assert out["action"] == 10 * i and out["mean"] == i
    assert wait_until(lambda: len(done) == 3, HANG_S)
    assert all(sorted(d) == [0, 1, 2, 3] for d in done)
    good = [c.act({"envid": i, "image": np.zeros((8, 8, 3), np.uint8)}) for i, c in enumerate(clients[1:])]
    assert wait_until(lambda: server.stats()["requests"] == 3, HANG_S)  # the batch's shape is theirs now
    with pytest.raises(RuntimeError, match="does not match previous requests"):
        clients[0].act({"envid": 0, "other": 1}).result(HANG_S)
    good.append(clients[0].act({"envid": 3, "image": np.zeros((8, 8, 3), np.uint8)}))
    assert [f.result(HANG_S)["action"] for f in good] == [0, 10, 20, 30]
    [c.close() for c in clients]
    server.close()


def test_futures_wait_amount_and_timeout(clean):
    gate = threading.Event()
    port = portal.free_port()
    server = portal.Server(port, "S", workers=2, errors=False)
    server.bind("fast", lambda: 1)
    server.bind("slow", lambda: gate.wait(HANG_S), workers=1)
    server.start(block=False)
    client = portal.Client(port, "C", logging=False)
    fast, slow = client.fast(), client.slow()
    assert portal.futures.wait([fast, slow], timeout=HANG_S, amount=1) == (fast,)
    assert portal.futures.wait([fast, slow], timeout=0.05) is False
    seen = []
    slow.add_callback(seen.append)
    gate.set()
    assert portal.futures.wait([fast, slow], timeout=HANG_S) and wait_until(lambda: seen == [slow], HANG_S)
    client.close()
    server.close()


def _serve(port: int) -> None:
    server = portal.Server(port, "S")
    server.bind("pid", lambda: os.getpid())
    server.bind("hang", lambda: threading.Event().wait(), workers=1)  # its own pool: pid() still answers
    server.start()


def test_disconnected_without_autoconn_then_connect_again(transport, clean):
    port = portal.free_port()
    first = portal.Process(_serve, port, start=True)
    track_pid(first.pid)
    client = portal.Client(port, "C", autoconn=False, logging=False)
    with pytest.raises(portal.Disconnected):
        client.pid()  # no connect() yet
    assert client.connect(HANG_S)
    assert client.pid().result(HANG_S) == first.pid
    pending = client.hang()
    os.kill(first.pid, signal.SIGKILL)
    with pytest.raises(portal.Disconnected):
        pending.result(HANG_S)
    assert wait_until(lambda: not client.connected, HANG_S)
    with pytest.raises(portal.Disconnected):
        client.pid()
    first.join(HANG_S)
    second = portal.Process(_serve, port, start=True)
    track_pid(second.pid)
    assert client.connect(HANG_S)
    assert client.pid().result(HANG_S) == second.pid
    client.close()
    second.kill()


def test_autoconn_sends_calls_in_flight_again(transport, clean):
    port = portal.free_port()
    first = portal.Process(_serve, port, start=True)
    track_pid(first.pid)
    client = portal.Client(port, "C", logging=False)
    assert client.pid().result(HANG_S) == first.pid
    hung = client.hang()
    first.kill()
    assert wait_until(lambda: not client.connected, HANG_S)
    late: list = []  # a call made while there is no server waits for one, as on portal
    caller = threading.Thread(target=lambda: late.append(client.pid()))
    caller.start()
    second = portal.Process(_serve, port, start=True)
    track_pid(second.pid)
    caller.join(HANG_S)
    assert late[0].result(HANG_S) == second.pid
    assert not hung.done()  # sent again to the new server, where it hangs too
    client.close()
    second.kill()


def test_a_failing_method_ends_the_server_process_by_default(clean):
    port = portal.free_port()

    def serve():
        server = portal.Server(port, "S")
        server.bind("fail", lambda: 1 / 0)
        server.start()

    proc = portal.Process(serve, start=True)
    track_pid(proc.pid)
    client = portal.Client(port, "C", logging=False)
    with pytest.raises(RuntimeError, match="division by zero"):
        client.fail().result(HANG_S)
    proc.join(HANG_S)
    assert proc.exitcode == 1
    client.close()


# ---------------------------------------------------------------- processes and threads


def _returns(code):
    return code


def test_process_exit_codes():
    procs = [
        portal.Process(_returns, 0, start=True),
        portal.Process(_returns, 3, start=True),
        portal.Process(lambda: 1 / 0, name="boom", start=True),
        portal.Process(lambda: exec("raise SystemExit(0)"), start=True),
    ]
    for p in procs:
        assert p.join(HANG_S).exitcode is not None
    assert [p.exitcode for p in procs] == [0, 3, 1, 2]  # SystemExit is a kill: 2, as in portal
    assert procs[2].name == "boom" and not procs[2].running


def _parent(pipe) -> None:
    child = portal.Process(lambda: threading.Event().wait(), start=True)
    grandchild = portal.Process(lambda: threading.Event().wait(), start=True)
    pipe.send([child.pid, grandchild.pid])
    threading.Event().wait()


def test_kill_takes_the_whole_subtree():
    ours_, theirs = portal.context.mp.Pipe()
    parent = portal.Process(_parent, theirs, start=True)
    below = ours_.recv()
    assert all(proctree.proc_alive(pid) for pid in below)
    parent.kill(timeout=HANG_S)  # the grace before SIGKILL is a hang guard: a loaded machine once took over 1 s
    assert parent.exitcode == -signal.SIGTERM
    assert wait_until(lambda: not any(proctree.proc_alive(pid) for pid in below), HANG_S)


def test_an_error_in_a_thread_ends_its_process():
    def body():
        portal.Thread(lambda: 1 / 0, name="worker", start=True)
        threading.Event().wait(HANG_S)

    proc = portal.Process(body, start=True)
    assert proc.join(HANG_S).exitcode == 1


def test_thread_kill_and_exitcode():
    stop = threading.Event()
    t = portal.Thread(lambda: stop.wait(HANG_S) and 5, start=True)
    assert t.running
    stop.set()
    t.join(HANG_S)
    assert t.exitcode == 5
    spin = portal.Thread(lambda: [time.sleep(0.01) for _ in iter(int, 1)], start=True)
    spin.kill(HANG_S)
    assert not spin.running and spin.exitcode == 2


def test_run_stops_everything_at_the_first_failure():
    sleeper = portal.Process(lambda: threading.Event().wait(), name="sleeper")
    failing = portal.Process(lambda: 1 / 0, name="failing")
    with pytest.raises(RuntimeError, match="'failing' crashed with exit code 1"):
        portal.run([sleeper, failing])
    assert not sleeper.running and sleeper.exitcode is not None


def test_run_returns_when_all_succeed_and_after_duration():
    portal.run([portal.Process(_returns, 0), portal.Thread(_returns, 0)])
    sleeper = portal.Process(lambda: threading.Event().wait())
    portal.run([sleeper], duration=0.2)
    assert not sleeper.running


def test_error_file_stops_every_watching_process(tmp_path: pathlib.Path):
    errfile = tmp_path / "error"

    def watcher():
        portal.setup(errfile=errfile, interval=0.05)
        threading.Event().wait()

    def failing(ready):
        # (setup is called in each worker, not here: this process would end too)
        portal.setup(errfile=errfile, interval=0.05)
        ready.wait(HANG_S)
        raise ValueError("the first failure")

    ready = portal.context.mp.Event()
    procs = [portal.Process(watcher, start=True) for _ in range(3)]
    bad = portal.Process(failing, ready, name="bad", start=True)
    ready.set()
    bad.join(HANG_S)
    assert bad.exitcode == 1
    assert "Error in 'bad' (ValueError: the first failure)" in errfile.read_text()
    for p in procs:
        assert p.join(HANG_S).exitcode == 2


def test_initfns_run_in_every_process(tmp_path: pathlib.Path):
    marks = tmp_path / "marks"
    marks.mkdir()

    def init():
        (marks / str(os.getpid())).touch()

    def body():
        return 0

    portal.setup(initfns=[init])
    try:
        proc = portal.Process(body, start=True)
        proc.join(HANG_S)
        assert {int(p.name) for p in marks.iterdir()} == {os.getpid(), proc.pid}
    finally:
        portal.reset()
    assert portal.context.initfns == []


def test_mp_objects_and_pickled_bytes_work_as_arguments():
    import cloudpickle

    a, b = portal.context.mp.Pipe()
    event = portal.context.mp.Event()
    fn = cloudpickle.dumps(lambda x: x * 2)

    def child(fn, pipe, event):
        pipe.send(cloudpickle.loads(fn)(21))
        event.set()

    proc = portal.Process(child, fn, b, event, start=True)
    assert event.wait(HANG_S) and a.recv() == 42
    assert proc.join(HANG_S).exitcode == 0


def test_argument_errors():
    with pytest.raises(ValueError, match="port must be in 1..65535, got 0"):
        portal.Server(0)
    with pytest.raises(TypeError, match="addr must be an int"):
        portal.Client(1.5)
    with pytest.raises(TypeError, match="Client got an unknown option 'max_queue'; its options are ipv6"):
        portal.Client(1234, max_queue=4)
    with pytest.raises(ValueError, match="Client cannot honour keepalive_after=1: a server on this host"):
        portal.Client(1234, keepalive_after=1)
    with pytest.raises(TypeError, match="Server option max_msg_size must be int, got str"):
        portal.Server(1234, max_msg_size="1G")
    with pytest.raises(ValueError, match="maxinflight must be >= 1, got 0"):
        portal.Client(1234, maxinflight=0)
    server = portal.Server(portal.free_port())
    server.bind("a", lambda: 1)
    with pytest.raises(ValueError, match="method 'a' is bound already"):
        server.bind("a", lambda: 1)
    os.environ["SHMPAD_TRANSPORT"] = "udp"
    try:
        with pytest.raises(ValueError, match="SHMPAD_TRANSPORT must be 'shm', 'tcp' or unset, got 'udp'"):
            server.start(block=False)
    finally:
        del os.environ["SHMPAD_TRANSPORT"]
