"""Every ```python block of README.md runs as written, each in its own interpreter, so the
examples a user copies first cannot rot."""

from __future__ import annotations

import os
import re
import sys

import pytest
from helpers import run_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK_TIMEOUT_S = 120


def python_blocks() -> list[tuple[int, str]]:
    """(line number, source) of every ```python block of the README."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)
    ]


def test_the_readme_has_python_blocks():
    assert len(python_blocks()) >= 5


def _block(line: int, source: str) -> object:
    """A block that names torch or the RL packages is marked rl (pytest --core leaves it out)."""
    rl = re.search(r"\b(torch|gymnasium|ale_py|actors|learners|bench)\b", source)
    return pytest.param(line, source, marks=pytest.mark.rl) if rl else (line, source)


@pytest.mark.parametrize(
    "line, source", [_block(*b) for b in python_blocks()], ids=[f"line{n}" for n, _ in python_blocks()]
)
def test_readme_block_runs(line, source):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    status, out, _ = run_command(
        [sys.executable, "-c", source], BLOCK_TIMEOUT_S, f"README block at line {line}", ROOT, env
    )
    assert status == 0, f"README block at line {line} failed:\n{out[-3000:]}"
