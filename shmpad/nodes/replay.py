"""``ReplayNode``: replay tables (``shmpad.replay``) as a node, shmpad's ``ReverbNode``.

The launcher calls ``tables_fn()`` before any node starts: the tables it returns live
in shared memory, owned by the launching process, and are loaded from
``checkpoint_dir`` when a checkpoint of them is there. A node given the handle gets a
``ReplayClient`` that attaches every table in its own process: its inserts and samples
touch the shared memory directly, with no server on the way. A seeded table's client
draws a stream of its own, named by its node (``learner/0``), so that a node's samples
are the same every run where what it inserts and when are. With
``checkpoint_minutes`` the node runs, checkpointing every table that often and once
more when the program stops. When the program stops, the tables close (a call waiting
on a rate limiter raises ``Closed``); they are removed when it has ended.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from shmpad._checks import check_number, type_name
from shmpad.context import current_or_none, wait_for_stop
from shmpad.nodes.base import Handle, Node, not_launched
from shmpad.replay import SampleBatch, Table, TableInfo, Writer

__all__ = ["ReplayNode", "ReplayClient"]


class ReplayClient:
    """A node's view of a ``ReplayNode``'s tables, by name."""

    def __init__(
        self, segments: Mapping[str, str], checkpoint_dir: str | None, seeds: Mapping[str, int | None] | None = None
    ):
        self._segments = dict(segments)
        self._seeds = dict(seeds or {})
        self._tables: dict[str, Table] = {}
        self._checkpoint_dir = checkpoint_dir

    def __reduce__(self):
        return (ReplayClient, (self._segments, self._checkpoint_dir, self._seeds))

    @property
    def tables(self) -> list[str]:
        return list(self._segments)

    def table(self, name: str) -> Table:
        """The ``Table`` called ``name``, attached in this process."""
        t = self._tables.get(name)
        if t is None:
            if not isinstance(name, str):
                raise TypeError(f"table must be a table's name (a str), got {type_name(name)}")
            if name not in self._segments:
                raise ValueError(f"unknown replay table {name!r}: the tables are {sorted(self._segments)}")
            ctx = current_or_none()  # the node this client serves names its stream of draws
            stream = None if ctx is None else ctx.node_name
            t = self._tables[name] = Table.attach(self._segments[name], self._seeds.get(name), stream=stream)
        return t

    def _only_table(self) -> str:
        if len(self._segments) != 1:
            raise ValueError(
                f"this replay node has tables {sorted(self._segments)}: name one (table=...) or give "
                "priorities as a dict of table -> priority"
            )
        return next(iter(self._segments))

    def insert(
        self,
        item: Mapping[str, Any],
        priority: float | Mapping[str, float] = 1.0,
        table: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, int]:
        """Insert ``item`` into ``table`` with ``priority``, or (Reverb's form) into each
        table of a ``{table: priority}`` dict; the key it got in each table. ``timeout``
        bounds each table's wait for its rate limiter."""
        if isinstance(priority, Mapping):
            if table is not None:
                raise ValueError("give priorities as a dict of table -> priority or a table=, not both")
            targets = dict(priority)
        else:
            targets = {self._only_table() if table is None else table: priority}
        return {name: self.table(name).insert(item, p, timeout=timeout) for name, p in targets.items()}

    def writer(self, table: str | None = None) -> Writer:
        """A ``Writer`` of ``table`` (may be left out when the node has one table):
        append steps, ``create_item`` of the last ``T``."""
        return self.table(self._only_table() if table is None else table).writer()

    def sample(self, table: str, batch_size: int, timeout: float | None = None, torch: bool = False) -> SampleBatch:
        return self.table(table).sample(batch_size, timeout=timeout, torch=torch)

    def update_priorities(self, table: str, keys: Any, priorities: Any) -> int:
        return self.table(table).update_priorities(keys, priorities)

    def info(self) -> dict[str, TableInfo]:
        return {name: self.table(name).info() for name in self._segments}

    def checkpoint(self) -> str:
        """Checkpoint every table into the node's ``checkpoint_dir``; the directory."""
        if self._checkpoint_dir is None:
            raise ValueError("this replay node has no checkpoint_dir to checkpoint into")
        return checkpoint_tables([self.table(n) for n in self._segments], self._checkpoint_dir)

    def close(self) -> None:
        for t in self._tables.values():
            t.close()
        self._tables.clear()


def checkpoint_path(checkpoint_dir: str, table: str) -> str:
    return os.path.join(checkpoint_dir, f"{table}.npz")


def checkpoint_tables(tables: list[Table], checkpoint_dir: str) -> str:
    os.makedirs(checkpoint_dir, exist_ok=True)
    for t in tables:
        t.checkpoint(checkpoint_path(checkpoint_dir, t.name))
    return checkpoint_dir


class _ReplayHandle(Handle):
    def __init__(self, node: ReplayNode):
        self._node = node

    def dereference(self) -> ReplayClient:
        return ReplayClient(self._node.segments, self._node.checkpoint_dir, self._node.seeds)

    def release(self, dereferenced: ReplayClient) -> None:
        dereferenced.close()


class ReplayNode(Node):
    """Replay tables made by ``tables_fn()`` (a list of ``shmpad.replay.Table``, with
    distinct names); see the module docstring. The handle dereferences to a
    ``ReplayClient``."""

    def __init__(
        self,
        tables_fn: Callable[[], list[Table]],
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_minutes: float | None = None,
    ):
        super().__init__()
        if not callable(tables_fn):
            raise TypeError(f"tables_fn must be a callable returning a list of Tables, got {type_name(tables_fn)}")
        if checkpoint_minutes is not None:
            checkpoint_minutes = check_number("checkpoint_minutes", checkpoint_minutes, 0.0)
            if checkpoint_minutes <= 0:
                raise ValueError(f"checkpoint_minutes must be > 0 or None, got {checkpoint_minutes}")
            if checkpoint_dir is None:
                raise ValueError("checkpoint_minutes needs a checkpoint_dir to write into")
        self._tables_fn = tables_fn
        self.checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self._every_s = None if checkpoint_minutes is None else 60.0 * checkpoint_minutes
        self.RUNS = checkpoint_minutes is not None
        self._tables: list[Table] | None = None

    def create_handle(self) -> Handle:
        return self._track_handle(_ReplayHandle(self))

    def _made(self) -> list[Table]:
        if self._tables is None:
            raise not_launched(repr(self), "tables")
        return self._tables

    @property
    def segments(self) -> dict[str, str]:
        return {t.name: t.segment for t in self._made()}

    @property
    def seeds(self) -> dict[str, int | None]:
        """Each table's seed: a client draws the stream of that seed and its node's name."""
        return {t.name: t.seed for t in self._made()}

    def allocate(self) -> None:
        if self._tables is not None:
            return
        tables = self._tables_fn()
        try:
            if not isinstance(tables, (list, tuple)) or not all(isinstance(t, Table) for t in tables) or not tables:
                raise TypeError(
                    f"tables_fn must return a non-empty list of shmpad.replay.Table, got {type_name(tables)}"
                    + (f" of {sorted({type_name(t) for t in tables})}" if isinstance(tables, (list, tuple)) else "")
                )
            names = [t.name for t in tables]
            if len(set(names)) != len(names):
                raise ValueError(f"the tables of a replay node need distinct names, got {names}")
            if self.checkpoint_dir is not None:
                found = [t for t in tables if os.path.exists(checkpoint_path(self.checkpoint_dir, t.name))]
                for t in found:
                    t.load(checkpoint_path(self.checkpoint_dir, t.name))
        except BaseException:
            for t in tables if isinstance(tables, (list, tuple)) else []:
                if isinstance(t, Table):
                    t.close()
            raise
        self._tables = list(tables)

    def run(self) -> None:
        """Checkpoint every ``checkpoint_minutes``, and once more when the program stops."""
        while not wait_for_stop(self._every_s):
            checkpoint_tables(self._tables, self.checkpoint_dir)
        checkpoint_tables(self._tables, self.checkpoint_dir)

    def on_stop(self) -> None:
        for t in self._tables or []:
            t.shutdown()

    def free(self) -> None:
        for t in self._tables or []:
            t.close()
        self._tables = None

    def __repr__(self) -> str:
        return f"ReplayNode({getattr(self._tables_fn, '__qualname__', self._tables_fn)!r})"
