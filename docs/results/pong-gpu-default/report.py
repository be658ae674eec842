"""Issue 41's targets from what run.sh (beside this file) left in its folder: per seed, the start-up
(the job's own line: command to first learner update), frames and seconds to +18 and +20 (bench.learn's
summary.json), the learned frames/s (the median of log.csv's rows after the first third, as
``bench.impala.compare.steady`` takes it) against the env workers' ceiling measured in the same call
(bench.envpool's ``ceiling`` subject), and the policy lag, the learner's wait and ms per update beside the
CPU runs' (docs/results/pong-rl-games-cpu: a lag of 2 updates); then the medians against the targets.

    python docs/results/pong-gpu-default/report.py FOLDER     # FOLDER: run.sh's, holding learn/ and ceiling.jsonl

It prints the table and, last, one JSON line (``report: {...}``)."""

from __future__ import annotations

import csv
import json
import os
import statistics
import sys

from bench.impala.compare import steady
from bench.impala.progress import startup_seconds

TARGETS = {"seconds_to_18": 75.0, "seconds_to_20": 90.0, "frames_to_18": 5_000_000, "startup": 15.0, "ceiling": 0.9}
"""issue 41's: medians of 3 seeds, each alone on the box; the learned frames/s over the ceiling; start-up"""


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _ceiling(folder: str) -> float | None:
    for line in _read(os.path.join(folder, "ceiling.jsonl")).splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if row.get("subject") == "ceiling" and row.get("frames_per_s"):
                return float(row["frames_per_s"])
    return None


def _seed(folder: str, run: dict, ceiling: float | None) -> dict:
    seed_dir = os.path.join(folder, "learn", f"seed-{run['seed']}")
    with open(os.path.join(seed_dir, "log.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(seed_dir, "config.json")) as f:
        config = json.load(f)
    figures = steady(rows) if rows else {}
    kept = rows[len(rows) // 3 :]
    learner_ms = [float(r["learner_ms"]) for r in kept if r.get("learner_ms")]
    steps = config["epochs"] * config["minibatches"] if config["algo"] == "appo" else 1
    fps = figures.get("frames_per_s")
    return {
        "seed": run["seed"],
        "device": config["device"],
        "startup_seconds": run.get("startup_seconds"),
        "frames": run["frames"],
        "seconds": run["seconds"],
        "reached": run["reached"],
        "interrupted": run.get("interrupted", False),
        "frames_per_optimiser_step": config["batch_size"] * config["unroll_length"] * 4 // steps,
        "learned_frames_per_s": fps,
        "ratio_to_ceiling": round(fps / ceiling, 3) if fps and ceiling else None,
        "policy_lag": figures.get("policy_lag"),
        "learner_wait": figures.get("wait_fraction"),
        "learner_ms_per_update": round(statistics.median(learner_ms), 1) if learner_ms else None,
        "env_busy": figures.get("env_busy"),
        "inference_ms": figures.get("inference_ms"),
        "rows": len(rows),
    }


def _median(values: list, missing: float = float("inf")) -> float | None:
    """The median, a missing value (a target not reached, a figure not measured) counted as
    ``missing``: worse than every other."""
    if not values:
        return None
    m = statistics.median(missing if v is None else v for v in values)
    return None if m == missing else m


def _verdict(value: float | None, target: float, at_most: bool = True) -> str:
    if value is None:
        return "MISSED (not reached)"
    return "MET" if (value <= target if at_most else value >= target) else "MISSED"


def main(folder: str) -> dict:
    with open(os.path.join(folder, "learn", "summary.json")) as f:
        summary = json.load(f)
    ceiling = _ceiling(folder)
    seeds = [_seed(folder, run, ceiling) for run in summary["runs"]]
    cold = startup_seconds(_read(os.path.join(folder, "first-run.log")))
    dry = any(s["device"] != "cuda" for s in seeds)
    if dry:
        print("CPU DRY RUN: not a figure (the script's steps on a tiny budget, on the CPU)")
    print(f"machine: {summary['machine']}")
    print(f"env workers' ceiling: {ceiling:,.0f} frames/s" if ceiling else "env workers' ceiling: not measured")
    print(f"first run of the call (numba's cache empty): start-up {cold} s")
    header = (
        "seed | start-up s | +18 frames | +18 s | +20 frames | +20 s | learned fps | / ceiling | policy lag | "
        "learner waits | learner ms/update | env busy | frames per step"
    )
    print(header)
    for s in seeds:
        at = {t: s["reached"].get(t, {}) for t in ("18", "20")}
        print(
            " | ".join(
                str(v)
                for v in (
                    s["seed"],
                    s["startup_seconds"],
                    at["18"].get("frames", "-"),
                    at["18"].get("seconds", "-"),
                    at["20"].get("frames", "-"),
                    at["20"].get("seconds", "-"),
                    s["learned_frames_per_s"],
                    s["ratio_to_ceiling"],
                    s["policy_lag"],
                    s["learner_wait"],
                    s["learner_ms_per_update"],
                    s["env_busy"],
                    s["frames_per_optimiser_step"],
                )
            )
        )
    medians = {
        "seconds_to_18": _median([s["reached"].get("18", {}).get("seconds") for s in seeds]),
        "seconds_to_20": _median([s["reached"].get("20", {}).get("seconds") for s in seeds]),
        "frames_to_18": _median([s["reached"].get("18", {}).get("frames") for s in seeds]),
        "startup": _median([s["startup_seconds"] for s in seeds]),
        "ceiling": _median([s["ratio_to_ceiling"] for s in seeds], missing=float("-inf")),
    }
    print(f"medians over {len(seeds)} seed(s):")
    for name, value in medians.items():
        at_most = name != "ceiling"
        rule = f"{'<=' if at_most else '>='} {TARGETS[name]:g}"
        verdict = "no verdict: a dry run" if dry else _verdict(value, TARGETS[name], at_most)
        print(f"  {name}: {value} (target {rule}): {verdict}")
    report = {"dry_run": dry, "ceiling_frames_per_s": ceiling, "cold_startup_seconds": cold, "seeds": seeds}
    report["medians"] = medians
    print("report: " + json.dumps(report))
    return report


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python docs/results/pong-gpu-default/report.py FOLDER")
    main(sys.argv[1])
