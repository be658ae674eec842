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
``--games``, or every one), so the table of kept runs can be made again at any time.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import sys
import time

from actors.envs.protocol import protocol_of
from bench.common.jobs import exit_on_sigterm
from bench.impala import options, rundir
from bench.impala.plan import env_family
from bench.learn import __main__ as learn
from bench.learn.overlay import parse_frames
from bench.learn.targets import ENVPOOL_DIFFERS, TARGETS, references_for, score_text, target_for

__all__ = ["GAMES_JSON", "GAMES_MD", "main", "parse_args", "read_game", "read_run", "table"]

GAMES_MD = "games.md"
GAMES_JSON = "games.json"


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


def game_folder(out: str, game: str) -> str:
    return os.path.join(out, rundir.env_slug(game))


def game_folders(out: str) -> dict[str, str]:
    """game -> its folder, for every folder in ``out`` that holds run folders (``seed-N`` with a
    config.json), the game read from their config.json."""
    found = {}
    for name in sorted(os.listdir(out)):
        folder = os.path.join(out, name)
        runs = _run_folders(folder) if os.path.isdir(folder) else []
        if runs:
            found[rundir.recorded_config(runs[0][1]).get("env", name)] = folder
    return found


def _run_folders(folder: str) -> list[tuple[int, str]]:
    """(seed, path) of each ``seed-N`` folder with a config.json, by seed."""
    runs = []
    for name in os.listdir(folder):
        seed = name.removeprefix("seed-")
        path = os.path.join(folder, name)
        if name.startswith("seed-") and seed.isdigit() and os.path.exists(os.path.join(path, rundir.CONFIG)):
            runs.append((int(seed), path))
    return sorted(runs)


# -- reading one run ---------------------------------------------------------------------------


def _rows(path: str) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def protocol_entry(config: dict) -> dict:
    """What the table says of a run's protocol: config.json's ``protocol`` and every setting."""
    env = config.get("env", "")
    try:
        atari = env_family(env) == "atari"
    except ValueError:
        atari = False
    if not atari:
        return {"name": None, "description": f"{env or 'the run'} is not an Atari game: no protocol"}
    recorded = config.get("protocol")
    return {
        "name": recorded,
        "description": protocol_of(config).describe()
        + ("" if recorded else " (recorded before the protocol was a setting)"),
        "fields": protocol_of(config).fields(),
    }


def read_run(folder: str, marks: list[int], window: int, target: float | None) -> dict:
    """One run folder's figures: its frames, its score at each mark, the frames and seconds to
    ``target`` (the episodes from its episodes.csv, the seconds from its log.csv)."""
    episodes_path = os.path.join(folder, rundir.EPISODES)
    episodes = [(int(float(r["frames"])), float(r["return"])) for r in _rows(episodes_path)]
    log = [(int(float(r["frames"])), float(r["seconds"])) for r in _rows(os.path.join(folder, rundir.LOG))]
    frames = max([f for f, _ in episodes[-1:] + log[-1:]], default=0)
    at_marks = {}
    for mark in marks:
        if frames < mark:
            at_marks[mark] = {"reached": False, "ran_to": frames}
            continue
        last = [ret for f, ret in episodes if f <= mark][-window:]
        at_marks[mark] = {"reached": True, "mean": statistics.fmean(last) if last else None, "games": len(last)}
    reached = None
    if target is not None:
        progress = learn.Progress([target], window)
        progress.read(episodes_path, seconds=0.0)
        if target in progress.reached:
            at = progress.reached[target][0]
            seconds = next((s for f, s in log if f >= at), None)
            reached = {"frames": at, "seconds": seconds}
    return {"frames": frames, "games": len(episodes), "marks": at_marks, "target": reached}


def _wall_clock(folder: str, target: float) -> dict[int, float]:
    """seed -> bench.learn's seconds from launch to ``target``, from the game folder's summary.json."""
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            runs = json.load(f)["runs"]
    except (OSError, ValueError, KeyError):
        return {}
    return {
        r["seed"]: r["reached"][learn._key(target)]["seconds"]
        for r in runs
        if learn._key(target) in r.get("reached", {})
    }


def _machine(folder: str) -> dict | None:
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            return json.load(f).get("machine")
    except (OSError, ValueError):
        return None


def read_game(folder: str, game: str, marks: list[int], window: int, target: float | None = None) -> dict:
    """A game folder's row: its runs' protocol, their figures, the target and its references.
    ``target`` overrides the table's (``bench/learn/targets.py``) for the runs' protocol."""
    runs = _run_folders(folder)
    configs = {seed: rundir.recorded_config(path) or {} for seed, path in runs}
    protocols = {seed: protocol_entry(config) for seed, config in configs.items()}
    names = {p["name"] for p in protocols.values()}
    protocol = names.pop() if len(names) == 1 else None
    listed = target_for(game, protocol)
    if target is not None:
        why = "given with --target"
    elif listed is not None:
        target, why = listed.score, listed.why
    else:
        why = None
    wall = _wall_clock(folder, target) if target is not None else {}
    per_seed = []
    for seed, path in runs:
        run = read_run(path, marks, window, target)
        if run["target"] is not None and seed in wall:
            run["target"]["wall_seconds"] = wall[seed]
        per_seed.append({"seed": seed, "protocol": protocols[seed], **run})
    references = [
        {**r.fields(), "comparable": r.protocol == protocol, "describe": r.describe()} for r in references_for(game)
    ]
    return {
        "game": game,
        "folder": folder,
        "protocol": _protocol_cell(protocols),
        "seeds": per_seed,
        "target": None if target is None else {"score": target, "why": why},
        "references": references,
        "machine": _machine(folder),
    }


