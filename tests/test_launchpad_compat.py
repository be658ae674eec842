"""Launchpad programs run with only the import changed: the scenarios of Launchpad's own
tests (program, courier node, both colocations, both test launchers, the worker
manager's public behaviour) and its examples, under every launch type."""

import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest
from pathlib import Path
from unittest import mock

import pytest
from helpers import start_session

import shmpad as lp

pytestmark = pytest.mark.timeout(120)

ALL_TYPES = ["local_mt", "local_mp", "test_mt", "test_mp"]
TEST_TYPES = ["test_mt", "test_mp"]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def run():
    """Launch; every program launched is stopped when the test ends."""
    managers = []

    def start(program, launch_type, **kwargs):
        manager = lp.launch(program, launch_type=launch_type, **kwargs)
        managers.append(manager)
        return manager

    yield start
    for manager in managers:
        manager.stop_and_wait()


def assert_passes(test) -> None:
    """Run ``test(case)`` as a unittest test case; fail with its errors unless it passed."""
    result = run_case(test)
    assert result.wasSuccessful(), details(result)


def program_of(name: str, **nodes) -> lp.Program:
    """``lp.Program(name)`` with each node added under its keyword as the label."""
    program = lp.Program(name)
    for label, node in nodes.items():
        program.add_node(node, label)
    return program


def run_case(method):
    """Run ``method`` as a unittest test case (cleanups included); the result."""
    case_type = type("Case", (unittest.TestCase,), {"test": method})
    result = unittest.TestResult()
    case_type("test").run(result)
    return result


def details(result):
    return "".join(text for _, text in result.errors + result.failures)


# -- the program (any object with the node methods is a node) ---------------------------


def test_program_takes_mock_nodes_groups_and_duplicates():
    program = lp.Program("foo")
    foo, bar = mock.Mock(), mock.Mock()
    program.add_node(foo, "foo")
    program.add_node(bar, "bar")
    with program.group("baz"):
        baz = [mock.Mock(), mock.Mock()]
        for node in baz:
            program.add_node(node)
    with program.group("bar"):
        program.add_node(foo)  # the same node under a second label
    assert program.groups["foo"] == [foo]
    assert program.groups["bar"] == [bar, foo]
    assert program.groups["baz"] == baz
    assert program.get_all_nodes() == [foo, bar, foo, *baz]


def test_program_label_errors():
    program = lp.Program("foo")
    with pytest.raises(ValueError, match="Label should not be empty."):
        program.add_node(mock.Mock())
    with pytest.raises(ValueError, match="Label should not be empty."):
        program.add_node(mock.Mock(), label="")
    with pytest.raises(ValueError, match="Label should not be empty."):
        with program.group(""):
            program.add_node(mock.Mock())
    with pytest.raises(ValueError, match="label does not match the current group"):
        with program.group("foo"):
            program.add_node(mock.Mock(), label="bar")
    with program.group("foo"):
        program.add_node(mock.Mock(), label="foo")
    with pytest.raises(ValueError, match=r"group\(\) cannot be nested."):
        with program.group("foo"):
            with program.group("bar"):
                pass


def test_a_node_without_the_node_methods_is_refused_by_name():
    class HalfNode:
        def create_handle(self):
            return None

    with pytest.raises(TypeError, match=r"got HalfNode, which has no run\(\)"):
        lp.Program("p").add_node(HalfNode(), "x")


class _Flag:
    """A node of another library: Launchpad's node methods, no shmpad base class."""

    def __init__(self, path):
        self._path = path
        self.addresses = []

    def create_handle(self):
        return "a handle of another library"

    def run(self):
        Path(self._path).write_text("ran")


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_a_duck_typed_node_runs(launch_type, run, tmp_path):
    program = lp.Program("duck")
    node = _Flag(tmp_path / "flag")
    assert program.add_node(node, "duck") == "a handle of another library"
    run(program, launch_type).wait()
    assert (tmp_path / "flag").read_text() == "ran"


def _count(path):
    with open(path, "a") as f:
        f.write("x")


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_a_node_added_twice_runs_twice(launch_type, run, tmp_path):
    program = lp.Program("twice")
    node = lp.PyNode(_count, str(tmp_path / "count"))
    program.add_node(node, "a")
    program.add_node(node, "b")
    run(program, launch_type).wait()
    assert (tmp_path / "count").read_text() == "xx"


# -- courier nodes ---------------------------------------------------------------------


