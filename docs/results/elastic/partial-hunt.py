"""Clean arms of 2 learners, hunting a version whose weights digests differ; each arm's events
are written to /tmp/diffhunt-<trial>.json (docs/results/elastic/README.md)."""

import collections
import json
import sys

from bench.elastic.group import run_arm


def main():
    for trial in range(int(sys.argv[1])):
        arm = run_arm(
            "shmpad",
            peers=2,
            seconds=14,
            interval=3,
            kinds=("stop", "kill"),
            faults_on=False,
            width=16,
            batch=32,
            stop_s=1.5,
            seed=0,
        )
        digests = collections.defaultdict(dict)
        for name, evs in arm.events.items():
            for e in evs:
                if e["e"] == "step":
                    digests[e["v"]].setdefault(name, []).append(e)
        bad = [v for v, d in digests.items() if len({x["d"] for xs in d.values() for x in xs}) > 1]
        print("trial", trial, "versions", len(digests), "differing", bad, flush=True)
        for v in bad[:3]:
            for name, evs in arm.events.items():
                near = [e for e in evs if e.get("v", -99) in range(v - 2, v + 3)]
                print(name, near)
        json.dump(arm.events, open(f"/tmp/diffhunt-{trial}.json", "w"))


if __name__ == "__main__":
    main()
