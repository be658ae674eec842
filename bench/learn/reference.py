"""``python -m bench.learn.reference``: a published run's printed log as a reference curve.

    python -m bench.learn.reference envpool_demo_pong.ipynb --steps-per-epoch 8192 --frame-skip 4 \\
        --out docs/results/pong-reference/rl-games-envpool-demo.csv

rl_games prints a line per epoch (``... epoch: 130/500``) and, once it keeps checkpoints, a line
each time the mean return over its last 100 games beats its best so far (``saving next best
rewards:  [18.07]``). Each such line becomes a point: the frames at the end of that epoch
(epochs x agent steps per epoch x frame skip) and the new best mean. From its first such line on
(rl_games starts them at ``save_best_after``, and the first is the mean then), the points are the
curve's running maximum, recorded where it rose: the first point at or above a target is where
the mean first reached it, at most one epoch late, and between points the curve may have dipped.

The input is the log as text, or a Jupyter notebook whose cells' printed outputs hold it. The
output is a CSV of ``frames,mean_return``, which ``python -m bench.learn.overlay`` draws beside
runs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

__all__ = ["best_means", "log_text", "main"]

_EPOCH = re.compile(r"epoch:\s*(\d+)\s*/\s*\d+")
_BEST = re.compile(r"saving next best rewards:\s*\[\s*([-+0-9.eE]+)\s*\]")


def log_text(raw: str) -> str:
    """The printed text of a log: as it is, or a notebook's stream outputs, cell after cell."""
    if not raw.lstrip().startswith("{"):
        return raw
    notebook = json.loads(raw)
    texts = []
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            text = output.get("text", "")
            texts.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(texts)


def best_means(text: str, steps_per_epoch: int, frame_skip: int) -> list[tuple[int, float]]:
    """``(frames, new best mean)`` for every best-rewards line, at the last epoch line before it."""
    if steps_per_epoch < 1 or frame_skip < 1:
        raise ValueError(f"steps_per_epoch and frame_skip must be >= 1, got {steps_per_epoch} and {frame_skip}")
    points: list[tuple[int, float]] = []
    epoch = None
    for line in text.splitlines():
        if found := _EPOCH.search(line):
            epoch = int(found.group(1))
        elif found := _BEST.search(line):
            if epoch is None:
                raise ValueError(f"a best-rewards line before any epoch line: {line.strip()!r}")
            points.append((epoch * steps_per_epoch * frame_skip, float(found.group(1))))
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.learn.reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="rl_games' printed log, or a notebook holding it ('-': standard input)")
    parser.add_argument("--steps-per-epoch", type=int, required=True, help="agent steps per epoch: actors x horizon")
    parser.add_argument("--frame-skip", type=int, required=True, help="emulator frames per agent step (4 on Atari)")
    parser.add_argument("--out", default="-", help="the CSV to write ('-': standard output) [-]")
    args = parser.parse_args(argv)
    with open(args.log if args.log != "-" else 0) as f:
        text = log_text(f.read())
    try:
        points = best_means(text, args.steps_per_epoch, args.frame_skip)
    except ValueError as e:
        parser.error(str(e))
    if not points:
        parser.error(f"{args.log}: no 'saving next best rewards' line after an 'epoch: N/M' line")
    lines = ["frames,mean_return", *(f"{frames},{mean:g}" for frames, mean in points)]
    if args.out == "-":
        print("\n".join(lines))
    else:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    print(f"{len(points)} points, {points[0][0]:,} to {points[-1][0]:,} frames", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