class OwnsItsServer:
    """Starts its server itself, and stops it once pinged and called."""

    def __init__(self):
        self._server = None
        self._pinged = threading.Event()
        self._called = threading.Event()

    def set_courier_server(self, server):
        self._server = server

    def ping(self):
        self._pinged.set()
        return "pong"

    def __call__(self):
        self._called.set()
        return "called"

    def run(self):
        self._server.Start()
        self._pinged.wait()
        self._called.wait()
        self._server.Stop()


def _ping_pong(server):
    assert server.futures.ping().result() == "pong"
    assert server.ping() == "pong"
    assert server.futures().result() == "called"
    assert server() == "called"


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_a_courier_object_that_owns_its_server(launch_type, run):
    program = lp.Program("owner")
    server = program.add_node(lp.CourierNode(OwnsItsServer, courier_client_kwargs={"call_timeout": 30}), "server")
    program.add_node(lp.PyNode(_ping_pong, server), "client")
    manager = run(program, launch_type)
    manager.wait()  # the server node ends once its run() stopped the server
    assert manager.failure is None


def test_the_server_given_to_the_object_starts_once():
    seen = []

    class Keeps:
        def set_courier_server(self, server):
            seen.append(server)

        def run(self):
            server = seen[0]
            assert not server.has_started
            with pytest.raises(ValueError, match="Server not started yet"):
                server.Stop()
            server.Start()
            with pytest.raises(ValueError, match="Server already started"):
                server.Start()
            server.Stop()
            server.Join()

    program = program_of("once", server=lp.CourierNode(Keeps))
    manager = lp.launch(program, launch_type="test_mt")
    manager.wait()
    assert manager.failure is None and len(seen) == 1


class Slow:
    def ping_slow(self):
        time.sleep(2)  # the slow work a deadline cuts short
        return "pong"


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_call_timeout_as_a_timedelta_exceeds_the_deadline(launch_type, run):
    program = lp.Program("deadline")
    node = lp.CourierNode(Slow, courier_client_kwargs={"call_timeout": datetime.timedelta(milliseconds=50)})
    handle = program.add_node(node, "slow")
    run(program, launch_type)
    client = handle.dereference()
    try:
        with pytest.raises(lp.Timeout, match="Deadline Exceeded") as caught:
            client.ping_slow()
        assert isinstance(caught.value, TimeoutError)
    finally:
        client.close()


def test_set_client_kwargs_takes_a_timedelta(run):
    program = lp.Program("deadline")
    handle = program.add_node(lp.CourierNode(Slow), "slow")
    handle.set_client_kwargs(call_timeout=datetime.timedelta(milliseconds=50))
    run(program, "test_mt")
    client = handle.dereference()
    try:
        assert client.call_timeout == pytest.approx(0.05)
        with pytest.raises(TimeoutError, match="Deadline Exceeded"):
            client.ping_slow()
    finally:
        client.close()
    with pytest.raises(ValueError, match="call_timeout must be > 0 or None, got datetime.timedelta\\(0\\)"):
        handle.set_client_kwargs(call_timeout=datetime.timedelta(0))
    with pytest.raises(TypeError, match="call_timeout must be a number of seconds, a timedelta or None, got str"):
        lp.CourierNode(Slow, courier_client_kwargs={"call_timeout": "1s"})


def _foo(bar):
    return bar


def _bar(foo):
    return foo


def test_configure_makes_cyclic_references():
    foo_node, bar_node = lp.CourierNode(_foo), lp.CourierNode(_bar)
    foo_handle, bar_handle = foo_node.create_handle(), bar_node.create_handle()
    assert foo_handle not in bar_node._input_handles
    assert bar_handle not in foo_node._input_handles
    foo_node.configure(bar=bar_handle)
    bar_node.configure(foo=foo_handle)
    assert foo_handle in bar_node._input_handles
    assert bar_handle in foo_node._input_handles
    assert foo_handle in foo_node._created_handles


class Peer:
    def __init__(self, name, other=None):
        self._name, self._other = name, other

    def name(self):
        return self._name

    def others_name(self):
        return self._other.name()


def _ask_both(a, b):
    assert a.others_name() == "b" and b.others_name() == "a"


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_nodes_configured_with_each_others_handles_call_each_other(launch_type, run):
    a_node, b_node = lp.CourierNode(Peer, "a"), lp.CourierNode(Peer, "b")
    a, b = a_node.create_handle(), b_node.create_handle()
    a_node.configure("a", other=b)
    b_node.configure("b", other=a)
    program = program_of("cycle", a=a_node, b=b_node, asker=lp.PyNode(_ask_both, a, b))
    manager = run(program, launch_type)
    manager.wait(["asker"])
    assert manager.failure is None


