"""``launch(program)``: start a program's nodes under one of the launch types.

``local_mp`` (shmpad's default) forks one process per node; ``local_mt`` runs
every node as a thread of the launching process; ``test_mp`` and ``test_mt`` do
the same for tests (no waiting at exit; with ``test_case`` the program is
stopped, and its failure raised, in the test's cleanup). The launch type also
comes from ``--lp_launch_type`` on the command line, and the termination notice
(seconds a stopping node gets before it is killed) from
``--lp_termination_notice_secs``.
"""

from __future__ import annotations

import atexit
import math
import sys
from typing import Any, Mapping, Sequence

from shmpad._checks import check_timeout
from shmpad.context import LaunchType
from shmpad.errors import SegmentError
from shmpad.launch import flags
from shmpad.launch.output import say
from shmpad.launch.resources import PythonProcess
from shmpad.launch.supervisor import WorkerManager
from shmpad.nodes.address import bind_addresses
from shmpad.nodes.base import Node, as_node
from shmpad.program import Program
from shmpad.shm import janitor
from shmpad.top.registry import Registry

__all__ = ["LaunchType", "launch", "PythonProcess", "is_local_launch", "is_local_launch_or_test"]

DEFAULT_TERMINATION_NOTICE_SECS = 10.0


_ALLOWED = [t.value for t in LaunchType]


def _as_launch_type(launch_type: LaunchType | str) -> LaunchType:
    if isinstance(launch_type, LaunchType):
        return launch_type
    if not isinstance(launch_type, str):
        raise TypeError(f"launch_type must be a LaunchType or a str, got {type(launch_type).__name__}")
    try:
        return LaunchType(launch_type)
    except ValueError:
        raise ValueError(f"unknown launch type {launch_type!r}: allowed: {_ALLOWED}") from None


def is_local_launch(launch_type: LaunchType | str) -> bool:
    """True for ``local_mt`` and ``local_mp`` (call it with ``LAUNCH_TYPE.value`` to ask
    about ``--lp_launch_type``)."""
    return _as_launch_type(launch_type) in (LaunchType.LOCAL_MULTI_THREADING, LaunchType.LOCAL_MULTI_PROCESSING)


def is_local_launch_or_test(launch_type: LaunchType | str) -> bool:
    """True for every launch type shmpad has (they all run on this machine)."""
    _as_launch_type(launch_type)
    return True


def _flag(name: str, argv: Sequence[str]) -> str | None:
    """The value of Launchpad's flag ``--name``: absl's when absl has it, else read from ``argv``."""
    value = flags.absl_value(name)
    return flags.argv_value(name, argv) if value is None else str(value)


def _launch_type(launch_type: LaunchType | str | None) -> LaunchType:
    if launch_type is None:
        launch_type = _flag("lp_launch_type", sys.argv[1:]) or LaunchType.LOCAL_MULTI_PROCESSING.value
    return _as_launch_type(launch_type)


def _notice(termination_notice_secs: float | None) -> float:
    """The seconds a stopping node gets before it is killed: finite and >= 0 (NaN or a
    negative notice would mean the launcher never kills a node that ignores SIGTERM)."""
    if termination_notice_secs is None:
        raw = _flag("lp_termination_notice_secs", sys.argv[1:])
        if raw is None:
            return DEFAULT_TERMINATION_NOTICE_SECS
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"--lp_termination_notice_secs must be a number of seconds, got {raw!r}") from None
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"--lp_termination_notice_secs must be a finite number of seconds >= 0, got {raw!r}")
        return value
    return check_timeout(termination_notice_secs, "termination_notice_secs")


def _adapted_groups(program: Program) -> dict[str, list[Node]]:
    """The program's groups with each node as shmpad runs it (a node added twice stays
    one object: it is allocated once and runs twice)."""
    adapted: dict[int, Node] = {}
    return {label: [adapted.setdefault(id(n), as_node(n)) for n in group] for label, group in program.groups.items()}


def _all_nodes(nodes: list[Node]) -> list[Node]:
    out = []
    for node in nodes:
        out.append(node)
        out.extend(_all_nodes(node.inner_nodes()))
    return out


def _registry(program: str, launch_type: str, groups: dict[str, list[Node]]) -> Registry:
    """The program's registry (what ``python -m shmpad.top`` reads): its node rows in the
    order the manager starts them, and the shared memory of its data and courier nodes."""
    rows = [(label, index) for label, group in groups.items() for index, node in enumerate(group) if node.RUNS]
    sections: dict[str, list[dict[str, str]]] = {"rings": [], "weights": [], "rpc": []}
    seen: set[int] = set()
    for label, group in groups.items():
        for node in _all_nodes(group):
            describe = getattr(node, "_registry_entry", None)
            entry = describe() if describe is not None and id(node) not in seen else None
            seen.add(id(node))
            if entry is not None:
                sections[entry[0]].append({"label": label, **entry[1]})
    return Registry.create(program, launch_type, rows, **sections)


