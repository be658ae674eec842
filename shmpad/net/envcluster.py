"""``broker="env://"``: a fixed cluster launched torchrun-style, from the usual variables.

    MASTER_ADDR   the host of rank 0, which runs the group's broker there
    MASTER_PORT   the broker's port
    RANK          this process's rank, 0 ... WORLD_SIZE - 1
    WORLD_SIZE    how many processes the first step waits for

Rank 0 serves the broker (``shmpad.net.broker.Broker``, authenticated by the group
token like any other, with the command line's heartbeat, timeout and settle delay) in
its own process; every rank, rank 0 included, then joins it
as with ``--peers HOST:PORT``. Nothing else differs: a process that dies and comes
back rejoins, and the group goes on without it meanwhile, except rank 0, whose broker
dies with it (the others keep reconnecting until a rank 0 serves again).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from shmpad.net.wire import join_address, parse_address

__all__ = ["ENV_URL", "EnvCluster", "from_env"]

ENV_URL = "env://"
VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


class EnvCluster(NamedTuple):
    broker: str  # "MASTER_ADDR:MASTER_PORT"
    rank: int
    world_size: int

    @property
    def serves_broker(self) -> bool:
        return self.rank == 0


def from_env(environ: Mapping[str, str] | None = None) -> EnvCluster:
    """The cluster ``environ`` (default ``os.environ``) describes; ``ValueError`` naming
    the variable that is missing or wrong."""
    environ = os.environ if environ is None else environ
    missing = [v for v in VARIABLES if not environ.get(v)]
    if missing:
        raise ValueError(f"{ENV_URL} needs {', '.join(VARIABLES)} set; missing: {', '.join(missing)}")
    numbers = {}
    for name in ("MASTER_PORT", "RANK", "WORLD_SIZE"):
        try:
            numbers[name] = int(environ[name])
        except ValueError:
            raise ValueError(f"{ENV_URL}: {name} must be an integer, got {environ[name]!r}") from None
    if numbers["WORLD_SIZE"] < 1:
        raise ValueError(f"{ENV_URL}: WORLD_SIZE must be >= 1, got {numbers['WORLD_SIZE']}")
    if not 0 <= numbers["RANK"] < numbers["WORLD_SIZE"]:
        raise ValueError(
            f"{ENV_URL}: RANK must be in 0..{numbers['WORLD_SIZE'] - 1} for WORLD_SIZE {numbers['WORLD_SIZE']}, "
            f"got {numbers['RANK']}"
        )
    if not 1 <= numbers["MASTER_PORT"] <= 65535:
        raise ValueError(f"{ENV_URL}: MASTER_PORT must be in 1..65535, got {numbers['MASTER_PORT']}")
    host = environ["MASTER_ADDR"]
    address = join_address(host, numbers["MASTER_PORT"])
    parse_address(address)
    return EnvCluster(address, numbers["RANK"], numbers["WORLD_SIZE"])
