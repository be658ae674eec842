"""How often a group of learners forks (one step to a version taken on two lineages) and
whether every fork is counted in ``Accumulator.discarded``: the hung-member scenario of
tests/test_net_accumulator.py, run ROUNDS times per data plane, alternating.

    python docs/results/net-forks/forks.py ROUNDS [BURNERS]

A broker with the command line's defaults (a member silent 0.6 s is dropped), three
learners (tests/helpers/net_peer.py), then a fourth that is SIGSTOPped for its group to
go on without it and SIGCONTed. BURNERS processes spin on the CPU meanwhile (the load a
CI runner's other work puts on it). One line per run: the plane, the versions reached on
more than one lineage, the discarded steps counted, and whether the old check (one hash
per version) would have failed; after a fork, a line per peer (``#``): its discarded count
and its steps at the forked versions as (version, group size, epoch)."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests"))

from helpers.net_procs import Broker, Peer  # noqa: E402


def one(backend: str) -> str:
    started: list = []
    try:
        broker = Broker(flags=())
        started.append(broker)
        peers = [Peer(broker.address, f"h{i}", "g", "--backend", backend) for i in range(3)]
        started += peers
        for p in peers:
            p.wait(lambda p: len(p.steps_with(3)) >= 5, 60, "5 steps in a group of 3")
        sleeper = Peer(broker.address, "hz", "g", "--backend", backend, "--grads-before-ready")
        started.append(sleeper)
        for p in [*peers, sleeper]:
            p.wait(lambda p: len(p.steps_with(4)) >= 3, 60, "3 steps in a group of 4")
        sleeper.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        for p in peers:
            p.wait(lambda p: len(p.steps_with(3, after=stopped)) >= 3, 60, "3 steps without the hung one")
        resumed = time.monotonic()
        sleeper.proc.send_signal(signal.SIGCONT)
        everyone = [*peers, sleeper]
        for p in everyone:
            p.wait(lambda p: len(p.steps_with(4, after=resumed)) >= 3, 60, "3 steps in a group of 4 after")
        for p in everyone:
            p.finish()
        hashes = collections.defaultdict(set)
        lineages = collections.defaultdict(set)
        for p in everyone:
            for s in p.steps:
                hashes[s["version"]].add(s["hash"])
                lineages[s["version"]].add(s["lineage"])
        forks = sorted(v for v, seen in lineages.items() if len(seen) > 1)
        discarded = sum(p.steps[-1]["discarded"] for p in everyone)
        old_check = "fail" if any(len(h) > 1 for h in hashes.values()) else "pass"
        line = f"{backend}\t{forks}\t{discarded}\t{old_check}"
        if forks:  # who took which steps: (version, group size, epoch) of each peer's steps at the forked versions
            for p in everyone:
                seen = [(s["version"], s["size"], s["key"].split("/")[1]) for s in p.steps if s["version"] in forks]
                shown = seen if len(seen) <= 6 else [*seen[:3], "...", *seen[-3:]]
                line += f"\n#\t{p.name}: discarded {p.steps[-1]['discarded']}, steps {shown}"
        return line
    except AssertionError as e:
        return f"{backend}\terror\t-\t-\t{str(e).splitlines()[0][:200]}"
    finally:
        for p in started:
            p.kill()


def main() -> None:
    rounds = int(sys.argv[1])
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    ]
    try:
        print("plane\tforked_versions\tdiscarded\tone_hash_per_version_check", flush=True)
        for _ in range(rounds):
            for backend in ("shmpad", "gloo"):
                print(one(backend), flush=True)
    finally:
        for b in burners:
            b.kill()
            b.wait()


if __name__ == "__main__":
    main()
