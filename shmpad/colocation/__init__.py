"""Nodes that hold other nodes: as threads of one node, or as its child processes."""

from shmpad.colocation.multi_processing import MultiProcessingColocation
from shmpad.colocation.multi_threading import MultiThreadingColocation

__all__ = ["MultiProcessingColocation", "MultiThreadingColocation"]
