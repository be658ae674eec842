"""Atari environment throughput: the shmpad pool side by side with its peers and the ceiling.

    python -m bench.envpool                   # 3 rounds of 6 s per subject
    python -m bench.envpool --quick           # one short round (1 s per subject): a smoke run
    python -m bench.envpool --json            # one JSON object per subject and line
    python -m bench.envpool --subjects ceiling,shmpad-random --rounds 5

Every subject steps ``--env`` (default ALE/Pong-v5) with the IMPALA/moolib preprocessing
(ALE v5 without sticky actions, frame skip 4 with max over the last two frames, up to
30 no-ops, grayscale 84x84, 4-frame stack) and uniformly random actions, on ``--cores``
cores, and counts emulator frames (frame skip included) per second. Every subject draws
its random actions the same way, a block of batches at a time (``RandomActions``): one
numpy call per batch is slow in a process that wakes on a core whose caches the
emulator has just filled, and that is the policy's cost, not the framework's.

- ceiling: one independent process per core stepping ``num_envs / cores`` environments
  in a plain loop (shmpad's ``AtariEnv``: the ALE plus the numba preprocessing); no
  framework, no communication;
- gym-async: gymnasium's ``AsyncVectorEnv(shared_memory=True)`` over the same
  environments wrapped as gymnasium envs (one process per environment, as it works);
  gymnasium's own ``AtariPreprocessing`` needs OpenCV, which is not a dependency;
- envpool: if installed (its C++ threads and preprocessing), else skipped with a note;
- ale-vector: ale-py's ``AtariVectorEnv`` (C++ threads, its own preprocessing), async
  with batches of half the environments, ``--cores`` threads;
- shmpad-random: ``EnvPool`` with ``--cores`` workers, double-buffered, random actions
  chosen in the pool's process and sent through the action slots;
- shmpad-impala-cpu: the same pool driven by ``BatchedInference`` of the IMPALA network
  (ResNet 16/32/32 + FC 256) on the CPU (``--device cuda`` uses the GPU); its line
  says where the time goes: in the workers' environments, in inference, waiting.

Each measurement runs in a fresh forked process tree, warms up for ``--warmup`` s and
then counts for ``--seconds`` s. Machine speed drifts, so rounds interleave the
subjects (the order rotates each round); tables show medians over rounds, and ratios
are medians of per-round ratios. Only ratios within one run count.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

from bench.common.cli import parser_for
from bench.common.harness import MeasurementFailed, MeasurementSkipped, in_own_tree
from bench.common.report import at_least, exit_status, fmt_ratio, verdict
from bench.envpool.peers import run_ale_vector, run_ceiling, run_envpool, run_gym_async
from bench.envpool.subjects import run_shmpad_impala, run_shmpad_random

TARGETS = (("ceiling", 0.90), ("gym-async", 2.0), ("ale-vector", 1.0))
"""shmpad-random's frames/s at least this many times each peer's"""

SUBJECTS = ("ceiling", "gym-async", "envpool", "ale-vector", "shmpad-random", "shmpad-impala-cpu")


@dataclass
class Args:
    """Atari throughput of the shmpad pool and its peers, side by side."""

    env: str = "ALE/Pong-v5"
    """Atari environment id."""
    cores: int = 2
    """Processes or threads each subject may use for environments."""
    num_envs: int = 32
    """Environments per subject (a multiple of 2 * cores); the same for every subject."""
    seconds: float = 6.0
    """Counted seconds per measurement."""
    warmup: float = 1.5
    """Seconds stepped before counting."""
    rounds: int = 3
    """Rounds; each measures every subject once."""
    subjects: str = ",".join(SUBJECTS)
    """Comma-separated subjects to run."""
    device: str = "cpu"
    """Device of the IMPALA network (cuda when there is one)."""
    json: bool = False
    """Print one JSON object per subject and line instead of tables."""
    quick: bool = False
    """one short round of every measurement, to see that it runs (noisy numbers): 1 round of 1 s after 0.5 s of warm-up (overrides --rounds, --seconds, --warmup)"""
    # Read where the program starts (bench.common.evidence.saving), so that the copy has every line.
    save: str = ""
    """write the run's evidence into this folder: its stdout, stderr, JSON report and machine.json"""


def parse_args(argv: list[str] | None = None) -> Args:
    parser = parser_for(Args, prog="python -m bench.envpool", description=__doc__.split("\n\n")[0])
    args = Args(**vars(parser.parse_args(argv)))
    if args.quick:
        args.rounds, args.seconds, args.warmup = 1, 1.0, 0.5
    if args.num_envs % (2 * args.cores):
        parser.error(f"--num-envs must be a multiple of 2 * cores ({2 * args.cores}), got {args.num_envs}")
    return args


