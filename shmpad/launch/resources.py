"""``PythonProcess``: how the nodes of one group run as processes (Launchpad's
``local_resources={group: PythonProcess(...)}``)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PythonProcess"]


@dataclass(frozen=True)
class PythonProcess:
    """How to run the nodes of one group as processes: ``env`` is laid over the
    environment and ``args`` become command-line flags (``--name=value``; a bool
    ``--name`` / ``--noname``) in the node's ``sys.argv``."""

    args: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)

    def argv(self) -> list[str]:
        out = []
        for k, v in self.args.items():
            if isinstance(v, bool):
                out.append(f"--{k}" if v else f"--no{k}")
            else:
                out.append(f"--{k}={v}")
        return out
