"""shmpad: a single-box, shared-memory runtime for distributed reinforcement learning."""

# Programs, nodes and launching (Launchpad's API)
from shmpad.colocation import MultiProcessingColocation, MultiThreadingColocation

# Errors
from shmpad.errors import (
    Abandoned,
    AuthError,
    Closed,
    FrameError,
    NodeFailed,
    RemoteError,
    SegmentError,
    ShmpadError,
    Timeout,
    WouldBlock,
)
from shmpad.launch.launcher import LaunchType, PythonProcess, launch
from shmpad.launch.stopping import register_stop_handler, stop, stop_event, unregister_stop_handler, wait_for_stop
from shmpad.launch.supervisor import WorkerManager
from shmpad.nodes.base import Handle, Node
from shmpad.nodes.courier import CourierClient, CourierHandle, CourierNode
from shmpad.nodes.data import RingNode, WeightStoreNode
from shmpad.nodes.python import PyClassNode, PyNode
from shmpad.program import Program

# Shared-memory rings and the weight store
from shmpad.ringbuf import (
    MessageBatch,
    MPMCRing,
    RingStatistics,
    SPSCRing,
    TypedRing,
    WeightStore,
    WeightStoreStatistics,
)
from shmpad.rpc import TcpRpcClient, TcpRpcServer

__version__ = "0.1.0"

__all__ = [
    "Abandoned",
    "AuthError",
    "FrameError",
    "TcpRpcClient",
    "TcpRpcServer",
    "Closed",
    "CourierClient",
    "CourierHandle",
    "CourierNode",
    "Handle",
    "LaunchType",
    "MultiProcessingColocation",
    "MultiThreadingColocation",
    "Node",
    "NodeFailed",
    "RemoteError",
    "Program",
    "PyClassNode",
    "PyNode",
    "PythonProcess",
    "RingNode",
    "WeightStoreNode",
    "WorkerManager",
    "launch",
    "register_stop_handler",
    "stop",
    "stop_event",
    "unregister_stop_handler",
    "wait_for_stop",
    "MPMCRing",
    "MessageBatch",
    "RingStatistics",
    "SPSCRing",
    "SegmentError",
    "ShmpadError",
    "Timeout",
    "TypedRing",
    "WeightStore",
    "WeightStoreStatistics",
    "WouldBlock",
]
