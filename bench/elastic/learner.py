"""One learner of ``bench.elastic``: a small model trained on data of its own under an
``Accumulator``, reporting every event as one JSON line.

Two ways to start one (``--restart`` of ``python -m bench.elastic``):

- ``forked(settings, events, control, errors)``: a child of the benchmark's fork server
  (``multiprocessing``'s ``forkserver``, with torch and this module imported once), the
  way a supervisor that keeps a warm parent restarts a worker: nothing is imported again.
- ``python -m bench.elastic.learner BROKER NAME PARENT_PID --peers N ...``: a fresh
  Python process that imports torch itself (a cold start).

Lines (``t`` is ``time.monotonic()``, one clock for every process on the host; ``g`` is
the ring the event happened in, ``broker_id/epoch``)::

    {"e": "up", "t"}                              the process is up and has asked to join
    {"e": "step", "t", "v": version, "n": group size, "d": digest of the weights, "r": refused, "g"}
    {"e": "abandoned", "t", "v": version, "g"}    a reduction the group's change abandoned

It trains until its control stream closes (stdin, or the ``control`` pipe: the
benchmark is done with it), then leaves the group and exits 0; it dies with its parent
(PR_SET_PDEATHSIG: the benchmark, or the fork server, which ends with the benchmark)
and at the latest after ``lifetime`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from dataclasses import dataclass

import torch

from shmpad.launch.process import die_with_parent
from shmpad.net.accumulator import Accumulator
from shmpad.net.model_state import digest

TOKEN = "bench-elastic"
INPUTS = 64
OUTPUTS = 8


@dataclass(frozen=True)
class Settings:
    broker: str
    name: str
    peers: int  # the first step waits for this many learners
    backend: str = "shmpad"
    width: int = 256
    batch: int = 32
    lifetime: float = 3600.0


def train(settings: Settings, events: int, control: int) -> None:
    """Train until ``control`` (a file descriptor) reads end-of-file; write events to ``events``."""

    def emit(**fields: object) -> None:
        os.write(events, (json.dumps(fields, separators=(",", ":")) + "\n").encode())  # one write per line

    signal.alarm(max(1, int(settings.lifetime)))
    torch.set_num_threads(1)  # N learners share a few cores
    torch.manual_seed(0)
    teacher = torch.nn.Linear(INPUTS, OUTPUTS)  # the same target function in every learner
    torch.manual_seed(sum(settings.name.encode()))  # different starting weights: the first sync makes them equal
    model = torch.nn.Sequential(
        torch.nn.Linear(INPUTS, settings.width),
        torch.nn.Tanh(),
        torch.nn.Linear(settings.width, settings.width),
        torch.nn.Tanh(),
        torch.nn.Linear(settings.width, OUTPUTS),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(os.getpid())  # a restarted learner draws other data: it does not matter
    stop = threading.Event()
    threading.Thread(target=_until_eof, args=(control, stop), daemon=True).start()
    emit(e="up", t=time.monotonic())
    acc = Accumulator(
        model,
        optimizer,
        broker=settings.broker,
        group="elastic",
        name=settings.name,
        token=TOKEN,
        min_size=settings.peers,
        op_timeout=30.0,
        backend=settings.backend,
    )
    try:
        while not stop.is_set():
            if not acc.ready(timeout=0.5):
                continue
            x = torch.randn(settings.batch, INPUTS, generator=data)
            with torch.no_grad():
                y = teacher(x)
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            abandoned, ring = acc.abandoned, acc.ring_key
            if acc.reduce_gradients(settings.batch):
                optimizer.step()
                emit(e="step", t=time.monotonic(), v=acc.version, n=acc.size, d=digest(model), r=acc.refused, g=ring)
            elif acc.abandoned != abandoned:
                emit(e="abandoned", t=time.monotonic(), v=acc.version, g=ring)
    finally:
        acc.close()


def forked(settings: Settings, events, control, errors) -> None:
    """The body of a learner the fork server starts: ``events``, ``control`` and ``errors``
    are the ends of three pipes (``multiprocessing`` connections, used as plain pipes)."""
    die_with_parent(os.getppid())  # the fork server: it exits when the benchmark's process does
    os.dup2(errors.fileno(), 2)  # tracebacks go where the benchmark reads a learner's stderr
    train(settings, events.fileno(), control.fileno())


def _until_eof(fd: int, stop: threading.Event) -> None:
    while os.read(fd, 4096):
        pass
    stop.set()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.elastic.learner")
    parser.add_argument("broker")
    parser.add_argument("name")
    parser.add_argument("parent", type=int, help="the benchmark's pid: this process dies with it")
    parser.add_argument("--peers", type=int, required=True, help="the first step waits for this many learners")
    parser.add_argument("--backend", default="shmpad")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lifetime", type=float, default=3600.0)
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    settings = Settings(args.broker, args.name, args.peers, args.backend, args.width, args.batch, args.lifetime)
    train(settings, 1, 0)


if __name__ == "__main__":
    main()
