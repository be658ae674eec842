"""The figures of ``bench.elastic`` from one arm's events (``bench.elastic.group.Arm``).

- steps/s: versions the group reached per second, counted from the whole group's first
  step (plus ``warmup`` seconds) to the arm's end, or over the seconds two arms run side
  by side both ran; samples/s: the samples those steps averaged (each version's group
  size x the batch).
- per fault, from the signal: ``detected``, when every survivor had stopped waiting for
  the victim (its reduction was abandoned, or it stepped in a smaller group);
  ``survived``, when every survivor had stepped in a group without the victim (None
  when a killed victim's new process was back before that group formed);
  ``rejoined``, from the restart (a new process, or SIGCONT) to the victim's first step
  in the whole group in a ring other than the one it was faulted in, state transfer
  included; ``stale``: reductions of the victim's
  after it woke, before it stepped in the group again, that were abandoned, refused, or
  completed only in the ring it had been dropped from (partial, below): none of them
  averaged into the group's weights.
- per kill of a job learner (``--restart job``), the new process's way back, each from the
  restart: ``started_s`` (its ``up``: the interpreter up with the job imported),
  ``built_s`` (the job's settings, environment spec, model and ``Learner`` built),
  ``compiled_s`` (its warm-up's first loss and gradients done, before it joins: where the
  job compiles, the compiling), ``joined_s`` (the rest of that update, undone, then it asked
  the broker to join), ``synced_s``
  (its first ring formed, the group's state loaded), then ``rejoined_s``. From ``synced_s``
  on the group waits for it: the survivors' next reduction is in the ring with it. ``cpu_s``: the CPU seconds the new
  process had used at each of those (on a loaded machine the seconds are mostly waiting for
  a core; the CPU seconds are the work).
- identical: for every version more than one learner reached, the digests of their
  weights after that step agree. A step is left out of that comparison, and counted as
  ``partial``, when another member of the ring it was taken in (``g``) abandoned the
  same reduction: a change of the group (a member dropped, or one leaving) closes the
  ring while the reduction's last messages are on their way, so some members complete
  it and others do not. The accumulator's next state sync brings every member of the
  new ring level (``shmpad/net/accumulator.py``), but a partial step of a member that
  is not in it (it left, or it was dropped while it slept) is not the group's: that
  member is given the group's state when it rejoins. ``partial_differing`` counts the
  partial steps whose weights differ from another learner's at that version.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bench.elastic.group import Arm, Fault


@dataclass
class FaultFigures:
    kind: str
    victim: str
    at_s: float  # since the group's first step
    detected_s: float | None
    survived_s: float | None
    rejoined_s: float | None
    started_s: float | None  # kill faults: of rejoined_s, until the new process was up (Python, torch imported)
    stale: int | None  # stop faults only
    built_s: float | None = None  # kill faults of job learners (--restart job): of rejoined_s, until each stage
    joined_s: float | None = None
    synced_s: float | None = None
    compiled_s: float | None = None
    cpu_s: dict[str, float] | None = None  # job learners: the new process's CPU seconds at each stage (STAGE_WORDS)


@dataclass
class ArmFigures:
    backend: str
    restart: str  # how its learners start and restart: fork, exec or job
    faults_on: bool
    peers: int
    seconds: float  # the window the rates are over
    steps_per_s: float
    samples_per_s: float
    versions_compared: int
    versions_differing: int
    partial: int
    partial_differing: int
    faults: list[FaultFigures]

    def as_dict(self) -> dict:
        return asdict(self)


def figures(arm: Arm, warmup: float, window: tuple[float, float] | None = None) -> ArmFigures:
    """``window``: the rates' ``(start, end)`` (``time.monotonic()``), if not from ``warmup``
    seconds after the group's first step to the arm's end (two arms run side by side are
    counted over the same seconds)."""
    start, end = window or (arm.started + warmup, arm.ended)
    first_seen: dict[int, float] = {}
    size: dict[int, int] = {}
    digests: dict[int, set[int]] = {}
    reporters: dict[int, int] = {}
    abandoned = _abandoned(arm)
    partial: list[dict] = []
    for events in arm.events.values():
        for e in events:
            if e["e"] != "step":
                continue
            v = e["v"]
            first_seen[v] = min(first_seen.get(v, e["t"]), e["t"])
            if _partial(e, abandoned):
                partial.append(e)
                continue
            size[v] = max(size.get(v, 0), e["n"])
            digests.setdefault(v, set()).add(e["d"])
            reporters[v] = reporters.get(v, 0) + 1
    window = [v for v, t in first_seen.items() if start <= t <= end]
    seconds = max(end - start, 1e-9)
    compared = [v for v, n in reporters.items() if n > 1]
    return ArmFigures(
        backend=arm.backend,
        restart=arm.restart,
        faults_on=arm.faults_on,
        peers=arm.peers,
        seconds=round(seconds, 3),
        steps_per_s=round(len(window) / seconds, 3),
        samples_per_s=round(sum(size.get(v, 0) for v in window) * arm.batch / seconds, 1),
        versions_compared=len(compared),
        versions_differing=sum(1 for v in compared if len(digests[v]) > 1),
        partial=len(partial),
        partial_differing=sum(1 for e in partial if e["d"] not in digests.get(e["v"], {e["d"]})),
        faults=[
            _fault(arm, f, abandoned, after.t if after is not None else None)
            for f, after in zip(arm.faults, [*arm.faults[1:], None])
        ],
    )


def _abandoned(arm: Arm) -> set[tuple[str | None, int]]:
    """``(ring, version)`` of every reduction some learner abandoned (at that version)."""
    return {(e.get("g"), e["v"]) for events in arm.events.values() for e in events if e["e"] == "abandoned"}


def _partial(step: dict, abandoned: set[tuple[str | None, int]]) -> bool:
    """Whether another member of the step's ring abandoned the reduction that made it."""
    return (step.get("g"), step["v"] - 1) in abandoned


