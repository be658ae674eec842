"""``MultiThreadingColocation``: several PyNodes as threads of one node; and what every
colocation is (``Colocation``: the nodes it holds, checked, and their handles)."""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from shmpad import context
from shmpad.nodes.base import Handle, Node
from shmpad.nodes.python import PyNode

__all__ = ["MultiThreadingColocation"]


def check_nodes(kind: str, nodes: Sequence[Node]) -> list[PyNode]:
    nodes = list(nodes)
    for n in nodes:
        if not isinstance(n, PyNode):  # a type, but Launchpad's ValueError, which its programs expect
            raise ValueError(f"{kind} only works with PyNodes, got {type(n).__name__}")
    return nodes


class Colocation(PyNode):
    """What every colocation is: a PyNode that runs ``run`` over the PyNodes it holds, and
    takes their input handles as its own."""

    def __init__(self, nodes: Sequence[PyNode], run: Callable[[], None]):
        self._nodes = check_nodes(type(self).__name__, nodes)
        super().__init__(run)
        self._input_handles = [h for n in self._nodes for h in n.input_handles]

    def add_node(self, node: PyNode) -> Handle:
        check_nodes(type(self).__name__, [node])
        self._nodes.append(node)
        self._input_handles.extend(node.input_handles)
        return node.create_handle()

    def inner_nodes(self) -> list[Node]:
        return list(self._nodes)


class MultiThreadingColocation(Colocation):
    """Runs ``nodes`` (PyNodes: PyClassNode and CourierNode included) as threads of one
    node. The first exception raised by any of them is re-raised by this node. With
    ``return_on_first_completed`` the node ends when the first inner node ends;
    otherwise when all have (or one raised)."""

    def __init__(self, nodes: Sequence[PyNode], return_on_first_completed: bool = False):
        self._return_on_first_completed = return_on_first_completed
        super().__init__(nodes, self._run_all)

    def _run_all(self) -> None:
        if not self._nodes:
            raise ValueError("MultiThreadingColocation requires at least one node.")
        ctx = context.current_or_none()
        done = threading.Condition()
        finished: list[int] = []
        errors: list[BaseException] = []

        def run(i: int, node: PyNode) -> None:
            context.set_thread_context(ctx)
            try:
                node.run()
            except BaseException as e:  # noqa: BLE001 - re-raised by the colocation
                with done:
                    errors.append(e)
            finally:
                with done:
                    finished.append(i)
                    done.notify_all()

        threads = [
            threading.Thread(target=run, args=(i, n), name=f"shmpad-colocated-{i}", daemon=True)
            for i, n in enumerate(self._nodes)
        ]
        for t in threads:
            t.start()
        with done:
            while not errors and len(finished) < len(threads):
                if self._return_on_first_completed and finished:
                    break
                done.wait()
            if errors:
                raise errors[0]
