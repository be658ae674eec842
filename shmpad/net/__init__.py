"""Several hosts: the authenticated TCP wire format, the membership broker, peer-to-peer
rings (PeerRing: allreduce, broadcast) and the gradient accumulator with its data planes.
Calls between hosts are ``shmpad.rpc``'s TCP transport, which runs on this wire format."""

from typing import Any

# Wire format and authentication
from shmpad.net.wire import Connection
from shmpad.net.auth import Listener
from shmpad.net.auth import connect
from shmpad.net.auth import load_token

# Membership (Broker below: ``python -m shmpad.net.broker`` runs that module as the
# main one, so the package must not have imported it already)
from shmpad.net.group import GroupClient
from shmpad.net.group import Member
from shmpad.net.group import Membership

# Collectives between peers
from shmpad.net.allreduce import PeerRing
from shmpad.net.mesh import Mesh


__all__ = [
    "Accumulator",
    "Broker",
    "Connection",
    "GroupClient",
    "Listener",
    "Member",
    "Membership",
    "Mesh",
    "PeerRing",
    "connect",
    "load_token",
]


def __getattr__(name: str) -> Any:
    if name == "Accumulator":  # it needs torch; importing shmpad.net alone does not
        from shmpad.net.accumulator import Accumulator

        return Accumulator
    if name == "Broker":
        from shmpad.net.broker import Broker

        return Broker
    raise AttributeError(f"module 'shmpad.net' has no attribute {name!r}")
