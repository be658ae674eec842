"""Forked children for one measurement: each prepares, meets the others at a start
barrier, works and reports, and dies with the parent.

A benchmark builds everything shared in the parent, then starts one ``FORK.Process``
per role with ``target=child``; a child that fails writes ``Error in '<label>': ...``
with its traceback to stderr and exits with code 1, which the parent turns into a
``MeasurementFailed`` naming that role.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from bench.common.evidence import saving
from bench.common.jobs import exit_on_sigterm
from shmpad.launch.process import die_with_parent, fork

__all__ = [
    "FORK",
    "START_TIMEOUT_S",
    "MeasurementFailed",
    "MeasurementSkipped",
    "child",
    "end",
    "in_own_tree",
    "nothing",
    "run_main",
]

# Children inherit what the parent built (shared memory, pipes, compiled kernels).
FORK = multiprocessing.get_context("fork")

# A child waits this long at the start barrier.
START_TIMEOUT_S = 15.0


class MeasurementFailed(Exception):
    """One measurement did not give a result; the run reports it and goes on."""


class MeasurementSkipped(MeasurementFailed):
    """A measurement whose subject cannot run here (a package it needs is not installed)."""


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


def run_main(main: Callable[[], int], name: str) -> None:
    """Run a benchmark's ``main`` as the program and exit with its status, its evidence
    kept where ``--save DIR`` says (``bench.common.evidence``). SIGTERM and Ctrl+C unwind
    through the measurement's ``finally`` (which kills its children): exit 128 + the
    signal, and 130 with a line saying so."""

    exit_on_sigterm()
    try:
        with saving(sys.argv[1:], name):
            sys.exit(main())
    except KeyboardInterrupt:
        print(f"\n{name}: interrupted; every child was killed", file=sys.stderr)
        sys.exit(130)


def in_own_tree(fn: Callable[[], Any], timeout: float) -> Any:
    """``fn()`` run in a forked process tree of its own (its own process group), its
    JSON-able result sent back through a pipe; whatever of the tree is left when it
    answers or ``timeout`` passes is killed. Raises ``MeasurementSkipped`` when ``fn``
    needs a package that is not installed, ``MeasurementFailed`` (with the child's
    traceback) when it raises or gives no result in time."""
    read_fd, write_fd = os.pipe()

    def body() -> None:
        try:
            out = {"ok": True, "result": fn()}
        except ImportError as e:
            out = {"ok": False, "skip": True, "why": f"not installed ({e})"}
        except BaseException:  # noqa: BLE001 - raised in the parent
            out = {"ok": False, "skip": False, "why": traceback.format_exc(limit=5)}
        os.write(write_fd, json.dumps(out).encode())

    pid = fork(body, close_fds=(read_fd,))
    os.close(write_fd)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([read_fd], [], [], 1.0)[0]:
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    os.close(read_fd)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # whatever of the tree is left
    os.waitpid(pid, 0)
    if not chunks:
        raise MeasurementFailed(f"no result within {timeout:.0f} s (killed)")
    result = json.loads(b"".join(chunks))
    if result["ok"]:
        return result["result"]
    raise (MeasurementSkipped if result["skip"] else MeasurementFailed)(result["why"])
