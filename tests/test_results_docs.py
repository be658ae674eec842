"""The measured runs keep their evidence: every ``docs/results/<name>/README.md`` names the command
that produced its figures and links only files that exist, and ``docs/benchmarks.md``, which states
the current figures, links existing evidence and reaches every results folder.

The evidence can be run again: every script kept under docs/results/ compiles, and what it imports
exists today (a script that reaches into code that has changed since says in its docstring which
commit it runs on, and its folder's README says so too); every shell script parses and the
``python -m`` modules it runs exist; the file and module names a folder's README writes in code
exist; docs/results/README.md lists every folder."""

from __future__ import annotations

import ast
import glob
import importlib
import os
import pathlib
import re
import subprocess

import pytest
from conftest import needs_rl
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


# -- the evidence can be run again ---------------------------------------------------------------

INDEX = os.path.join(RESULTS, "README.md")
PINNED = re.compile(r"Runs on a checkout of commit ([0-9a-f]{7,40})")
"""how a script that uses code of the past says so in its docstring"""
PACKAGES = ("shmpad", "bench", "actors", "learners")
CODE_DIRS = {*PACKAGES, "tests", ".ci"}
FILE_TYPES = ("py", "sh", "txt", "json", "jsonl", "csv", "tsv", "png", "gif", "log", "out", "md", "pt")
RUN_FILES = {"config.json", "checkpoint.pt", "log.csv", "episodes.csv"}
"""what every bench.impala run writes into its folder (bench/impala/rundir.py): a README may name
them as kinds of files, not as files of its own folder"""
_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_PATH = re.compile(r"[\w.\-]+(/[\w.\-]+)*/?")
_MODULE = re.compile(rf"({'|'.join(PACKAGES)})(\.\w+)+")
_FILE = re.compile(rf".*\.({'|'.join(FILE_TYPES)})")
_PLACEHOLDER = re.compile(r"[A-Z]+(?![a-z])")  # seedS.log, hung-CONFIG-ROUND.log: a glob's stars


def scripts(suffix: str) -> list[str]:
    """Every ``*suffix`` file under docs/results/, relative to the repository."""
    found = glob.glob(os.path.join(ROOT, RESULTS, "**", f"*{suffix}"), recursive=True)
    return sorted(os.path.relpath(f, ROOT) for f in found)


def _python_script(path: str):
    return pytest.param(path, marks=pytest.mark.rl) if needs_rl(pathlib.Path(ROOT, path)) else path


def module_file(name: str) -> str | None:
    """The file of the repository's module ``name`` (``bench.impala.plan``), or None."""
    base = os.path.join(ROOT, *name.split("."))
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.exists(candidate):
            return candidate
    return None


def runnable(module: str) -> bool:
    """Whether ``python -m module`` finds a module of the repository to run."""
    base = os.path.join(ROOT, *module.split("."))
    return os.path.exists(base + ".py") or os.path.exists(os.path.join(base, "__main__.py"))


