"""``python -m bench.elastic``'s mechanics, not its speed: the figures it derives from
the learners' events, one tiny run of two learners through a stop and a kill, and the job's
learner (``--restart job``) killed and started again as a new interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from bench.elastic import __main__ as cli
from bench.elastic import group
from bench.elastic.group import Arm, Fault, run_arm
from bench.elastic.report import figures, stage_cpu, stage_seconds, table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step(t: float, v: int, n: int, g: str, d: int = 7, r: int = 0) -> dict:
    return {"e": "step", "t": t, "v": v, "n": n, "d": d, "r": r, "g": g}


def abandoned(t: float, v: int, g: str) -> dict:
    return {"e": "abandoned", "t": t, "v": v, "g": g}


def test_the_figures_of_a_stop_and_a_kill():
    arm = Arm("shmpad", True, 3, batch=10, started=100.0, ended=120.0)
    arm.events = {
        "a": [step(100.0, 1, 3, "k1"), step(101.0, 2, 3, "k1"), abandoned(102.3, 2, "k1"), step(102.6, 3, 2, "k2")]
        + [step(104.0, 4, 3, "k3"), abandoned(110.1, 4, "k3"), step(110.5, 5, 2, "k4"), step(115.0, 6, 3, "k5")],
        "b": [step(100.0, 1, 3, "k1"), step(101.0, 2, 3, "k1"), step(102.4, 3, 2, "k2"), step(104.0, 4, 3, "k3")]
        + [step(110.2, 5, 2, "k4"), step(115.0, 6, 3, "k5", d=8)],
        # c, woken at 103.0, completes the reduction of ring k1 that a abandoned (a partial step, not the
        # group's and not its rejoin), then abandons its next one there and is synced into k3
        "c": [step(100.0, 1, 3, "k1"), step(101.0, 2, 3, "k1"), step(103.05, 3, 3, "k1", d=9)]
        + [abandoned(103.1, 3, "k1"), step(104.0, 4, 3, "k3", r=1), {"e": "up", "t": 112.0}]
        + [step(115.0, 6, 3, "k5", d=8, r=0)],
    }
    arm.faults = [Fault("stop", "c", 102.0, restarted=103.0), Fault("kill", "c", 110.0, restarted=110.0)]
    fig = figures(arm, warmup=1.0)
    assert fig.steps_per_s == pytest.approx(5 / 19, abs=1e-3)  # versions 2..6 first seen in [101, 120]
    assert fig.samples_per_s == pytest.approx((3 + 2 + 3 + 2 + 3) * 10 / 19, abs=0.1)
    assert (fig.versions_compared, fig.versions_differing) == (6, 1)  # version 6: a says 7, b and c 8
    assert (fig.partial, fig.partial_differing) == (1, 1)  # c's version 3 (9, where a and b say 7)
    stop, kill = fig.faults
    assert (stop.kind, stop.at_s, stop.detected_s, stop.survived_s, stop.rejoined_s) == ("stop", 2.0, 0.4, 0.6, 1.0)
    assert stop.stale == 3  # after it woke: one partial step, one reduction abandoned, one refused
    assert (kill.detected_s, kill.survived_s, kill.rejoined_s, kill.started_s, kill.stale) == (0.2, 0.5, 5.0, 2.0, None)
    lines = table(figures(Arm("shmpad", False, 3, 10, 100.0, 120.0, {"a": [step(101.0, 2, 3, "k1")]}), 1.0), fig)
    assert (
        "NO (1 differ), 1 partial (1 differ)" in lines[1]
        and "rejoined 5.00 s (the new process up after 2.00 s)" in lines[3]
    )


def test_a_step_a_stopped_learner_finishes_in_its_old_ring_is_not_its_return():
    # b was stopped after its reduction of version 2 completed, before it said so; it says so when it
    # wakes (103.01), in the ring it was dropped from, and returns to the group in ring k3 at 104.0
    arm = Arm("shmpad", True, 2, batch=10, started=100.0, ended=110.0)
    arm.events = {
        "a": [step(100.0, 1, 2, "k1"), step(101.0, 2, 2, "k1"), step(102.2, 3, 1, "k2"), step(104.0, 4, 2, "k3")],
        "b": [step(100.0, 1, 2, "k1"), step(103.01, 2, 2, "k1"), step(104.0, 4, 2, "k3", r=0)],
    }
    arm.faults = [Fault("stop", "b", 101.5, restarted=103.0)]
    (stop,) = figures(arm, warmup=0.0).faults
    assert (stop.detected_s, stop.survived_s, stop.rejoined_s, stop.stale) == (0.7, 0.7, 1.0, 0)


def test_a_fault_is_read_from_the_events_before_the_next_one():
    # b is killed at 102 and its new process is back (in ring k2) before a steps without it; at 110 b is
    # stopped and a steps alone: that step is the stop's, not the kill's
    arm = Arm("shmpad", True, 2, batch=10, started=100.0, ended=120.0)
    arm.events = {
        "a": [step(101.0, 1, 2, "k1"), abandoned(102.05, 1, "k1"), step(102.4, 2, 2, "k2"), step(110.8, 3, 1, "k3")]
        + [step(112.0, 4, 2, "k4")],
        "b": [step(101.0, 1, 2, "k1"), {"e": "up", "t": 102.1}, step(102.4, 2, 2, "k2"), step(112.0, 4, 2, "k4")],
    }
    arm.faults = [Fault("kill", "b", 102.0, restarted=102.0), Fault("stop", "b", 110.0, restarted=111.0)]
    kill, stop = figures(arm, warmup=0.0).faults
    assert (kill.detected_s, kill.survived_s, kill.rejoined_s, kill.started_s) == (0.05, None, 0.4, 0.1)
    assert (stop.detected_s, stop.survived_s, stop.rejoined_s, stop.stale) == (0.8, 0.8, 1.0, 0)


@pytest.mark.slow
def test_a_tiny_run_goes_through_a_stop_and_a_kill():
    argv = ["--peers", "2", "--seconds", "9", "--interval", "3", "--faults", "stop,kill", "--stop-seconds", "1.5"]
    argv += ["--width", "16", "--backends", "shmpad", "--warmup", "1", "--rounds", "1", "--arms", "apart", "--json"]
    done = _bench_elastic(argv)
    clean, faulty, summary = (json.loads(line) for line in done.stdout.splitlines())
    assert [a["round"] for a in (clean, faulty)] == [1, 1]
    assert (clean["faults_on"], clean["faults"], faulty["faults_on"]) == (False, [], True)
    kept = [faulty["steps_per_s"] / clean["steps_per_s"]]
    assert summary == {
        "backend": "shmpad",
        "restart": "fork",
        "kept_median": pytest.approx(kept[0]),
        "kept": pytest.approx(kept),
    }
    # every version two learners reached holds the same weights on both, apart from partial steps: one
    # learner's completion of a reduction another member of its ring abandoned (a change of the group came
    # while its last messages were on their way); they are counted, and the next sync replaces them
    for arm in (clean, faulty):
        assert arm["steps_per_s"] > 0 and arm["versions_compared"] > 0
        assert arm["versions_differing"] == 0, arm
        assert 0 <= arm["partial_differing"] <= arm["partial"]
    stop = faulty["faults"][0]
    assert stop["kind"] == "stop" and stop["rejoined_s"] is not None and stop["stale"] >= 0
    # a survivor steps without a killed learner unless its new process (forked in a few ms) is back first
    for f in faulty["faults"]:
        assert f["detected_s"] is not None and (f["survived_s"] is not None or f["kind"] == "kill"), f
        assert f["survived_s"] is not None or f["rejoined_s"] is not None, f


def test_a_learner_started_as_a_new_interpreter_trains():
    arm = run_arm(
        "shmpad", peers=1, seconds=1.0, interval=1.0, kinds=("kill",), faults_on=False, width=8, batch=4, stop_s=1.0,
        seed=0, restart="exec",
    )  # fmt: skip
    steps = [e for e in arm.events["learner0"] if e["e"] == "step"]
    assert arm.events["learner0"][0]["e"] == "up" and steps and steps[-1]["n"] == 1
    assert [e["v"] for e in steps] == list(range(1, len(steps) + 1))


def test_an_arm_stops_as_soon_as_it_is_aborted():
    abort = threading.Event()
    timer = threading.Timer(1.0, abort.set)  # once the group has formed, or while it forms
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(group.Aborted, match="the clean arm was stopped: the other arm failed"):
            group.run_arm(
                "shmpad", peers=1, seconds=600.0, interval=600.0, kinds=("kill",), faults_on=False, width=8, batch=4,
                stop_s=1.0, seed=0, abort=abort,
            )  # fmt: skip
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < group.START_S["fork"] + 60  # hang guard: unaborted, the arm trains for 600 s


def test_when_one_side_by_side_arm_fails_the_other_is_stopped_and_the_failure_raised(monkeypatch):
    seen = {}

    def fake_arm(backend, *, faults_on, abort, **settings):
        if faults_on:
            raise group.RunFailed("learner learner0 exited with 1")
        seen["aborted"] = abort.wait(timeout=60)  # hang guard; set at once by the failing arm
        raise group.Aborted("stopped")

    monkeypatch.setattr(group, "run_arm", fake_arm)
    monkeypatch.setattr(group, "_fork_server", lambda: None)
    with pytest.raises(group.RunFailed, match="learner learner0 exited with 1"):
        group.run_arms_together("shmpad", peers=2, seconds=1.0)
    assert seen == {"aborted": True}


@pytest.mark.slow
def test_side_by_side_arms_are_counted_over_the_same_seconds(tmp_path):
    argv = ["--peers", "2", "--seconds", "6", "--interval", "3", "--faults", "kill", "--width", "16"]
    argv += ["--backends", "shmpad", "--warmup", "1", "--rounds", "1", "--json", "--save", str(tmp_path)]
    done = _bench_elastic(argv)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == [json.loads(line) for line in done.stdout.splitlines()]
    clean, faulty, summary = (json.loads(line) for line in done.stdout.splitlines())
    assert (clean["faults_on"], faulty["faults_on"], len(clean["faults"]), len(faulty["faults"])) == (False, True, 0, 1)
    assert clean["seconds"] == faulty["seconds"] <= 5.0  # the window both arms ran, less the warm-up
    assert summary["kept"] == [pytest.approx(faulty["steps_per_s"] / clean["steps_per_s"])]
    for arm in (clean, faulty):
        assert arm["steps_per_s"] > 0 and arm["versions_compared"] > 0 and arm["versions_differing"] == 0, arm
    kill = faulty["faults"][0]
    assert kill["kind"] == "kill" and kill["detected_s"] is not None and kill["rejoined_s"] is not None, kill


def _bench_elastic(argv: list[str]) -> subprocess.CompletedProcess:
    """``python -m bench.elastic ARGV``, which must succeed."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-m", "bench.elastic", *argv], capture_output=True, text=True, timeout=400, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done


