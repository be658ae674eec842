"""The table of ab.sh's runs: per arm, each round's seconds per update before and after, the
ratio, and the medians of every phase (the folders ab.sh saved, each with its report.jsonl).

    python docs/results/learner-cost-cpu/summary.py docs/results/learner-cost-cpu/ab
"""

from __future__ import annotations

import json
import pathlib
import statistics
import sys


def load(folder: pathlib.Path) -> dict:
    return json.loads(folder.joinpath("report.jsonl").read_text().splitlines()[-1])


def main(root: str) -> None:
    runs = {}
    for folder in sorted(pathlib.Path(root).iterdir()):
        tree, round_ = folder.name.rsplit("-", 1)
        runs[(tree, int(round_))] = load(folder)
    rounds = sorted({r for _, r in runs})
    arms = list(runs[("before", rounds[0])]["arms"])
    for arm in arms:
        print(f"\n## {arm}\n")
        print("| round | before s | after s | before / after |")
        print("| --- | --- | --- | --- |")
        ratios = []
        for r in rounds:
            b, a = runs[("before", r)]["arms"][arm], runs[("after", r)]["arms"][arm]
            ratios.append(b["update_s"] / a["update_s"])
            print(f"| {r} | {b['update_s']:.2f} | {a['update_s']:.2f} | {ratios[-1]:.2f} |")
        print(f"| median | | | **{statistics.median(ratios):.2f}** |")
        print("\n| | update s | frames/s | GFLOP/s | of fp32 peak | targets | forward | backward | optimizer | other |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for tree in ("before", "after"):
            got = [runs[(tree, r)]["arms"][arm] for r in rounds]
            med = lambda f, got=got: statistics.median(f(g) for g in got)  # noqa: E731
            phases = " | ".join(f"{med(lambda g, p=p: g['phase_s'][p]):.2f}" for p in got[0]["phase_s"])
            print(
                f"| {tree} | {med(lambda g: g['update_s']):.2f} | {med(lambda g: g['frames_per_s']):.0f}"
                f" | {med(lambda g: g['gflops']):.1f} | {med(lambda g: g['of_fp32_peak']):.2f} | {phases} |"
            )


if __name__ == "__main__":
    main(sys.argv[1])
