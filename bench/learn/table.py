"""games.md and games.json: the table ``python -m bench.learn.games`` writes, from run folders alone.

A game's folder is bench.learn's (``seed-N`` run folders, each with the config.json, episodes.csv
and log.csv that ``python -m bench.impala`` writes, and bench.learn's summary.json beside them);
what each column means, and how it is computed from those files, is ``python -m
bench.learn.games --help``'s (``bench/learn/games.py``'s docstring). Nothing here runs anything, so
the table of kept runs can be made again at any time.
"""

from __future__ import annotations

import csv
import json
import os
import statistics

from actors.envs.protocol import protocol_of
from bench.impala import rundir
from bench.impala.plan import env_family
from bench.learn import __main__ as learn
from bench.learn.targets import ENVPOOL_DIFFERS, references_for, score_text, target_for

__all__ = [
    "GAMES_JSON",
    "GAMES_MD",
    "game_folder",
    "game_folders",
    "protocol_entry",
    "read_game",
    "read_run",
    "table",
    "write",
]

GAMES_MD = "games.md"
GAMES_JSON = "games.json"


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
