"""Same-host RPC speed: shmpad's RpcServer/RpcClient side by side with the usual peers.

    python -m bench.rpc                         # full run: every subject in both modes
    python -m bench.rpc --quick                 # a few seconds: 1 round, 0.2 s per measurement
    python -m bench.rpc --subjects shmpad,mp-pipe --rounds 7
    python -m bench.rpc --json                  # one JSON object per subject and mode

Method. One measurement = one subject in one mode, with a server process and a
client process, both forked afresh (``fork`` context) from this one, which only
waits. Everything shared is built here before the fork; the children meet at a start
barrier, so start-up is not timed. The client makes untimed warm-up calls, then
times calls for ``--seconds``: each call is ``echo(payload)`` with a 64-byte
``bytes`` payload, and every reply is checked against the payload sent.

Modes:

- sync: one caller thread, one call at a time; a round trip is one call;
- in-flight-N (``--in-flight``, 16 by default): the client keeps N calls
  outstanding, each subject in its natural way (see its line in the output), and
  submits a new call as each reply arrives; a round trip is from submitting a call
  to taking its reply.

Per measurement: median and p99 round trip, and calls/s = calls completed / time
from the first submit to the last reply. Subjects, each following ``bench/rpc/contract.py``: the
peers ``multiprocessing.Pipe``, pyzmq over ipc:// and portal (danijar/portal) over localhost
TCP, and ``floor``, a bare shared-memory flag ping-pong in numba (``bench/rpc/peers.py``);
``shmpad``, ``RpcServer(obj, threads=16)`` / ``RpcClient`` (``bench/rpc/subjects.py``).

Machine speed drifts, so subjects are interleaved: each round measures every subject
once per mode, in an order rotated every round, and the tables show medians over
rounds. Ratios are medians of per-round ratios, so a slow round slows both sides of a
ratio alike. Only ratios within one run count; an absolute time is never the headline.

Every child dies with this process (PR_SET_PDEATHSIG) and at the latest after its
deadline (SIGALRM); a measurement that does not finish in time, or whose child fails,
is killed and reported as failed, and the run goes on.
"""

from __future__ import annotations

import functools
import importlib.util
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
from bench.rpc.contract import Plan, Subject
from bench.rpc.peers import FLOOR, PEERS, warm_up_floor
from bench.rpc.subjects import SHMPAD
from bench.rpc.timing import Sample, run_client

# A measurement may take this long on top of the start barrier's timeout, its warm-up
# and its timed phase (the first shmpad call may compile kernels).
SLACK_S = 60.0
# After the client is done, the server has this long to end once asked.
STOP_TIMEOUT_S = 10.0

TARGET_MEDIAN_US = 8.0
TARGET_RATIO = 2.5


@dataclass
class Args:
    rounds: int = 5
    """every subject is measured once per mode and round; tables show medians over rounds"""
    seconds: float = 0.5
    """timed phase of each measurement"""
    warmup: float = 0.1
    """untimed calls before it, in seconds from the first reply"""
    in_flight: int = 16
    """calls in flight in the concurrent mode"""
    subjects: str = "*"
    """subjects to measure: comma-separated names or globs, or a family (shmpad, peer, floor)"""
    json: bool = False
    """print one JSON object per subject and mode and line instead of tables"""
    quick: bool = False
    """one short round of every measurement, to see that it runs (noisy numbers): 1 round of 0.2 s (overrides --rounds, --seconds, --warmup)"""
    # Read where the program starts (bench.common.evidence.saving), so that the copy has every line.
    save: str = ""
    """write the run's evidence into this folder: its stdout, stderr, JSON report and machine.json"""


