"""Nodes that carry bulk data between other nodes through shared memory: a ring
(typed trajectories or byte messages) and a versioned weight store.

They run no code of their own. The launcher creates their segment before any node
starts, closes it shortly after the program starts stopping (so that blocked
producers and consumers wake with ``Closed``; what is left can still be drained),
and removes its name when the program has ended (after a SIGKILL of the launcher,
the janitor does). Each node that gets the handle attaches the segment in its own
process; the launching process can too, while the program runs.
"""

from __future__ import annotations

from typing import Any, Mapping

from shmpad.nodes.base import Handle, Node, not_launched
from shmpad.ringbuf import MPMCRing, SPSCRing, TypedRing
from shmpad.weights import WeightStore

__all__ = ["RingNode", "WeightStoreNode"]


class _SegmentHandle(Handle):
    def __init__(self, node: "_SegmentNode"):
        self._node = node

    @property
    def name(self) -> str:
        return self._node.segment_name

    def dereference(self) -> Any:
        return self._node.attach()


class _SegmentNode(Node):
    RUNS = False

    def __init__(self) -> None:
        super().__init__()
        self._owner: Any = None

    def create_handle(self) -> Handle:
        return self._track_handle(_SegmentHandle(self))

    @property
    def segment_name(self) -> str:
        if self._owner is None:
            raise not_launched(repr(self), "shared memory")
        return self._owner.name

    def allocate(self) -> None:
        if self._owner is None:
            self._owner = self._create()

    def on_stop(self) -> None:
        if self._owner is not None:
            self._close_shared()

    def free(self) -> None:
        if self._owner is not None:
            self._owner.close()
            self._owner = None

    def _close_shared(self) -> None:
        """Close for every process, keeping the name (an attached handle's close)."""
        self.attach().close()

    def _create(self) -> Any:
        raise NotImplementedError

    def attach(self) -> Any:
        raise NotImplementedError


class RingNode(_SegmentNode):
    """A shared-memory queue between nodes (shmpad's counterpart of a replay/queue
    server). With ``spec`` (field name -> (dtype, shape)) it is a ``TypedRing`` of
    fixed-shape slots, such as trajectories; without it a ring of byte messages of up
    to ``slot_size`` bytes. ``multi=True`` (the default) allows several producers and
    consumers; ``multi=False`` is the faster single-producer single-consumer ring.
    The handle dereferences to the ring."""

    def __init__(
        self,
        capacity: int,
        spec: Mapping[str, Any] | None = None,
        slot_size: int | None = None,
        multi: bool = True,
    ):
        super().__init__()
        if spec is None and slot_size is None:
            raise ValueError(
                "RingNode needs a spec (typed slots: name -> (dtype, shape)) or a slot_size (byte messages), got neither"
            )
        if spec is not None and slot_size is not None:
            raise ValueError("RingNode takes a spec (typed slots) or a slot_size (byte messages), not both")
        self._capacity = capacity
        self._spec = spec
        self._slot_size = slot_size
        self._multi = multi
        if spec is not None:  # check the arguments now, not at launch
            TypedRing.create(spec, capacity, multi=multi).close()
        else:
            (MPMCRing if multi else SPSCRing).create(capacity, slot_size).close()

    def _create(self) -> Any:
        if self._spec is not None:
            return TypedRing.create(self._spec, self._capacity, multi=self._multi)
        return (MPMCRing if self._multi else SPSCRing).create(self._capacity, self._slot_size)

    def _registry_entry(self) -> tuple[str, dict[str, str]] | None:
        kind = "typed" if self._spec is not None else "mpmc" if self._multi else "spsc"
        return "rings", {"segment": self.segment_name, "kind": kind}

    def attach(self) -> Any:
        name = self.segment_name
        if self._spec is not None:
            return TypedRing.attach(name)
        return (MPMCRing if self._multi else SPSCRing).attach(name)

    def __repr__(self) -> str:
        what = f"spec={list(self._spec)}" if self._spec is not None else f"slot_size={self._slot_size}"
        return f"RingNode(capacity={self._capacity}, {what}, multi={self._multi})"


class WeightStoreNode(_SegmentNode):
    """A versioned weight store shaped like ``template`` (a torch module, a state
    dict or a dict of arrays). The handle dereferences to the ``WeightStore``."""

    def __init__(self, template: Any):
        super().__init__()
        self._template = template
        WeightStore.create(template).close()  # check the template now, not at launch

    def _create(self) -> Any:
        return WeightStore.create(self._template)

    def _close_shared(self) -> None:
        """A weight store blocks nobody for good (``wait_for_version`` takes a timeout):
        it stays open until freed."""

    def _registry_entry(self) -> tuple[str, dict[str, str]] | None:
        return "weights", {"segment": self.segment_name}

    def attach(self) -> Any:
        return WeightStore.attach(self.segment_name)

    def __repr__(self) -> str:
        return "WeightStoreNode()"
