"""A job (the default, Pong with APPO, unless flags follow ROUNDS) with torch's allocator on
transparent huge pages and without, in interleaved rounds: each round runs ``python -m bench.impala
--total-frames 1_000_000_000 [FLAGS]`` for ``SECONDS`` s (``bench.impala.compare.run_one``: its median
frames/s over its log rows after the first third) once with THP_MEM_ALLOC_ENABLE=0 and once with =1,
the order alternating. The variable is read when torch first allocates, so it cannot be a flag of one
compare run.

    python docs/results/learner-cost-cpu/thp_job.py OUT [ROUNDS [FLAGS...]]
    python docs/results/learner-cost-cpu/thp_job.py OUT 2 --algo impala
"""

from __future__ import annotations

import json
import os
import statistics
import sys

from bench.impala.compare import run_one

SECONDS = 150.0


def main(out: str, rounds: int, flags: list[str]) -> None:
    os.makedirs(out, exist_ok=True)
    got: dict[str, list[dict]] = {"0": [], "1": []}
    for r in range(1, rounds + 1):
        for thp in ("0", "1") if r % 2 else ("1", "0"):
            os.environ["THP_MEM_ALLOC_ENABLE"] = thp
            figures = run_one(["--total-frames", "1_000_000_000", *flags], os.path.join(out, f"thp{thp}-{r}"), SECONDS)
            got[thp].append(figures)
            print(f"round {r}, THP_MEM_ALLOC_ENABLE={thp}: {json.dumps(figures)}", flush=True)
    ratios = [b["frames_per_s"] / a["frames_per_s"] for a, b in zip(got["0"], got["1"])]
    print(f"frames/s off: {[g['frames_per_s'] for g in got['0']]}, on: {[g['frames_per_s'] for g in got['1']]}")
    print(f"on / off per round: {[round(x, 3) for x in ratios]}, median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2, sys.argv[3:])