def parse_args(argv: list[str] | None = None) -> Args:
    parser = parser_for(Args, prog="python -m bench.rpc", description=__doc__.split("\n\n")[0])
    args = Args(**vars(parser.parse_args(argv)))
    if args.quick:
        args.rounds, args.seconds, args.warmup = 1, 0.2, 0.05
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if not args.seconds > 0:
        parser.error(f"--seconds must be > 0, got {args.seconds}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    if not 2 <= args.in_flight <= 64:
        parser.error(f"--in-flight must be between 2 and 64, got {args.in_flight}")
    return args


SUBJECTS: list[type[Subject]] = SHMPAD + PEERS + FLOOR


def missing(subject: type[Subject]) -> str | None:
    """Why ``subject`` cannot run here (its package is not installed, or shmpad.rpc does
    not import), or None. Peers are looked up, not imported: importing portal sets the
    spawn start method."""
    if subject.name == "portal" and importlib.util.find_spec("portal") is None:
        return "not installed (pip install portal)"
    if subject.name == "zmq-ipc" and importlib.util.find_spec("zmq") is None:
        return "pyzmq is not installed"
    if subject.family == "shmpad":
        try:
            import shmpad.rpc  # noqa: F401
        except Exception as e:  # missing, or broken mid-edit
            return f"shmpad.rpc does not import: {e!r}"
    return None


# ---------------------------------------------------------------------------------------
# Running one measurement


def measure(subject_type: type[Subject], plan: Plan) -> Sample:
    """Run one measurement in a fresh server and client process; what the client measured."""
    what = f"{subject_type.name} {plan.mode}"
    try:
        subject = subject_type(plan)
    except Exception as e:
        raise MeasurementFailed(f"{what}: setting up failed: {e!r}") from e
    barrier = FORK.Barrier(2)
    results, results_in = FORK.Pipe(duplex=False)
    timed = plan.warmup_seconds + (plan.seconds if not plan.calls else 0)
    budget = START_TIMEOUT_S + timed + SLACK_S
    server = FORK.Process(
        target=child,
        args=(f"{what}/server", budget + STOP_TIMEOUT_S + 5, subject.prepare_server, subject.serve, barrier, None),
        daemon=True,
    )
    client = FORK.Process(
        target=child,
        args=(
            f"{what}/client",
            budget + 5,
            nothing,
            functools.partial(run_client, subject, plan),
            barrier,
            results_in.send,
        ),
        daemon=True,
    )
    started: list = []
    try:
        for p in (server, client):
            p.start()
            started.append(p)
        deadline = time.monotonic() + budget
        while client.exitcode is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MeasurementFailed(f"{what}: timed out after {budget:.0f} s, the client was still calling")
            ready = multiprocessing.connection.wait([client.sentinel, server.sentinel], timeout=left)
            if client.sentinel in ready:
                client.join()
            elif server.sentinel in ready:
                # A server that ends on the client's goodbye may end before the client does.
                server.join()
                client.join(STOP_TIMEOUT_S if server.exitcode == 0 else 0)
                if client.exitcode is None:
                    raise MeasurementFailed(
                        f"{what}: the server exited with code {server.exitcode} while the client was calling"
                    )
        if client.exitcode != 0:
            raise MeasurementFailed(f"{what}: the client exited with code {client.exitcode}")
        if not results.poll():
            raise MeasurementFailed(f"{what}: the client reported nothing")
        sample: Sample = results.recv()
        subject.stop()
        server.join(STOP_TIMEOUT_S)
        if server.exitcode is None:
            raise MeasurementFailed(f"{what}: the server did not end within {STOP_TIMEOUT_S:g} s of being asked to")
        if server.exitcode != 0:
            raise MeasurementFailed(f"{what}: the server exited with code {server.exitcode}")
        return sample
    finally:
        end(started)
        results.close()
        results_in.close()
        subject.close()


# ---------------------------------------------------------------------------------------
# Reporting


class Results:
    """Per-round samples of every (subject, mode)."""

    def __init__(self):
        self.samples: dict[tuple[str, str], list[Sample | None]] = {}

    def add(self, name: str, mode: str, sample: Sample | None) -> None:
        self.samples.setdefault((name, mode), []).append(sample)

    def median(self, name: str, mode: str, field: str) -> float | None:
        vals = [getattr(s, field) for s in self.samples.get((name, mode), []) if s is not None]
        return statistics.median(vals) if vals else None

    def ratio(self, top: str, bottom: str | list[str], mode: str, field: str = "calls_per_s") -> float | None:
        """Median over rounds of top / bottom; a list means its best (highest) in that round."""

        def per_round(names: list[str]) -> list[float | None]:
            rows = [self.samples.get((n, mode), []) for n in names]
            best = []
            for i in range(max((len(r) for r in rows), default=0)):
                vals = [getattr(r[i], field) for r in rows if i < len(r) and r[i] is not None]
                best.append(max(vals) if vals else None)
            return best

        a = per_round([top])
        b = per_round([bottom] if isinstance(bottom, str) else bottom)
        ratios = [x / y for x, y in zip(a, b) if x is not None and y]
        return statistics.median(ratios) if ratios else None

    def best(self, names: list[str], mode: str) -> str | None:
        ranked = [(self.median(n, mode, "calls_per_s"), n) for n in names]
        ranked = [(r, n) for r, n in ranked if r is not None]
        return max(ranked)[1] if ranked else None


def fmt_us(x: float | None) -> str:
    return "failed" if x is None else f"{x:.1f}"


def print_tables(results: Results, subjects, modes: list[str], args: Args) -> None:
    print(
        f"RPC round trips of echo(64-byte bytes): medians of {args.rounds} round(s), {args.seconds:g} s per measurement."
    )
    print("Ratios are medians of per-round ratios of calls/s. Each subject's calls:")
    for s in subjects:
        print(f"  {s.name:<8} {s.how}")
    shmpad = "shmpad" if any(s.family == "shmpad" for s in subjects) else None
    for mode in modes:
        title = (
            "one caller thread, one call at a time" if mode == "sync" else f"{mode.rsplit('-', 1)[1]} calls in flight"
        )
        print()
        print(f"== {mode}: {title} ==")
        print(f"  {'subject':<8} {'median us':>10} {'p99 us':>9} {'calls/s':>9} {'shmpad/this':>12}")
        for s in subjects:
            ratio = results.ratio(shmpad, s.name, mode) if shmpad else None
            print(
                f"  {s.name:<8} {fmt_us(results.median(s.name, mode, 'median_us')):>10}"
                f" {fmt_us(results.median(s.name, mode, 'p99_us')):>9}"
                f" {fmt_rate(results.median(s.name, mode, 'calls_per_s')):>9} {fmt_ratio(ratio):>12}"
            )


TARGETS = f"shmpad sync median round trip <= {TARGET_MEDIAN_US:g} us; shmpad calls/s >= {TARGET_RATIO:g}x the best peer's, sync and in flight"


def targets(results: Results, subjects, modes: list[str]) -> list[str]:
    """One line per target: PASS/FAIL, the claim, the measured value."""
    lines = []

    def line(claim: str, shown: str, passed: bool | None) -> None:
        lines.append(f"  {verdict(passed)}  {claim}: {shown}")

    if not any(s.family == "shmpad" for s in subjects):
        return ["  n/a   shmpad was not measured"]
    peers = [s.name for s in subjects if s.family == "peer"]
    if "sync" in modes:
        m = results.median("shmpad", "sync", "median_us")
        line(
            f"shmpad sync median round trip <= {TARGET_MEDIAN_US:g} us",
            f"{fmt_us(m)} us",
            None if m is None else m <= TARGET_MEDIAN_US,
        )
    for mode in modes:
        best = results.best(peers, mode)
        r = results.ratio("shmpad", peers, mode) if peers else None
        line(
            f"shmpad {mode} calls/s >= {TARGET_RATIO:g}x the best peer's ({best or 'no peer measured'})",
            fmt_ratio(r),
            at_least(r, TARGET_RATIO),
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    subjects, notes = available(select(SUBJECTS, args.subjects), missing)
    for note in notes:
        print(note, file=sys.stderr)
    if not subjects:
        raise SystemExit("bench.rpc: no subject left to measure")
    if any(s.family == "floor" for s in subjects):
        warm_up_floor()
    plans = [Plan(depth=depth, seconds=args.seconds, warmup_seconds=args.warmup) for depth in (1, args.in_flight)]
    modes = [p.mode for p in plans]
    results = Results()
    failures: list[str] = []
    started = time.monotonic()
    for r in range(args.rounds):
        order = subjects[r % len(subjects) :] + subjects[: r % len(subjects)]
        for plan in plans:
            for s in order:
                try:
                    sample = measure(s, plan)
                except MeasurementFailed as e:
                    failures.append(f"round {r + 1}: {e}")
                    print(f"FAILED {e}", file=sys.stderr)
                    sample = None
                results.add(s.name, plan.mode, sample)
        print(f"round {r + 1}/{args.rounds} done, {time.monotonic() - started:.0f} s", file=sys.stderr)

    if args.json:
        for mode in modes:
            for s in subjects:
                record = {
                    "subject": s.name,
                    "mode": mode,
                    "median_us": results.median(s.name, mode, "median_us"),
                    "p99_us": results.median(s.name, mode, "p99_us"),
                    "calls_per_s": results.median(s.name, mode, "calls_per_s"),
                }
                print(json.dumps(record), flush=True)
        out = sys.stderr
    else:
        print_tables(results, subjects, modes, args)
        out = sys.stdout
    return finish(TARGETS, targets(results, subjects, modes), failures, started, out, notes)
