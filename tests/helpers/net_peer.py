"""One learner of a gradient-averaging group, for the multi-process tests: trains a
small model on data of its own and prints one JSON line per event on stdout.

    python tests/helpers/net_peer.py BROKER GROUP NAME [--width W] [--pace S] [--virtual-batch-size N] [--backend B]
                                     [--grads-before-ready]
    python tests/helpers/net_peer.py BROKER GROUP NAME --algo appo [--min-size N] [--stop-after S] [--join-on-cue]
                                     [--backend B]

``--algo appo``: a ``learners.Learner`` running APPO (``tests/helpers/appo_group.py``'s
setting) in the group, each minibatch step one reduction; its step lines also say which
minibatch of its batch the step was (``minibatch``, from 0) and the KL-adapted factor of the
rate before the step (``factor``, also in the hash, as the input and value statistics are:
they are buffers of the model). ``--stop-after S``: the peer stops itself (SIGSTOP) once it
has printed its ``S``-th step, for a test to kill it there. ``--join-on-cue``: the peer gets
ready (imports, model) but joins the group only when a line arrives on its stdin.

Lines: ``{"event": "step", "version", "lineage", "discarded", "hash", "size", "abandoned", "refused", "computed_at",
"contributed", "key", "plane"}`` after each optimiser step (hash: SHA-256 of every parameter,
buffer and the optimiser's state; computed_at: the version whose weights gave the gradients
handed to the reduction; contributed: the accumulator did not refuse them),
``{"event": "held", "version", "lineage", "discarded"}`` when a state sync (or a digest
check's resync) changed the version or lineage this peer holds without a step of its own,
``{"event": "reduce", "version"}`` as a reduction starts. ``--grads-before-ready`` computes
the gradients before calling ``ready()``, the order in which a sync can make them stale. The peer trains until its
stdin closes, then leaves the group and exits 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository

from shmpad.net.accumulator import Accumulator  # noqa: E402


def state_hash(model: torch.nn.Module, optimizer: torch.optim.Optimizer, more: str = "") -> str:
    h = hashlib.sha256(more.encode())
    for t in model.state_dict().values():
        h.update(t.detach().numpy().tobytes())
    for state in optimizer.state.values():
        for v in state.values():
            h.update(v.detach().numpy().tobytes() if torch.is_tensor(v) else repr(v).encode())
    return h.hexdigest()[:16]


def emit(**fields) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")  # one write per line: lines from peers never interleave
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("broker")
    parser.add_argument("group")
    parser.add_argument("name")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--pace", type=float, default=0.01)
    parser.add_argument("--virtual-batch-size", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--backend", default="shmpad")
    parser.add_argument("--op-timeout", type=float, default=20.0)
    parser.add_argument("--grads-before-ready", action="store_true")
    parser.add_argument("--algo", choices=("raw", "appo"), default="raw")
    parser.add_argument("--min-size", type=int, default=1)
    parser.add_argument("--stop-after", type=int, default=0)
    parser.add_argument("--join-on-cue", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=f"%(relativeCreated)d [{args.name}] %(message)s")
    torch.set_num_threads(1)
    torch.manual_seed(0)  # every peer starts from the same weights only if synced: seed by name below
    torch.manual_seed(sum(args.name.encode()))
    model = torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.Tanh(), torch.nn.Linear(args.width, 4))
    model.register_buffer("seen", torch.zeros(1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(sum(args.name.encode()) * 7919)
    stop, cue = threading.Event(), threading.Event()

    def read_stdin() -> None:
        for _ in sys.stdin:
            cue.set()
        cue.set()
        stop.set()

    threading.Thread(target=read_stdin, daemon=True).start()
    if args.algo == "appo":
        run_appo(args, stop, cue)
        return
    acc = Accumulator(
        model,
        optimizer,
        broker=args.broker,
        group=args.group,
        name=args.name,
        host=args.host,
        virtual_batch_size=args.virtual_batch_size,
        op_timeout=args.op_timeout,
        backend=args.backend,
    )

    def backward() -> int:
        x = torch.randn(8, 16, generator=data)
        loss = (model(x) - x[:, :4]).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return acc.version

    computed_at = None
    held = (acc.version, acc.lineage)

    def note_held() -> None:
        nonlocal held
        if (acc.version, acc.lineage) != held:
            held = (acc.version, acc.lineage)
            emit(event="held", name=args.name, version=acc.version, lineage=acc.lineage, discarded=acc.discarded)

    try:
        while not stop.is_set():
            if args.grads_before_ready and computed_at is None:
                computed_at = backward()
            if not acc.ready(timeout=0.5):
                continue
            note_held()
            if not args.grads_before_ready:
                computed_at = backward()
            emit(event="reduce", name=args.name, version=acc.version)
            refused = acc.refused
            stepped = acc.reduce_gradients(8)
            contributed = acc.refused == refused
            if not stepped:
                note_held()
            else:
                held = (acc.version, acc.lineage)
                optimizer.step()
                with torch.no_grad():
                    model.seen += 8
                emit(
                    event="step",
                    name=args.name,
                    version=acc.version,
                    lineage=acc.lineage,
                    discarded=acc.discarded,
                    hash=state_hash(model, optimizer),
                    size=acc.size,
                    abandoned=acc.abandoned,
                    refused=acc.refused,
                    computed_at=computed_at,
                    contributed=contributed,
                    key=acc.ring_key,
                    plane=acc.plane,
                )
            computed_at = None
            time.sleep(args.pace)
    finally:
        acc.close()


def run_appo(args: argparse.Namespace, stop: threading.Event, cue: threading.Event) -> None:
    """A learner running APPO in the group until ``stop``: batches of its own (seeded by its
    name), a step line after every minibatch step."""
    import appo_group  # tests/helpers/, this script's folder

    from learners.learner import Learner

    class Member(Learner):
        def optimizer_step(self, columns: int = 0, extra: torch.Tensor | None = None) -> bool:
            acc = self.accumulator
            emit(event="reduce", name=args.name, version=acc.version)
            factor = self.schedule.factor
            refused = acc.refused
            stepped = super().optimizer_step(columns, extra)
            self.minibatch += 1
            if not stepped:
                note_held()
                return False
            held[:] = [acc.version, acc.lineage]
            emit(
                event="step",
                name=args.name,
                version=acc.version,
                lineage=acc.lineage,
                discarded=acc.discarded,
                hash=state_hash(self.model, self.optimizer, repr(factor)),
                size=acc.size,
                abandoned=acc.abandoned,
                refused=acc.refused,
                computed_at=acc.version - 1,
                contributed=acc.refused == refused,
                key=acc.ring_key,
                plane=acc.plane,
                minibatch=self.minibatch - 1,
                factor=factor,
            )
            self.steps_printed += 1
            if self.steps_printed == args.stop_after:
                os.kill(os.getpid(), signal.SIGSTOP)  # the test kills it here, mid-batch
            return True

    learner = appo_group.learner(appo_group.model(sum(args.name.encode())), appo_group.config(), Member)
    learner.minibatch = learner.steps_printed = 0
    if args.join_on_cue:
        cue.wait()
    learner.join_group(
        args.broker,
        args.group,
        name=args.name,
        host=args.host,
        op_timeout=args.op_timeout,
        backend=args.backend,
        min_size=args.min_size,
    )
    acc = learner.accumulator
    held = [acc.version, acc.lineage]

    def note_held() -> None:
        if [acc.version, acc.lineage] != held:
            held[:] = [acc.version, acc.lineage]
            emit(event="held", name=args.name, version=acc.version, lineage=acc.lineage, discarded=acc.discarded)

    seed = sum(args.name.encode()) * 7919
    try:
        while not stop.is_set():
            if not acc.ready(timeout=0.5):
                continue
            note_held()
            learner.minibatch = 0
            learner.update(appo_group.batch(seed))
            seed += 1
            time.sleep(args.pace)
    finally:
        acc.close()


if __name__ == "__main__":
    main()
