"""``Program``: a graph of nodes grouped by label; handles returned by ``add_node``
are its edges."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, Iterator

from shmpad.nodes.base import Handle, Node, check_node

__all__ = ["Program"]


class Program:
    """A named set of nodes, grouped by label in insertion order."""

    def __init__(self, name: str):
        if not isinstance(name, str):
            raise TypeError(f"program name must be a str, got {type(name).__name__}")
        self.name = name
        self._groups: dict[str, list[Node]] = {}
        self._current_group: str | None = None

    @property
    def groups(self) -> dict[str, list[Node]]:
        """Label -> the nodes added under it, in order (the program's own dict)."""
        return self._groups

    def add_node(self, node: Any, label: str | None = None) -> Handle:
        """Add ``node`` under ``label`` (or under the current group's label) and return
        a handle to it: pass the handle to other nodes to connect them. As in Launchpad,
        a node added twice runs twice. ``node`` is a shmpad node or any object with
        Launchpad's node methods ``create_handle()`` and ``run()``."""
        check_node(node)
        if self._current_group:
            if label and label != self._current_group:
                raise ValueError(f"The given label does not match the current group: {label} vs {self._current_group}.")
            label = self._current_group
        elif not label:
            raise ValueError("Label should not be empty.")
        if not isinstance(label, str):
            raise TypeError(f"label must be a str, got {type(label).__name__}")
        if "/" in label:
            raise ValueError(f"label must not contain '/', got {label!r}")
        self._groups.setdefault(label, []).append(node)
        return node.create_handle()

    @contextlib.contextmanager
    def group(self, label: str) -> Iterator[None]:
        """Nodes added inside ``with program.group(label):`` get ``label``."""
        if not label:
            raise ValueError("Label should not be empty.")
        if self._current_group:
            raise ValueError("group() cannot be nested.")
        self._current_group = label
        try:
            yield
        finally:
            self._current_group = None

    def get_all_nodes(self) -> list[Node]:
        return list(itertools.chain(*self._groups.values()))

    def __repr__(self) -> str:
        return f"Program({self.name!r}, groups={ {k: len(v) for k, v in self._groups.items()} })"