def _fault(arm: Arm, fault: Fault, abandoned: set[tuple[str | None, int]], until: float | None) -> FaultFigures:
    """The figures of ``fault``, from the events before ``until`` (the next fault, if any:
    what came after it is that fault's)."""
    survivors = [n for n in arm.events if n != fault.victim]
    restart = fault.restarted if fault.restarted is not None else fault.t

    def first(name: str, after: float, before: float | None, test) -> float | None:
        return next(
            (e["t"] for e in arm.events[name] if after < e["t"] and (before is None or e["t"] < before) and test(e)),
            None,
        )

    stopped = [
        first(n, fault.t, until, lambda e: e["e"] == "abandoned" or (e["e"] == "step" and e["n"] < arm.peers))
        for n in survivors
    ]
    stepped = [first(n, fault.t, until, lambda e: e["e"] == "step" and e["n"] < arm.peers) for n in survivors]
    # the ring the victim was in when it was faulted: a step there after it woke (one it finished before
    # the stop, or a partial one) is not its return to the group
    old_ring = next((e.get("g") for e in reversed(arm.events[fault.victim]) if e["t"] < fault.t and "g" in e), None)
    back = first(
        fault.victim,
        restart,
        until,
        lambda e: e["e"] == "step" and e["n"] == arm.peers and e.get("g") != old_ring and not _partial(e, abandoned),
    )
    stages: dict[str, float | None] = {}
    cpu: dict[str, float] = {}
    if fault.kind == "kill":
        limit = back if back is not None else until
        after = [e for e in arm.events[fault.victim] if restart < e["t"] and (limit is None or e["t"] <= limit)]
        for stage in ("up", *JOB_STAGES, "step"):
            event = next((e for e in after if e["e"] == stage and (stage != "step" or e["t"] == back)), None)
            if stage != "step":
                stages[stage] = None if event is None else round(event["t"] - restart, 3)
            if event is not None and "cpu" in event:  # job learners' events
                cpu[{"up": "started_s", "step": "rejoined_s"}.get(stage, f"{stage}_s")] = event["cpu"]
    stale = None
    if fault.kind == "stop":
        last = back if back is not None else until
        woke = [e for e in arm.events[fault.victim] if restart < e["t"] and (last is None or e["t"] <= last)]
        refused_before = max(
            (e["r"] for e in arm.events[fault.victim] if e["e"] == "step" and e["t"] < fault.t), default=0
        )
        rejoin = [e for e in woke if e["e"] == "step" and e.get("g") != old_ring and not _partial(e, abandoned)]
        refused_after = rejoin[0]["r"] if rejoin else refused_before
        held = sum(1 for e in woke if e["e"] == "abandoned" or (e["e"] == "step" and _partial(e, abandoned)))
        stale = held + refused_after - refused_before
    return FaultFigures(
        kind=fault.kind,
        victim=fault.victim,
        at_s=round(fault.t - arm.started, 3),
        detected_s=_since(fault.t, stopped),
        survived_s=_since(fault.t, stepped),
        rejoined_s=None if back is None else round(back - restart, 3),
        started_s=stages.get("up"),
        stale=stale,
        **{f"{stage}_s": stages.get(stage) for stage in JOB_STAGES},
        cpu_s=cpu or None,
    )


