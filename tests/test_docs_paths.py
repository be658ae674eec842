"""docs/architecture.md names the tree as it is, both ways: every repository path it writes in
backticks (``shmpad/launch/``, ``shmpad/context.py``) exists, so a move that forgets the page
fails here; and every package of the tree has its place in the folder table, and its layers
table is the import-linter layers contract, floor by floor, so a new package or floor that
forgets the page fails here too."""

from __future__ import annotations

import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest brings tomli, the same parser
    import tomli as tomllib

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


# -- the other direction: what exists has its place on the page -------------------------------

ROOTS = ("shmpad", "actors", "learners", "bench")
"""the root packages import-linter checks (``root_packages`` in pyproject.toml)"""


def section(text: str, heading: str) -> str:
    """The part of ``text`` under ``## heading``, up to the next heading of that level."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def packages() -> list[str]:
    """Every package of the tree, as a folder path ending in '/'."""
    found = {p.parent for root in ROOTS for p in (ROOT / root).rglob("__init__.py") if "__pycache__" not in p.parts}
    return sorted(f"{p.relative_to(ROOT).as_posix()}/" for p in found)


def contract_layers() -> list[set[str]]:
    """The floors of the layers contract in pyproject.toml, top to bottom, each the set of its rooms."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return [{room.strip() for room in floor.split("|")} for floor in layers]


def page_layers(text: str) -> list[set[str]]:
    """The floors of the page's layers table, top to bottom: the modules in each row's first cell."""
    rows = [line for line in section(text, "Layers").splitlines() if line.startswith("| `")]
    return [set(re.findall(r"`([^`]+)`", re.split(r"(?<!\\)\|", row)[1])) for row in rows]


def test_what_counts_as_a_layer_row():
    text = (
        "\n## Layers\n\n| floor | may import |\n| --- | --- |\n| `a.b` \\| `a.c` | `a.d` and below |\n| `a.d` | x |\n"
    )
    assert page_layers(text) == [{"a.b", "a.c"}, {"a.d"}]


def test_every_package_has_a_row_or_a_name_in_the_folder_table():
    named = set(repository_paths(section(DOC.read_text(), "Folders")))
    assert len(packages()) >= 20  # the tree is read at all
    missing = [p for p in packages() if p not in named]
    assert not missing, f"docs/architecture.md's folder table does not name these packages: {missing}"


def test_the_layers_table_is_the_import_contract_floor_by_floor():
    page, contract = page_layers(DOC.read_text()), contract_layers()
    assert len(contract) >= 10
    assert page == contract, (
        "docs/architecture.md's layers table differs from the layers contract in pyproject.toml:\n"
        f"  page:     {[' | '.join(sorted(f)) for f in page]}\n  contract: {[' | '.join(sorted(f)) for f in contract]}"
    )


def test_every_part_of_the_runtime_stands_on_a_floor():
    floors = set().union(*contract_layers())
    parts = {p.parent.name for p in (ROOT / "shmpad").glob("*/__init__.py")}
    parts |= {p.stem for p in (ROOT / "shmpad").glob("*.py") if p.name != "__init__.py"}
    outside = sorted(f"shmpad.{part}" for part in parts if f"shmpad.{part}" not in floors)
    assert not outside, f"these parts of shmpad are on no floor of the layers contract (pyproject.toml): {outside}"
