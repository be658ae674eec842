"""Calls between processes: one codec, two transports (shared-memory rings on one
host, authenticated TCP across hosts), one client surface."""

from shmpad.rpc.batching import batched_handler
from shmpad.rpc.shm_client import RpcClient
from shmpad.rpc.shm_server import RpcServer
from shmpad.rpc.tcp_client import TcpRpcClient
from shmpad.rpc.tcp_server import TcpRpcServer

__all__ = ["batched_handler", "RpcClient", "RpcServer", "TcpRpcClient", "TcpRpcServer"]
