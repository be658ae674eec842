"""bench.rpc's harness: every subject answers every call correctly, and the harness
ends every process it starts, also when a measurement fails. Nothing here is timed."""

from __future__ import annotations

import glob
import os

import pytest

from bench.rpc import benchmark
from bench.rpc.contract import Plan
from bench.rpc.peers import MpPipe
from shmpad.shm import janitor

CALLS = 50
NEEDS = {"zmq-ipc": "zmq", "portal": "portal"}  # the bench extra; shmpad, mp-pipe and floor need nothing more


def children() -> set[int]:
    """Pids of this process's live children (of every thread of it)."""
    pids: set[int] = set()
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        with open(path) as f:
            pids.update(int(p) for p in f.read().split())
    return pids


@pytest.fixture
def no_children_left():
    # The janitor is the one child that lives on (until the session ends): start it first.
    janitor.start()
    before = children()
    yield
    left = children() - before
    assert not left, f"the harness left processes running: {sorted(left)}"


def test_every_subject_is_in_the_test():
    # The shmpad subject must import here: the benchmark exists to measure it.
    import shmpad.rpc  # noqa: F401

    assert {s.name for s in benchmark.SUBJECTS} >= {"shmpad", "mp-pipe", "zmq-ipc", "portal", "floor"}


@pytest.mark.parametrize("depth", [1, 16], ids=["sync", "in-flight-16"])
@pytest.mark.parametrize("subject", benchmark.SUBJECTS, ids=lambda s: s.name)
def test_subject_answers_every_call(subject, depth, no_children_left, shm_leak_check):
    if subject.name in NEEDS:
        pytest.importorskip(NEEDS[subject.name])
    if subject.family == "floor":
        benchmark.warm_up_floor()
    sample = benchmark.measure(subject, Plan(depth=depth, seconds=0.0, warmup_seconds=0.0, calls=CALLS))
    # A wrong or missing reply fails the client, and measure() with it.
    assert sample.calls == CALLS
    assert 0 < sample.median_us <= sample.p99_us


class _StuckWrongPipe(MpPipe):
    """Answers with the wrong bytes and never ends on its own."""

    def serve(self) -> None:
        conn = self._server_end
        while True:
            conn.recv_bytes()
            conn.send_bytes(b"\xff" * 64)


def test_failed_measurement_kills_its_server(no_children_left):
    with pytest.raises(benchmark.MeasurementFailed, match="the client exited with code 1"):
        benchmark.measure(_StuckWrongPipe, Plan(depth=1, seconds=0.0, warmup_seconds=0.0, calls=CALLS))
