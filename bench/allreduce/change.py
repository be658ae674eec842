"""The time from a member-list change to the group's first completed reduction, per
accumulator backend: what a join or a SIGKILL costs a training group (``python -m
bench.allreduce`` runs it after the bandwidth table; ``--changes 0`` leaves it out).

Method. A broker runs in this process (settle 0.05 s, so its coalescing delay is part
of every figure), and forked learners each run ``Accumulator(backend=...)`` on a 1 MB
model, reducing as fast as they can and reporting every completed reduction with its
group size and ``time.monotonic()`` (one clock for every process on the host).

- join: ``peers - 1`` learners train; one more starts; the clock starts when its
  Accumulator has joined the broker and stops when every member, the joiner included,
  has completed a reduction in the group of ``peers`` (forming the ring and, for gloo,
  the process group, the state sync to the joiner, one reduction).
- kill: ``peers`` learners train; one is SIGKILLed (mid-reduction, most likely: they
  reduce back to back); the clock stops when every survivor has completed a
  reduction in the group of ``peers - 1``.

Backends and events alternate from one repetition to the next; tables show medians.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import signal
import statistics
import time

from bench.common.harness import FORK, MeasurementFailed, end
from shmpad.launch.process import die_with_parent

TOKEN = "bench-allreduce-change"
EVENTS = ("join", "kill")
BACKENDS = ("shmpad", "gloo")
MODEL_FLOATS = 1 << 18  # 1 MB of float32
SETTLE_S = 0.05
STEADY_STEPS = 3  # reductions every member completes before the change
WAIT_S = 60.0  # for any one thing to happen, before the measurement counts as failed
LIFETIME_S = 180.0


def learner(broker: str, name: str, backend: str, min_size: int, events, stop) -> None:
    """One forked learner: join, reduce until ``stop``, report each step on ``events``,
    a pipe of its own (a shared queue's lock dies held with a SIGKILLed learner)."""
    die_with_parent(os.getppid())
    signal.alarm(int(LIFETIME_S))
    import torch

    from shmpad.net.accumulator import Accumulator

    torch.set_num_threads(1)
    param = torch.nn.Parameter(torch.zeros(MODEL_FLOATS))
    model = torch.nn.ParameterList([param])
    acc = Accumulator(
        model, broker=broker, group="g", name=name, token=TOKEN, min_size=min_size, check_every=0, backend=backend
    )
    events.send(("joined", name, time.monotonic(), 0))
    try:
        while not stop.is_set():
            if not acc.ready(timeout=0.2):
                continue
            param.grad = torch.ones(MODEL_FLOATS)
            if acc.reduce_gradients(1):
                events.send(("step", name, time.monotonic(), acc.size))
    finally:
        acc.close()


class Run:
    """One group of forked learners around one change."""

    def __init__(self, backend: str, peers: int):
        from shmpad.net.broker import Broker

        self.backend, self.peers = backend, peers
        self.broker = Broker(port=0, token=TOKEN, settle_s=SETTLE_S, heartbeat_s=0.5, timeout_s=5.0)
        self.stop = FORK.Event()
        self.pipes: dict[object, str] = {}  # the read end of each learner's pipe
        self.procs: dict[str, object] = {}
        self.steps: dict[str, list[tuple[float, int]]] = {}
        self.joined: dict[str, float] = {}

    def start(self, name: str, min_size: int) -> None:
        read, write = FORK.Pipe(duplex=False)
        args = (self.broker.address, name, self.backend, min_size, write, self.stop)
        proc = FORK.Process(target=learner, args=args, daemon=True, name=name)
        proc.start()
        write.close()
        self.procs[name] = proc
        self.pipes[read] = name
        self.steps[name] = []

    def until(self, done, what: str) -> None:
        """Take events until ``done()``; ``MeasurementFailed`` after ``WAIT_S`` or when a learner dies."""
        deadline = time.monotonic() + WAIT_S
        while not done():
            ready = multiprocessing.connection.wait(list(self.pipes), timeout=0.5)
            dead = [n for n, p in self.procs.items() if p.exitcode not in (None, 0, -signal.SIGKILL)]
            if dead or time.monotonic() > deadline:
                why = f"learner {dead[0]} exited with code {self.procs[dead[0]].exitcode}" if dead else "timed out"
                raise MeasurementFailed(f"{self.backend}, {self.peers} peers: {why} waiting for {what}")
            for pipe in ready:
                try:
                    kind, name, t, size = pipe.recv()
                except EOFError:  # that learner is gone
                    del self.pipes[pipe]
                    pipe.close()
                    continue
                if kind == "joined":
                    self.joined[name] = t
                else:
                    self.steps[name].append((t, size))

    def stepped(self, names, size: int, after: float, count: int = 1) -> bool:
        return all(sum(1 for t, s in self.steps[n] if s == size and t > after) >= count for n in names)

    def first(self, names, size: int, after: float) -> float:
        return max(min(t for t, s in self.steps[n] if s == size and t > after) for n in names)

    def close(self) -> None:
        self.stop.set()
        for p in self.procs.values():
            p.join(10)
        end(list(self.procs.values()))
        self.broker.close()
        for pipe in self.pipes:
            pipe.close()


def measure_change(backend: str, peers: int, event: str) -> float:
    """Seconds from the change ``event`` to every member's first reduction after it."""
    import torch  # noqa: F401 - imported once here, not in every learner after the fork

    run = Run(backend, peers)
    try:
        before = peers - 1 if event == "join" else peers
        names = [f"l{i}" for i in range(before)]
        for name in names:
            run.start(name, before)
        run.until(lambda: run.stepped(names, before, 0.0, STEADY_STEPS), f"{STEADY_STEPS} steps in a group of {before}")
        if event == "join":
            run.start("joiner", 1)
            run.until(lambda: "joiner" in run.joined, "the joiner's join")
            t0 = run.joined["joiner"]
            members = [*names, "joiner"]
        else:
            victim = run.procs[names[0]]
            t0 = time.monotonic()
            os.kill(victim.pid, signal.SIGKILL)
            members = names[1:]
        after = peers if event == "join" else peers - 1
        run.until(lambda: run.stepped(members, after, t0), f"a reduction in the group of {after} after the {event}")
        return run.first(members, after, t0) - t0
    finally:
        run.close()


def measure_changes(peers: int, reps: int, backends=BACKENDS) -> tuple[dict[tuple[str, str], list[float]], list[str]]:
    """Seconds by (backend, event), ``reps`` each, interleaved; and the failures."""
    results: dict[tuple[str, str], list[float]] = {}
    failures: list[str] = []
    for rep in range(reps):
        order = backends if rep % 2 == 0 else backends[::-1]
        for backend in order:
            for event in EVENTS:
                try:
                    results.setdefault((backend, event), []).append(measure_change(backend, peers, event))
                except MeasurementFailed as e:
                    failures.append(f"change: {e}")
    return results, failures


def print_changes(results: dict[tuple[str, str], list[float]], peers: int, reps: int) -> None:
    print()
    print(
        f"Member-list change to the first completed reduction of every member ({peers - 1} <-> {peers} peers, "
        f"1 MB model, broker settle {SETTLE_S} s): medians of {reps}, seconds"
    )
    print(f"  {'event':<6}" + "".join(f" {b:>16}" for b in BACKENDS))
    for event in EVENTS:
        cells = []
        for backend in BACKENDS:
            seconds = results.get((backend, event))
            cells.append(
                "failed" if not seconds else f"{statistics.median(seconds):.2f} ({min(seconds):.2f}-{max(seconds):.2f})"
            )
        print(f"  {event:<6}" + "".join(f" {c:>16}" for c in cells))
