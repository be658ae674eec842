"""``PythonProcess``: how the nodes of one group run as processes (Launchpad's
``local_resources={group: PythonProcess(...)}``)."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

__all__ = ["PythonProcess"]


@dataclass(frozen=True)
class PythonProcess:
    """How to run the nodes of one group as processes: ``env`` is laid over the
    environment and ``args`` become command-line flags (``--name=value``; a bool
    ``--name`` / ``--noname``) in the node's ``sys.argv``. ``cpus`` (a shmpad
    extension) pins each node process of the group, and the processes it forks, to
    those CPU numbers (``os.sched_setaffinity``), so that nodes which would fight for a
    core do not; they must be among the launching process's own. Thread launch types,
    whose nodes share one process, leave ``cpus`` (like ``env`` and ``args``) unused."""

    args: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    cpus: Collection[int] | None = None

    def __post_init__(self) -> None:
        if self.cpus is None:
            return
        cpus = tuple(self.cpus) if isinstance(self.cpus, Iterable) and not isinstance(self.cpus, (str, bytes)) else None
        if cpus is None or any(isinstance(c, bool) or not isinstance(c, int) for c in cpus):
            raise TypeError(f"cpus must be distinct CPU numbers (ints >= 0), at least one, got {self.cpus!r}")
        if not cpus or any(c < 0 for c in cpus) or len(set(cpus)) != len(cpus):
            raise ValueError(f"cpus must be distinct CPU numbers (ints >= 0), at least one, got {self.cpus!r}")
        object.__setattr__(self, "cpus", tuple(sorted(cpus)))

    def check_cpus(self, label: str) -> None:
        """``ValueError`` naming the group if ``cpus`` holds a CPU the launching process may not use."""
        if self.cpus is None:
            return
        allowed = os.sched_getaffinity(0)
        if not set(self.cpus) <= allowed:
            raise ValueError(
                f"local_resources[{label!r}] pins to cpus {list(self.cpus)}, but this process may run only on "
                f"{sorted(allowed)}"
            )

    def argv(self) -> list[str]:
        out = []
        for k, v in self.args.items():
            if isinstance(v, bool):
                out.append(f"--{k}" if v else f"--no{k}")
            else:
                out.append(f"--{k}={v}")
        return out
