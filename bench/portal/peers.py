"""The implementations ``python -m bench.portal`` runs side by side: shmpad.portal and its
peer, danijar/portal itself (the ``bench`` extra), with the options each gets.

Both run the same calls (``subjects``), each in a fresh interpreter: ``import portal``
sets multiprocessing's start method to spawn for the whole process, so the two never
share one. Both keep their connection logging off, so neither prints in the measured
loop. portal's servers bind every interface, its default: its BatchServer passes its
keywords to its inner client too, which refuses ``host``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

__all__ = ["Peer", "PEERS", "available"]


@dataclass(frozen=True)
class Peer:
    name: str
    module: str
    how: str
    server_kw: dict
    client_kw: dict


PEERS = [
    Peer(
        "shmpad.portal",
        "shmpad.portal",
        "shmpad.portal: forked processes, shared-memory RPC found through its doorbell",
        {},
        {"logging": False},
    ),
    Peer(
        "portal",
        "portal",
        "danijar/portal: spawned processes, TCP over 127.0.0.1 (BatchServer with its batcher process)",
        {"logging": False},
        {"logging": False},
    ),
]


def available(peer: Peer) -> bool:
    """Whether the peer's module is installed here (portal comes with the bench extra)."""
    return importlib.util.find_spec(peer.module.split(".")[0]) is not None
