"""``python -m bench.portal``: shmpad.portal beside danijar/portal, the same calls in one run.

Two figures, each measured for both implementations in interleaved rounds (the order
alternates from round to round, each measurement in a fresh interpreter: ``subjects``):

- the synchronous round trip of a small call, in microseconds; target: shmpad.portal's
  at most 1/10 of portal's;
- DreamerV3's actor pattern (16 environment clients, batch 16, 64x64x3 uint8
  observations and a few scalars), in environment steps per second; target: at least
  5x portal's.

The median over the rounds of each implementation is compared; a ratio prints PASS or
FAIL against its target. ``--json`` prints the report as one JSON object, ``--save DIR``
writes it (``report.json``) with the printed table (``report.txt``) and every
measurement's raw line (``rounds.jsonl``). Without portal installed (the ``bench`` extra)
shmpad.portal is measured alone and no ratio is printed.

    python -m bench.portal --rounds 3 --seconds 3 --save docs/results/portal
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

from bench.portal.peers import PEERS, available

__all__ = ["main", "TARGETS"]

TARGETS = {
    "roundtrip": ("us_per_call", "at most", 0.1),
    "actor": ("steps_per_s", "at least", 5.0),
}
"""pattern: (figure, direction, shmpad.portal / portal)"""


def _measure(peer: str, pattern: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "bench.portal.subjects", "--peer", peer, "--pattern", pattern]
    cmd += ["--seconds", str(args.seconds), "--envs", str(args.envs), "--batch", str(args.batch)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pathlib.Path(__file__).parents[2]), *sys.path])}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return json.loads(lines[-1])


def report(rounds: list[dict], peers: list[str]) -> dict:
    """The medians per implementation and pattern, and each ratio against its target."""
    medians: dict = {}
    for pattern, (figure, _, _) in TARGETS.items():
        for peer in peers:
            values = [r[figure] for r in rounds if r["peer"] == peer and r["pattern"] == pattern]
            if values:
                medians.setdefault(pattern, {})[peer] = statistics.median(values)
    ratios = {}
    for pattern, (figure, direction, target) in TARGETS.items():
        mine, theirs = medians.get(pattern, {}).get("shmpad.portal"), medians.get(pattern, {}).get("portal")
        if mine is None or theirs is None:
            continue
        ratio = mine / theirs
        ok = ratio <= target if direction == "at most" else ratio >= target
        ratios[pattern] = {"figure": figure, "ratio": ratio, "target": f"{direction} {target:g}", "pass": ok}
    return {"medians": medians, "ratios": ratios}


def render(rep: dict, args: argparse.Namespace) -> str:
    lines = [f"bench.portal: {args.rounds} interleaved rounds of {args.seconds:g} s per measurement"]
    for pattern, (figure, _, _) in TARGETS.items():
        for peer, value in rep["medians"].get(pattern, {}).items():
            lines.append(f"  {pattern:<10} {peer:<14} {figure:<12} {value:12.1f}  (median)")
    for pattern, r in rep["ratios"].items():
        verdict = "PASS" if r["pass"] else "FAIL"
        lines.append(
            f"  {pattern:<10} shmpad.portal/portal {r['figure']}: {r['ratio']:.4g} (target {r['target']}) {verdict}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.portal", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each measures every implementation)")
    p.add_argument("--seconds", type=float, default=3.0, help="length of one measurement window")
    p.add_argument("--patterns", default="roundtrip,actor", help="comma-separated: roundtrip, actor")
    p.add_argument("--envs", type=int, default=16, help="environment clients of the actor pattern")
    p.add_argument("--batch", type=int, default=16, help="the actor's batch")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one measurement may take, start-up included")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--save", metavar="DIR", help="write report.json, report.txt and rounds.jsonl there")
    args = p.parse_args(argv)
    patterns = [x.strip() for x in args.patterns.split(",") if x.strip()]
    for pattern in patterns:
        if pattern not in TARGETS:
            p.error(f"--patterns: unknown pattern {pattern!r}; known: {', '.join(TARGETS)}")
    peers = [peer.name for peer in PEERS if available(peer)]
    rounds = []
    for i in range(args.rounds):
        order = peers if i % 2 == 0 else peers[::-1]
        for pattern in patterns:
            for peer in order:
                result = _measure(peer, pattern, args)
                rounds.append({"round": i, **result})
                if not args.json:
                    print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    rep = {"args": vars(args), **report(rounds, peers), "rounds": rounds}
    text = render(rep, args)
    if args.json:
        print(json.dumps(rep))
    else:
        print(text)
    if args.save:
        out = pathlib.Path(args.save)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
        (out / "report.txt").write_text(text + "\n")
        (out / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))


if __name__ == "__main__":
    main()
