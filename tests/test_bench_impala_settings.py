"""What ``python -m bench.impala`` runs, pinned: the job each of a few command lines
resolves to (every value the nodes get, on a fixed 2-core machine without bf16) is
``resolved_jobs.json`` beside this file. A change to a default fails here, so it is a
deliberate act: rebuild the table in the same commit and say why
(``python tests/test_bench_impala_settings.py`` rewrites it)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from typing import Any

import pytest

from bench.impala import train
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
        if isinstance(value, dict):
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
