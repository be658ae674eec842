"""Checkpoints of a replay ``Table``: every item and the counters written to one ``.npz``,
and a table filled or made again from it.

A checkpoint holds ``config`` (the table's name, spec, max_size, selectors, rate limiter
and max_times_sampled, as JSON), ``keys``, ``times`` and ``priorities`` of the ready items
in insertion order, ``counters`` (inserts, samples, deletes, the next key) and one
``field:<name>`` array ``[items, *shape]`` per field. It is taken under the index lock, so
it holds whole items only, and written to a temporary file that is renamed into place, so
a reader never finds half of one.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import numpy as np

from shmpad.errors import Closed
from shmpad.replay import index, lock
from shmpad.replay.rate_limiters import from_dict as rate_limiter_from_dict
from shmpad.replay.selectors import from_dict
from shmpad.ringbuf.wait import notify

if TYPE_CHECKING:
    from shmpad.replay.table import Table

_CONFIG_KEYS = ("name", "spec", "max_size", "sampler", "remover", "rate_limiter", "max_times_sampled")


def _config(table: Table) -> dict:
    meta = table._seg.meta
    return {k: meta[k] for k in _CONFIG_KEYS}


def write_checkpoint(table: Table, path: str | os.PathLike) -> str:
    """``Table.checkpoint``: write ``table``'s items and counters to ``path``; the path."""
    if table._ctl is None:
        raise Closed(f"replay table {table.name!r}: this handle is closed")
    path = os.fspath(path)
    table._lock()
    try:
        slots = index.ready_slots(table._index)
        t = table._index
        state = {
            "keys": t[3][slots].copy(),
            "times": t[4][slots].copy(),
            "priorities": t[5][slots].copy(),
            "counters": table._ctl[[index.INSERTS, index.SAMPLES, index.DELETES, index.NEXT_SEQ]].copy(),
        }
        for f in table._data:
            state["field:" + f] = table._data[f][slots]
    finally:
        lock.release(table._ctl)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        np.savez(fh, config=np.array(json.dumps(_config(table))), **state)
    os.replace(tmp, path)
    return path


def load_checkpoint(table: Table, path: str | os.PathLike) -> None:
    """``Table.load``: fill the empty ``table`` from the checkpoint at ``path``."""
    table._check_open()
    with np.load(os.fspath(path), allow_pickle=False) as z:
        config = json.loads(str(z["config"]))
        mine = _config(table)
        differs = [k for k in mine if k != "name" and config.get(k) != mine[k]]
        if differs:
            raise ValueError(
                f"checkpoint {os.fspath(path)!r} is of a different table: its {differs} differ from "
                f"table {table.name!r}'s"
            )
        keys, times, prios, counters = z["keys"], z["times"], z["priorities"], z["counters"]
        fields = {f: z["field:" + f] for f in table._data}
    table._lock()
    try:
        ctl, state, owner, key, tm, prio = table._index[:6]
        if ctl[index.SIZE] or ctl[index.PENDING] or ctl[index.INSERTS]:
            raise ValueError(f"replay table {table.name!r} must be empty to load a checkpoint")
        slots = keys % table.max_size
        for f, a in fields.items():
            table._data[f][slots] = a
        key[slots] = keys
        tm[slots] = times
        prio[slots] = prios
        state[slots] = index.READY
        ctl[[index.INSERTS, index.SAMPLES, index.DELETES, index.NEXT_SEQ]] = counters
        index.rebuild(table._index, table._exponent, np.empty(0, np.int64), table.max_times_sampled)
    finally:
        lock.release(table._ctl)
    notify(table._ctl, index.EV_CHANGED)


def restore_table(cls: type[Table], path: str | os.PathLike, seed: int | None = None) -> Table:
    """``Table.restore``: a new ``cls`` made from the checkpoint at ``path``."""
    with np.load(os.fspath(path), allow_pickle=False) as z:
        c = json.loads(str(z["config"]))
    table = cls(
        c["name"],
        {f: (d, tuple(s)) for f, d, s in c["spec"]},
        c["max_size"],
        from_dict(c["sampler"]),
        from_dict(c["remover"]),
        rate_limiter_from_dict(c["rate_limiter"]),
        c["max_times_sampled"],
        seed=seed,
    )
    try:
        table.load(path)
    except BaseException:
        table.close()
        raise
    return table
