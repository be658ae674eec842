"""One learner of ``bench.elastic``: a small model trained on data of its own under an
``Accumulator``, reporting every event as one JSON line on stdout.

    python -m bench.elastic.learner BROKER NAME PARENT_PID --peers N --backend B --width W --batch B

Lines (``t`` is ``time.monotonic()``, one clock for every process on the host)::

    {"e": "up", "t"}                          the process is up and has asked to join
    {"e": "step", "t", "v": version, "n": group size, "d": digest of the weights, "r": refused}
    {"e": "abandoned", "t", "v": version}     a reduction the group's change abandoned

It trains until its stdin closes (the benchmark is done with it), then leaves the
group and exits 0; it dies with the benchmark's process (PR_SET_PDEATHSIG) and at the
latest after ``--lifetime`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

TOKEN = "bench-elastic"
INPUTS = 64
OUTPUTS = 8


def emit(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields, separators=(",", ":")) + "\n")  # one write per line
    sys.stdout.flush()


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

    from shmpad.launch.process import die_with_parent

    die_with_parent(args.parent)
    signal.alarm(max(1, int(args.lifetime)))
    import torch

    from shmpad.net.accumulator import Accumulator
    from shmpad.net.state import digest

    torch.set_num_threads(1)  # N learners share a few cores
    torch.manual_seed(0)
    teacher = torch.nn.Linear(INPUTS, OUTPUTS)  # the same target function in every learner
    torch.manual_seed(sum(args.name.encode()))  # different starting weights: the first sync makes them equal
    model = torch.nn.Sequential(
        torch.nn.Linear(INPUTS, args.width),
        torch.nn.Tanh(),
        torch.nn.Linear(args.width, args.width),
        torch.nn.Tanh(),
        torch.nn.Linear(args.width, OUTPUTS),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(os.getpid())  # a restarted learner draws other data: it does not matter
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    emit(e="up", t=time.monotonic())
    acc = Accumulator(
        model,
        optimizer,
        broker=args.broker,
        group="elastic",
        name=args.name,
        token=TOKEN,
        min_size=args.peers,
        op_timeout=30.0,
        backend=args.backend,
    )
    try:
        while not stop.is_set():
            if not acc.ready(timeout=0.5):
                continue
            x = torch.randn(args.batch, INPUTS, generator=data)
            with torch.no_grad():
                y = teacher(x)
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            abandoned = acc.abandoned
            if acc.reduce_gradients(args.batch):
                optimizer.step()
                emit(e="step", t=time.monotonic(), v=acc.version, n=acc.size, d=digest(model), r=acc.refused)
            elif acc.abandoned != abandoned:
                emit(e="abandoned", t=time.monotonic(), v=acc.version)
    finally:
        acc.close()


if __name__ == "__main__":
    main()
