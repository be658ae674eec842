"""One arm of ``bench.elastic``: a broker in this process, N learner processes, and the
fault injector, with every learner's events collected as they come.

A learner is started (and restarted) one of three ways, ``restart``:

- ``"fork"``: a child of a fork server (``multiprocessing``'s ``forkserver``) that has
  imported torch and the learner once, as a supervisor with a warm parent restarts a
  worker (shmpad's launcher forks its nodes the same way). The join, the ring and the
  state sync count in its rejoin time; Python and ``import torch`` do not. The learner
  is ``bench.elastic.learner``'s MLP.
- ``"exec"``: ``python -m bench.elastic.learner``, a fresh interpreter: Python and
  ``import torch`` count too.
- ``"job"``: ``python -m bench.elastic.job_learner``, a fresh interpreter running the
  Pong job's learner (``bench.impala``'s settings, model, ``Learner`` and ``join_group``,
  compiled as the job's plan says; synthetic batches): Python, the job's imports, the
  model, the compiling and the join all count.

Everything runs in this process's main thread: it reads the learners' pipes
with a selector and, ``interval`` seconds after the whole group's first step and after
each fault (later if the group is not whole again by then: every learner stepping in
a group of all of them), picks a member at random and faults it:

- ``kill``: SIGKILL, reap, and start it again at once under the same name;
- ``stop``: SIGSTOP, and SIGCONT ``stop_s`` seconds later: the hung learner wakes up,
  finds itself dropped, rejoins and is brought level (what it held is refused).

No fault comes in the last ``interval / 2`` seconds of the arm, so that each one's
recovery is seen, and a faults arm goes on after its end (uncounted) until its group is
whole again, at most ``recover_s`` seconds (``RECOVER_S``: a job learner's way back can take
longer than the arm has left).

The broker uses the command line's defaults (``shmpad.net.broker.HEARTBEAT_S`` ...).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import multiprocessing.context
import os
import random
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from bench.elastic.learner import TOKEN, Settings, forked
from shmpad.net.broker import HEARTBEAT_S, SETTLE_S, TIMEOUT_S, Broker

START_S = {"fork": 120.0, "exec": 120.0, "job": 900.0}
"""hang guards for the whole group's first step, by ``restart``: N fresh processes importing torch on a busy
box; for ``job``, each also builds the job's learner and compiles its loss (8 at once on 2 cores)"""


RECOVER_S = {"fork": 10.0, "exec": 120.0, "job": 600.0}
"""how long a faults arm waits after its end for the last fault's way back, by ``restart``: a hang guard"""


class RunFailed(Exception):
    """The arm could not run to its end (a learner failed, the group never formed)."""


class Aborted(RunFailed):
    """The arm was stopped from outside (``run_arm``'s ``abort``)."""


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
    restart: str = "fork"  # how its learners start and restart (run_arm's restart)


class _Learner:
    """A learner process, however it was started: its event and error streams, the
    control stream whose end stops it, and its exit."""

    def __init__(self, name: str, events, errors) -> None:
        self.name = name
        self.events, self.errors = events, errors
        for stream in (events, errors):
            os.set_blocking(stream.fileno(), False)
        self.partial = b""
        self.stderr = b""
        self.started = time.monotonic()

    pid: int

    def poll(self) -> int | None:
        """The exit code (minus the signal that killed it), None while it runs."""
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> bool:
        """True once it has exited (reaped), False if ``timeout`` passed first."""
        raise NotImplementedError

    def stop(self) -> None:
        """Close its control stream: it leaves the group and exits."""
        raise NotImplementedError

    def close(self) -> None:
        """Close this side's streams."""
        raise NotImplementedError

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)


class _Exec(_Learner):
    """A new interpreter running ``argv`` (``exec_argv``, ``job_argv``), its stdin the control
    stream, its stdout the events."""

    def __init__(self, name: str, argv: list[str]) -> None:
        env = {**os.environ, "SHMPAD_TOKEN": TOKEN}
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        self.pid = self.proc.pid
        super().__init__(name, self.proc.stdout, self.proc.stderr)

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> bool:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass


