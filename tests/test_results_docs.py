"""The measured runs keep their evidence: every ``docs/results/<name>/README.md`` names the command
that produced its figures and links only files that exist, and ``docs/benchmarks.md``, which states
the current figures, links existing evidence and reaches every results folder."""

from __future__ import annotations

import os
import re

import pytest
from test_readme import ROOT, relative_links

RESULTS = os.path.join("docs", "results")
BENCHMARKS = os.path.join("docs", "benchmarks.md")
COMMAND = re.compile(r"\bpython3? -m [A-Za-z_][\w.]*")


def result_folders() -> list[str]:
    """Every folder under docs/results/, relative to the repository."""
    root = os.path.join(ROOT, RESULTS)
    return sorted(os.path.join(RESULTS, n) for n in os.listdir(root) if os.path.isdir(os.path.join(root, n)))


def code(text: str) -> list[str]:
    """The fenced blocks and the inline code spans of a Markdown text."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)
    rest = re.sub(r"^```.*?^```$", "", text, flags=re.DOTALL | re.MULTILINE)
    return blocks + re.findall(r"`([^`]+)`", rest)  # a span may wrap onto the next line


def missing_links(path: str) -> list[str]:
    """``path:line: target`` for every relative link of ``path`` whose file does not exist."""
    return [
        f"{path}:{line}: {target}"
        for line, target in relative_links(path)
        if not os.path.exists(os.path.normpath(os.path.join(ROOT, os.path.dirname(path), target)))
    ]


def test_there_are_results():
    assert len(result_folders()) >= 5, result_folders()


@pytest.mark.parametrize("folder", result_folders())
def test_a_result_names_its_command_and_links_existing_files(folder):
    readme = os.path.join(folder, "README.md")
    assert os.path.exists(os.path.join(ROOT, readme)), f"{folder} has no README.md saying how it was made"
    with open(os.path.join(ROOT, readme)) as f:
        text = f.read()
    assert any(COMMAND.search(c) for c in code(text)), f"{readme} names no command (`python -m ...`) in code"
    assert not missing_links(readme), "links to missing files:\n" + "\n".join(missing_links(readme))


def test_benchmarks_link_existing_evidence():
    assert not missing_links(BENCHMARKS), "links to missing files:\n" + "\n".join(missing_links(BENCHMARKS))


def test_benchmarks_reach_every_result():
    """Each results folder is linked from docs/benchmarks.md, so no kept evidence is orphaned and no
    current figure lives only in its folder."""
    linked = {
        os.path.normpath(os.path.join(os.path.dirname(BENCHMARKS), target)) for _, target in relative_links(BENCHMARKS)
    }
    orphans = [f for f in result_folders() if not any(p == f or p.startswith(f + os.sep) for p in linked)]
    assert not orphans, f"docs/benchmarks.md links nothing in {orphans}"


def test_the_checks_see_commands_and_links():
    assert COMMAND.search("`python -m bench.impala --device cuda`")
    assert not COMMAND.search("rounds.sh ran bench.impala")
    assert code("a `python -m x` and\n```\npython -m y\n```\n") == ["python -m y\n", "python -m x"]
    assert len(relative_links(BENCHMARKS)) >= 5
