"""Ring throughput: shmpad's SPSC and MPMC rings side by side with the usual IPC peers.

    python -m bench.ringbuf                      # full run: every subject, size and topology
    python -m bench.ringbuf --quick              # a few seconds: 1 round, 0.1 s, 64 B and 64 KiB
    python -m bench.ringbuf --sizes 4K --subjects 'shmpad-*,zmq-ipc,ceiling' --rounds 5
    python -m bench.ringbuf --json               # one JSON object per measurement and line

Method. One measurement = one subject, one message size, 1 or 4 producers and one
consumer, all forked afresh (``fork`` context). Everything shared is built in the
parent before the fork; the children meet at a start barrier, so start-up is not
timed. Each producer sends the same message for ``--seconds`` and then an end
marker; the consumer receives until it has every end marker, touching each message
as its subject's ``reads`` says (a copy into private memory, or for the zero-copy
subjects the first and last byte). Throughput = messages received after the first
receive returned / time from then to the last end marker. The consumer's count is
checked against the producers', and the last payload against the one sent.

Subjects (the tables start with one line per subject saying what its consumer does):

- shmpad-spsc, shmpad-mpmc: single calls, ``put(bytes)`` / ``get_bytes()``;
- shmpad-*-into: ``put(bytes)`` / ``get_into(buffer)``, a copy into a private buffer;
- shmpad-*-batch: ``put_many`` of a [batch, size] array / ``get_many``, rows copied out;
- shmpad-*-zc: ``put(bytes)`` / ``get()``, a view of which only the first and last
  byte are read, then ``release()``;
- with N producers, SPSC gets one ring per producer, which the consumer polls in
  turn with the non-blocking calls; MPMC gets one ring shared by all;
- peers (``bench/ringbuf/peers.py``): multiprocessing Queue and Pipe, faster-fifo, pyzmq
  PUSH/PULL over ipc and tcp, and monobeast (shared torch tensors, slot indices
  through SimpleQueues);
- ceiling: numpy copies into and out of shared memory, synchronised by spinning on
  two counters per producer: what moving the bytes costs with no queue at all.

``--json`` prints one object per subject, size and topology with keys transport,
size_bytes, producers, consumers, msgs_per_s and bytes_per_s (medians; null when
every round failed); the targets then go to stderr.

Machine speed drifts, so subjects are interleaved: each round measures every
subject once per size and topology, in an order rotated every round, and the
tables show medians over rounds. Ratios are medians of the per-round ratios, so a
slow round slows both sides of a ratio alike. Only ratios within one run count.

Every transport gets the same buffering in bytes (``--queue-bytes``, as a number of
messages between 16 and 4096; subjects with a channel per producer split it).
Every child has a deadline: a measurement that does not finish in time, or whose
child fails, is killed and reported as failed; the run goes on.
"""

from __future__ import annotations

import functools
import json
import multiprocessing.connection
import statistics
import sys
import time
from dataclasses import dataclass

from bench.common.cli import parser_for
from bench.common.harness import FORK, START_TIMEOUT_S, MeasurementFailed, child, end, nothing
from bench.common.report import at_least, finish, fmt_rate, fmt_ratio, verdict
from bench.common.subject import available, select
from bench.ringbuf.contract import Plan, Subject, Tally
from bench.ringbuf.peers import PEERS
from bench.ringbuf.subjects import SHMPAD, ShmpadSubject, copies, missing_ring, single_calls

KIB = 1 << 10
MIB = 1 << 20

# The parent allows this much beyond --seconds and the start barrier's timeout for
# draining before it kills a measurement.
DRAIN_TIMEOUT_S = 15.0

SUBJECTS: list[type[Subject]] = SHMPAD + PEERS


