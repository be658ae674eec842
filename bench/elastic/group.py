"""One arm of ``bench.elastic``: a broker in this process, N learner processes, and the
fault injector, with every learner's events collected as they come.

The learners are ``python -m bench.elastic.learner`` processes (a restart is a fresh
process: Python, torch, the join, the ring and the state sync all count in its rejoin
time). Everything runs in this process's main thread: it reads the learners' pipes
with a selector and, ``interval`` seconds after the whole group's first step and after
each fault (later if the group is not whole again by then: every learner stepping in
a group of all of them), picks a member at random and faults it:

- ``kill``: SIGKILL, reap, and start it again at once under the same name;
- ``stop``: SIGSTOP, and SIGCONT ``stop_s`` seconds later: the hung learner wakes up,
  finds itself dropped, rejoins and is brought level (what it held is refused).

No fault comes in the last ``interval / 2`` seconds of the arm, so that each one's
recovery is seen.

The broker uses the command line's defaults (``shmpad.net.broker.HEARTBEAT_S`` ...).
"""

from __future__ import annotations

import json
import os
import random
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from bench.elastic.learner import TOKEN
from shmpad.net.broker import HEARTBEAT_S, SETTLE_S, TIMEOUT_S, Broker

START_S = 120.0  # for the whole group's first step (N fresh processes importing torch on a busy box)


class RunFailed(Exception):
    """The arm could not run to its end (a learner failed, the group never formed)."""


@dataclass
class Fault:
    kind: str  # "kill" or "stop"
    victim: str
    t: float  # when the signal was sent
    restarted: float | None = None  # when the new process started (kill) or SIGCONT was sent (stop)


@dataclass
class Arm:
    """What one arm's run left: every event by learner, the faults, the time bounds."""

    backend: str
    faults_on: bool
    peers: int
    batch: int
    started: float = 0.0  # the whole group's first step
    ended: float = 0.0
    events: dict[str, list[dict]] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)


class _Learner:
    def __init__(self, name: str, argv: list[str]):
        self.name = name
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "SHMPAD_TOKEN": TOKEN},
        )
        os.set_blocking(self.proc.stdout.fileno(), False)
        os.set_blocking(self.proc.stderr.fileno(), False)
        self.partial = b""
        self.stderr = b""
        self.started = time.monotonic()


def run_arm(
    backend: str,
    *,
    peers: int,
    seconds: float,
    interval: float,
    kinds: tuple[str, ...],
    faults_on: bool,
    width: int,
    batch: int,
    stop_s: float,
    seed: int,
) -> Arm:
    """Train ``seconds`` from the group's first step; fault a member every ``interval``
    seconds if ``faults_on`` (``kinds`` in turn)."""
    arm = Arm(backend, faults_on, peers, batch)
    rng = random.Random(seed)
    broker = Broker(port=0, token=TOKEN, heartbeat_s=HEARTBEAT_S, timeout_s=TIMEOUT_S, settle_s=SETTLE_S)
    learners: dict[str, _Learner] = {}
    selector = selectors.DefaultSelector()
    lifetime = START_S + seconds + 60

    def start(name: str) -> None:
        argv = [sys.executable, "-m", "bench.elastic.learner", broker.address, name, str(os.getpid())]
        argv += ["--peers", str(peers), "--backend", backend, "--width", str(width), "--batch", str(batch)]
        argv += ["--lifetime", str(lifetime)]
        learner = learners[name] = _Learner(name, argv)
        arm.events.setdefault(name, [])
        selector.register(learner.proc.stdout, selectors.EVENT_READ, (learner, "out"))
        selector.register(learner.proc.stderr, selectors.EVENT_READ, (learner, "err"))

    def pump(until: float) -> None:
        """Collect events until ``until``; ``RunFailed`` if a learner exits by itself."""
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            for key, _ in selector.select(min(left, 0.5)):
                learner, stream = key.data
                chunk = os.read(key.fileobj.fileno(), 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                if stream == "err":
                    learner.stderr = (learner.stderr + chunk)[-4000:]
                    continue
                lines = (learner.partial + chunk).split(b"\n")
                learner.partial = lines.pop()
                arm.events[learner.name].extend(json.loads(line) for line in lines)
            for learner in learners.values():
                code = learner.proc.poll()
                if code is not None and code != -signal.SIGKILL:
                    raise RunFailed(
                        f"learner {learner.name} exited with {code}:\n{learner.stderr.decode(errors='replace')}"
                    )

    def retire(learner: _Learner) -> None:
        for stream in (learner.proc.stdout, learner.proc.stderr):
            if _registered(selector, stream):
                selector.unregister(stream)
        _close(learner.proc)

    try:
        for i in range(peers):
            start(f"learner{i}")
        deadline = time.monotonic() + START_S
        while not all(any(e["e"] == "step" and e["n"] == peers for e in arm.events[n]) for n in learners):
            if time.monotonic() > deadline:
                raise RunFailed(f"the group of {peers} did not take its first step within {START_S} s")
            pump(time.monotonic() + 0.2)
        arm.started = max(next(e["t"] for e in arm.events[n] if e["e"] == "step") for n in learners)
        arm.ended = arm.started + seconds
        last = arm.ended - interval / 2  # no fault after this
        due = arm.started + interval
        faults = 0
        while faults_on and due <= last:
            pump(due)
            while not _whole(arm, learners, peers) and time.monotonic() < last:
                pump(time.monotonic() + 0.1)
            if not _whole(arm, learners, peers):
                break
            kind = kinds[faults % len(kinds)]
            victim = learners[rng.choice(sorted(learners))]
            fault = Fault(kind, victim.name, time.monotonic())
            arm.faults.append(fault)
            faults += 1
            if kind == "kill":
                victim.proc.kill()
                fault.t = time.monotonic()
                victim.proc.wait()
                pump(time.monotonic() + 0.05)  # the lines it wrote before it died
                retire(victim)
                fault.restarted = time.monotonic()
                start(victim.name)
            else:
                victim.proc.send_signal(signal.SIGSTOP)
                fault.t = time.monotonic()
                pump(min(fault.t + stop_s, arm.ended))
                victim.proc.send_signal(signal.SIGCONT)
                fault.restarted = time.monotonic()
            due = fault.t + interval
        pump(arm.ended)
        pump(time.monotonic() + 0.5)  # lines written just before the end
        return arm
    finally:
        _end(list(learners.values()))
        selector.close()
        broker.close()


def _whole(arm: Arm, learners: dict[str, _Learner], peers: int) -> bool:
    """Every learner's latest step since it (re)started was in a group of ``peers``."""
    for name, learner in learners.items():
        last = next((e for e in reversed(arm.events[name]) if e["e"] == "step"), None)
        if last is None or last["t"] < learner.started or last["n"] != peers:
            return False
    return True


def _registered(selector: selectors.BaseSelector, stream) -> bool:
    try:
        selector.get_key(stream)
    except KeyError:
        return False
    return True


def _end(learners: list[_Learner]) -> None:
    """Close their stdin (each leaves the group and exits); SIGKILL any still there 10 s later."""
    for learner in learners:
        if learner.proc.poll() is None:
            learner.proc.send_signal(signal.SIGCONT)  # a stopped learner cannot read its stdin
            try:
                learner.proc.stdin.close()
            except OSError:
                pass
    deadline = time.monotonic() + 10
    for learner in learners:
        try:
            learner.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            learner.proc.kill()
            learner.proc.wait()
        _close(learner.proc)


def _close(proc: subprocess.Popen) -> None:
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        try:
            stream.close()
        except OSError:
            pass
