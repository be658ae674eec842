"""shmpad: a single-box, shared-memory runtime for distributed reinforcement learning."""

# Programs, nodes and launching (Launchpad's API)
from shmpad.program import Program
from shmpad.nodes.base import Handle
from shmpad.nodes.base import Node
from shmpad.nodes.python import PyClassNode
from shmpad.nodes.python import PyNode
from shmpad.nodes.courier import CourierClient
from shmpad.nodes.courier import CourierHandle
from shmpad.nodes.courier import CourierNode
from shmpad.nodes.courier import CourierServer
from shmpad.rpc import batched_handler
from shmpad.nodes.address import AbstractAddressBuilder
from shmpad.nodes.address import Address
from shmpad.nodes.address import SimpleLocalAddressBuilder
from shmpad.nodes.address import get_port_from_address
from shmpad.rpc import TcpRpcClient
from shmpad.rpc import TcpRpcServer
from shmpad.nodes.data import RingNode
from shmpad.nodes.data import WeightStoreNode
from shmpad.nodes.replay import ReplayClient
from shmpad.nodes.replay import ReplayNode
from shmpad.colocation import MultiProcessingColocation
from shmpad.colocation import MultiThreadingColocation
from shmpad.launch.flags import LAUNCH_TYPE
from shmpad.launch.launcher import is_local_launch
from shmpad.launch.launcher import is_local_launch_or_test
from shmpad.launch.launcher import PythonProcess
from shmpad.launch.launcher import launch
from shmpad.launch.supervisor import WorkerManager
from shmpad import context as context  # Launchpad's module: lp.context.LaunchType, lp.context.get_context()
from shmpad.context import LaunchType
from shmpad.context import make_program_stopper
from shmpad.context import register_stop_handler
from shmpad.context import stop
from shmpad.context import stop_event
from shmpad.context import unregister_stop_handler
from shmpad.context import wait_for_stop
from shmpad.top.registry import counters
from shmpad.top.registry import publish_counter

# Errors
from shmpad.errors import Abandoned
from shmpad.errors import AuthError
from shmpad.errors import Closed
from shmpad.errors import FrameError
from shmpad.errors import NodeFailed
from shmpad.errors import RemoteError
from shmpad.errors import SegmentError
from shmpad.errors import ShmpadError
from shmpad.errors import Timeout
from shmpad.errors import WouldBlock

# Shared-memory rings and the weight store
from shmpad.ringbuf import MPMCRing
from shmpad.ringbuf import MessageBatch
from shmpad.ringbuf import RingStatistics
from shmpad.ringbuf import SPSCRing
from shmpad.ringbuf import TypedRing
from shmpad.weights import WeightStore
from shmpad.weights import WeightStoreStatistics

__version__ = "0.1.0"

__all__ = [
    "AbstractAddressBuilder",
    "Abandoned",
    "Address",
    "CourierServer",
    "batched_handler",
    "LAUNCH_TYPE",
    "SimpleLocalAddressBuilder",
    "get_port_from_address",
    "is_local_launch",
    "is_local_launch_or_test",
    "make_program_stopper",
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
    "ReplayClient",
    "ReplayNode",
    "WeightStoreNode",
    "WorkerManager",
    "launch",
    "register_stop_handler",
    "stop",
    "stop_event",
    "unregister_stop_handler",
    "wait_for_stop",
    "counters",
    "publish_counter",
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
