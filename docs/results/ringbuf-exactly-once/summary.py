"""Medians of raw.jsonl (run.sh's output): per code, and of the per-round ratio new / old.

python docs/results/ringbuf-exactly-once/summary.py < docs/results/ringbuf-exactly-once/raw.jsonl
"""

import json
import statistics
import sys

rounds: dict[int, dict[str, float]] = {}
for line in sys.stdin:
    row = json.loads(line)
    rounds.setdefault(row["round"], {})[row["code"]] = row["msgs_per_s"]
for code in ("old", "new"):
    values = [r[code] for r in rounds.values() if r.get(code)]
    print(
        f"{code}: median {statistics.median(values) / 1e3:.1f}K msgs/s over {len(values)} runs, "
        f"min {min(values) / 1e3:.1f}K, max {max(values) / 1e3:.1f}K"
    )
ratios = [r["new"] / r["old"] for r in rounds.values() if r.get("new") and r.get("old")]
print(
    f"new / old: median of per-round ratios {statistics.median(ratios):.3f} over {len(ratios)} rounds "
    f"(min {min(ratios):.3f}, max {max(ratios):.3f})"
)
