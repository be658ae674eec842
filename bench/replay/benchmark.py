"""Replay tables side by side: shmpad.replay.Table against TorchRL's ReplayBuffer
(LazyMemmapStorage, shared across processes as TorchRL documents) and a ceiling (the same
bytes copied through shared memory, no index), in interleaved rounds; medians and ratios.

    python -m bench.replay            # 3 rounds
    python -m bench.replay --quick    # 1 short round, to see that it runs

Items: ``atari`` ([4, 84, 84] uint8 observation + action, reward, done) and ``vec64``
(64 float32). Measured: inserts/s of 4 inserter processes; samples/s (items) of 1 and 2
sampler processes taking batches of 32 from a full table; the median latency of one
batch of 32 in one process. Uniform and prioritized (TorchRL's prioritized sampler needs
its C++ extension, which does not load with this torch: it is reported as n/a, and so is
Reverb, which needs TensorFlow). The machine is shared: read the ratios, not the rates.
Exit status 1 when a target line says FAIL (``bench.common.report``'s convention).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from bench.common.evidence import add_save_option
from bench.common.harness import FORK, child, end, nothing
from bench.common.report import exit_status, fmt_rate, fmt_ratio, verdict
from bench.replay.contract import BATCH, CAPACITY, KINDS, make_item
from bench.replay.peers import CeilingSubject, TorchRLSubject
from bench.replay.subjects import ShmpadSubject

INSERTERS = 4

SUBJECTS = [ShmpadSubject, TorchRLSubject, CeilingSubject]


# -- measurements ------------------------------------------------------------------------------


def _timed(procs_work: list, lifetime: float) -> float:
    """Start one child per work function, release them together; seconds until all end."""
    barrier = FORK.Barrier(len(procs_work) + 1)
    procs = [
        FORK.Process(target=child, args=(f"worker-{i}", lifetime, nothing, w, barrier, None), daemon=True)
        for i, w in enumerate(procs_work)
    ]
    try:
        for p in procs:
            p.start()
        barrier.wait(60)
        start = time.perf_counter()
        for p in procs:
            p.join(lifetime)
        took = time.perf_counter() - start
        failed = [p.exitcode for p in procs if p.exitcode != 0]
        if failed:
            raise RuntimeError(f"a worker failed (exit codes {failed})")
        return took
    finally:
        end(procs)


def measure_inserts(subject: Any, kind: str, n: int) -> float:
    item = make_item(KINDS[kind])

    def work() -> None:
        for _ in range(n):
            subject.insert(item)

    return INSERTERS * n / _timed([work] * INSERTERS, 300)


def fill(subject: Any, kind: str) -> None:
    item = make_item(KINDS[kind])
    for _ in range(CAPACITY[kind]):
        subject.insert(item)


def measure_samples(subject: Any, samplers: int, batches: int) -> float:
    def work() -> None:
        for _ in range(batches):
            subject.sample()

    return samplers * batches * BATCH / _timed([work] * samplers, 300)


def measure_latency(subject: Any, batches: int) -> float:
    times = []
    for _ in range(batches):
        t = time.perf_counter()
        subject.sample()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument("--quick", action="store_true", help="one short round, to see that it runs")
    add_save_option(parser)  # read where the program starts (run_main), so that the copy has every line
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    scale = 0.1 if args.quick else 1.0
    results: dict[tuple, list[float]] = {}
    unavailable: dict[str, str] = {}
    print(f"bench.replay: {rounds} round(s); 4 inserter processes, batches of {BATCH}; a shared 2-core machine\n")
    for r in range(rounds):
        for kind in KINDS:
            n_insert = int((1000 if kind == "atari" else 10000) * scale)
            n_batches = int((300 if kind == "atari" else 1000) * scale)
            for prioritized in (False, True):
                for cls in SUBJECTS:
                    key = (kind, "prioritized" if prioritized else "uniform", cls.name)
                    try:
                        subject = cls(kind, prioritized)
                    except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
                        unavailable.setdefault(f"{cls.name} {key[1]}", f"{type(e).__name__}: {str(e)[:100]}")
                        continue
                    try:
                        ins = measure_inserts(subject, kind, n_insert)
                        fill(subject, kind)
                        s1 = measure_samples(subject, 1, n_batches)
                        s2 = measure_samples(subject, 2, n_batches)
                        lat = measure_latency(subject, n_batches)
                    finally:
                        subject.close()
                    for what, v in (("inserts/s", ins), ("samples/s 1", s1), ("samples/s 2", s2), ("latency", lat)):
                        results.setdefault((*key, what), []).append(v)
        print(f"round {r + 1} done", flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    lines = []
    for kind in KINDS:
        for sampler in ("uniform", "prioritized"):
            print(f"\n{kind} items, {sampler} sampler")
            print(f"  {'':12}{'shmpad':>10}{'torchrl':>10}{'ceiling':>10}{'vs torchrl':>12}{'vs ceiling':>12}")
            for what in ("inserts/s", "samples/s 1", "samples/s 2", "latency"):
                vals = {s.name: med.get((kind, sampler, s.name, what)) for s in SUBJECTS}
                mine = vals["shmpad"]

                def ratio(peer: str, vals=vals, mine=mine, what=what) -> float | None:
                    """shmpad's advantage over ``peer``: a rate ratio, or the inverse latency ratio."""
                    v = vals[peer]
                    if v is None or mine is None:
                        return None
                    return v / mine if what == "latency" else mine / v

                if what == "latency":
                    cells = ["-" if v is None else f"{v * 1e3:.3f}ms" for v in vals.values()]
                else:
                    cells = ["n/a" if v is None else fmt_rate(v) for v in vals.values()]
                print(
                    f"  {what:12}"
                    + "".join(f"{c:>10}" for c in cells)
                    + f"{fmt_ratio(ratio('torchrl')):>12}{fmt_ratio(ratio('ceiling')):>12}"
                )
                if kind == "atari" and what != "latency":
                    peer = ratio("torchrl")
                    lines.append(
                        f"{verdict(None if peer is None else peer >= 3.0)} atari {sampler} {what}: shmpad >= 3x torchrl ({fmt_ratio(peer)})"
                    )
                if kind == "atari" and what.startswith("samples"):
                    c = ratio("ceiling")
                    lines.append(
                        f"{verdict(None if c is None else c >= 0.8)} atari {sampler} {what}: shmpad >= 80% of the copy ceiling ({fmt_ratio(c)})"
                    )
                if kind == "atari" and what == "latency" and mine is not None:
                    lines.append(
                        f"{verdict(mine < 1e-3)} atari {sampler} batch-of-32 latency < 1 ms ({mine * 1e3:.3f} ms)"
                    )
    if unavailable:
        print("\nnot measured:")
        for name, why in sorted(unavailable.items()):
            print(f"  {name}: {why}")
        print("  reverb: not installed (it needs TensorFlow)")
    print("\ntargets:")
    for line in lines:
        print(f"  {line}")
    return exit_status(lines, [], sys.stdout)
