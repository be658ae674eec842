"""``python -m bench.learn.games``: scores at frame marks and frames to a target, game by game, in one table.

    python -m bench.learn.games --games ALE/Breakout-v5,ALE/Pong-v5 --seeds 1 -- --device cuda
    python -m bench.learn.games --games ALE/Breakout-v5,ALE/Pong-v5 --seeds 1 --out OUT --resume --frames 50M
    python -m bench.learn.games --table-only --out OUT
    python -m bench.learn.games --games ALE/Alien-v5 --target ALE/Alien-v5=1700

Each game is one ``python -m bench.learn`` into ``OUT/<game>`` (``OUT/ale-breakout-v5``): its
seeds run as bench.learn runs them, to ``--frames`` (the flags after ``--`` go to every run),
and on past the game's target (``--stop-at-target`` stops there). ``--resume`` continues the
runs of every game whose folder holds them and starts the others. After each game, and when
stopped, ``OUT`` gets ``games.md`` and ``games.json``: one row per game with

- the protocol: the runs' config.json ``protocol`` and every setting of it, in words
  (``actors/envs/protocol.py``); a run from before the setting says so;
- the score at each of ``--marks`` (10M and 40M frames): the mean true return of the last
  ``--window`` (100) whole games that had ended by that mark; a run that stopped short of a
  mark has no score there, only "not reached: ran to N frames";
- the frames and minutes to the game's target: the frames of the first game at which the mean of
  the last 100 reached it, and the run's own clock there (the seconds of its first log.csv row
  at or after those frames: from the learner's start, the stretches of a resumed run added, at
  most one progress row late), with bench.learn's wall-clock from the run's launch where its
  summary.json has it;
- the target and its references (``bench/learn/targets.py``): each published run's score,
  frames, minutes, protocol, and the file and commit it comes from. A reference is compared
  with a run only under the same protocol; a run under another gets no target from the table.

With several seeds a cell holds their median and each seed's figure (a seed that missed the
target counts as never; a seed without a score at a mark leaves the median there undefined).
``--table-only`` runs nothing: it builds the table from the game folders in ``OUT`` (those of
``--games``, or every one), so the table of kept runs can be made again at any time
(``bench/learn/table.py`` reads the folders and writes the table).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from bench.common.jobs import exit_on_sigterm
from bench.impala import options, rundir
from bench.impala.plan import env_family
from bench.learn import __main__ as learn
from bench.learn.overlay import parse_frames
from bench.learn.table import game_folder, game_folders, read_game, write
from bench.learn.targets import TARGETS, target_for

__all__ = ["main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    job = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog="python -m bench.learn.games",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        usage="python -m bench.learn.games [options] [-- bench.impala flags]",
    )
    parser.add_argument(
        "--games", default="", help="gymnasium ids, comma-separated (--table-only: [every game in --out])"
    )
    parser.add_argument(
        "--target", action="append", default=[], help="GAME=SCORE: a target over the table's, or for a game without one"
    )
    parser.add_argument("--marks", default="10M,40M", help="frames at which to give each run's score [10M,40M]")
    parser.add_argument("--frames", default="40M", help="each run's frame budget [40M]")
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 per game [1]")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed [0]")
    parser.add_argument(
        "--parallel", type=int, default=1, help="a game's runs at once, each on its share of the CPUs [1]"
    )
    parser.add_argument("--window", type=int, default=100, help="games in the mean return [100]")
    parser.add_argument("--seconds", type=float, default=0.0, help="stop a run after this many seconds (0: never) [0]")
    parser.add_argument("--stop-at-target", action="store_true", help="stop each run at its target, not its budget")
    parser.add_argument("--out", default="", help="folder for the games' runs and the table [runs/games-<time>]")
    parser.add_argument(
        "--resume", action="store_true", help="continue the runs of each game that has a folder in --out"
    )
    parser.add_argument("--table-only", action="store_true", help="run nothing: the table of the runs in --out")
    args = parser.parse_args(own)
    for name in ("marks", "frames"):
        text = getattr(args, name)
        try:
            values = sorted({parse_frames(m) for m in text.split(",") if m})
        except ValueError:
            parser.error(
                f"--{name} takes frame counts (10M, 500K, 5e6){' separated by commas' * (name == 'marks')}, got {text!r}"
            )
        if name == "frames" and len(values) != 1:
            parser.error(f"--frames takes one frame count (10M, 500K, 5e6), got {text!r}")
        setattr(args, name, values if name == "marks" else values[0])
    if not args.marks:
        parser.error("--marks must name at least one frame count, got ''")
    if args.window < 1:
        parser.error(f"--window must be >= 1, got {args.window}")
    listed, args.games = args.games, [g.strip() for g in args.games.split(",") if g.strip()]
    if len(set(args.games)) != len(args.games):
        parser.error(f"--games names a game twice: {','.join(args.games)}")
    for game in args.games:
        try:
            env_family(game)
        except ValueError as e:
            parser.error(f"--games: {e}")
    if args.table_only:
        if not args.out or not os.path.isdir(args.out):
            parser.error(f"--table-only builds the table of the runs in --out: give a folder, got {args.out!r}")
        if job or args.resume:
            parser.error("--table-only runs nothing: it takes neither --resume nor bench.impala flags")
        found = game_folders(args.out)
        missing = [g for g in args.games if g not in found]
        if missing:
            parser.error(f"--table-only: no runs of {', '.join(missing)} in {args.out} (it holds {_names(found)})")
        if not found:
            parser.error(f"--table-only: {args.out} holds no game's runs (a folder of seed-N run folders)")
        args.games = args.games or list(found)
    elif not args.games:
        parser.error(f"--games must name at least one game (gymnasium ids, comma-separated), got {listed!r}")
    args.targets = {}
    for given in args.target:
        game, _, score = given.partition("=")
        try:
            args.targets[game] = float(score)
        except ValueError:
            parser.error(f"--target takes GAME=SCORE, got {given!r}")
        if game not in args.games:
            parser.error(f"--target {given}: {game!r} is not one of the games ({','.join(args.games)})")
    if args.table_only:
        return args, job
    args.out = args.out or os.path.join(rundir.RUNS, f"games-{time.strftime('%Y%m%d-%H%M%S')}")
    args.plans = {game: _plan(parser, args, job, game) for game in args.games}
    return args, job


def _plan(parser: argparse.ArgumentParser, args: argparse.Namespace, job: list[str], game: str) -> list[str]:
    """bench.learn's command line for ``game``, checked as bench.learn checks it; a game without
    a target under the protocol its runs will have is refused."""
    try:
        protocol = _protocol_of_job(game, job)
    except options.UsageError as e:
        parser.error(f"{game}: {e}")
    except SystemExit:
        parser.error(f"{game}: bench.impala refused the flags {shlex.join(job)!r} (its message is above)")
    table_target = target_for(game, protocol)
    if game not in args.targets and table_target is None:
        has = sorted(g for g, p in TARGETS if p == protocol)
        parser.error(
            f"--games: no target for {game} under the {protocol or 'non-Atari'} protocol in "
            f"bench/learn/targets.py (it has {_names(has)}); give one with --target {game}=SCORE"
        )
    target = args.targets[game] if game in args.targets else table_target.score
    folder = game_folder(args.out, game)
    resume = args.resume and os.path.isdir(folder) and bool(os.listdir(folder))
    argv = ["--env", game, "--targets", repr(float(target)), "--frames", str(args.frames)]
    argv += ["--seeds", str(args.seeds), "--first-seed", str(args.first_seed), "--parallel", str(args.parallel)]
    argv += ["--window", str(args.window), "--seconds", str(args.seconds), "--out", folder]
    argv += [] if args.stop_at_target else ["--keep-going"]
    argv += ["--resume"] if resume else []
    argv += ["--", *job] if job else []
    try:
        learn.parse_args(argv)
    except SystemExit:
        parser.error(f"{game}: bench.learn refused {shlex.join(argv)!r} (its message is above)")
    return argv


def _names(items) -> str:
    return ", ".join(items) if items else "none"


def _protocol_of_job(game: str, job: list[str]) -> str | None:
    """The protocol a run of ``game`` with these flags will record (None: not Atari)."""
    if env_family(game) != "atari":
        return None
    return options.parse_args(["--env", game, *job, "--out", os.devnull]).protocol


def build(args: argparse.Namespace, command: str) -> str:
    """The table of the games in ``args.out`` that have runs, in ``args.games``' order."""
    found = game_folders(args.out) if os.path.isdir(args.out) else {}
    games = [read_game(found[g], g, args.marks, args.window, args.targets.get(g)) for g in args.games if g in found]
    return write(args.out, games, args.marks, args.window, command)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, job = parse_args(argv)
    command = f"python -m bench.learn.games {shlex.join(argv)}"
    if args.table_only:
        print(build(args, command), flush=True)
        return 0
    os.makedirs(args.out, exist_ok=True)
    print(f"# bench.learn.games {time.strftime('%Y-%m-%d %H:%M')} {','.join(args.games)} out={args.out}", flush=True)
    try:
        for game in args.games:
            print(f"## {game}: python -m bench.learn {shlex.join(args.plans[game])}", flush=True)
            learn.main(args.plans[game])
            build(args, command)
    finally:  # stopped or failed: the table of what the games have so far
        print(build(args, command), flush=True)
    return 0


if __name__ == "__main__":
    exit_on_sigterm()  # a kill unwinds through bench.learn's finally, which stops the runs
    sys.exit(main())
