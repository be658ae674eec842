"""docs/architecture.md names the tree as it is: every repository path it writes in backticks
(``shmpad/launch/``, ``shmpad/context.py``) exists, so a move that forgets the page fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"

# an inline code span: one backtick on each side, not part of a ``` fence
_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
# what a repository path is made of; an absolute path (``/proc``) or a URL (``env://``) is none
_PATH = re.compile(r"[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*/?")


def repository_paths(text: str) -> list[str]:
    """The backticked spans of ``text`` that look like repository paths: made of path
    characters, relative, and containing a '/' or ending in '.py'."""
    return [s for s in _SPAN.findall(text) if _PATH.fullmatch(s) and ("/" in s or s.endswith(".py"))]


def test_what_counts_as_a_path():
    text = "`shmpad/top/` `shmpad/context.py` `/proc` `env://` `launch(..., top=True)` `registry` ```x/y```"
    assert repository_paths(text) == ["shmpad/top/", "shmpad/context.py"]


def test_every_path_the_architecture_page_names_exists():
    paths = repository_paths(DOC.read_text())
    assert len(paths) >= 10  # the folder table is read at all
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md names paths that are not in the tree: {missing}"