def exec_argv(settings: Settings, parent: int) -> list[str]:
    """``python -m bench.elastic.learner``: the MLP learner in a new interpreter that imports torch itself."""
    argv = [sys.executable, "-m", "bench.elastic.learner", settings.broker, settings.name, str(parent)]
    argv += ["--peers", str(settings.peers), "--backend", settings.backend, "--width", str(settings.width)]
    return argv + ["--batch", str(settings.batch), "--lifetime", str(settings.lifetime)]


def job_argv(settings: Settings, parent: int, job: tuple[str, ...], threads: int) -> list[str]:
    """``python -m bench.elastic.job_learner``: the job's learner (``job``: its flags) in a new interpreter."""
    from bench.elastic.job_learner import group_argv  # the job's modules stay out of the fork server

    argv = [sys.executable, "-m", "bench.elastic.job_learner", settings.name, str(parent), str(settings.lifetime)]
    return argv + group_argv(list(job), settings.broker, settings.peers, settings.backend, threads)


class _Forked(_Learner):
    """A child of the fork server, which imported torch and the learner once."""

    def __init__(self, name: str, settings: Settings) -> None:
        ctx = _fork_server()
        events, events_w = ctx.Pipe(duplex=False)
        control_r, self.control = ctx.Pipe(duplex=False)
        errors, errors_w = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=forked, args=(settings, events_w, control_r, errors_w), name=name, daemon=True)
        self.proc.start()
        for theirs in (events_w, control_r, errors_w):
            theirs.close()
        self.pid = self.proc.pid
        super().__init__(name, events, errors)

    def poll(self) -> int | None:
        return self.proc.exitcode

    def wait(self, timeout: float | None = None) -> bool:
        self.proc.join(timeout)
        return self.proc.exitcode is not None

    def stop(self) -> None:
        self.control.close()

    def close(self) -> None:
        for stream in (self.control, self.events, self.errors):
            stream.close()
        if self.proc.exitcode is not None:
            self.proc.close()


_SERVER: multiprocessing.context.BaseContext | None = None


