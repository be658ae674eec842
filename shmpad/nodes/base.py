"""Nodes and handles: the vertices of a program and the edges between them.

A handle is what ``Program.add_node`` returns. Passed (anywhere inside lists,
tuples, namedtuples and dicts) in another node's arguments, it is replaced by
``handle.dereference()`` in that node's own process before the node runs: a
courier handle becomes an RPC client, a ring handle the attached ring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

__all__ = [
    "Handle",
    "Node",
    "Dereferenced",
    "map_handles",
    "collect_handles",
    "as_node",
    "check_node",
    "not_launched",
]


def not_launched(node: str, what: str) -> RuntimeError:
    """The error of a handle dereferenced before the program that holds its node was
    launched: ``node`` (as the message names it) has no ``what`` yet."""
    return RuntimeError(
        f"{node} has no {what} yet: its handle can be dereferenced only once the program "
        "that holds the node is launched (shmpad.launch.launcher)"
    )


class Handle:
    """A reference to a node, dereferenced in the process that uses it."""

    def dereference(self) -> Any:
        raise NotImplementedError

    def connect(self, node: "Node", label: str) -> None:
        """Called by the launcher for each node whose arguments hold this handle."""

    def release(self, dereferenced: Any) -> None:
        """Free what ``dereference`` made, once the node that got it has ended."""


class Node:
    """Base of every node. The launcher calls, in the launching process: ``allocate``
    (create shared resources, before any node starts), ``on_stop`` (the program is
    stopping) and ``release`` (it has ended); and ``run`` in the node's own process
    or thread. Nodes whose ``RUNS`` is False (rings, weight stores) have no worker."""

    RUNS = True

    def __init__(self) -> None:
        self._input_handles: list[Handle] = []  # handles this node uses
        self._created_handles: list[Handle] = []  # handles made by create_handle
        self.addresses: list = []  # shmpad.nodes.address.Address objects bound at launch

    def _track_handle(self, handle: Handle) -> Handle:
        """Remember ``handle`` as one of this node's (Launchpad's nodes call it in
        ``create_handle``); returns it."""
        self._created_handles.append(handle)
        return handle

    def allocate_address(self, address: Any) -> None:
        """Make this node the owner of ``address`` (a ``shmpad.Address``), bound at launch."""
        address.assign(self)

    @property
    def input_handles(self) -> list[Handle]:
        return list(self._input_handles)

    def create_handle(self) -> Handle:
        raise NotImplementedError

    def inner_nodes(self) -> list["Node"]:
        """Nodes held by this one (colocation)."""
        return []

    def allocate(self) -> None:
        """Create what other nodes reach through handles, before anything runs."""

    def run(self) -> None:
        raise NotImplementedError

    def on_stop(self) -> None:
        """The program is stopping: wake whoever waits on this node's resources."""

    def free(self) -> None:
        """The program has ended, or its launch failed half-way: remove this node's resources."""

    def _registry_entry(self) -> tuple[str, dict[str, str]] | None:
        """Once allocated, what ``shmpad.top`` can read of this node's shared memory:
        ``("rings" | "weights" | "rpc", {"segment": name, ...})``, or None."""
        return None


# What shmpad calls on a node that is not one of its own (Launchpad's node protocol)
_PROTOCOL = ("create_handle", "run")


def check_node(node: Any) -> None:
    """``TypeError`` unless ``node`` is a shmpad node or has Launchpad's node methods."""
    if isinstance(node, Node):
        return
    missing = [m for m in _PROTOCOL if not callable(getattr(node, m, None))]
    if missing:
        raise TypeError(
            "add_node() takes a shmpad node (PyNode, CourierNode, ...) or an object with Launchpad's node methods "
            f"create_handle() and run(); got {type(node).__name__}, which has no {', '.join(m + '()' for m in missing)}"
        )


class _ForeignNode(Node):
    """A node that is not a shmpad ``Node`` but has ``create_handle()`` and ``run()``: the
    launcher runs it through this, with the hooks it does not have doing nothing."""

    def __init__(self, node: Any):
        super().__init__()
        self.node = node
        self._input_handles = [h for h in getattr(node, "_input_handles", None) or () if isinstance(h, Handle)]
        self.addresses = getattr(node, "addresses", None) or []

    def create_handle(self) -> Any:
        return self.node.create_handle()

    def run(self) -> None:
        self.node.run()

    def __repr__(self) -> str:
        return repr(self.node)


def as_node(node: Any) -> Node:
    """``node`` itself if it is a shmpad node, else what runs it (see ``check_node``)."""
    return node if isinstance(node, Node) else _ForeignNode(node)


def map_handles(fn: Callable[[Handle], Any], obj: Any) -> Any:
    """``obj`` with every handle ``h`` inside lists, tuples, namedtuples and dicts
    replaced by ``fn(h)``; other objects are leaves and are kept as they are."""
    if isinstance(obj, Handle):
        return fn(obj)
    if isinstance(obj, list):
        return (
            type(obj)(map_handles(fn, x) for x in obj) if type(obj) is not list else [map_handles(fn, x) for x in obj]
        )
    if isinstance(obj, tuple):
        items = [map_handles(fn, x) for x in obj]
        if hasattr(type(obj), "_fields"):  # namedtuple
            return type(obj)(*items)
        return tuple(items) if type(obj) is tuple else type(obj)(items)
    if isinstance(obj, Mapping):
        if type(obj) is dict:
            return {k: map_handles(fn, v) for k, v in obj.items()}
        try:
            out = obj.copy()
            for k, v in obj.items():
                out[k] = map_handles(fn, v)
            return out
        except (AttributeError, TypeError):
            return obj  # a read-only mapping: a leaf
    return obj


def collect_handles(obj: Any) -> list[Handle]:
    """Every handle ``map_handles`` would visit in ``obj``."""
    found: list[Handle] = []

    def visit(h: Handle) -> Handle:
        found.append(h)
        return h

    map_handles(visit, obj)
    return found


class Dereferenced:
    """``with Dereferenced(obj) as value:`` -- ``obj`` with its handles dereferenced;
    what they made (RPC clients and their reply rings) is freed on exit."""

    def __init__(self, obj: Any):
        self._made: list[tuple[Handle, Any]] = []

        def deref(h: Handle) -> Any:
            value = h.dereference()
            self._made.append((h, value))
            return value

        try:
            self.value = map_handles(deref, obj)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        made, self._made = self._made, []
        for handle, value in made:
            handle.release(value)

    def __enter__(self) -> Any:
        return self.value

    def __exit__(self, *exc) -> None:
        self.close()
