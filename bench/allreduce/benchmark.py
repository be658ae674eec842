"""Allreduce over loopback TCP: shmpad's PeerRing.allreduce side by side with torch.distributed (gloo).

    python -m bench.allreduce                          # 2, 3, 4 peers x 1, 16, 64 MB
    python -m bench.allreduce --quick                  # one short round: 2 peers, 1 and 16 MB, 1 repetition
    python -m bench.allreduce --peers 4 --sizes-mb 64 --reps 15
    python -m bench.allreduce --json                   # one JSON object per subject, peer count and size
    python -m bench.allreduce --peers 2 --changes 0    # the bandwidth table only, no member-list changes

Method. For each peer count, that many worker processes are forked afresh from this
one (which only waits) and join both subjects' groups: a shmpad ``Mesh`` ring over
loopback, and a gloo process group (``init_process_group("gloo")`` on a ``TCPStore``).
Then, for each size, every repetition runs an allreduce (sum) of a float32 tensor of
that many bytes with each subject in turn, gloo first in even repetitions and shmpad
first in odd ones, so that machine drift touches both alike. Before each timed
operation every worker refills its tensor with its rank + 1 (untimed), meets the others
at a barrier, times the one call, and checks the result. An operation's time is the
slowest worker's; tables show medians over repetitions (after ``--warmup`` untimed
ones). GB/s is algorithm bandwidth: tensor bytes / time (1 GB = 1e9 bytes). The ratio
shmpad/gloo is the median of per-repetition ratios.

Every worker dies with this process (PR_SET_PDEATHSIG) and at the latest after its
deadline (SIGALRM); a peer count whose workers fail or time out is reported as failed
and the run goes on.
"""

from __future__ import annotations

import json
import multiprocessing.connection
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from time import perf_counter

import numpy as np

from bench.allreduce.change import measure_changes, print_changes
from bench.allreduce.contract import SETUP_S, Group
from bench.allreduce.peers import Gloo
from bench.allreduce.subjects import AccumulatedGloo, AccumulatedShmpad, Shmpad
from bench.common.cli import parser_for
from bench.common.harness import FORK, START_TIMEOUT_S, MeasurementFailed, child, end
from bench.common.report import at_least, finish, fmt_ratio, verdict
from bench.common.subject import available, select

TARGET_RATIO = 1.0
TARGET_SIZES = (16 << 20, 64 << 20)
CPU = "cpu:"  # results keyed (CPU + subject, ...) are CPU seconds, not wall-clock seconds
SYS = "cpu:sys:"  # ... and (SYS + subject, ...) the system (kernel) part of them
# A worker's whole life is bounded by the time to form the groups (SETUP_S) plus a
# generous time per operation.
OP_BUDGET_S = 5.0


@dataclass
class Args:
    peers: str = "2,3,4"
    """peer counts to measure, comma-separated"""
    sizes_mb: str = "1,16,64"
    """tensor sizes in MB (2**20 bytes of float32), comma-separated"""
    reps: int = 21
    """timed repetitions per subject, peer count and size"""
    warmup: int = 2
    """untimed repetitions before them"""
    chunk_kib: int = 0
    """shmpad's chunk size in KiB (0: the library's default)"""
    subjects: str = "*"
    """subjects to measure: comma-separated names or globs (shmpad, gloo)"""
    json: bool = False
    """print one JSON object per subject, peer count and size instead of a table"""
    quick: bool = False
    """one short round of every measurement, to see that it runs (noisy numbers): 2 peers, 1 and 16 MB, 1 repetition after 1 warm-up (overrides --peers, --sizes-mb, --reps, --warmup)"""
    # Read where the program starts (bench.common.evidence.saving), so that the copy has every line.
    save: str = ""
    """write the run's evidence into this folder: its stdout, stderr, JSON report and machine.json"""
    changes: int = 5
    """repetitions of each member-list change (join, SIGKILL) per backend (0: measure none)"""
    change_peers: int = 3
    """group size around the changes: a joiner makes it this many, a SIGKILL this many minus one"""


