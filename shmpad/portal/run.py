"""``run``: start a program's workers, watch them, and stop them all at the first failure."""

from __future__ import annotations

import time
from typing import Any

from shmpad._checks import check_timeout

__all__ = ["run"]

_POLL_S = 0.1
"""how often the workers' exit codes are read (a worker's end is noticed within this)"""


def run(workers: list, duration: float | None = None) -> None:
    """Start the workers not started yet and wait until all of them exit 0 (then return),
    one exits otherwise (then kill them all and raise ``RuntimeError`` naming it), or
    ``duration`` s passed (then kill them all and return). An exception in the caller
    (Ctrl+C) kills them all too."""
    duration = check_timeout(duration, "duration")
    for worker in workers:
        if not worker.started:
            worker.start()
    start = time.monotonic()
    ended = False
    try:
        while True:
            if duration and time.monotonic() - start >= duration:
                print(f"Shutting down workers after {duration} seconds.", flush=True)
                return
            codes = [w.exitcode for w in workers]
            if all(code == 0 for code in codes):
                print("All workers terminated successfully.", flush=True)
                ended = True
                return
            failed = [(w, code) for w, code in zip(workers, codes) if code not in (None, 0)]
            if failed:
                worker, code = failed[0]
                print(f"Shutting down workers due to crash in '{worker.name}' ({code}).", flush=True)
                raise RuntimeError(f"'{worker.name}' crashed with exit code {code}")
            _wait(workers, _POLL_S)
    finally:
        if not ended:
            for worker in workers:
                worker.kill()


def _wait(workers: list, timeout: float) -> Any:
    """Wait up to ``timeout`` s, returning early when the first worker still running ends."""
    for worker in workers:
        if worker.exitcode is None:
            worker.join(timeout)
            return