# -- addresses -------------------------------------------------------------------------


def test_addresses_and_ports():
    assert lp.get_port_from_address("localhost:8123") == 8123
    with mock.patch.dict(os.environ, {"LP_PORT_courier": "9001"}):
        assert lp.get_port_from_address("somehost:courier") == 9001
    with pytest.raises(TypeError, match="address name must be a str or None, got int"):
        lp.Address(7)
    with pytest.raises(ValueError, match="Wrong address name"):
        lp.Address("Bad-Name")
    address = lp.Address()
    with pytest.raises(RuntimeError, match="not assigned to any node"):
        address.resolve()
    node = lp.PyNode(print)
    node.allocate_address(address)
    assert node.addresses == [address]
    with pytest.raises(RuntimeError, match="not bound yet"):
        address.resolve()
    with pytest.raises(ValueError, match="already assigned"):
        address.assign(lp.PyNode(print))
    address.bind(lp.SimpleLocalAddressBuilder())
    assert address.resolve().startswith("localhost:")


def _serve_once(address, got):
    with socket.create_server(("127.0.0.1", lp.get_port_from_address(address.resolve()))) as srv:
        got.set()
        conn, _ = srv.accept()
        with conn:
            conn.sendall(conn.recv(16).upper())
        lp.wait_for_stop()


def _ping_once(address, listening):
    listening.wait()
    with socket.create_connection(("127.0.0.1", lp.get_port_from_address(address.resolve()))) as s:
        s.sendall(b"ping")
        assert s.recv(16) == b"PING"
    lp.stop()


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_a_node_serves_on_its_allocated_address(launch_type, run):
    address = lp.Address()
    listening = threading.Event()  # shared by the colocated threads
    server = lp.PyNode(_serve_once, address, listening)
    server.allocate_address(address)
    program = program_of(
        "address", both=lp.MultiThreadingColocation([lp.PyNode(_ping_once, address, listening), server])
    )
    manager = run(program, launch_type)
    manager.wait()
    assert manager.failure is None


# -- stopping, waiting, failures -----------------------------------------------------------


def _wait_for_stop():
    lp.wait_for_stop()


def _wait_on_stop_event():
    lp.stop_event().wait()


def _stop():
    lp.stop()


def _call(stopper):
    stopper()


def _fail():
    raise RuntimeError("Launchpad has stopped working")


def _noop():
    pass


def _check_timeouts():
    assert lp.wait_for_stop(0) is False
    assert lp.wait_for_stop(0.05) is False
    lp.stop()
    assert lp.wait_for_stop(10) is True


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_make_program_stopper_stops_the_program(launch_type, run):
    program = program_of(
        "stopper",
        block=lp.PyNode(_wait_for_stop),
        event=lp.PyNode(_wait_on_stop_event),
        stop=lp.PyNode(_call, lp.make_program_stopper(launch_type)),
    )
    manager = run(program, launch_type)
    manager.wait()
    assert manager.failure is None


def test_make_program_stopper_refuses_unknown_launch_types():
    with pytest.raises(ValueError, match="got 'vertex_ai'"):
        lp.make_program_stopper("vertex_ai")


def _report_context(path, stopper):
    """Write what Launchpad's ``lp.context.get_context()`` says of this node, then stop the
    program with ``stopper`` (None: the context's own ``program_stopper``)."""
    ctx = lp.context.get_context()
    config = ctx.launch_config
    Path(path).write_text(f"{ctx.launch_type.name} {None if config is None else config.env['WHERE']}")
    (stopper or ctx.program_stopper)()


@pytest.mark.parametrize("stopper", ["make_program_stopper", "program_stopper"])
@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_the_context_module_as_launchpad_programs_write_it(launch_type, stopper, run, tmp_path):
    # lp.context is Launchpad's module: its LaunchType (the one lp exports), make_program_stopper
    # given one of its members, and get_context() in a node
    assert lp.context.LaunchType is lp.LaunchType
    report = tmp_path / "context"
    given = (
        lp.make_program_stopper(lp.context.LaunchType.TEST_MULTI_PROCESSING)
        if stopper == "make_program_stopper"
        else None
    )
    program = program_of(
        "context", block=lp.PyNode(_wait_for_stop), report=lp.PyNode(_report_context, str(report), given)
    )
    resources = {"report": lp.PythonProcess(env={"WHERE": "forked"})}
    manager = run(program, launch_type, local_resources=resources)
    manager.wait()
    assert manager.failure is None
    # the group's PythonProcess is the launch config of a forked node; a node that is a thread has none
    config = "forked" if launch_type in ("local_mp", "test_mp") else None
    assert report.read_text() == f"{lp.LaunchType(launch_type).name} {config}"


