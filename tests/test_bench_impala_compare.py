"""``python -m bench.impala.compare``: flags checked before anything runs, the figures a
run's log gives, and a tiny comparison end to end, including a run stopped after
``--seconds``. Its figures are checked against its runs' own logs, never against a speed:
a benchmark is never a timed unit test."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
from helpers import wait_until

from bench.impala import compare

TINY = "--env CartPole-v1 --num-actors 1 --num-workers 1 --envs-per-worker 4 --batch-size 4 --unroll-length 5"
FRAMES_PER_UPDATE = 4 * 5
"""a TINY learner update: 4 unrolls of 5 CartPole steps, one frame each"""


def assert_a_sane_log(run: str, frames_per_s: float) -> None:
    """The figure a comparison reports is what its run's ``log.csv`` gives, and that log adds up:
    frames come in whole updates of ``FRAMES_PER_UPDATE``, at least one per optimiser step (an
    update whose step was skipped still counts its frames), and grow, and each row's frames/s is
    the frames it added over the seconds it took, to the rounding of its columns (fps to 0.1,
    seconds to 0.01). A run that logged nonsense, or a comparison that read another file or
    column, fails here; how fast the machine runs does not enter it."""
    with open(os.path.join(run, "log.csv")) as f:
        rows = list(csv.DictReader(f))
    assert rows and compare.steady(rows)["frames_per_s"] == frames_per_s
    before_frames, before_seconds = 0, 0.0
    for row in rows:
        frames, seconds, fps = int(row["frames"]), float(row["seconds"]), float(row["fps"])
        assert frames % FRAMES_PER_UPDATE == 0 and frames >= int(row["learner_steps"]) * FRAMES_PER_UPDATE, row
        assert frames >= before_frames and seconds > before_seconds and fps >= 0, row
        took = seconds - before_seconds
        assert abs(fps * took - (frames - before_frames)) <= 0.05 * took + 0.011 * fps + 1, row
        before_frames, before_seconds = frames, seconds
    assert 0 < before_frames < 100_000_000, "the run learned nothing, or ran to its budget"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--arm", "--pin on"], "give at least 2 --arm to compare, got 1"),
        (["--arm", "", "--arm", "--pin off", "--rounds", "0"], "--rounds must be >= 1, got 0"),
        (["--arm", "", "--arm", "", "--seconds", "-1"], "--seconds must be >= 0"),
        (["--arm", "--out /tmp/x", "--arm", ""], "'--out /tmp/x': --out is set by the comparison for every run"),
        (["--arm", "--pin sometimes", "--arm", ""], "bench.impala refused the flags ' --pin sometimes'"),
        (["--arm", "--env NoSuchEnv-v9", "--arm", ""], "unknown environment id 'NoSuchEnv-v9'"),
        (["--arm", "'unclosed", "--arm", ""], "No closing quotation"),
    ],
)
def test_mistakes_are_refused_before_any_run(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        compare.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_an_arm_may_be_one_flag_alone_or_none():
    args = compare.parse_args(["--arm=--use-lstm", "--arm", "", "--common", "--env CartPole-v1"])
    assert args.arm == ["--use-lstm", ""] and args.common == "--env CartPole-v1"


def test_keep_refuses_a_folder_that_holds_something(tmp_path):
    (tmp_path / "old").mkdir()
    with pytest.raises(SystemExit):
        compare.parse_args(["--arm", "", "--arm", "", "--keep", str(tmp_path)])


def test_steady_takes_medians_after_the_first_third_and_the_last_rows_return():
    rows = [
        {
            "fps": str(f),
            "wait_fraction": "0.5",
            "env_busy": "",
            "inference_ms": "2",
            "policy_lag": "1.5",
            "mean_return": "12.5",
        }
        for f in [10, 20, 30, 40, 50, 60]
    ]
    rows[0]["wait_fraction"] = "0.9"  # start-up: not counted
    rows[-1]["wait_fraction"] = "0.25"  # one outlying row does not move the median
    rows[-1]["mean_return"] = "14"
    rows[2]["inference_ms"] = rows[3]["inference_ms"] = "4"
    got = compare.steady(rows)
    assert got["frames_per_s"] == 45 and got["rows"] == 4  # the median of 30, 40, 50, 60
    assert (got["wait_fraction"], got["env_busy"], got["inference_ms"], got["policy_lag"]) == (0.5, None, 3.0, 1.5)
    assert got["mean_return"] == 14.0
    assert compare.steady(rows[:1])["frames_per_s"] == 10
    with pytest.raises(ValueError, match="no log row"):
        compare.steady([])


_session_members = compare._session_members


@pytest.mark.slow
def test_two_arms_compare_and_a_run_stops_after_its_seconds(tmp_path, capsys, shm_leak_check, monkeypatch):
    pids = []
    run_one = compare.run_one

    def recording(*a, **kw):
        got = run_one(*a, **kw)
        pids.append(got["pid"])
        assert _session_members(got["pid"]) == [], "the run's processes outlived it"
        return got

    monkeypatch.setattr(compare, "run_one", recording)
    keep = tmp_path / "runs"
    argv = ["--common", f"{TINY} --total-frames 100000000", "--arm", "--learner-threads 1", "--arm", "--pin off"]
    assert compare.main([*argv, "--rounds", "1", "--seconds", "6", "--log-interval", "1", "--keep", str(keep)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# bench.impala.compare") and len(pids) == 2
    assert sum(line.startswith("  round 1: arm ") for line in lines) == 2
    report = json.loads(lines[-1][len("report: ") :])
    assert [a["flags"] for a in report["arms"]] == ["--learner-threads 1", "--pin off"]
    assert report["arms"][0]["ratio_to_first"] == 1.0
    assert all(len(a["per_round"]) == len(a["mean_return_per_round"]) == 1 for a in report["arms"])
    for i, a in enumerate(report["arms"]):  # each arm's figure is its run's log, and the log adds up
        assert a["frames_per_s"] == a["per_round"][0]
        assert_a_sane_log(str(keep / f"arm{i}-round1"), a["per_round"][0])
    for a in report["arms"]:  # each run's breakdown, as its line printed it
        (b,) = a["breakdown_per_round"]
        assert set(b) == set(compare.STEADY_COLUMNS) and 0 <= b["wait_fraction"] <= 1
    assert sorted(os.listdir(keep)) == ["arm0-round1", "arm0-round1.log", "arm1-round1", "arm1-round1.log"]
    assert "done: " not in (keep / "arm0-round1.log").read_text()  # stopped long before 100M frames


@pytest.mark.slow
def test_a_run_that_does_not_stop_in_its_grace_is_killed_with_its_whole_session(tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "STOP_GRACE_S", 0.0)  # SIGKILL right after the SIGINT
    before = set(os.listdir("/dev/shm"))
    got = compare.run_one(
        ["--log-interval", "1", *f"{TINY} --total-frames 100000000".split()], str(tmp_path / "run"), 8.0
    )
    assert_a_sane_log(str(tmp_path / "run"), got["frames_per_s"])  # the rows it logged before it was killed
    assert _session_members(got["pid"]) == []  # its nodes saw their parent gone and exited
    assert wait_until(lambda: not (set(os.listdir("/dev/shm")) - before), 60), set(os.listdir("/dev/shm")) - before


def _writer(log_csv, script: str) -> subprocess.Popen:
    """A stand-in for a run: a Python process that writes ``log_csv`` as ``script`` says."""
    return subprocess.Popen(
        [sys.executable, "-c", f"import time\nf = open({str(log_csv)!r}, 'w', buffering=1)\n{script}"]
    )


@pytest.mark.parametrize(
    "script, rows",
    [
        ("time.sleep(1)\nf.write('fps\\n')\ntime.sleep(1)\nf.write('10\\n')\ntime.sleep(600)", 1),
        ("f.write('fps\\n')", 0),  # ended without a row: nothing to wait for
    ],
)
def test_a_runs_seconds_start_at_its_first_log_row(tmp_path, script, rows):
    log_csv = tmp_path / "log.csv"
    proc = _writer(log_csv, script)
    try:
        compare._await_first_row(proc, str(log_csv), timeout=300.0)  # hang guard
        assert log_csv.read_text().count("\n") == 1 + rows
        assert (proc.poll() is None) == (rows == 1)
    finally:
        proc.kill()
        proc.wait()


def test_a_run_that_logs_no_row_in_its_start_up_time_is_timed_out(tmp_path):
    log_csv = tmp_path / "log.csv"
    proc = _writer(log_csv, "f.write('fps\\n')\ntime.sleep(600)")
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            compare._await_first_row(proc, str(log_csv), timeout=1.0)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_a_run_with_no_row_in_its_start_up_time_is_stopped_and_named(tmp_path, monkeypatch):
    start_job = compare.start_job

    def sleeper(cmd, **kw):  # a run that never logs
        return start_job([sys.executable, "-c", "import time; time.sleep(600)"], **kw)

    monkeypatch.setattr(compare, "start_job", sleeper)
    monkeypatch.setattr(compare, "STARTUP_S", 1.0)
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match=r"logged no row within 1 s of its start; see .*run\.log"):
        compare.run_one([], str(out), 5.0)


def test_a_stopped_run_gets_longer_than_its_nodes_notice():
    from bench.impala import train
    from bench.soak.__main__ import STOP_GRACE_S as SOAK_GRACE_S

    assert compare.STOP_GRACE_S > train.STOP_NOTICE_S and SOAK_GRACE_S > train.STOP_NOTICE_S


def test_session_members_are_read_from_proc():
    assert os.getpid() in _session_members(os.getsid(0))
    assert _session_members(2**22 + 12345) == []  # above pid_max's default: no such session
