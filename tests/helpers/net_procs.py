"""Processes of the multi-host tests: a broker, and learners of a gradient-averaging
group (``tests/helpers/net_peer.py``) whose JSON lines are collected as they come."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from helpers import kill_and_reap, start_session, track_pid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOKEN = "accumulator-test-token"


def env() -> dict:
    # RES_OPTIONS: torch.distributed looks up the names of the addresses it connects to, and
    # from a network namespace the host's DNS server cannot be reached: glibc's default 5 s
    # timeout, twice, per lookup made forming a gloo group there take 10 s and more
    return {**os.environ, "SHMPAD_TOKEN": TOKEN, "PYTHONPATH": ROOT, "RES_OPTIONS": "timeout:1 attempts:1"}


SLOW_FLAGS = ("--settle", "0.3", "--heartbeat", "0.5", "--timeout", "5")
"""a broker that drops a silent member after 5 s: what most of these tests use"""


class Broker:
    """``python -m shmpad.net.broker`` on ``host:port`` (0: a free port), ready when made;
    ``flags`` (``()``: the command line's defaults) set its heartbeat, timeout and settle delay."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1", flags: tuple[str, ...] = SLOW_FLAGS):
        self.proc = start_session(
            [
                sys.executable,
                "-m",
                "shmpad.net.broker",
                "--host",
                host,
                "--port",
                str(port),
                *flags,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env(),
            cwd=ROOT,
            text=True,
        )
        track_pid(self.proc.pid)
        line = self.proc.stdout.readline()
        match = re.search(r"listening on (\S+)", line)
        if not match:
            kill_and_reap(self.proc)  # the test has no handle on it yet: it must not outlive this
            raise AssertionError(f"broker did not start: {line!r}")
        self.address = match.group(1)
        self.port = int(self.address.rsplit(":", 1)[1])
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # keep its pipe drained

    def kill(self) -> None:
        kill_and_reap(self.proc)


class Peer:
    """One ``tests/helpers/net_peer.py`` process; ``popen`` starts it elsewhere (a namespace's)."""

    def __init__(self, broker: str, name: str, group: str = "g", *extra: str, popen=None):
        self.name = name
        args = [sys.executable, os.path.join(HERE, "net_peer.py"), broker, group, name, *extra]
        pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(), text=True)
        if popen is None:
            self.proc = start_session(args, **pipes)
            track_pid(self.proc.pid)
        else:
            self.proc = popen(args, **pipes)
        self.steps: list[dict] = []
        self.reduces: list[float] = []
        self.stderr: list[str] = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            event = json.loads(line)
            with self.changed:
                if event["event"] == "step":
                    event["t"] = time.monotonic()
                    self.steps.append(event)
                else:
                    self.reduces.append(time.monotonic())
                self.changed.notify_all()

    def wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate(self):
                remaining = deadline - time.monotonic()
                assert remaining > 0 and self.proc.poll() is None, (
                    f"{self.name}: {what} did not happen within {timeout} s (exit {self.proc.poll()}); "
                    f"last steps {self.steps[-3:]}\nstderr:\n{''.join(self.stderr[-30:])}"
                )
                self.changed.wait(min(remaining, 0.2))

    def steps_with(self, size: int, after: float = 0.0) -> list[dict]:
        return [s for s in self.steps if s["size"] == size and s["t"] >= after]

    def finish(self, timeout: float = 20.0) -> None:
        """Close stdin (the peer leaves the group and exits 0)."""
        self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_and_reap(self.proc)
            raise AssertionError(f"{self.name} did not exit within {timeout} s of being asked") from None
        assert code == 0, f"{self.name} exited {code}:\n{''.join(self.stderr[-30:])}"

    def kill(self) -> None:
        kill_and_reap(self.proc)


@pytest.fixture
def procs():
    """A list to put every Broker and Peer a test starts in: all are killed at the end."""
    started: list = []
    yield started
    for p in started:
        p.kill()


def assert_identical(peers: list[Peer]) -> int:
    """Every step is the same on every peer that took it: at each version, peers of the
    same lineage (``Accumulator.lineage``: the steps that led there) hold the same hash;
    and a version reached on two lineages (a step the group did not keep) was counted by a
    peer in ``Accumulator.discarded``. Returns how many versions more than one peer
    reached on one lineage."""
    by_step: dict[tuple[int, int], dict[str, str]] = collections.defaultdict(dict)
    for p in peers:
        for s in p.steps:
            by_step[s["version"], s["lineage"]][p.name] = s["hash"]
    shared = 0
    for (version, lineage), hashes in sorted(by_step.items()):
        if len(set(hashes.values())) > 1:
            raise AssertionError(
                f"version {version}, lineage {lineage}: peers disagree: {hashes}\n{_history(peers, version)}"
            )
        shared += len(hashes) > 1
    forks = sorted(v for v, n in collections.Counter(v for v, _ in by_step).items() if n > 1)
    discarded = {p.name: p.steps[-1]["discarded"] for p in peers if p.steps}
    if forks and not any(discarded.values()):  # a step the group did not keep must be counted where it went
        raise AssertionError(
            f"versions {forks} were reached on more than one lineage, but no peer counted a discarded step "
            f"({discarded})\n{_history(peers, forks[0])}"
        )
    return shared


def _history(peers: list[Peer], version: int) -> str:
    """Each peer's steps up to two versions past ``version``, and the first lines of its log."""
    keep = (
        "version",
        "lineage",
        "discarded",
        "hash",
        "size",
        "key",
        "computed_at",
        "contributed",
        "abandoned",
        "refused",
    )
    parts = []
    for p in peers:
        steps = [{k: s.get(k) for k in keep} for s in p.steps if s["version"] <= version + 2]
        parts.append(f"{p.name} steps: {steps}\n{p.name} log:\n{''.join(p.stderr[:60])}")
    return "\n".join(parts)