RUNNERS = {
    "ceiling": run_ceiling,
    "gym-async": run_gym_async,
    "envpool": run_envpool,
    "ale-vector": run_ale_vector,
    "shmpad-random": run_shmpad_random,
    "shmpad-impala-cpu": run_shmpad_impala,
}


# -- running a measurement in its own process tree -------------------------------------


def measure(subject: str, args: Args) -> tuple[float | None, dict | str]:
    """(frames/s, details) of one measurement in a process tree of its own, or (None, why)."""
    try:
        rate, details = in_own_tree(lambda: RUNNERS[subject](args), args.warmup + args.seconds + 120)
    except MeasurementSkipped as e:
        return None, f"skipped: {e}"
    except MeasurementFailed as e:
        return None, f"failed: {e}"
    return rate, details


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from shmpad.shm import janitor

    janitor.start()
    subjects = [s.strip() for s in args.subjects.split(",") if s.strip()]
    unknown = [s for s in subjects if s not in RUNNERS]
    if unknown:
        raise SystemExit(f"unknown subjects {unknown}; known: {list(RUNNERS)}")
    rates: dict[str, list[float]] = {s: [] for s in subjects}
    details: dict[str, list] = {s: [] for s in subjects}
    notes: dict[str, str] = {}
    per_round: list[dict[str, float]] = []
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))
    say(
        f"# bench.envpool {time.strftime('%Y-%m-%d %H:%M')} {platform.node()} cpus={os.cpu_count()} env={args.env} "
        f"cores={args.cores} num_envs={args.num_envs} rounds={args.rounds} seconds={args.seconds}"
    )
    for r in range(args.rounds):
        order = subjects[r % len(subjects) :] + subjects[: r % len(subjects)]
        this_round = {}
        for s in order:
            if s in notes and notes[s].startswith("skipped"):
                continue
            rate, info = measure(s, args)
            if rate is None:
                notes[s] = info
                say(f"  round {r + 1}: {s}: {info.splitlines()[0] if info else ''}")
                continue
            rates[s].append(rate)
            details[s].append(info)
            this_round[s] = rate
            say(f"  round {r + 1}: {s:18s} {rate:10.0f} frames/s {info if info else ''}")
        per_round.append(this_round)
    return report(args, subjects, rates, details, notes, per_round)


def _ratio(per_round: list[dict[str, float]], a: str, b: str) -> float | None:
    values = [r[a] / r[b] for r in per_round if a in r and b in r and r[b] > 0]
    return statistics.median(values) if values else None


def report(args: Args, subjects, rates, details, notes, per_round) -> int:
    """Print the table and the targets; the exit status (1 when a target was missed)."""
    peers = [p for p in ("ceiling", "gym-async", "envpool", "ale-vector") if p in subjects]
    rows = []
    for s in subjects:
        med = statistics.median(rates[s]) if rates[s] else None
        row = {
            "subject": s,
            "cores": args.cores,
            "num_envs": args.num_envs,
            "frames_per_s": None if med is None else round(med),
        }
        for p in peers:
            if p != s:
                ratio = _ratio(per_round, s, p)
                row[f"ratio_to_{p}"] = None if ratio is None else round(ratio, 3)
        if details[s] and details[s][-1]:
            row["where"] = {k: round(statistics.median(d[k] for d in details[s]), 3) for k in details[s][-1]}
        if s in notes:
            row["note"] = notes[s].splitlines()[0]
        row["rounds"] = len(rates[s])
        rows.append(row)
    target_lines = [
        f"  {verdict(at_least(r, want))}  shmpad-random / {peer}: {fmt_ratio(r)} (target >= {want:g}x)"
        for peer, want in TARGETS
        for r in [_ratio(per_round, "shmpad-random", peer)]
    ]
    out = sys.stderr if args.json else sys.stdout
    if args.json:
        for row in rows:
            print(json.dumps(row), flush=True)
    else:
        _print_table(rows, peers)
    print("\nTargets: " + ", ".join(f"shmpad-random >= {want:g} x {peer}" for peer, want in TARGETS), file=out)
    for line in target_lines:
        print(line, file=out)
    return exit_status(target_lines, [], out)


def _print_table(rows: list[dict], peers: list[str]) -> None:
    print()
    head = f"{'subject':20s}{'frames/s':>12s}" + "".join(f"{'/' + p:>13s}" for p in peers)
    print(head)
    for row in rows:
        fps = "-" if row["frames_per_s"] is None else f"{row['frames_per_s']:,}"
        cells = "".join(
            f"{'' if row.get('ratio_to_' + p) is None else format(row['ratio_to_' + p], '.2f'):>13s}" for p in peers
        )
        print(f"{row['subject']:20s}{fps:>12s}{cells}" + (f"   ({row['note']})" if "note" in row else ""))
    for row in rows:
        if "where" in row:
            print(f"  {row['subject']}: {row['where']}")