@dataclass
class Args:
    rounds: int = 3
    """every subject is measured once per round; tables show medians over rounds"""
    seconds: float = 0.5
    """how long each producer sends, per measurement"""
    sizes: str = "64,4K,64K,1M"
    """message sizes, comma-separated (suffixes K/KiB, M/MiB)"""
    producers: str = "1,4"
    """producer counts (topologies N->1), comma-separated"""
    subjects: str = "*"
    """subjects to measure: comma-separated names or globs, or a family (shmpad, peer, ceiling)"""
    queue_bytes: int = 4 * MIB
    """buffering every transport gets, in bytes (as 16 to 4096 messages)"""
    json: bool = False
    """print one JSON object per measurement and line instead of tables"""
    ring_stats: bool = False
    """after each shmpad measurement, print its rings' statistics() to stderr"""
    quick: bool = False
    """one short round of every measurement, to see that it runs (noisy numbers): 1 round of 0.1 s, 64 B and 64 KiB (overrides --rounds, --seconds, --sizes)"""
    # Read where the program starts (bench.common.evidence.saving), so that the copy has every line.
    save: str = ""
    """write the run's evidence into this folder: its stdout, stderr, JSON report and machine.json"""


def parse_args(argv: list[str] | None = None) -> Args:
    parser = parser_for(Args, prog="python -m bench.ringbuf", description=__doc__.split("\n\n")[0])
    args = Args(**vars(parser.parse_args(argv)))
    if args.quick:
        args.rounds, args.seconds, args.sizes = 1, 0.1, "64,64K"
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if not args.seconds > 0:
        parser.error(f"--seconds must be > 0, got {args.seconds}")
    return args


def parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": KIB, "M": MIB}.get(t[-1:], 1)
    try:
        n = int(t[:-1] if scale > 1 else t) * scale
    except ValueError:
        raise ValueError(f"a message size is a number of bytes with an optional K or M suffix, got {text!r}") from None
    if n < 2:
        raise ValueError(f"messages must hold at least 2 bytes (1 byte is the end marker), got {text!r}")
    return n


def size_label(n: int) -> str:
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB} KiB"
    return f"{n} B"


