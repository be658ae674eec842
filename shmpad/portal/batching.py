"""``BatchServer``: a ``Server`` whose methods can batch their callers' calls.

``bind(name, workfn, donefn=None, batch=N, workers=W)``: the method waits for exactly N
calls, calls ``workfn`` once with every argument leaf stacked on a new leading axis
(nested dicts and lists of arrays and numbers), replies to each caller with its row of
every leaf of the result, and then runs ``donefn(info)`` (``workfn`` returns
``(result, info)`` when there is a ``donefn``) in the order the batches arrived.
``batch=0`` binds a method that is not batched.

portal runs the batching in a process of its own (``process=True``) between the
clients and an inner server, so every call crosses one more socket; here the batch is
stacked in the server's process as the calls arrive, and ``process`` and ``shmem`` are
accepted for compatibility and change nothing (docs/portal.md).
"""

from __future__ import annotations

from typing import Any, Callable

from shmpad.portal.server import Server

__all__ = ["BatchServer"]


class BatchServer(Server):
    def __init__(
        self,
        port: int | str,
        name: str = "Server",
        workers: int = 1,
        errors: bool = True,
        process: bool = True,
        shmem: bool = False,
        **kwargs: Any,
    ):
        super().__init__(port, name, workers, errors, **kwargs)

    def bind(  # type: ignore[override]
        self, name: str, workfn: Callable, donefn: Callable | None = None, batch: int = 0, workers: int = 0
    ) -> None:
        self._bind(name, workfn, donefn, workers, batch)
