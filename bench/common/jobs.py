"""Starting a job (``python -m bench.impala ...``) that a benchmark later stops as Ctrl+C
does: with SIGINT to its session, after which the job writes its checkpoint and files.

A benchmark started in the background of a shell (``&``, ``nohup``) inherits SIGINT
ignored, and a child inherits that in turn: its job would not see the SIGINT, run on
and be SIGKILLed after a grace period, its last checkpoint lost. ``start_job`` gives
the job SIGINT at its default, as a terminal's Ctrl+C finds it.

A job leads a session of its own, so a benchmark killed outright leaves it running: the
benchmark's ``finally`` is what stops its jobs. ``exit_on_sigterm`` makes SIGTERM (``kill``,
a CI's timeout) unwind through that ``finally`` as Ctrl+C does.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence

__all__ = ["exit_on_sigterm", "start_job"]


def exit_on_sigterm() -> None:
    """From now on SIGTERM raises ``SystemExit(128 + SIGTERM)`` in the main thread, so that a
    program's ``finally`` blocks run (call it where the program starts, not in a library)."""

    def exit_now(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_now)


def start_job(
    cmd: Sequence[str], stdout, stderr=subprocess.STDOUT, cpus: Sequence[int] | None = None
) -> subprocess.Popen:
    """``cmd`` in a session of its own (``os.killpg(proc.pid, ...)`` reaches all it starts),
    SIGINT at its default, on ``cpus`` if given; ``stdout`` and ``stderr`` as
    ``subprocess.Popen`` takes them (stderr with stdout unless told)."""

    def prepare() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return subprocess.Popen(list(cmd), stdout=stdout, stderr=stderr, start_new_session=True, preexec_fn=prepare)