def make_plan(size: int, producers: int, args: Args) -> Plan:
    return Plan(
        size=size,
        producers=producers,
        seconds=args.seconds,
        capacity=min(4096, max(16, args.queue_bytes // size)),
        batch=min(512, max(1, 256 * KIB // size)),
    )


# ---------------------------------------------------------------------------------------
# Running one measurement


def measure(subject_type: type[Subject], plan: Plan, ring_stats: bool = False) -> float:
    """Run one measurement in fresh processes; messages per second at the consumer."""
    what = f"{subject_type.name} {size_label(plan.size)} {plan.producers}->1"
    try:
        subject = subject_type(plan)
    except Exception as e:
        raise MeasurementFailed(f"{what}: setting up failed: {e!r}") from e
    barrier = FORK.Barrier(plan.producers + 1)
    sent = FORK.RawArray("q", plan.producers)
    results, results_in = FORK.Pipe(duplex=False)
    # role, before the barrier, after it, what to do with its result
    roles = [("consumer", subject.prepare_consumer, subject.consume, results_in.send)]
    for i in range(plan.producers):
        roles.append(
            (f"producer/{i}", nothing, functools.partial(subject.produce, i), functools.partial(sent.__setitem__, i))
        )
    # The parent kills a measurement after ``budget``; a child left on its own ends a bit later.
    budget = START_TIMEOUT_S + plan.seconds + DRAIN_TIMEOUT_S
    names = {
        FORK.Process(
            target=child, args=(f"{what}/{role}", budget + 5, prepare, work, barrier, report), daemon=True
        ): role
        for role, prepare, work, report in roles
    }
    procs = list(names)
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + budget
        pending = {p.sentinel: p for p in procs}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                stuck = ", ".join(names[p] for p in pending.values())
                raise MeasurementFailed(f"{what}: timed out, still running: {stuck}")
            for s in multiprocessing.connection.wait(list(pending), timeout=left):
                p = pending.pop(s)
                p.join()
                if p.exitcode != 0:
                    raise MeasurementFailed(f"{what}: {names[p]} exited with code {p.exitcode}")
        if not results.poll():
            raise MeasurementFailed(f"{what}: the consumer reported nothing")
        tally: Tally = results.recv()
    finally:
        end(procs)
        results.close()
        results_in.close()
        if ring_stats and isinstance(subject, ShmpadSubject):
            for st in subject.statistics():
                print(f"{what}: {st}", file=sys.stderr)
        subject.close()
    total_sent = sum(sent)
    if tally.received != total_sent:
        raise MeasurementFailed(f"{what}: producers sent {total_sent} messages, the consumer received {tally.received}")
    if not tally.intact:
        raise MeasurementFailed(f"{what}: the payload arrived changed")
    if tally.timed < 1 or tally.t_last <= tally.t_first:
        raise MeasurementFailed(f"{what}: too few messages to time ({tally.received})")
    return tally.timed / (tally.t_last - tally.t_first)


# ---------------------------------------------------------------------------------------
# Reporting


class Results:
    """Per-round rates of every (subject, size, producers)."""

    def __init__(self):
        self.rates: dict[tuple[str, int, int], list[float | None]] = {}

    def add(self, name: str, size: int, producers: int, rate: float | None) -> None:
        self.rates.setdefault((name, size, producers), []).append(rate)

    def median(self, name: str, size: int, producers: int) -> float | None:
        good = [r for r in self.rates.get((name, size, producers), []) if r is not None]
        return statistics.median(good) if good else None

    def ratio(self, top: str | list[str], bottom: str | list[str], size: int, producers: int) -> float | None:
        """Median over rounds of rate(top) / rate(bottom); a list means its best in that round."""

        def per_round(names):
            names = [names] if isinstance(names, str) else names
            rows = [self.rates.get((n, size, producers), []) for n in names]
            rounds = max((len(r) for r in rows), default=0)
            best = []
            for i in range(rounds):
                vals = [r[i] for r in rows if i < len(r) and r[i] is not None]
                best.append(max(vals) if vals else None)
            return best

        a, b = per_round(top), per_round(bottom)
        ratios = [x / y for x, y in zip(a, b) if x is not None and y]
        return statistics.median(ratios) if ratios else None

    def best(self, names: list[str], size: int, producers: int) -> str | None:
        ranked = [(self.median(n, size, producers), n) for n in names]
        ranked = [(r, n) for r, n in ranked if r is not None]
        return max(ranked)[1] if ranked else None


def print_tables(results: Results, subjects, sizes, producer_counts, args: Args) -> None:
    print(f"Ring throughput: medians of {args.rounds} round(s), {args.seconds:g} s per measurement.")
    print("Ratios are medians of per-round ratios; 'best' is the fastest shmpad subject whose consumer copies.")
    print("What each consumer does with a message:")
    for s in subjects:
        print(f"  {s.name:<18} {s.reads}")
    for size in sizes:
        for producers in producer_counts:
            best = results.best([s.name for s in subjects if s.family == "shmpad" and copies(s)], size, producers)
            print()
            print(f"== {size_label(size)}, {producers}->1 == best: {best or '-'}")
            print(f"  {'subject':<18} {'msgs/s':>9} {'GB/s':>7} {'best/this':>10}")
            for s in subjects:
                rate = results.median(s.name, size, producers)
                gbs = "-" if rate is None else f"{rate * size / 1e9:.3f}"
                ratio = results.ratio(best, s.name, size, producers) if best else None
                print(f"  {s.name:<18} {fmt_rate(rate):>9} {gbs:>7} {fmt_ratio(ratio):>10}")


TARGETS = (
    "64 B and 4 KiB: >= 2x the best peer (64 B: >= 2M msgs/s single calls, >= 20M msgs/s batch); "
    "64 KiB and 1 MiB: >= 80% of the ceiling with copying reads and >= 1.2x the best peer; "
    "zero-copy reads above the ceiling"
)


def targets(results: Results, subjects, sizes, producer_counts) -> list[str]:
    """One line per target and case: PASS/FAIL, the claim, the measured value."""
    lines = []

    def line(case: str, claim: str, shown: str, passed: bool | None) -> None:
        lines.append(f"  {verdict(passed)}  {case}: {claim}: {shown}")

    for size in sizes:
        for producers in producer_counts:
            case = f"{size_label(size)} {producers}->1"
            peers = [s.name for s in subjects if s.family == "peer"]
            shmpad = [s for s in subjects if s.family == "shmpad"]
            single = results.best([s.name for s in shmpad if single_calls(s)], size, producers)
            batch = results.best([s.name for s in shmpad if s.name.endswith("-batch")], size, producers)
            copying = results.best([s.name for s in shmpad if copies(s)], size, producers)
            zero = results.best([s.name for s in shmpad if not copies(s)], size, producers)
            best_peer = results.best(peers, size, producers)
            ceiling = "ceiling" if any(s.name == "ceiling" for s in subjects) else None
            if size < 64 * KIB:
                for name in (single, batch):
                    if name and best_peer:
                        r = results.ratio(name, peers, size, producers)
                        line(case, f"{name} >= 2x the best peer ({best_peer})", fmt_ratio(r), at_least(r, 2))
                if size == 64:
                    for name, bar in ((single, 2e6), (batch, 20e6)):
                        if name:
                            rate = results.median(name, size, producers)
                            line(case, f"{name} >= {fmt_rate(bar)} msgs/s", fmt_rate(rate), at_least(rate, bar))
            else:
                if copying and ceiling:
                    r = results.ratio(copying, ceiling, size, producers)
                    shown = "-" if r is None else f"{r:.0%}"
                    line(case, f"{copying} (copying reads) >= 80% of the ceiling", shown, at_least(r, 0.8))
                if copying and best_peer:
                    r = results.ratio(copying, peers, size, producers)
                    line(
                        case,
                        f"{copying} (copying reads) >= 1.2x the best peer ({best_peer})",
                        fmt_ratio(r),
                        at_least(r, 1.2),
                    )
                if zero and ceiling:
                    r = results.ratio(zero, ceiling, size, producers)
                    line(
                        case, f"{zero} (zero-copy reads) above the ceiling", fmt_ratio(r), at_least(r, 1, strictly=True)
                    )
    if not lines:
        lines.append("  n/a   no shmpad subject was measured")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
        producer_counts = [int(p) for p in args.producers.split(",") if p.strip()]
        if not producer_counts or min(producer_counts) < 1:
            raise ValueError(f"--producers takes counts >= 1, got {args.producers!r}")
    except ValueError as e:
        raise SystemExit(f"bench.ringbuf: {e}") from None
    subjects, notes = available(select(SUBJECTS, args.subjects), missing_ring)
    for note in notes:
        print(note, file=sys.stderr)
    if not subjects:
        raise SystemExit("bench.ringbuf: no subject left to measure")
    results = Results()
    failures: list[str] = []
    started = time.monotonic()
    for r in range(args.rounds):
        order = subjects[r % len(subjects) :] + subjects[: r % len(subjects)]
        for size in sizes:
            for producers in producer_counts:
                plan = make_plan(size, producers, args)
                for s in order:
                    try:
                        rate = measure(s, plan, args.ring_stats)
                    except MeasurementFailed as e:
                        failures.append(f"round {r + 1}: {e}")
                        print(f"FAILED {e}", file=sys.stderr)
                        rate = None
                    results.add(s.name, size, producers, rate)
        print(f"round {r + 1}/{args.rounds} done, {time.monotonic() - started:.0f} s", file=sys.stderr)

    if args.json:
        for size in sizes:
            for producers in producer_counts:
                for s in subjects:
                    rate = results.median(s.name, size, producers)
                    record = {
                        "transport": s.name,
                        "size_bytes": size,
                        "producers": producers,
                        "consumers": 1,
                        "msgs_per_s": rate,
                        "bytes_per_s": None if rate is None else rate * size,
                    }
                    print(json.dumps(record), flush=True)
        out = sys.stderr
    else:
        print_tables(results, subjects, sizes, producer_counts, args)
        out = sys.stdout
    return finish(TARGETS, targets(results, subjects, sizes, producer_counts), failures, started, out)
