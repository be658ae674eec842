"""Faulted arms of 3 learners, a fault every 1.2 s: versions whose digests differ, raw and
after partial steps are left out (docs/results/elastic/README.md)."""

import collections
import json
import sys

from bench.elastic.group import run_arm
from bench.elastic.report import figures


def main():
    for trial in range(int(sys.argv[1])):
        arm = run_arm(
            "shmpad",
            peers=3,
            seconds=20,
            interval=1.2,
            kinds=("stop", "kill"),
            faults_on=True,
            width=16,
            batch=32,
            stop_s=1.0,
            seed=trial,
        )
        fig = figures(arm, 1.0)
        digests = collections.defaultdict(set)
        for evs in arm.events.values():
            for e in evs:
                if e["e"] == "step":
                    digests[e["v"]].add(e["d"])
        raw = sum(1 for d in digests.values() if len(d) > 1)
        print(
            "trial",
            trial,
            "faults",
            len(arm.faults),
            "raw differing",
            raw,
            "differing",
            fig.versions_differing,
            "partial",
            fig.partial,
            fig.partial_differing,
            flush=True,
        )
        json.dump(arm.events, open(f"/tmp/diffhunt2-{trial}.json", "w"))


if __name__ == "__main__":
    main()
