"""Session-wide shared-memory leak check, and fixtures the ring-buffer tests share.

Every test must leave /dev/shm as it found it. At the end of the session, any
``shmpad.*`` entry that this session made and that is still there is listed, the
session fails (exit status 1), and the entry is removed so that it does not outlive
the run. Tests that want the check per test use the ``shm_leak_check`` fixture.

``pytest --core`` runs the core's tests only: those that need neither torch nor
gymnasium nor ale-py, for an install of shmpad without them (``.ci/core`` runs it on each
Python). A test module is left out when its top-level imports (or those of the test and
helper modules it imports, tests/helpers/ included) reach torch, gymnasium, ale_py, actors,
learners or bench; a test that needs them only inside its body is marked ``rl``.
"""

from __future__ import annotations

import ast
import functools
import os
import pathlib
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import helpers  # noqa: E402

LEAK_GRACE = 5.0

_leftovers_key = pytest.StashKey[list]()
_start_key = pytest.StashKey[set]()


RL_PACKAGES = frozenset({"torch", "gymnasium", "ale_py", "actors", "learners", "bench"})
_TESTS = pathlib.Path(__file__).parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--core",
        action="store_true",
        help="run only the tests of shmpad's core (no torch, gymnasium or ale-py needed)",
    )


@functools.lru_cache(maxsize=None)
def needs_rl(path: pathlib.Path) -> bool:
    """True if the module's top-level imports reach an RL package: directly, through local
    helpers, or through a shmpad module that imports one (shmpad.net.torchgroup imports torch)."""
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            root = name.split(".")[0]
            if root in RL_PACKAGES or any(needs_rl(path) for path in _local_modules(name)):
                return True
            if root == "shmpad" and _shmpad_needs_rl(name):
                return True
    return False


def _local_modules(name: str) -> list[pathlib.Path]:
    """The files under tests/ that importing ``name`` runs: ``helpers.net_procs`` runs
    helpers/__init__.py and helpers/net_procs.py; ``test_rpc_shm`` runs test_rpc_shm.py."""
    paths = []
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        base = _TESTS.joinpath(*parts[:i])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.exists():
                paths.append(path)
    return paths


@functools.lru_cache(maxsize=None)
def _shmpad_needs_rl(module: str) -> bool:
    """Whether importing the shmpad module ``module`` imports an RL package at its top level
    (its own top-level imports: import-linter's contract lets only a few leaf modules of the
    runtime import torch, and no other runtime module imports those at its top level)."""
    base = _TESTS.parent / module.replace(".", "/")
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    if not path.exists():
        return False
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots = [node.module.split(".")[0]]
        else:
            continue
        if any(root in RL_PACKAGES for root in roots):
            return True
    return False


def pytest_ignore_collect(collection_path: pathlib.Path, config: pytest.Config) -> bool | None:
    if config.getoption("core") and collection_path.suffix == ".py" and needs_rl(collection_path):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("core"):
        return
    rl = [item for item in items if item.get_closest_marker("rl") is not None]
    if rl:
        config.hook.pytest_deselected(items=rl)
        items[:] = [item for item in items if item.get_closest_marker("rl") is None]


def _remove(names) -> None:
    for name in names:
        try:
            os.unlink(os.path.join(helpers.SHM_DIR, name))
        except FileNotFoundError:
            pass


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_start_key] = helpers.shm_entries()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    leftovers = _new_entries(session.config.stash.get(_start_key, set()))
    session.config.stash[_leftovers_key] = leftovers
    if leftovers:
        _remove(leftovers)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    leftovers = config.stash.get(_leftovers_key, [])
    if leftovers:
        terminalreporter.section("shared-memory leak", sep="=", red=True, bold=True)
        terminalreporter.write_line(
            f"{len(leftovers)} /dev/shm entries made by this session were left behind (now removed):"
        )
        for name in leftovers:
            terminalreporter.write_line(f"  /dev/shm/{name}")


def _new_entries(before: set[str]) -> list[str]:
    """Entries made by this session since ``before``, once the janitors at work are done.

    A janitor unlinks a few milliseconds after the last process of its program died; an
    entry that is still there after ``LEAK_GRACE`` seconds has leaked.
    """
    helpers.wait_until(lambda: not helpers.ours(helpers.shm_entries() - before), LEAK_GRACE)
    return sorted(helpers.ours(helpers.shm_entries() - before))


@pytest.fixture
def shm_leak_check():
    """Fail the test if it leaves a ``shmpad.*`` entry in /dev/shm that was not there before it."""
    before = helpers.shm_entries()
    yield
    leaked = _new_entries(before)
    if leaked:
        _remove(leaked)
        pytest.fail(f"test left shared-memory segments behind (now removed): {leaked}")


@pytest.fixture
def make_segment():
    """``make_segment(kind="test", meta=None, data_bytes=4096, name=None)`` creates a segment that
    is unlinked when the test ends."""
    from shmpad.shm.segment import Segment

    made = []

    def make(kind: str = "test", meta: dict | None = None, data_bytes: int = 4096, name: str | None = None):
        seg = Segment.create(kind, meta if meta is not None else {}, data_bytes, name=name)
        made.append(seg)
        return seg

    yield make
    for seg in made:
        seg.unlink()
