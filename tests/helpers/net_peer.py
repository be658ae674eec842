"""One learner of a gradient-averaging group, for the multi-process tests: trains a
small model on data of its own and prints one JSON line per event on stdout.

    python tests/helpers/net_peer.py BROKER GROUP NAME [--width W] [--pace S] [--virtual-batch-size N] [--backend B]
                                     [--grads-before-ready]

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
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository

from shmpad.net.accumulator import Accumulator  # noqa: E402


def state_hash(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
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
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=f"%(relativeCreated)d [{args.name}] %(message)s")
    torch.set_num_threads(1)
    torch.manual_seed(0)  # every peer starts from the same weights only if synced: seed by name below
    torch.manual_seed(sum(args.name.encode()))
    model = torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.Tanh(), torch.nn.Linear(args.width, 4))
    model.register_buffer("seen", torch.zeros(1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(sum(args.name.encode()) * 7919)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
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


if __name__ == "__main__":
    main()
