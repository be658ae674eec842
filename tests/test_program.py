"""Program rules (Launchpad's program_test, with its exact messages), handles and
their dereferencing, and node construction errors."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import shmpad as lp
from shmpad.nodes.base import collect_handles, map_handles


def noop():
    pass


def test_add_node():
    program = lp.Program("test_program")
    n, m = lp.PyNode(noop), lp.PyNode(noop)
    program.add_node(n, "foo")
    program.add_node(m, "bar")
    assert program.groups["foo"] == [n]
    assert program.groups["bar"] == [m]


def test_add_nodes_to_group():
    program = lp.Program("test_program")
    nodes_foo = [lp.PyNode(noop), lp.PyNode(noop)]
    with program.group("foo"):
        for node in nodes_foo:
            program.add_node(node)
    nodes_bar = [lp.PyNode(noop), lp.PyNode(noop)]
    with program.group("bar"):
        for node in nodes_bar:
            program.add_node(node)
    assert program.groups["foo"] == nodes_foo
    assert program.groups["bar"] == nodes_bar


@pytest.mark.parametrize("label", [None, ""])
def test_add_node_without_label(label):
    program = lp.Program("test_program")
    with pytest.raises(ValueError, match="^Label should not be empty.$"):
        program.add_node(lp.PyNode(noop), label)


def test_add_group_with_empty_label():
    program = lp.Program("test_program")
    with pytest.raises(ValueError, match="^Label should not be empty.$"):
        with program.group(""):
            pass


def test_use_label_in_node_and_group():
    program = lp.Program("test_program")
    with pytest.raises(ValueError, match="^The given label does not match the current group: bar vs foo.$"):
        with program.group("foo"):
            program.add_node(lp.PyNode(noop), "bar")
    with program.group("foo"):
        program.add_node(lp.PyNode(noop), "foo")
    assert len(program.groups["foo"]) == 1


def test_nested_groups():
    program = lp.Program("test_program")
    with pytest.raises(ValueError, match=r"^group\(\) cannot be nested.$"):
        with program.group("foo"):
            with program.group("bar"):
                pass
    with program.group("baz"):  # the failed nesting left no group open
        program.add_node(lp.PyNode(noop))


def test_duplicated_label():
    program = lp.Program("test_program")
    node1, node2 = lp.PyNode(noop), lp.PyNode(noop)
    program.add_node(node1, "foo")
    program.add_node(node2, "foo")
    node3, node4 = lp.PyNode(noop), lp.PyNode(noop)
    with program.group("bar"):
        program.add_node(node3)
    with program.group("bar"):
        program.add_node(node4)
    assert program.groups["foo"] == [node1, node2]
    assert program.groups["bar"] == [node3, node4]


def test_get_all_nodes():
    program = lp.Program("test_program")
    nodes = [lp.PyNode(noop) for _ in range(3)]
    program.add_node(nodes[0], "foo")
    with program.group("bar"):
        program.add_node(nodes[1])
        program.add_node(nodes[2])
    assert program.get_all_nodes() == nodes


def test_bad_nodes_and_labels():
    program = lp.Program("p")
    with pytest.raises(TypeError, match="add_node\\(\\) takes a shmpad node .* got function"):
        program.add_node(noop, "x")
    with pytest.raises(ValueError, match="label must not contain '/', got 'a/b'"):
        program.add_node(lp.PyNode(noop), "a/b")
    with pytest.raises(TypeError, match="got object, which has no create_handle\\(\\), run\\(\\)"):
        program.add_node(object(), "x")
    with pytest.raises(TypeError, match="PyNode needs a callable, got int"):
        lp.PyNode(3)
    with pytest.raises(TypeError, match="program name must be a str, got int"):
        lp.Program(3)


class _Leaf(lp.Handle):
    def __init__(self, value):
        self.value = value

    def dereference(self):
        return ("deref", self.value)


def test_handles_are_found_and_replaced_in_nested_structures():
    Point = collections.namedtuple("Point", "x y")
    a, b, c, d, e = (_Leaf(i) for i in range(5))
    s = {1, 2}
    arr = np.arange(3)
    structure = ([a, (b, Point(c, 7))], {"k": {"kk": [d]}, "arr": arr}, collections.OrderedDict(z=e), s, "text")
    assert collect_handles(structure) == [a, b, c, d, e]
    out = map_handles(lambda h: h.dereference(), structure)
    assert out[0] == [("deref", 0), (("deref", 1), Point(("deref", 2), 7))]
    assert isinstance(out[0][1][1], Point)
    assert out[1]["k"] == {"kk": [("deref", 3)]}
    assert out[1]["arr"] is arr
    assert out[2] == collections.OrderedDict(z=("deref", 4)) and type(out[2]) is collections.OrderedDict
    assert out[3] is s and out[4] == "text"
    assert structure[0][0] is a  # the original is untouched


def test_pynode_collects_input_handles():
    program = lp.Program("p")
    server = program.add_node(lp.CourierNode(dict), "server")
    node = lp.PyNode(noop, [server], key={"s": server})
    assert node.input_handles == [server, server]
    cls_node = lp.PyClassNode(dict, a=server)
    assert cls_node.input_handles == [server]


def test_pynode_handle_cannot_be_dereferenced():
    program = lp.Program("p")
    handle = program.add_node(lp.PyNode(noop), "worker")
    with pytest.raises(NotImplementedError, match="a PyNode's handle cannot be dereferenced"):
        handle.dereference()


def test_courier_handle_errors_before_launch_and_without_dereference():
    program = lp.Program("p")
    handle = program.add_node(lp.CourierNode(dict), "server")
    with pytest.raises(RuntimeError, match="has no address yet: its handle can be dereferenced only once the program"):
        handle.dereference()
    with pytest.raises(
        AttributeError, match="'CourierHandle' object has no attribute 'ping': call methods on a client"
    ):
        handle.ping()
    with pytest.raises(TypeError, match=r"unknown client option\(s\) \['timeout'\]: allowed: \['call_timeout'\]"):
        handle.set_client_kwargs(timeout=1)
    with pytest.raises(TypeError, match=r"unknown courier_kwargs \['port'\]: allowed: \['thread_pool_size'\]"):
        lp.CourierNode(dict, courier_kwargs={"port": 1})


def test_ring_node_arguments_are_checked_at_construction():
    with pytest.raises(ValueError, match="RingNode needs a spec .* or a slot_size .*, got neither"):
        lp.RingNode(8)
    with pytest.raises(ValueError, match="not both"):
        lp.RingNode(8, spec={"x": (np.float32, (2,))}, slot_size=64)
    with pytest.raises(ValueError, match="capacity"):
        lp.RingNode(0, slot_size=64)
    program = lp.Program("p")
    handle = program.add_node(lp.RingNode(8, slot_size=64), "queue")
    with pytest.raises(RuntimeError, match="has no shared memory yet"):
        handle.dereference()


def test_launch_argument_errors():
    program = lp.Program("p")
    program.add_node(lp.PyNode(noop), "a")
    with pytest.raises(
        ValueError, match=r"unknown launch type 'local_xx': allowed: \['local_mt', 'local_mp', 'test_mt', 'test_mp'\]"
    ):
        lp.launch(program, launch_type="local_xx")
    with pytest.raises(
        ValueError, match="local_resources names group 'b', which the program does not have; groups: \\['a'\\]"
    ):
        lp.launch(program, launch_type="test_mt", local_resources={"b": lp.PythonProcess()})
    with pytest.raises(ValueError, match="Launch config for a must be a PythonProcess, got dict"):
        lp.launch(program, launch_type="test_mt", local_resources={"a": {}})
    with pytest.raises(TypeError, match="launch\\(\\) takes a Program, got str"):
        lp.launch("program")


def test_stop_api_outside_a_program():
    with pytest.raises(RuntimeError, match=r"shmpad.stop\(\) needs a launched program"):
        lp.stop()
    with pytest.raises(RuntimeError, match=r"shmpad.wait_for_stop\(\) needs a launched program"):
        lp.wait_for_stop(0)