def test_get_context_outside_a_program_says_what_it_needs():
    with pytest.raises(RuntimeError, match=r"shmpad\.context\.get_context\(\) needs a launched program"):
        lp.context.get_context()


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_wait_for_stop_with_timeouts(launch_type, run):
    program = program_of("timeouts", check=lp.PyNode(_check_timeouts))
    manager = run(program, launch_type)
    manager.wait()
    assert manager.failure is None


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_stop_from_a_colocation_and_a_nested_one(launch_type, run):
    program = lp.Program("stop")
    inner = lp.MultiThreadingColocation([lp.PyNode(_wait_for_stop), lp.PyNode(_stop)])
    program.add_node(lp.MultiThreadingColocation([lp.PyNode(_wait_for_stop), inner]), "node")
    program.add_node(lp.MultiThreadingColocation([lp.PyNode(_wait_for_stop), lp.PyNode(_wait_on_stop_event)]), "other")
    manager = run(program, launch_type)
    manager.wait()
    assert manager.failure is None


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_colocation_first_completed_and_all_completed(launch_type, run, tmp_path):
    release = tmp_path / "release"

    def slow(flag):
        while not os.path.exists(release):
            if lp.wait_for_stop(0.01):
                return
        Path(flag).write_text("done")

    program = lp.Program("completed")
    first = lp.MultiThreadingColocation(
        [lp.PyNode(_count, str(tmp_path / "quick")), lp.PyNode(slow, str(tmp_path / "slow"))],
        return_on_first_completed=True,
    )
    program.add_node(first, "first")
    program.add_node(lp.MultiThreadingColocation([lp.PyNode(_noop), lp.PyNode(_noop)]), "all")
    manager = run(program, launch_type)
    manager.wait(["first", "all"])  # the first colocation returned once its quick node did
    assert (tmp_path / "quick").read_text() == "x"
    assert not (tmp_path / "slow").exists()


@pytest.mark.parametrize(
    "failing",
    [
        lambda: lp.PyNode(_fail),
        lambda: lp.MultiThreadingColocation([lp.PyNode(_fail), lp.PyNode(_wait_for_stop)]),
    ],
    ids=["node", "colocated"],
)
@pytest.mark.parametrize("launch_type", TEST_TYPES)
def test_a_failure_raised_by_wait_is_not_raised_again_at_cleanup(launch_type, failing):
    """A node's failure (also from inside a colocation) reaches the test once: from wait()."""

    def test(case):
        program = program_of("fails", run=failing())
        with case.assertRaisesRegex(RuntimeError, "Launchpad has stopped working"):
            lp.launch(program, launch_type=launch_type, test_case=case).wait()

    assert_passes(test)


@pytest.mark.parametrize("launch_type", TEST_TYPES)
def test_a_failure_in_another_group_is_raised_by_wait_for_some_once(launch_type):
    def test(case):
        program = program_of("fails", main=lp.PyNode(_wait_for_stop), daemon=lp.PyNode(_fail))
        manager = lp.launch(program, launch_type=launch_type, test_case=case)
        with case.assertRaises(RuntimeError):
            manager.wait(["main"])
        manager.wait()  # raised once already

    assert_passes(test)


@pytest.mark.parametrize("launch_type", TEST_TYPES)
def test_a_failure_nobody_waited_for_fails_the_test_at_cleanup(launch_type):
    def test(case):
        program = program_of("fails", run=lp.PyNode(_fail))
        manager = lp.launch(program, launch_type=launch_type, test_case=case)
        manager.wait(raise_error=False)

    result = run_case(test)
    assert len(result.errors) == 1 and "Launchpad has stopped working" in details(result)


@pytest.mark.parametrize("launch_type", TEST_TYPES)
def test_wait_raise_error_false_then_wait_raises(launch_type):
    def test(case):
        program = program_of("fails", failure=lp.PyNode(_fail))
        manager = lp.launch(program, launch_type=launch_type, test_case=case)
        manager.wait(raise_error=False)
        with case.assertRaisesRegex(RuntimeError, "Launchpad has stopped working"):
            manager.wait()

    assert_passes(test)


