"""Processes of the multi-host tests: a broker, and learners of a gradient-averaging
group (``tests/helpers/net_peer.py``) whose JSON lines are collected as they come."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from helpers import kill_and_reap, start_session, track_pid
from shmpad.net.accumulator import _next_lineage

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
    ``flags`` (``()``: the command line's defaults) set its heartbeat, timeout and settle delay;
    ``popen`` starts it elsewhere (in a host of ``tests/helpers/hosts.py``)."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1", flags: tuple[str, ...] = SLOW_FLAGS, popen=None):
        args = [sys.executable, "-m", "shmpad.net.broker", "--host", host, "--port", str(port), *flags]
        pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env(), cwd=ROOT, text=True)
        if popen is None:
            self.proc = start_session(args, **pipes)
            track_pid(self.proc.pid)
        else:
            self.proc = popen(args, **pipes)
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
        self.trail: list[dict] = []
        """every change of what this peer holds, in order: its steps and its ``held`` events"""
        self.reduces: list[float] = []
        self.stderr: list[str] = []
        self.changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            event = json.loads(line)
            with self.changed:
                if event["event"] == "reduce":
                    self.reduces.append(time.monotonic())
                else:
                    event["t"] = time.monotonic()
                    self.trail.append(event)
                    if event["event"] == "step":
                        self.steps.append(event)
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
        self._reader.join(timeout)  # every line it printed is read: its last steps count in the checks
        assert not self._reader.is_alive(), f"{self.name}'s output was not read to its end within {timeout} s"

    def kill(self) -> None:
        kill_and_reap(self.proc)


@pytest.fixture
def procs():
    """A list to put every Broker and Peer a test starts in: all are killed at the end."""
    started: list = []
    yield started
    for p in started:
        p.kill()


def assert_identical(peers: list[Peer], others: list[Peer] = ()) -> int:
    """What a gradient group guarantees, checked on the steps its ``peers`` printed
    (``others``: peers whose steps and syncs count, but which need not end with the
    group, such as one that was killed):

    - one state per step: peers at the same version and lineage (``Accumulator.lineage``:
      the steps that led there) hold the same hash;
    - one history at the end: every peer's last state lies on the lineage of the furthest
      one, so no step that a peer still holds was left out of the group's;
    - every lost step counted: each time a sync replaced a state a peer held, its
      ``Accumulator.discarded`` grew by exactly the number of versions of that state's
      lineage that the state it loaded does not share (the versions forked), and by
      nothing otherwise. So a fork nobody counted, or counted as less than it was, fails.

    Each step's predecessor is found among the states printed (its lineage hashes the
    predecessor's with the step's epoch), so the steps form a tree rooted at version 0;
    forks are taken to be shorter than ``accumulator.HISTORY``, the window in which the
    leader recognises them. Returns how many (version, lineage) steps more than one peer took."""
    everyone = [*peers, *others]
    hashes: dict[tuple[int, int], dict[str, str]] = collections.defaultdict(dict)
    for p in everyone:
        for s in p.steps:
            hashes[s["version"], s["lineage"]][p.name] = s["hash"]
    for (version, lineage), by_peer in sorted(hashes.items()):
        if len(set(by_peer.values())) > 1:
            raise AssertionError(
                f"version {version}, lineage {lineage}: peers disagree: {by_peer}\n{_history(everyone, version)}"
            )
    tree = _Tree(everyone)
    ends = {p.name: _node(p.trail[-1]) if p.trail else ROOT_STATE for p in peers}
    furthest = max(ends.values())
    apart = {name: end for name, end in ends.items() if not tree.on(end, furthest)}
    if apart:
        raise AssertionError(
            f"the peers do not end on one lineage: {apart} are not on the lineage of {furthest} "
            f"(ends: {ends})\n{_history(everyone, min(v for v, _ in apart.values()))}"
        )
    for p in everyone:
        held, counted = ROOT_STATE, 0
        for event in p.trail:
            moved_to = _node(event) if event["event"] == "held" else tree.parent[_node(event)]
            if moved_to != held:  # a sync replaced what this peer held: its lost versions are counted
                counted += tree.lost(held, moved_to)
            held = _node(event)
            if event["discarded"] != counted:
                raise AssertionError(
                    f"{p.name} counted {event['discarded']} discarded steps at version {event['version']} "
                    f"({event['event']}), but the syncs replaced {counted} versions it held on another lineage"
                    f"\n{_history(everyone, event['version'])}"
                )
    return sum(len(by_peer) > 1 for by_peer in hashes.values())


ROOT_STATE = (0, 0)
"""(version, lineage) of an Accumulator that has taken no step"""


def _node(event: dict) -> tuple[int, int]:
    return event["version"], event["lineage"]


class _Tree:
    """The states the peers printed, each step linked to the state it was taken from."""

    def __init__(self, peers: list[Peer]):
        lineages: dict[int, set[int]] = collections.defaultdict(set)
        lineages[0].add(0)
        for p in peers:
            for e in p.trail:
                lineages[e["version"]].add(e["lineage"])
        self.parent: dict[tuple[int, int], tuple[int, int]] = {}
        for p in peers:
            for s in p.steps:
                node = _node(s)
                before = [x for x in lineages[s["version"] - 1] if _next_lineage(x, s["key"]) == s["lineage"]]
                if not before:
                    raise AssertionError(
                        f"{p.name}'s step to version {node[0]} (lineage {node[1]}, epoch {s['key']}) follows "
                        f"no state any peer printed at version {node[0] - 1}"
                    )
                self.parent[node] = (s["version"] - 1, before[0])

    def path(self, node: tuple[int, int]) -> dict[int, int]:
        """version -> lineage of every state that led to ``node`` (``node`` included)."""
        out = {}
        while node != ROOT_STATE:
            out[node[0]] = node[1]
            if node not in self.parent:
                raise AssertionError(f"state {node} was printed as held, but no peer printed the step to it")
            node = self.parent[node]
        return out

    def on(self, node: tuple[int, int], of: tuple[int, int]) -> bool:
        """Whether ``node`` is ``of`` or a state that led to it."""
        return node == ROOT_STATE or self.path(of).get(node[0]) == node[1]

    def lost(self, held: tuple[int, int], loaded: tuple[int, int]) -> int:
        """How many versions of ``held``'s lineage ``loaded``'s does not share."""
        kept = self.path(loaded)
        return sum(1 for version, lineage in self.path(held).items() if kept.get(version, lineage) != lineage)


def _history(peers: list[Peer], version: int) -> str:
    """Each peer's steps and syncs up to two versions past ``version``, and the first lines of its log."""
    keep = (
        "event",
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
        steps = [{k: s.get(k) for k in keep} for s in p.trail if s["version"] <= version + 2]
        parts.append(f"{p.name} steps: {steps}\n{p.name} log:\n{''.join(p.stderr[:60])}")
    return "\n".join(parts)


def run_group_jobs(argvs: list[list[str]], timeout: float = 240) -> list[str]:
    """Run one ``python -m bench.impala`` per argv at once (the hosts of a group, $SHMPAD_TOKEN
    set to the tests' token), wait for all, and return their outputs; each must exit 0 having
    trained in a group of ``len(argvs)``."""
    runs = []
    for argv in argvs:
        proc = start_session(
            [sys.executable, "-m", "bench.impala", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "SHMPAD_TOKEN": TOKEN},
            cwd=ROOT,
        )
        track_pid(proc.pid)
        runs.append(proc)
    try:
        outs = [proc.communicate(timeout=timeout)[0].decode() for proc in runs]
    finally:
        for proc in runs:
            kill_and_reap(proc)
    for proc, out in zip(runs, outs):
        assert proc.returncode == 0, out[-3000:]
        assert f"group {len(argvs)}" in out, out[-3000:]
    return outs


def kill_a_member_mid_reduction(victim, survivors, kill) -> None:
    """Stop ``victim`` (SIGSTOP) until each of ``survivors`` has started a reduction it cannot
    finish without it, then ``kill()`` it; the survivors must then take 3 steps as a group of 2
    and have abandoned a reduction. They are finished (their output read) on return."""
    victim.proc.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    for p in survivors:  # a reduction that starts now cannot finish without the victim
        p.wait(lambda p: p.reduces and p.reduces[-1] > stopped, 60, "a reduction started after the stop")
    kill()
    killed = time.monotonic()
    for p in survivors:
        p.wait(lambda p: len(p.steps_with(2, after=killed)) >= 3, 60, "3 steps in a group of 2 after the kill")
    for p in survivors:
        p.finish()
    assert any(s["abandoned"] > 0 for p in survivors for s in p.steps), "no reduction was abandoned"