TINY_JOB = ("--env", "CartPole-v1", "--batch-size", "4", "--unroll-length", "5")
"""the job's learner on something tiny: CartPole's MLP, IMPALA's update (the plan compiles only
convolutional models)"""


@pytest.mark.slow
def test_a_killed_job_learner_comes_back_as_a_new_interpreter_with_the_groups_state():
    # a kill 1 s after the group's first step; the arm goes on after its 2 s until the killed learner is back
    # (recover_s: a hang guard)
    arm = run_arm(
        "shmpad", peers=2, seconds=2.0, interval=1.0, kinds=("kill",), faults_on=True, width=8, batch=4, stop_s=1.0,
        seed=0, restart="job", job=TINY_JOB, threads=1, recover_s=300.0,
    )  # fmt: skip
    (kill,) = arm.faults
    events = arm.events[kill.victim]
    ups = [e for e in events if e["e"] == "up"]
    assert len(ups) == 2 and len({ups[0]["pid"], ups[1]["pid"], os.getpid()}) == 3, ups
    for up in ups:  # each interpreter was started on the job learner's module, not forked from another process
        assert up["argv"][:4] == [sys.executable, "-m", "bench.elastic.job_learner", kill.victim], up
    after = [e for e in events if e["t"] > kill.restarted]
    assert [e["e"] for e in after if e["e"] != "step"][:5] == ["up", "built", "compiled", "joined", "synced"]
    first = next(e for e in after if e["e"] == "step")
    # its first step is the group's: in a group of 2, its own gradients averaged in (none refused), from the
    # version the survivor had reached without it, to the same weights as the survivor's at that version
    assert first["n"] == 2 and first["r"] == 0 and first["v"] > 1, first
    survivor = next(name for name in arm.events if name != kill.victim)
    same = [e for e in arm.events[survivor] if e["e"] == "step" and e["v"] == first["v"]]
    assert [(e["n"], e["d"]) for e in same] == [(2, first["d"])]
    fig = figures(arm, warmup=0.0)
    (f,) = fig.faults
    assert fig.restart == "job" and fig.steps_per_s > 0 and fig.versions_differing == 0, fig
    assert 0 < f.started_s < f.built_s < f.compiled_s < f.joined_s < f.synced_s <= f.rejoined_s, f
    stages, cpu = stage_seconds(f), stage_cpu(f)
    assert all(v is not None and v >= 0 for v in stages.values()), stages
    assert sum(stages.values()) == pytest.approx(f.rejoined_s)
    assert cpu.keys() == stages.keys() and all(v is not None and v >= 0 for v in cpu.values()), cpu
    assert cpu["started_s"] > 0  # the interpreter and the job's imports took CPU in this process
    assert "interpreter and imports" in table(None, fig)[1]