def parse_args(argv: list[str] | None = None) -> tuple[Args, list[int], list[int]]:
    parser = parser_for(Args, prog="python -m bench.allreduce", description=__doc__.split("\n\n")[0])
    args = Args(**vars(parser.parse_args(argv)))
    if args.quick:
        args.peers, args.sizes_mb, args.reps, args.warmup = "2", "1,16", 1, 1
        args.changes = min(args.changes, 1)
    try:
        peers = [int(p) for p in args.peers.split(",") if p.strip()]
        sizes = [int(float(s) * (1 << 20)) // 4 * 4 for s in args.sizes_mb.split(",") if s.strip()]
    except ValueError as e:
        parser.error(f"--peers and --sizes-mb take comma-separated numbers: {e}")
    if not peers or min(peers) < 2:
        parser.error(f"--peers takes counts >= 2, got {args.peers!r}")
    if not sizes or min(sizes) < 4:
        parser.error(f"--sizes-mb takes sizes of at least one float32, got {args.sizes_mb!r}")
    if args.reps < 1 or args.warmup < 0:
        parser.error(f"--reps must be >= 1 and --warmup >= 0, got {args.reps} and {args.warmup}")
    if args.chunk_kib < 0:
        parser.error(f"--chunk-kib must be >= 0, got {args.chunk_kib}")
    if args.changes < 0 or args.change_peers < 2:
        parser.error(f"--changes must be >= 0 and --change-peers >= 2, got {args.changes} and {args.change_peers}")
    return args, peers, sizes


SUBJECTS: list[type[Group]] = [Gloo, Shmpad, AccumulatedGloo, AccumulatedShmpad]


def missing(subject: type[Group]) -> str | None:
    """Why ``subject`` cannot run here, or None."""
    try:
        if subject.name in ("gloo", "acc-gloo"):
            import torch.distributed as dist

            if not dist.is_available() or not dist.is_gloo_available():
                return "this torch has no gloo backend"
        else:
            import shmpad.net.mesh  # noqa: F401
    except Exception as e:
        return f"does not import: {e!r}"
    return None


# ---------------------------------------------------------------------------------------
# One worker process (rank) of one peer count


class Worker:
    """Everything one rank does; built in the parent, run in the forked worker."""

    def __init__(
        self,
        rank: int,
        peers: int,
        sizes: list[int],
        subjects: list[type[Group]],
        args: Args,
        gather,
        scatter,
        step_barrier,
        report,
    ):
        self.rank, self.peers, self.sizes, self.args = rank, peers, sizes, args
        self.subject_types = subjects
        self._gather, self._scatter, self._step, self._report = gather, scatter, step_barrier, report

    def prepare(self) -> None:
        """Listen, trade addresses with the others through the parent, form every group."""
        self.groups = [s(self.args) for s in self.subject_types]
        mine = [g.listen(self.rank, self.peers) for g in self.groups]
        self._gather.send((self.rank, mine))
        everyone = self._scatter.recv()
        for g, addresses in zip(self.groups, everyone):
            g.join(addresses)

    def work(self) -> dict[tuple[str, int], list[float]]:
        """Seconds per timed operation, by (subject, size); and by (CPU + subject, size)
        the CPU seconds (user and system, every thread of this process) it took."""
        times: dict[tuple[str, int], list[float]] = {}
        total = self.peers * (self.peers + 1) // 2
        try:
            for size in self.sizes:
                array = np.empty(size // 4, np.float32)
                for g in self.groups:
                    g.resize(array)
                for rep in range(self.args.warmup + self.args.reps):
                    order = self.groups if rep % 2 == 0 else self.groups[::-1]
                    for g in order:
                        array.fill(self.rank + 1)
                        expected = total / self.peers if g.averages else total
                        self._step.wait(OP_BUDGET_S * 4)
                        c0, t0 = resource.getrusage(resource.RUSAGE_SELF), perf_counter()
                        g.allreduce(array)
                        elapsed, c1 = perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
                        if array[0] != expected or array[-1] != expected or array[len(array) // 2] != expected:
                            raise AssertionError(
                                f"{g.name}: allreduce of {size} bytes gave {array[0]}, expected {expected}"
                            )
                        if rep >= self.args.warmup:
                            times.setdefault((g.name, size), []).append(elapsed)
                            system = c1.ru_stime - c0.ru_stime
                            times.setdefault((CPU + g.name, size), []).append(c1.ru_utime - c0.ru_utime + system)
                            times.setdefault((SYS + g.name, size), []).append(system)
        finally:
            for g in self.groups:
                g.close()
        return times

    def send(self, result) -> None:
        self._report.send((self.rank, result))


def measure(
    peers: int, sizes: list[int], subjects: list[type[Group]], args: Args
) -> dict[tuple[str, int], list[float]]:
    """Fork ``peers`` workers, relay their addresses, and return the slowest worker's
    seconds per operation, by (subject, size), and the CPU seconds of all workers
    together, by (CPU + subject, size)."""
    ops = len(subjects) * len(sizes) * (args.reps + args.warmup)
    lifetime = SETUP_S + START_TIMEOUT_S + ops * OP_BUDGET_S * max(1, max(sizes) >> 26)
    links = [(FORK.Pipe(duplex=False), FORK.Pipe(duplex=False)) for _ in range(peers)]  # (to parent, to worker)
    report_r, report_w = FORK.Pipe(duplex=False)
    start, step = FORK.Barrier(peers), FORK.Barrier(peers)
    procs = []
    for rank in range(peers):
        (up_r, up_w), (down_r, down_w) = links[rank]
        worker = Worker(rank, peers, sizes, subjects, args, up_w, down_r, step, report_w)
        procs.append(
            FORK.Process(
                target=child,
                args=(f"rank {rank} of {peers}", lifetime, worker.prepare, worker.work, start, worker.send),
                daemon=True,
            )
        )
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + lifetime
        found = [_recv(links[r][0][0], procs, deadline, f"rank {r}'s addresses") for r in range(peers)]
        by_rank = dict(found)
        everyone = [[by_rank[r][i] for r in range(peers)] for i in range(len(subjects))]
        for (_, _), (_, down_w) in links:
            down_w.send(everyone)
        results = [_recv(report_r, procs, deadline, "the results") for _ in range(peers)]
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode != 0:
                raise MeasurementFailed(f"{peers} peers: a worker exited with code {p.exitcode}")
    finally:
        end(procs)
        for pipe in [report_r, report_w] + [c for pair in links for ends in pair for c in ends]:
            pipe.close()
    slowest: dict[tuple[str, int], list[float]] = {}
    for key in results[0][1]:
        combine = sum if key[0].startswith(CPU) else max
        slowest[key] = [combine(ts) for ts in zip(*(r[1][key] for r in results))]
    return slowest


def _recv(conn, procs, deadline: float, what: str):
    """The next object on ``conn``, failing when a worker dies or the deadline passes."""
    while not conn.poll():
        left = deadline - time.monotonic()
        if left <= 0:
            raise MeasurementFailed(f"{len(procs)} peers: timed out waiting for {what}")
        ready = multiprocessing.connection.wait([conn] + [p.sentinel for p in procs], timeout=left)
        dead = [p for p in procs if p.sentinel in ready and p.exitcode not in (None, 0)]
        if dead and not conn.poll():
            raise MeasurementFailed(
                f"{len(procs)} peers: worker {dead[0].name} exited with code {dead[0].exitcode} before {what}"
            )
    return conn.recv()


# ---------------------------------------------------------------------------------------
# Reporting


def gb_per_s(size: int, seconds: list[float] | None) -> float | None:
    return None if not seconds else size / statistics.median(seconds) / 1e9


def ratio(results: dict, peers: int, size: int, mine: str = "shmpad", theirs: str = "gloo") -> float | None:
    """Median over repetitions of ``mine``'s GB/s over ``theirs``'."""
    a, b = results.get((mine, peers, size)), results.get((theirs, peers, size))
    if not a or not b:
        return None
    ratios = [tb / ta for ta, tb in zip(a, b) if ta > 0]  # CPU seconds may round to 0
    return statistics.median(ratios) if ratios else None


def fmt_cpu(results: dict, name: str, peers: int, size: int) -> str:
    cpu, sys_ = results.get((CPU + name, peers, size)), results.get((SYS + name, peers, size))
    if not cpu or not sys_:
        return "failed"
    return f"{statistics.median(cpu) * 1e3:.0f} ({sum(sys_) / max(sum(cpu), 1e-9):.0%})"


def fmt_size(size: int) -> str:
    return f"{size / (1 << 20):g} MB"


def fmt_gbs(x: float | None) -> str:
    return "failed" if x is None else f"{x:.2f}"


def print_table(
    results: dict, subjects: list[type[Group]], peer_counts: list[int], sizes: list[int], args: Args
) -> None:
    print(
        f"Allreduce (sum) of float32 tensors over loopback TCP: medians of {args.reps} repetitions "
        f"after {args.warmup} warm-up(s); GB/s = tensor bytes / time of the slowest peer."
    )
    for s in subjects:
        print(f"  {s.name:<10} {s.how}")
    names = [s.name for s in subjects]
    print()
    print(
        f"  {'peers':>5} {'size':>7}"
        + "".join(f" {n + ' GB/s':>15}" for n in names)
        + f" {'shmpad/gloo':>12} {'acc s/g':>8}  target"
    )
    for peers in peer_counts:
        for size in sizes:
            r = ratio(results, peers, size)
            acc = ratio(results, peers, size, "acc-shmpad", "acc-gloo")
            target = verdict(at_least(r, TARGET_RATIO)) if size in TARGET_SIZES else ""
            rates = "".join(f" {fmt_gbs(gb_per_s(size, results.get((n, peers, size)))):>15}" for n in names)
            print(f"  {peers:>5} {fmt_size(size):>7}{rates} {fmt_ratio(r):>12} {fmt_ratio(acc):>8}  {target}")
    print("  acc s/g: the accumulator's end-to-end reduction, backend='shmpad' over backend='gloo'")
    print()
    print(
        "CPU per operation, every peer together (user + system seconds of all their threads), ms (system share); "
        "on a loopback box the peers share its cores, so the subject that burns less CPU per byte wins "
        "once they are all busy"
    )
    print(f"  {'peers':>5} {'size':>7}" + "".join(f" {n + ' CPU':>15}" for n in names) + f" {'shmpad/gloo':>12}")
    for peers in peer_counts:
        for size in sizes:
            cells = "".join(f" {fmt_cpu(results, n, peers, size):>15}" for n in names)
            r = ratio(results, peers, size, CPU + "gloo", CPU + "shmpad")  # CPU of shmpad over gloo's
            print(f"  {peers:>5} {fmt_size(size):>7}{cells} {fmt_ratio(r):>12}")


def targets(results: dict, peer_counts: list[int], sizes: list[int]) -> list[str]:
    lines = []
    for peers in peer_counts:
        for size in sizes:
            if size in TARGET_SIZES:
                r = ratio(results, peers, size)
                lines.append(
                    f"  {verdict(at_least(r, TARGET_RATIO))}  {peers} peers, {fmt_size(size)}: "
                    f"shmpad/gloo {fmt_ratio(r)} (target >= {TARGET_RATIO:g}x)"
                )
    return lines or ["  n/a   no target size (16 or 64 MB) was measured"]


def main(argv: list[str] | None = None) -> int:
    args, peer_counts, sizes = parse_args(argv)
    subjects, notes = available(select(SUBJECTS, args.subjects), missing)
    for note in notes:
        print(note, file=sys.stderr)
    if not subjects:
        raise SystemExit("bench.allreduce: no subject left to measure")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    results: dict[tuple[str, int, int], list[float]] = {}
    failures: list[str] = []
    started = time.monotonic()
    for peers in peer_counts:
        try:
            measured = measure(peers, sizes, subjects, args)
        except MeasurementFailed as e:
            failures.append(str(e))
            print(f"FAILED {e}", file=sys.stderr)
            continue
        for (name, size), seconds in measured.items():
            results[(name, peers, size)] = seconds
        print(f"{peers} peers done, {time.monotonic() - started:.0f} s", file=sys.stderr)
    changes: dict[tuple[str, str], list[float]] = {}
    if args.changes:
        changes, failed = measure_changes(args.change_peers, args.changes)
        failures.extend(failed)
        for failure in failed:
            print(f"FAILED {failure}", file=sys.stderr)
        print(f"member-list changes done, {time.monotonic() - started:.0f} s", file=sys.stderr)

    if args.json:
        for peers in peer_counts:
            for size in sizes:
                for s in subjects:
                    seconds = results.get((s.name, peers, size))
                    record = {
                        "subject": s.name,
                        "peers": peers,
                        "size_bytes": size,
                        "gb_per_s": gb_per_s(size, seconds),
                        "median_ms": None if not seconds else statistics.median(seconds) * 1e3,
                        "cpu_ms_all_peers": (
                            statistics.median(results[(CPU + s.name, peers, size)]) * 1e3
                            if results.get((CPU + s.name, peers, size))
                            else None
                        ),
                        "reps": len(seconds or []),
                        "ratio_to_gloo": (
                            ratio(results, peers, size)
                            if s.name == "shmpad"
                            else ratio(results, peers, size, s.name, "acc-gloo")
                            if s.name == "acc-shmpad"
                            else None
                        ),
                    }
                    print(json.dumps(record), flush=True)
        for (backend, event), seconds in changes.items():
            record = {
                "change": event,
                "backend": backend,
                "peers": args.change_peers,
                "median_s": statistics.median(seconds),
                "seconds": seconds,
            }
            print(json.dumps(record), flush=True)
        out = sys.stderr
    else:
        print_table(results, subjects, peer_counts, sizes, args)
        if changes:
            print_changes(changes, args.change_peers, args.changes)
        out = sys.stdout
    target = f"shmpad >= {TARGET_RATIO:g}x gloo's GB/s at 16 and 64 MB"
    return finish(target, targets(results, peer_counts, sizes), failures, started, out)
