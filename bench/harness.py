"""Forked children for one measurement: each prepares, meets the others at a start
barrier, works and reports, and dies with the parent.

A benchmark builds everything shared in the parent, then starts one ``FORK.Process``
per role with ``target=child``; a child that fails writes ``Error in '<label>': ...``
with its traceback to stderr and exits with code 1, which the parent turns into a
``MeasurementFailed`` naming that role.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

from shmpad.launch.process import die_with_parent

__all__ = ["FORK", "START_TIMEOUT_S", "MeasurementFailed", "child", "end", "nothing"]

# Children inherit what the parent built (shared memory, pipes, compiled kernels).
FORK = multiprocessing.get_context("fork")

# A child waits this long at the start barrier.
START_TIMEOUT_S = 15.0

class MeasurementFailed(Exception):
    """One measurement did not give a result; the run reports it and goes on."""


def child(
    label: str,
    lifetime: float,
    prepare: Callable[[], None],
    work: Callable[[], Any],
    barrier,
    report: Callable[[Any], None] | None,
) -> None:
    """Body of every forked child: prepare, meet at the barrier, work, report; name any failure.

    The child dies with its parent (PR_SET_PDEATHSIG) and at the latest after
    ``lifetime`` seconds (SIGALRM), so nothing outlives a killed or stuck run."""
    die_with_parent(os.getppid())
    signal.alarm(math.ceil(lifetime))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the parent's to handle: it kills us
    try:
        prepare()
        barrier.wait(START_TIMEOUT_S)
        result = work()
        if report is not None:
            report(result)
    except BaseException:
        sys.stderr.write(f"Error in '{label}':\n{traceback.format_exc()}")
        sys.stderr.flush()
        os._exit(1)


def nothing() -> None:
    """What a child with nothing to prepare prepares."""


def end(procs: list) -> None:
    """Kill whichever of ``procs`` still run, then join them all (a measurement's last word)."""
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()