def test_the_report_of_job_restarts_names_the_kind_and_both_arms(monkeypatch, capsys):
    def fake_arms(backend, *, restart, batch, peers, **settings):
        assert (restart, batch, peers) == ("job", 4, 2)  # the job's --batch-size
        arms = []
        for faults_on, last in ((False, 10), (True, 8)):
            arm = Arm(backend, faults_on, peers, batch, started=100.0, ended=110.0, restart=restart)
            arm.events = {n: [step(100.0 + v, v, 2, "k1") for v in range(1, last + 1)] for n in ("a", "b")}
            arms.append(arm)
        return tuple(arms)

    monkeypatch.setattr(cli, "run_arms_together", fake_arms)
    job = "--env CartPole-v1 --batch-size 4 --unroll-length 5"
    assert cli.main(["--restart", "job", f"--job={job}", "--peers", "2", "--backends", "gloo", "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("bench.elastic: restarts job: a new interpreter running the job's learner")
    assert "CartPole-v1 job's learner (mlp model" in lines[0] and "IMPALA update, T=5 B=4" in lines[0]
    assert lines[2].startswith("gloo    job     clean") and lines[3].startswith("gloo    job     faults")
    # 6 versions first seen in [105, 110] (the warm-up's 5 s left out) in the clean arm, 4 in the faults arm's
    assert lines[-1].startswith("gloo, restarts job (a new interpreter running the job's learner")
    assert "kept 66.7% of the clean steps/s, the median of 1 round (66.7%)" in lines[-1]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--restart", "jobs"], "--restart takes a comma-separated list of fork, exec, job, got 'jobs'"),
        (["--restart", "fork,fork"], "--restart takes a comma-separated list of fork, exec, job, got 'fork,fork'"),
        (["--job=--model deep"], "--job gives the job's flags to --restart job, got --restart 'fork'"),
        (
            ["--restart", "job", "--job=--peers 10.0.0.1:4431"],
            "the benchmark sets --peers itself, got --job '--peers 10.0.0.1:4431'",
        ),
        (["--restart", "job", "--job=--model nope"], "argument --model: invalid choice: 'nope'"),
    ],
)
def test_a_bad_restart_option_is_refused_naming_its_value(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
