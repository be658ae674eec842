"""What ``python -m bench.impala`` runs, pinned: the job each of a few command lines
resolves to (every value the nodes get, on a fixed 2-core machine without bf16) is
``resolved_jobs.json`` beside this file. A change to a default fails here, so it is a
deliberate act: rebuild the table in the same commit and say why
(``python tests/test_bench_impala_settings.py`` rewrites it)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
from typing import Any

import pytest

from bench.impala import defaults, options, train
from bench.impala.plan import make_plan

TABLE = pathlib.Path(__file__).parent / "resolved_jobs.json"
COMMANDS = {
    "pong": [],
    "pong-impala": ["--algo", "impala"],
    "breakout-sticky": ["--env", "ALE/Breakout-v5", "--protocol", "sticky"],
    "cartpole": ["--env", "CartPole-v1"],
    "cartpole-appo": ["--env", "CartPole-v1", "--algo", "appo"],
}


def resolved(argv: list[str]) -> dict[str, Any]:
    """The job ``argv`` resolves to, as one flat table of what runs (the run folder left out)."""
    args = train.parse_args([*argv, "--out", "/nonexistent/run"])
    job = train.resolve(args, make_plan(args, cores=2, cpu_bf16=False))
    flat: dict[str, Any] = {}
    for name, value in dataclasses.asdict(job).items():
        if name == "model":  # the model's settings by their options' names
            flat.update(job.model.record())
        elif isinstance(value, dict):
            flat.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            flat[name] = value
    flat.pop("out")
    return json.loads(json.dumps(flat))  # tuples as lists, as the table has them


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_command_line_runs_the_job_it_ran_before(name):
    assert resolved(COMMANDS[name]) == json.loads(TABLE.read_text())[name]


if __name__ == "__main__":
    TABLE.write_text(json.dumps({n: resolved(a) for n, a in COMMANDS.items()}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {TABLE}", file=sys.stderr)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_shows_the_values_that_run(name):
    """Every option's default in the parser (its metavar, its [choice] or [on]/[off] in --help)
    is the value the parsed job runs with."""
    argv = COMMANDS[name]
    parser, _, _ = options.make_parser(argv)
    args = train.parse_args([*argv, "--out", "/nonexistent/run"])
    text = parser.format_help()
    for action in parser._actions:
        if action.dest in ("help", "out"):
            continue
        value = getattr(args, action.dest)
        if isinstance(action, argparse.BooleanOptionalAction):
            assert f"[{'on' if value else 'off'}]" in action.help, action.dest
        elif action.nargs == 0:  # a plain switch: off unless given
            assert value is False, action.dest
        elif action.dest != "protocol" or value != "custom":
            assert action.default == value, action.dest
            if action.metavar is not None and action.metavar != action.dest.upper():
                assert f"{action.option_strings[0]} {value}" in " ".join(text.split()), action.dest


def test_args_own_values_are_the_default_command_s():
    """``Args()`` reads as what ``python -m bench.impala`` runs: Pong, APPO, envpool."""
    parsed = train.parse_args(["--out", "/nonexistent/run"])
    assert dataclasses.replace(options.Args(), out=parsed.out) == parsed


def test_the_algorithm_rows_name_the_same_settings():
    """What IMPALA runs never depends on APPO's values, nor the other way round."""
    assert set(defaults.IMPALA) == set(defaults.PPO)
    for _, _, row in defaults.ROWS:
        assert set(row) <= {f.name for f in dataclasses.fields(options.Args)}


@pytest.mark.parametrize(
    "algo, given, runs",
    [("appo", None, "1"), ("appo", "0", "0"), ("appo", "1", "1"), ("impala", None, None), ("impala", "1", "1")],
)
def test_an_appo_job_turns_huge_pages_on_unless_the_environment_says(algo, given, runs, tmp_path, monkeypatch):
    if given is None:
        monkeypatch.delenv(train.HUGE_PAGES, raising=False)
    else:
        monkeypatch.setenv(train.HUGE_PAGES, given)
    monkeypatch.setattr(train, "prepare_run", lambda args, job: args.total_frames)  # "already there": no tensor
    out = str(tmp_path / "run")
    assert train.main(["--algo", algo, "--env", "CartPole-v1", "--total-frames", "1", "--out", out]) == 0
    assert os.environ.get(train.HUGE_PAGES) == runs