def _fork_server() -> multiprocessing.context.BaseContext:
    """The fork server context, its server importing torch and the learner once, when
    the first learner starts (and ending with this process), and building an optimiser
    once (``bench.elastic.warm``). It also imports what
    ``python -m bench.elastic``'s main module imports, which every child runs again
    (``multiprocessing`` prepares a child so), to find it imported already."""
    global _SERVER
    if _SERVER is None:
        _SERVER = multiprocessing.get_context("forkserver")
        _SERVER.set_forkserver_preload(
            ["bench.elastic.warm", "bench.elastic.group", "bench.elastic.report", "bench.common.cli"]
        )
    return _SERVER


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
    restart: str = "fork",
    job: tuple[str, ...] = (),
    threads: int = 1,
    recover_s: float = 0.0,
    abort: threading.Event | None = None,
) -> Arm:
    """Train ``seconds`` from the group's first step; fault a member every ``interval``
    seconds if ``faults_on`` (``kinds`` in turn). ``restart``: how learners start,
    ``"fork"``, ``"exec"`` or ``"job"`` (``job``: the job's flags, ``threads``: its learner's
    torch threads unless they say; ``batch`` is then the job's, for samples/s). After its
    ``seconds``, a faults arm goes on until the group is whole again, at most ``recover_s``
    seconds: the last fault's way back is then seen even where it takes longer than the
    arm has left (those seconds count in no rate). Once ``abort`` is set the arm ends its
    learners and raises ``Aborted`` within half a second."""
    arm = Arm(backend, faults_on, peers, batch, restart=restart)
    rng = random.Random(seed)
    broker = Broker(port=0, token=TOKEN, heartbeat_s=HEARTBEAT_S, timeout_s=TIMEOUT_S, settle_s=SETTLE_S)
    learners: dict[str, _Learner] = {}
    selector = selectors.DefaultSelector()
    start_s = START_S[restart]
    settings = Settings(broker.address, "", peers, backend, width, batch, lifetime=start_s + seconds + recover_s + 60)

    def start(name: str) -> None:
        named = dataclasses.replace(settings, name=name)
        if restart == "fork":
            learner: _Learner = _Forked(name, named)
        elif restart == "exec":
            learner = _Exec(name, exec_argv(named, os.getpid()))
        else:
            learner = _Exec(name, job_argv(named, os.getpid(), job, threads))
        learners[name] = learner
        arm.events.setdefault(name, [])
        selector.register(learner.events, selectors.EVENT_READ, (learner, "out"))
        selector.register(learner.errors, selectors.EVENT_READ, (learner, "err"))

    def pump(until: float) -> None:
        """Collect events until ``until``; ``RunFailed`` if a learner exits by itself."""
        while True:
            if abort is not None and abort.is_set():
                raise Aborted(f"the {'faults' if faults_on else 'clean'} arm was stopped: the other arm failed")
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
                code = learner.poll()
                if code is not None and code != -signal.SIGKILL:
                    raise RunFailed(
                        f"learner {learner.name} exited with {code}:\n{learner.stderr.decode(errors='replace')}"
                    )

    def retire(learner: _Learner) -> None:
        for stream in (learner.events, learner.errors):
            if _registered(selector, stream):
                selector.unregister(stream)
        learner.close()

    try:
        for i in range(peers):
            start(f"learner{i}")
        deadline = time.monotonic() + start_s
        while not all(any(e["e"] == "step" and e["n"] == peers for e in arm.events[n]) for n in learners):
            if time.monotonic() > deadline:
                raise RunFailed(f"the group of {peers} did not take its first step within {start_s:g} s")
            pump(time.monotonic() + 0.2)
        arm.started = max(next(e["t"] for e in arm.events[n] if e["e"] == "step") for n in learners)
        arm.ended = arm.started + seconds
        last = arm.ended - interval / 2  # no fault after this
        due = arm.started + interval
        faults = 0
        while faults_on and kinds and due <= last:
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
                victim.signal(signal.SIGKILL)
                fault.t = time.monotonic()
                victim.wait()
                pump(time.monotonic() + 0.05)  # the lines it wrote before it died
                retire(victim)
                fault.restarted = time.monotonic()
                start(victim.name)
            else:
                victim.signal(signal.SIGSTOP)
                fault.t = time.monotonic()
                pump(min(fault.t + stop_s, arm.ended))
                victim.signal(signal.SIGCONT)
                fault.restarted = time.monotonic()
            due = fault.t + interval
        pump(arm.ended)
        back = time.monotonic() + (recover_s if faults_on else 0.0)
        while time.monotonic() < back and not _whole(arm, learners, peers):
            pump(time.monotonic() + 0.1)  # the last fault's way back, after the counted seconds
        pump(time.monotonic() + 0.5)  # lines written just before the end
        return arm
    finally:
        _end(list(learners.values()))
        selector.close()
        broker.close()


def run_arms_together(backend: str, **settings) -> tuple[Arm, Arm]:
    """A clean arm and a faults arm at once, side by side on the same machine (two groups,
    each with its broker, run from two threads of this process): whatever the machine's
    speed does while they run (other tenants, clock changes) falls on both alike.
    ``settings`` are ``run_arm``'s, less ``faults_on`` and ``abort``. Returns ``(clean, faulty)``;
    when one arm fails the other is stopped at once and the failure raised."""
    if settings.get("restart", "fork") == "fork":
        _fork_server()  # once, before two threads start learners
    arms: dict[bool, Arm] = {}
    failures: list[BaseException] = []
    abort = threading.Event()

    def one(faults_on: bool) -> None:
        try:
            arms[faults_on] = run_arm(backend, faults_on=faults_on, abort=abort, **settings)
        except Aborted:
            pass  # the other arm's failure is the one to raise
        except BaseException as e:  # re-raised in the caller's thread
            failures.append(e)
            abort.set()

    threads = [threading.Thread(target=one, args=(faults_on,), name=f"arm-{faults_on}") for faults_on in (False, True)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    finally:  # also on Ctrl+C here: the arms end their learners instead of running on
        abort.set()
        for thread in threads:
            thread.join()
    if failures:
        raise failures[0]
    return arms[False], arms[True]


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
    """Close their control streams (each leaves the group and exits); SIGKILL any still
    there 10 s later."""
    for learner in learners:
        if learner.poll() is None:
            learner.signal(signal.SIGCONT)  # a stopped learner cannot read its control stream
            learner.stop()
    deadline = time.monotonic() + 10
    for learner in learners:
        if not learner.wait(max(0.1, deadline - time.monotonic())):
            learner.signal(signal.SIGKILL)
            learner.wait()
        learner.close()