def _show_top(manager: WorkerManager) -> None:
    """The live view at the bottom of this terminal until the program ends (the manager
    stops it before ``wait()`` returns)."""
    if not sys.stdout.isatty():
        say("shmpad: top=True draws the live view in a terminal, and stdout is not one: running without it")
        return
    try:
        from shmpad.launch.live import LiveView
    except ImportError:
        say("shmpad: top=True needs rich for the live view (pip install 'shmpad[top]'): running without it")
        return
    try:
        view = LiveView(manager.registry.name)
    except SegmentError:
        return  # the program has ended already: nothing to show
    except Exception as e:  # the program runs already: a view that cannot start must not fail the launch
        say(f"shmpad: the live view could not start ({type(e).__name__}: {e}): running without it")
        return
    manager.on_end(view.stop)


def launch(
    programs: Program | Sequence[Program],
    launch_type: LaunchType | str | None = None,
    local_resources: Mapping[str, PythonProcess] | None = None,
    test_case: Any = None,
    terminal: str | None = None,
    *,
    termination_notice_secs: float | None = None,
    serialize_py_nodes: bool | None = None,
    top: bool = False,
) -> WorkerManager:
    """Start every node of ``program`` and return its ``WorkerManager`` (``wait()``,
    ``stop_and_wait()``). Under the local launch types the launching interpreter also
    waits for the program when it exits, and exits non-zero if a node failed.
    With ``top``, the live view of ``python -m shmpad.top`` is drawn at the bottom of
    this terminal until the program ends, the nodes' output scrolling above it (see
    ``shmpad.launch.live``); without a terminal on stdout that is said in one line, and
    the program runs without it.
    ``terminal`` and ``serialize_py_nodes`` are accepted for Launchpad compatibility
    and ignored: output always goes to this terminal with a ``[label/i]`` prefix, and
    nodes are forked, not serialized."""
    if isinstance(programs, Program):
        program = programs
    elif isinstance(programs, (list, tuple)) and programs and all(isinstance(p, Program) for p in programs):
        if len(programs) > 1:
            raise ValueError(f"launch() runs one program at a time, got {len(programs)}")
        program = programs[0]
    else:
        raise TypeError(f"launch() takes a Program, got {type(programs).__name__}")
    if not isinstance(top, bool):
        raise TypeError(f"top must be a bool, got {type(top).__name__}")
    kind = _launch_type(launch_type)
    notice = _notice(termination_notice_secs)
    resources = dict(local_resources or {})
    for label, res in resources.items():
        if label not in program.groups:
            raise ValueError(
                f"local_resources names group {label!r}, which the program does not have; groups: {sorted(program.groups)}"
            )
        if not isinstance(res, PythonProcess):  # a type, but Launchpad's ValueError, which its programs expect
            raise ValueError(f"Launch config for {label} must be a PythonProcess, got {type(res).__name__}")
        res.check_cpus(label)
    processes = kind in (LaunchType.LOCAL_MULTI_PROCESSING, LaunchType.TEST_MULTI_PROCESSING)
    if processes:
        janitor.start()  # before any fork, so that every node holds the janitor's pipe
        janitor.set_notice(notice)  # and ends what the nodes started if this process dies first
    groups = _adapted_groups(program)
    nodes = _all_nodes(list({id(n): n for g in groups.values() for n in g}.values()))
    bind_addresses(nodes)
    allocated: list[Node] = []
    try:
        for node in nodes:
            node.allocate()
            allocated.append(node)
        for label, group in groups.items():
            for node in group:
                for handle in node.input_handles:
                    handle.connect(node, label)
        registry = _registry(program.name, kind.value, groups)
    except BaseException:
        for node in allocated:
            node.free()
        raise
    manager = WorkerManager(program.name, kind.value, processes, notice, registry)
    manager.track(nodes)
    for label, group in groups.items():
        for index, node in enumerate(group):
            if node.RUNS:
                manager.add(label, index, node, resources.get(label))
    manager.start()
    if top:
        _show_top(manager)
    if kind in (LaunchType.LOCAL_MULTI_PROCESSING, LaunchType.LOCAL_MULTI_THREADING):
        atexit.register(manager._wait_at_exit)
    if test_case is not None:
        test_case.addCleanup(manager.cleanup_after_test, test_case)
    return manager
