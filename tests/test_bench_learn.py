"""bench.learn's mechanics (not learning speed): its options are checked before any run,
a run's episodes give the frames and seconds at which each windowed mean return was first
reached, the summary's medians and worst count a seed that missed as never, a real run
is stopped once its targets are reached, leaving its summary and no process behind, and
one killed with SIGTERM stops its runs as Ctrl+C does, each keeping its checkpoint, and
still writes its summary."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

import helpers
import pytest

from bench.impala.compare import _session_members
from bench.learn.__main__ import STOP_GRACE_S, Progress, main, parse_args, summarize


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--targets", "20,18"], "--targets must be in increasing order, got [20.0, 18.0]"),
        (["--targets", "x"], "--targets must be numbers separated by commas, got 'x'"),
        (["--seeds", "0"], "--seeds must be >= 1, got 0"),
        (["--", "--seed", "3"], "--seed: bench.learn sets it for every run"),
        (["--", "--total-frames", "5"], "--total-frames: bench.learn sets it for every run"),
        (["--parallel", "100000"], "--parallel 100000: this process may run on"),
        (["--", "--algo", "ppo"], "bench.impala refused the flags '--algo ppo'"),
    ],
)
def test_mistakes_are_refused_before_any_run(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_progress_records_the_first_episode_whose_window_reaches_each_target(tmp_path):
    path = tmp_path / "episodes.csv"
    progress = Progress([1.0, 2.0], window=2)
    path.write_text("frames,return\n100,0\n200,1\n300,1.5\n")  # windowed means: -, 0.5, 1.25
    progress.read(str(path), seconds=7.0)
    assert progress.reached == {1.0: (300, 7.0)} and not progress.done
    with open(path, "a") as f:
        f.write("400,2.5\n500,")  # a line still being written is left for the next read
    progress.read(str(path), seconds=9.0)
    assert progress.reached == {1.0: (300, 7.0), 2.0: (400, 9.0)} and progress.done
    assert progress.curve == [(200, 0.5), (300, 1.25), (400, 2.0)]
    with open(path, "a") as f:
        f.write("9\n")
    progress.read(str(path), seconds=10.0)
    assert progress.frames == 500 and progress.curve[-1] == (500, 5.75)  # the line "500,9", whole at last


def test_progress_reads_the_run_log_s_own_files_episode_by_episode(tmp_path):
    """episodes.csv as the job writes it (csv rows end in \\r\\n), read while it grows: every episode
    once. A reader that counted the text it got instead of the file's bytes fell behind by a byte
    a line and took the tails of old lines for new episodes (frames 720 out of "28672,-21.0")."""
    from bench.impala.progress import RunLog

    progress = Progress([100.0], window=3)
    episodes = [(-21.0 + (i % 5), 760 + i) for i in range(48)]
    with RunLog(str(tmp_path), resume=False) as log:
        for i in range(0, 48, 16):  # a progress row with its episodes, then a read or two
            log.episodes(28672 * (i + 1), episodes[i : i + 16])
            log.row({"frames": 28672 * (i + 1)})
            progress.read(str(tmp_path / "episodes.csv"), seconds=float(i))
            progress.read(str(tmp_path / "episodes.csv"), seconds=float(i))
    assert len(progress.curve) == 48 - 2  # one point per episode once the window of 3 is full
    assert [f for f, _ in progress.curve] == sorted(f for f, _ in progress.curve) and progress.frames == 28672 * 33
    assert list(progress.returns) == [r for r, _ in episodes[-3:]]


def test_summary_counts_a_seed_that_missed_as_never():
    runs = [
        {"reached": {"18": {"frames": 4_000_000, "seconds": 80.0}}},
        {"reached": {"18": {"frames": 6_000_000, "seconds": 120.0}}},
        {"reached": {}},
    ]
    row = summarize([18.0], runs)["18"]
    assert row["reached"] == 2 and row["frames_per_seed"] == [4_000_000, 6_000_000, None]
    assert row["median_frames"] == 6_000_000 and row["worst_frames"] is None
    assert summarize([18.0], runs[2:])["18"]["median_seconds"] is None


@pytest.mark.slow
def test_a_run_stops_once_its_targets_are_reached(tmp_path, capsys, shm_leak_check):
    out = tmp_path / "learn"
    # CartPole's random policy scores about 20: a window of 5 reaches 10 within its first episodes
    argv = ["--env", "CartPole-v1", "--targets", "5,10", "--window", "5", "--frames", "100_000_000", "--seeds", "1"]
    assert main([*argv, "--out", str(out), "--", "--log-interval", "1"]) == 0
    report = json.loads((out / "summary.json").read_text())
    (run,) = report["runs"]
    assert set(run["reached"]) == {"5", "10"} and run["frames"] < 100_000_000  # stopped, not run to the budget
    assert report["summary"]["10"]["reached"] == 1 and report["summary"]["10"]["median_frames"] > 0
    assert run["plan"] and run["plan"][0].startswith("IMPALA on CartPole-v1")
    assert 0 < run["startup_seconds"] < run["seconds"]  # the job's own line: command to first learner update
    assert f"start-up: {run['startup_seconds']:.1f} s" in (out / "seed-0.log").read_text()
    assert sorted(os.listdir(out)) == ["curves.png", "seed-0", "seed-0.log", "summary.json", "summary.md"]
    assert "| 10 | 1/1 |" in (out / "summary.md").read_text()
    assert f"Command: `python -m bench.learn {' '.join(argv)} --out {out} -- --log-interval 1`" in (
        (out / "summary.md").read_text()
    )  # the command main was given, not this process's
    assert capsys.readouterr().out.splitlines()[-1].startswith("summary: ")
    assert _session_members(run["pid"]) == [], "the run's processes outlived it"


@pytest.mark.slow
def test_resume_continues_each_run_and_keeps_what_it_had_reached(tmp_path, capsys, shm_leak_check):
    out = tmp_path / "learn"
    argv = ["--env", "CartPole-v1", "--targets", "5,1000", "--window", "5", "--seeds", "1", "--out", str(out)]
    job = ["--", "--log-interval", "1"]
    assert main([*argv, "--frames", "20_000", *job]) == 0  # to its budget: 1000 is never reached
    first = json.loads((out / "summary.json").read_text())["runs"][0]
    assert first["frames"] >= 20_000 and set(first["reached"]) == {"5"}
    with pytest.raises(SystemExit):
        parse_args([*argv, "--frames", "40_000", *job])  # the folder is taken
    assert "(--resume continues its runs)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args([*argv, "--seeds", "2", "--frames", "40_000", "--resume", *job])
    assert f"--resume: {out / 'seed-1'} holds no checkpoint to continue" in capsys.readouterr().err
    assert main([*argv, "--frames", "40_000", "--resume", *job]) == 0
    (run,) = json.loads((out / "summary.json").read_text())["runs"]
    assert run["frames"] >= 40_000
    assert run["reached"]["5"] == first["reached"]["5"]  # reached in the first stretch: as it measured it
    assert run["seconds"] > first["seconds"]  # the second stretch's seconds go on from the first's
    log = (out / "seed-0.log").read_text()
    assert "resuming" in log and log.count("IMPALA on CartPole-v1") == 2  # both stretches' output, appended
    assert _session_members(run["pid"]) == []


def test_overlay_reads_runs_and_names_the_first_frames_at_each_target(tmp_path, capsys):
    from bench.learn import overlay

    run = tmp_path / "run"
    run.mkdir()
    (run / "log.csv").write_text("frames,mean_return\n100,\n200,-3\n300,1.5\n400,2.5\n")
    assert overlay.read_curve(str(run)) == [(200, -3.0), (300, 1.5), (400, 2.5)]
    assert overlay.first_reached(overlay.read_curve(str(run)), 2.0) == 400
    assert overlay.first_reached(overlay.read_curve(str(run)), 9.0) is None
    out = tmp_path / "o.png"
    assert (
        overlay.main(
            [str(run), "--label", "a", "--targets", "1,9", "--out", str(out), "--csv", str(tmp_path / "o.csv")]
        )
        == 0
    )
    assert out.stat().st_size > 0 and (tmp_path / "o.csv").read_text().count("\n") == 4
    assert "a: last 400 frames, 2.5; first reached 1: 300, 9: not reached" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        overlay.main([str(tmp_path), "--out", str(out)])
    assert "no log.csv" in capsys.readouterr().err


def test_overlay_tabulates_each_run_at_the_marks_and_the_median_over_runs(tmp_path, capsys):
    from bench.learn import overlay

    rows = {
        "a": [(1000, -20), (2100, -5), (3050, 4)],
        "b": [(900, -21), (1900, -10), (2200, 0)],
        "c": [(1000, -19), (1500, -18)],
    }
    for name, points in rows.items():
        (tmp_path / name).mkdir()
        text = "frames,mean_return\n" + "".join(f"{f},{m}\n" for f, m in points)
        (tmp_path / name / "log.csv").write_text(text)
    assert overlay.at_mark(rows["a"], 2000) == -20  # the last point at or before the mark
    assert overlay.at_mark(rows["b"], 3000) is None  # stopped short of the mark: no figure
    assert [overlay.parse_frames(t) for t in ("2M", "500k", "5e6", "1_000")] == [2_000_000, 500_000, 5_000_000, 1000]
    runs = [str(tmp_path / n) for n in rows]
    argv = [
        *runs,
        "--label",
        "a",
        "--label",
        "b",
        "--label",
        "c",
        "--targets=-10,0,5",
        "--out",
        str(tmp_path / "o.png"),
    ]
    assert overlay.main([*argv, "--marks", "1K,2K,3K", "--median"]) == 0
    out = capsys.readouterr().out
    assert "median of 3 runs: first reached -10: 2,100, 0: 3,050, 5: not reached" in out
    assert "| a | -20.0 | -20.0 | -5.0 |" in out
    assert "| b | -21.0 | -10.0 | - |" in out
    assert "| c | -19.0 | - | - |" in out
    assert "| median | -20.0 | - | - |" in out
    for bad in ("2X", "0", "1.5"):
        with pytest.raises(SystemExit):
            overlay.main([*argv, "--marks", bad])
        assert (
            f"--marks must be frame counts (2M, 500K, 5e6) separated by commas, got {bad!r}" in capsys.readouterr().err
        )


RL_GAMES_LOG = """fps step: 11849 fps total: 5652 epoch: 1/500
fps step: 11318 fps total: 6340 epoch: 100/500
saving next best rewards:  [14.216911]
=> saving checkpoint 'runs/x.pth'
fps step: 10767 fps total: 6099 epoch: 130/500
saving next best rewards:  [18.07]
fps step: 10548 fps total: 5964 epoch: 131/500
"""


def test_a_reference_log_becomes_a_curve_that_overlay_draws_dashed(tmp_path, capsys):
    from bench.learn import overlay, reference

    assert reference.best_means(RL_GAMES_LOG, 8192, 4) == [(100 * 8192 * 4, 14.216911), (130 * 8192 * 4, 18.07)]
    cells = [{"cell_type": "markdown"}, {"cell_type": "code", "outputs": [{"text": RL_GAMES_LOG.splitlines(True)}]}]
    notebook = tmp_path / "demo.ipynb"
    notebook.write_text(json.dumps({"cells": cells}))
    csv_path = tmp_path / "ref.csv"
    argv = [str(notebook), "--steps-per-epoch", "8192", "--frame-skip", "4"]
    assert reference.main([*argv, "--out", str(csv_path)]) == 0
    assert csv_path.read_text() == "frames,mean_return\n3276800,14.2169\n4259840,18.07\n"
    assert overlay.read_curve(str(csv_path)) == [(3276800, 14.2169), (4259840, 18.07)]
    assert overlay.main([str(csv_path), "--label", "ref", "--targets", "18", "--out", str(tmp_path / "o.png")]) == 0
    assert "ref: last 4,259,840 frames, 18.07; first reached 18: 4,259,840" in capsys.readouterr().out
    with pytest.raises(ValueError, match="a best-rewards line before any epoch line"):
        reference.best_means("saving next best rewards:  [1.0]\n", 8192, 4)
    (tmp_path / "empty.txt").write_text("nothing here\n")
    with pytest.raises(SystemExit):
        reference.main([str(tmp_path / "empty.txt"), "--steps-per-epoch", "8192", "--frame-skip", "4"])
    assert "no 'saving next best rewards' line" in capsys.readouterr().err


@pytest.mark.timeout(900)  # start-up and stop under load, each with a guard of its own
def test_sigterm_stops_the_runs_as_ctrl_c_does(tmp_path, shm_leak_check):
    """A run leads a session of its own: killed outright, bench.learn would leave it running."""
    out = tmp_path / "learn"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = ["--env", "CartPole-v1", "--targets", "1000", "--frames", "100_000_000", "--seeds", "1", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "bench.learn", *argv, "--", "--log-interval", "1"], cwd=root)
    run = None
    try:
        log = out / "seed-0" / "log.csv"
        logged = helpers.wait_until(lambda: log.exists() and log.read_text().count("\n") >= 2, 300)  # hang guard
        assert logged and proc.poll() is None, "the run never logged a row"
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            (run,) = [int(pid) for pid in f.read().split()]
        proc.send_signal(signal.SIGTERM)
        # a hang guard beyond the grace bench.learn gives its runs to stop, and its report
        assert proc.wait(timeout=STOP_GRACE_S + 150) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        left = _session_members(run) if run is not None else []
        for pid in left:  # ended here whatever happened, then reported
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert left == [], "the run outlived bench.learn"
    assert (out / "seed-0" / "checkpoint.pt").exists()  # stopped as Ctrl+C stops it, not killed
    (stopped,) = json.loads((out / "summary.json").read_text())["runs"]  # what it had, written all the same
    assert stopped["interrupted"] and stopped["seed"] == 0 and stopped["frames"] > 0
    assert (out / "summary.md").exists() and (out / "curves.png").exists()
