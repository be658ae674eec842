"""Every ```python block of README.md and of the guides in docs/ runs as written, each in its own
interpreter, so the examples a user copies first cannot rot; the README stays a short guide."""

from __future__ import annotations

import os
import re
import sys

import pytest
from helpers import run_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK_TIMEOUT_S = 120
README_MAX_LINES = 220
"""about 200: the README is a guide that links docs/ for depth, not a reference or a lab notebook"""


def guides() -> list[str]:
    """README.md and the Markdown guides directly under docs/ (not the measured runs' pages)."""
    docs = os.path.join(ROOT, "docs")
    return ["README.md"] + sorted(os.path.join("docs", n) for n in os.listdir(docs) if n.endswith(".md"))


def python_blocks(path: str = "README.md") -> list[tuple[int, str]]:
    """(line number, source) of every ```python block of ``path`` (relative to the repository)."""
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)
    ]


def all_blocks() -> list[tuple[str, int, str]]:
    return [(path, line, source) for path in guides() for line, source in python_blocks(path)]


def test_the_readme_has_python_blocks():
    assert len(python_blocks()) >= 5


def test_the_readme_is_a_short_guide():
    with open(os.path.join(ROOT, "README.md")) as f:
        lines = f.read().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, at most {README_MAX_LINES}: move depth to docs/"


def _block(path: str, line: int, source: str) -> object:
    """A block that names torch or the RL packages is marked rl (pytest --core leaves it out)."""
    rl = re.search(r"\b(torch|gymnasium|ale_py|actors|learners|bench)\b", source)
    return pytest.param(path, line, source, marks=pytest.mark.rl) if rl else (path, line, source)


@pytest.mark.parametrize(
    "path, line, source", [_block(*b) for b in all_blocks()], ids=[f"{p}:{n}" for p, n, _ in all_blocks()]
)
def test_readme_block_runs(path, line, source):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    status, out, _ = run_command(
        [sys.executable, "-c", source], BLOCK_TIMEOUT_S, f"{path} block at line {line}", ROOT, env
    )
    assert status == 0, f"{path} block at line {line} failed:\n{out[-3000:]}"


def markdown_files() -> list[str]:
    """README.md and every Markdown file under docs/, relative to the repository."""
    found = ["README.md"]
    for folder, _, names in os.walk(os.path.join(ROOT, "docs")):
        found += sorted(os.path.relpath(os.path.join(folder, n), ROOT) for n in names if n.endswith(".md"))
    return found


def relative_links(path: str) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link or image in ``path`` that is not a URL or an anchor."""
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    text = re.sub(r"^```.*?^```$", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.DOTALL | re.MULTILINE)
    out = []
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = m.group(1)
        if not re.match(r"[a-z][a-z0-9+.-]*:|#", target):
            out.append((text.count("\n", 0, m.start()) + 1, target.split("#")[0]))
    return out


def test_relative_links_find_their_files():
    """A link in the README or docs/ to a file of the repository points at one that exists
    (and never out of the repository: the project explains itself)."""
    broken = []
    for path in markdown_files():
        for line, target in relative_links(path):
            resolved = os.path.normpath(os.path.join(ROOT, os.path.dirname(path), target))
            inside = os.path.commonpath([resolved, ROOT]) == ROOT
            if not inside or not os.path.exists(resolved):
                broken.append(f"{path}:{line}: {target}")
    assert not broken, "links to missing files:\n" + "\n".join(broken)


def test_the_link_check_sees_links():
    links = relative_links("README.md")
    assert ("docs/architecture.md" in (t for _, t in links)) and len(links) >= 5, links
