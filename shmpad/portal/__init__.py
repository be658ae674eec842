"""portal's API on shmpad: ``import shmpad.portal as portal`` runs a program written for
danijar/portal (DreamerV3's launcher) on shmpad's processes and shared-memory RPC, with
TCP kept for other hosts. docs/portal.md says what is supported and how it differs.

``import shmpad`` does not import this package.
"""

from typing import Any

# Processes, threads and the program
from shmpad.portal.runtime import initfn
from shmpad.portal.runtime import reset
from shmpad.portal.runtime import setup
from shmpad.portal.thread import Thread
from shmpad.portal.process import Process
from shmpad.portal.run import run
from shmpad.portal.proctree import proc_alive
from shmpad.portal.transport import free_port

# Sockets
from shmpad.portal.server_socket import ServerSocket
from shmpad.portal.client_socket import ClientSocket
from shmpad.portal.client_socket import Disconnected

# Calls
from shmpad.portal.futures import Future
from shmpad.portal.client import Client
from shmpad.portal.server import Server
from shmpad.portal.batching import BatchServer
from shmpad.portal import futures

# Values
from shmpad.portal.packing import pack
from shmpad.portal.packing import unpack
from shmpad.portal.packing import tree_equals
from shmpad.portal.sharray import SharedArray

__all__ = [
    "BatchServer",
    "Client",
    "ClientSocket",
    "Disconnected",
    "Future",
    "Process",
    "Server",
    "ServerSocket",
    "SharedArray",
    "Thread",
    "context",
    "free_port",
    "futures",
    "initfn",
    "pack",
    "proc_alive",
    "reset",
    "run",
    "setup",
    "tree_equals",
    "unpack",
]


def __getattr__(name: str) -> Any:
    if name == "context":  # the current one: reset() replaces it
        from shmpad.portal import runtime

        return runtime.current()
    raise AttributeError(f"module 'shmpad.portal' has no attribute {name!r}")
