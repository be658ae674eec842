"""Nodes and handles: the vertices of a program and the edges between them.

A handle is what ``Program.add_node`` returns. Passed (anywhere inside lists,
tuples, namedtuples and dicts) in another node's arguments, it is replaced by
``handle.dereference()`` in that node's own process before the node runs: a
courier handle becomes an RPC client, a ring handle the attached ring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

__all__ = ["Handle", "Node", "Dereferenced", "map_handles", "collect_handles"]


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
        self._input_handles: list[Handle] = []

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
