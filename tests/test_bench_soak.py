"""``python -m bench.soak``'s mechanics on a tiny job of a few seconds: the samples of its
whole process tree, the growth figures, and what of the job outlived it. Not a soak."""

from __future__ import annotations

import csv
import glob
import os
import signal
import subprocess
import sys

import pytest

from bench.soak.__main__ import growth

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A job with a child process, a second thread and a 64 KiB shmpad-named segment in /dev/shm.
# LEAK: the child ignores SIGINT and the segment is not removed, so both outlive the job.
JOB = """
import os, signal, subprocess, sys, threading, time
leak = sys.argv[1] == "leak"
name = f"/dev/shm/shmpad.{os.getpid()}.0.soaktest"
with open(name, "wb") as f:
    f.write(b"x" * 65536)
ignore = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(120)"
child = subprocess.Popen([sys.executable, "-c", ignore if leak else "import time; time.sleep(120)"])
threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
try:
    time.sleep(120)
except KeyboardInterrupt:
    if not leak:
        child.kill()
        os.unlink(name)
"""


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def soak(tmp_path, mode: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Soak the tiny job, with SIGINT ignored in the soak as in a shell's background job (``&``):
    the soak still stops its job with SIGINT."""
    job = tmp_path / "job.py"
    job.write_text(JOB)
    path = tmp_path / "soak.csv"
    argv = ["--hours", "0.002", "--sample-seconds", "0.4", "--warmup-minutes", "0.02", "--csv", str(path)]
    argv += ["--leftover-seconds", "2"]  # the leaked child ignores SIGINT: it would be waited for the whole time
    argv += ["--job", f"{sys.executable} {job} {mode}"]
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
        preexec_fn=_ignore_sigint,
    )
    with open(path) as f:
        return done, list(csv.DictReader(f))


def test_the_job_tree_is_sampled_and_its_growth_printed(tmp_path):
    done, rows = soak(tmp_path, "clean")
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(rows) >= 5
    assert list(rows[0]) == ["t_s", "processes", "rss_kb", "pss_kb", "open_files", "threads", "shm_files", "shm_bytes"]
    # the job, its child, two threads in the job, the segment: once both processes are up (on a loaded
    # machine that may take a few of the 18 samples)
    up = [r for r in rows if int(r["processes"]) == 2 and int(r["shm_files"]) == 1]
    assert up, rows
    settled = up[-1]
    assert int(settled["threads"]) >= 3
    assert int(settled["shm_files"]) == 1 and int(settled["shm_bytes"]) >= 65536
    assert int(settled["rss_kb"]) > 0 and int(settled["open_files"]) > 0
    assert "growth per hour" in done.stdout and "shm_bytes" in done.stdout
    assert "left after the job: 0 processes, 0 shmpad segments" in done.stdout


def test_what_outlives_the_job_is_reported_and_fails_the_soak(tmp_path):
    try:
        done, _ = soak(tmp_path, "leak")
        assert done.returncode == 1, done.stdout + done.stderr
        assert "left after the job: 1 processes, 1 shmpad segments" in done.stdout
    finally:
        for path in glob.glob("/dev/shm/shmpad.*.0.soaktest"):
            os.unlink(path)  # the soak kills what outlived the job, but leaves the segment as evidence


@pytest.mark.parametrize(
    "values, slope",
    [([10.0, 12.0, 14.0, 16.0], 2.0), ([5.0, 5.0, 5.0, 5.0], 0.0), ([3.0], 0.0)],
)
def test_growth_is_the_least_squares_slope(values, slope):
    times = [float(i) for i in range(len(values))]
    per_hour, share = growth(times, values)
    assert per_hour == pytest.approx(slope)
    assert share == pytest.approx(slope / (sum(values) / len(values)))