@pytest.mark.parametrize("launch_type", TEST_TYPES)
def test_cleanup_stops_a_blocking_program_and_waits_only_for_named_groups(launch_type):
    def test(case):
        program = program_of("cleanup", main=lp.PyNode(_noop))
        with program.group("daemon"):
            for _ in range(2):
                program.add_node(lp.PyNode(_wait_for_stop))
        manager = lp.launch(program, launch_type=launch_type, test_case=case)
        manager.wait(["main"])
        case.assertEqual(sorted(manager.exit_codes()), ["daemon/0", "daemon/1", "main/0"])
        case.assertFalse(manager.stop_event().is_set())

    assert_passes(test)


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_return_on_first_completed(launch_type, run):
    program = program_of("first", waiter=lp.PyNode(_wait_for_stop), worker=lp.PyNode(_noop))
    manager = run(program, launch_type)
    manager.wait(return_on_first_completed=True)
    assert not manager.stop_event().is_set()


# -- the launch type and the flags ---------------------------------------------------------


def test_launch_type_helpers_and_flags():
    from absl import flags

    assert lp.is_local_launch("local_mt") and lp.is_local_launch(lp.LaunchType.LOCAL_MULTI_PROCESSING)
    assert not lp.is_local_launch("test_mt")
    assert all(lp.is_local_launch_or_test(t) for t in ALL_TYPES)
    with pytest.raises(ValueError, match="unknown launch type 'vertex_ai'"):
        lp.is_local_launch("vertex_ai")
    fl = flags.FLAGS
    assert fl["lp_launch_type"].default == "local_mp"
    assert fl["lp_termination_notice_secs"].default == 10
    assert fl["lp_worker_manager_v2"].default is False
    assert fl["tmux_open_window"].default is None
    assert fl["tmux_session_name"].default == "launchpad"
    assert lp.LAUNCH_TYPE.name == "lp_launch_type"


def test_importing_twice_does_not_define_the_flags_twice():
    from shmpad.launch import flags as lp_flags

    assert lp_flags._define().name == "lp_launch_type"


# -- the examples ---------------------------------------------------------------------------


def _example(name, *args, timeout=90):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = start_session(
        [sys.executable, str(ROOT / "tests" / "lp_examples" / f"{name}.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out, err


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_example_hello_world(launch_type):
    code, out, err = _example("hello_world", f"--lp_launch_type={launch_type}")
    assert code == 0, err
    if launch_type.startswith("local"):  # the test types do not wait for the program at exit
        assert "Hello from a node" in out


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_example_consumer_producers(launch_type):
    code, out, err = _example("consumer_producers", f"--lp_launch_type={launch_type}", "--producers=2")
    assert code == 0, err
    # rounds r = 0..4 over producers i = 0, 1: sum of (r + i)^2
    assert f"consumer total {sum((r + i) ** 2 for r in range(5) for i in range(2))}" in out
    assert out.rstrip().endswith("program finished")


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_example_program_wait(launch_type):
    code, out, err = _example("program_wait", "--lp_launch_type", launch_type)
    assert code == 0, err
    for name in ("poll_for_stop", "block_for_stop", "stop_event", "stop_handler"):
        assert f"clean end: {name}" in out
    assert out.rstrip().endswith("program finished")


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_example_batching(launch_type):
    code, out, err = _example("batching", f"--lp_launch_type={launch_type}", "--num_clients=3", "--calls=10")
    assert code == 0, err
    # the server's running sum after every call of [x, x + 1], x = client .. client + 9, however batched
    total = [sum(x for c in range(3) for x in range(c, c + 10)), sum(x + 1 for c in range(3) for x in range(c, c + 10))]
    lasts = [line.split(" last result ")[1] for line in out.splitlines() if " last result " in line]
    assert len(lasts) == 3 and str(total) in lasts, out
    assert out.rstrip().endswith("program finished")


def test_example_with_an_unknown_flag_fails_as_absl_does():
    code, _, err = _example("hello_world", "--lp_no_such_flag=1")
    assert code == 1 and "Unknown command line flag 'lp_no_such_flag'" in err


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_consumer_steps_called_from_the_test(launch_type, run):
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from lp_examples.consumer_producers import make_program
    finally:
        sys.path.remove(str(ROOT / "tests"))
    program = make_program(producers=2, rounds=1)
    (consumer_node,) = program.groups["consumer"]
    consumer_node.disable_run()
    run(program, launch_type)
    consumer = consumer_node.create_handle().dereference()
    try:
        for r in range(10):
            assert consumer.step(r) == [r * r, (r + 1) * (r + 1)]
    finally:
        consumer.close()