def top_level_names(path: str) -> set[str]:
    """What a module defines or imports at its top level."""
    names = set()
    for node in ast.parse(pathlib.Path(path).read_text(), path).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def names_that_exist(name: str) -> bool:
    """Whether ``name`` is a module of the repository, or one followed by a name it defines
    (``bench.impala.plan.cpu_has_bf16``), without importing anything."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:k]))
        if path is not None:
            rest = parts[k:]
            return not rest or (len(rest) == 1 and rest[0] in top_level_names(path))
    return False


def unresolved_imports(source: str, name: str) -> list[str]:
    """The imports of the script ``source`` (anywhere in it) that fail today: a module not found,
    or a name its module lacks. The modules are imported, the script is not run."""
    missing = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            wanted = {alias.name: [] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            wanted = {node.module: [alias.name for alias in node.names]}
        else:
            continue
        for module_name, attributes in wanted.items():
            try:
                module = importlib.import_module(module_name)
            except ImportError as e:
                missing.append(f"line {node.lineno}: import {module_name}: {e}")
                continue
            for attribute in attributes:
                if not hasattr(module, attribute) and not _submodule(module_name, attribute):
                    missing.append(f"line {node.lineno}: {module_name} has no {attribute!r}")
    return missing


def _submodule(package: str, name: str) -> bool:
    try:
        importlib.import_module(f"{package}.{name}")
    except ImportError:
        return False
    return True


def test_there_are_scripts():
    assert len(scripts(".py")) >= 5 and len(scripts(".sh")) >= 5


@pytest.mark.parametrize("path", [_python_script(p) for p in scripts(".py")])
def test_an_evidence_script_compiles_and_what_it_imports_exists(path):
    source = pathlib.Path(ROOT, path).read_text()
    tree = compile(source, path, "exec", flags=ast.PyCF_ONLY_AST)
    compile(tree, path, "exec")
    pinned = PINNED.search(ast.get_docstring(tree) or "")
    if pinned:  # the code it needs is that commit's: the reader must be told where to run it
        readme = pathlib.Path(ROOT, os.path.dirname(path), "README.md").read_text()
        assert pinned.group(1) in readme, f"{path} runs on commit {pinned.group(1)}, which its README does not name"
        return
    missing = unresolved_imports(source, path)
    assert not missing, f"{path} imports what no longer exists:\n" + "\n".join(missing)


@pytest.mark.parametrize("path", scripts(".sh"))
def test_an_evidence_shell_script_parses_and_its_modules_exist(path):
    checked = subprocess.run(["bash", "-n", os.path.join(ROOT, path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, f"{path} does not parse: {checked.stderr}"
    text = pathlib.Path(ROOT, path).read_text()
    for module in re.findall(r"\bpython3? -m ([\w.]+)", text):
        if module.split(".")[0] in PACKAGES:
            assert runnable(module), f"{path} runs python -m {module}, which does not exist"
    for heredoc in re.findall(r"<<'PY'\n(.*?)^PY$", text, flags=re.DOTALL | re.MULTILINE):
        compile(heredoc, f"{path} (python here-document)", "exec")


def missing_names(text: str, folder: str) -> list[str]:
    """The names that ``text`` (the README of the results folder ``folder``, an absolute path)
    writes in inline code and that do not exist: repository paths (``bench/impala/plan.py``),
    modules (``bench.impala.plan``), and files of its folder (``quieter/machine.txt``,
    ``rounds.txt``, found anywhere under the folder; ``seedS.log`` stands for ``seed*.log``).
    Paths of other projects (``rl_games/common/a2c_common.py``) are not read as ours."""
    text = re.sub(r"^```.*?^```$", "", text, flags=re.DOTALL | re.MULTILINE)
    missing = []
    for span in (s.strip() for s in _SPAN.findall(text)):
        if _MODULE.fullmatch(span):
            if not names_that_exist(span):
                missing.append(span)
            continue
        if not _PATH.fullmatch(span) or not (_FILE.fullmatch(span) or span.endswith("/")):
            continue
        first = span.split("/")[0]
        if "/" in span and (first in CODE_DIRS or span.startswith(RESULTS + "/")):
            where = [os.path.join(ROOT, span)]
        elif "/" in span and os.path.exists(os.path.join(folder, first)):
            where = [os.path.join(folder, _PLACEHOLDER.sub("*", span))]
        elif "/" not in span and span not in RUN_FILES:
            where = [os.path.join(folder, "**", _PLACEHOLDER.sub("*", span))]
        else:
            continue
        if not any(glob.glob(w, recursive=True) for w in where):
            missing.append(span)
    return missing


@pytest.mark.parametrize("folder", result_folders())
def test_a_result_names_only_files_and_modules_that_exist(folder):
    missing = missing_names(pathlib.Path(ROOT, folder, "README.md").read_text(), os.path.join(ROOT, folder))
    assert not missing, f"{folder}/README.md names what does not exist: {missing}"


def test_the_results_index_lists_every_folder():
    linked = {os.path.normpath(os.path.join(RESULTS, target)) for _, target in relative_links(INDEX)}
    unlisted = [f for f in result_folders() if os.path.join(f, "README.md") not in linked]
    assert not unlisted, f"{INDEX} does not list {unlisted}"


@pytest.mark.rl  # its script imports bench.impala.train, which needs torch
def test_the_evidence_checks_see_what_is_missing(tmp_path):
    assert names_that_exist("bench.impala.plan") and names_that_exist("bench.impala.plan.cpu_has_bf16")
    assert not names_that_exist("bench.impala_plan") and not names_that_exist("bench.impala.plan.no_such_name")
    assert runnable("bench.impala") and runnable("bench.impala.compare") and not runnable("bench.impala_compare")
    for name in ("forks.py", "runs-burn1.tsv", "runs-burn2.tsv"):
        (tmp_path / name).write_text("")
    (tmp_path / "seed-0").mkdir()
    (tmp_path / "seed-0" / "run.log").write_text("")
    text = (
        "`bench/impala_plan.py` `bench/impala/plan.py` `forks.py` `no-such.tsv` `runs-burnN.tsv` `rl_games/x.py` "
        "`run.log` `seed-0/run.log` `seed-0/gone.log` `log.csv` `shmpad/Spot-v0` `BatchServer.close` "
        "`bench.impala_compare` `bench.impala.compare`\n```\n`gone.txt`\n```\n"
    )
    assert missing_names(text, str(tmp_path)) == [
        "bench/impala_plan.py",
        "no-such.tsv",
        "seed-0/gone.log",
        "bench.impala_compare",
    ]
    source = "import os\nfrom bench.impala import train, no_such_thing\nimport no_such_module\n"
    assert [m.split(":")[1].strip() for m in unresolved_imports(source, "old.py")] == [
        "bench.impala has no 'no_such_thing'",
        "import no_such_module",
    ]