def _protocol_cell(protocols: dict[int, dict]) -> dict:
    """The game's protocol: the one its seeds share, or each seed's where they differ."""
    kinds = {json.dumps(p, sort_keys=True) for p in protocols.values()}
    if len(kinds) == 1:
        return next(iter(protocols.values()))
    described = "; ".join(f"seed {seed}: {p['name']}: {p['description']}" for seed, p in protocols.items())
    return {"name": "mixed", "description": f"the seeds differ: {described}"}


# -- the table ---------------------------------------------------------------------------------


def _frames(v: int) -> str:
    return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v:,}"


def _mark_name(mark: int) -> str:
    return f"{mark / 1e6:g}M" if mark >= 1e6 else f"{mark:,}"


def _mark_cell(seeds: list[dict], mark: int, window: int) -> str:
    def one(s: dict) -> str:
        at = s["marks"][mark]
        if not at["reached"]:
            return f"not reached: ran to {_frames(at['ran_to'])} frames"
        if at["mean"] is None:
            return "no game had ended"
        short = f" ({at['games']} games)" if at["games"] < window else ""
        return f"{at['mean']:,.1f}{short}"

    if len(seeds) == 1:
        return one(seeds[0])
    each = ", ".join(f"seed {s['seed']}: {one(s)}" for s in seeds)
    means = [s["marks"][mark].get("mean") for s in seeds]
    if None in means:
        return each
    return f"median {statistics.median(means):,.1f} ({each})"


def _target_cells(seeds: list[dict]) -> tuple[str, str]:
    """(frames, minutes) to the target: one seed's, or the median and each seed's."""

    def frames(s: dict) -> str:
        return _frames(s["target"]["frames"]) if s["target"] else f"not reached: ran to {_frames(s['frames'])} frames"

    def minutes(s: dict) -> str:
        t = s["target"]
        if not t:
            return "not reached"
        own = "no log row after it" if t["seconds"] is None else f"{t['seconds'] / 60:,.1f}"
        return own + (f" (wall-clock {t['wall_seconds'] / 60:,.1f})" if "wall_seconds" in t else "")

    if len(seeds) == 1:
        return frames(seeds[0]), minutes(seeds[0])
    median = statistics.median(s["target"]["frames"] if s["target"] else float("inf") for s in seeds)
    head = "median not reached" if median == float("inf") else f"median {_frames(int(median))}"
    each = ", ".join(f"seed {s['seed']}: {frames(s)}" for s in seeds)
    return f"{head} ({each})", ", ".join(f"seed {s['seed']}: {minutes(s)}" for s in seeds)


def table(games: list[dict], marks: list[int], window: int, command: str) -> str:
    """games.md: the command, one row per game, then the references' sources and the machines."""
    lines = [
        f"# bench.learn.games: {len(games)} game(s)",
        "",
        f"Command: `{command}`",
        "",
        f"Scores: the mean true return of the last {window} whole games ended by the mark. Minutes: the run's "
        "own clock (log.csv's seconds, from the learner's start, a resumed run's stretches added), with "
        "bench.learn's wall-clock from the launch where its summary.json has it.",
        "",
        "| game | protocol | seeds | "
        + " | ".join(f"score at {_mark_name(m)} frames" for m in marks)
        + " | target | frames to target | minutes to target | references |",
        "| --- | --- | --- | " + "--- | " * len(marks) + "--- | --- | --- | --- |",
    ]
    notes: dict[tuple[str, str], str] = {}  # a reference's project and source -> its note, numbered in order
    for g in games:
        seeds = g["seeds"]
        protocol = g["protocol"]
        frames, minutes = _target_cells(seeds) if g["target"] else ("no target", "no target")
        refs = []
        for r in g["references"]:
            key = (r["name"], r["source"])
            notes.setdefault(
                key,
                f"{r['name']}. Protocol: {r['protocol']}; beyond it: {r['differs']}. Measure: {r['measure']}. "
                f"Source: {r['source']}.",
            )
            flag = "" if r["comparable"] else f" (under the {r['protocol']} protocol: not comparable with this run)"
            refs.append(f"[{list(notes).index(key) + 1}] {r['describe']}{flag}")
        target = f"{score_text(g['target']['score'])} ({g['target']['why']})" if g["target"] else "none"
        ids = ", ".join(str(s["seed"]) for s in seeds)
        lines.append(
            f"| {g['game']} | {protocol['description']} (config.json: {protocol['name'] or '-'}) | {len(seeds)} ({ids}) | "
            + " | ".join(_mark_cell(seeds, m, window) for m in marks)
            + f" | {target} | {frames} | {minutes} | {'; '.join(refs) or 'none'} |"
        )
    if notes:
        lines += ["", "## References", ""]
        lines += [f"{i}. {note}" for i, note in enumerate(notes.values(), 1)]
        lines += ["", f"Every EnvPool reference: {ENVPOOL_DIFFERS}."]
    machines = [(g["game"], g["machine"]) for g in games if g["machine"]]
    if machines:
        lines += ["", "## Machines (bench.learn's summary.json of each game)", ""]
        lines += [f"- {game}: {json.dumps(m)}" for game, m in machines]
    return "\n".join(lines) + "\n"


def write(out: str, games: list[dict], marks: list[int], window: int, command: str) -> str:
    """games.md and games.json in ``out``; the Markdown returned."""
    text = table(games, marks, window, command)
    with open(os.path.join(out, GAMES_MD), "w") as f:
        f.write(text)
    report = {"command": command, "marks": marks, "window": window, "games": games}
    with open(os.path.join(out, GAMES_JSON), "w") as f:
        json.dump(report, f, indent=1)
    return text


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