def _since(t0: float, times: list[float | None]) -> float | None:
    """When the last of ``times`` came, after ``t0`` (None if one never came)."""
    if not times or any(t is None for t in times):
        return None
    return round(max(times) - t0, 3)


def table(clean: ArmFigures | None, faulty: ArmFigures | None) -> list[str]:
    """The lines of one backend's report."""
    lines = []
    for fig in (clean, faulty):
        if fig is None:
            continue
        kept = ""
        if fig is faulty and clean is not None and clean.steps_per_s > 0:
            kept = f"{fig.steps_per_s / clean.steps_per_s:7.1%}"
        same = "yes" if fig.versions_differing == 0 else f"NO ({fig.versions_differing} differ)"
        if fig.partial:
            same += f", {fig.partial} partial ({fig.partial_differing} differ)"
        lines.append(
            f"{fig.backend:7} {fig.restart:7} {'faults' if fig.faults_on else 'clean':7} {fig.steps_per_s:8.2f} "
            f"{fig.samples_per_s:10.1f}"
            f" {kept:>7} {len(fig.faults):6}  {same} ({fig.versions_compared} versions compared)"
        )
    if faulty is not None:
        for f in faulty.faults:
            extra = "" if f.started_s is None else f" (the new process up after {_s(f.started_s)})"
            if faulty.restart == "job" and f.kind == "kill":
                extra = f" ({_stages(f)})"
            if f.stale is not None:
                extra = f", stale reductions not averaged in: {f.stale}"
            survived = _s(f.survived_s)
            if f.survived_s is None and f.rejoined_s is not None:
                survived = "not before it was back"  # its replacement joined before the smaller group formed
            lines.append(
                f"    at {f.at_s:6.1f} s {f.kind:4} {f.victim}: detected {_s(f.detected_s)}, survivors stepped "
                f"{survived}, rejoined {_s(f.rejoined_s)}{extra}"
            )
    return lines


HEADER = "backend restart arm      steps/s  samples/s    kept faults  weights identical after every step"

JOB_STAGES = ("built", "compiled", "joined", "synced")
"""the events a job learner (``bench.elastic.job_learner``) reports on its way into the group, after ``up``"""

STAGE_WORDS = {
    "started_s": "interpreter and imports",
    "built_s": "settings, env spec, model and Learner",
    "compiled_s": "the warm-up's first loss and gradients (compiling)",
    "joined_s": "the rest of the undone warm-up update, and the join",
    "synced_s": "ring and the group's state",
    "rejoined_s": "first step in the group",
}
"""what each stage of a job learner's way back is, from the end of the one before"""


def stage_seconds(f: FaultFigures) -> dict[str, float | None]:
    """Each stage of a killed job learner's way back (``STAGE_WORDS``), in seconds from the previous one."""
    out: dict[str, float | None] = {}
    before: float | None = 0.0
    for name in STAGE_WORDS:
        at = getattr(f, name)
        out[name] = None if at is None or before is None else round(at - before, 3)
        before = at
    return out


def stage_cpu(f: FaultFigures) -> dict[str, float | None]:
    """The CPU seconds the new process spent in each stage of its way back (``stage_seconds``'s stages)."""
    out: dict[str, float | None] = {}
    before: float | None = 0.0
    for name in STAGE_WORDS:
        at = (f.cpu_s or {}).get(name)
        out[name] = None if at is None or before is None else round(at - before, 3)
        before = at
    return out


def _stages(f: FaultFigures) -> str:
    cpu = stage_cpu(f)
    return ", ".join(
        f"{STAGE_WORDS[k]} {_s(v)}" + ("" if cpu[k] is None else f" ({cpu[k]:.2f} s CPU)")
        for k, v in stage_seconds(f).items()
    )


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"
