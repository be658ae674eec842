"""The benchmarks' shared command-line contract: a missed target (FAIL) or a failed
measurement makes the exit status 1, every benchmark has --help text, and --quick is
described the same way in each."""

from __future__ import annotations

import importlib
import io
import os
import signal
import subprocess
import sys

import pytest

from bench.common.cli import _field_docs
from bench.common.jobs import start_job
from bench.common.report import exit_status

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_missed_target_or_a_failed_measurement_is_exit_status_1():
    out = io.StringIO()
    assert exit_status(["  PASS  a: 2.00x (target >= 1x)", "  n/a   b: - (target >= 1x)"], [], out) == 0
    assert exit_status(["  PASS  a: 2.00x", "  FAIL  b: 0.50x (target >= 1x)"], [], out) == 1
    assert "1 target(s) missed" in out.getvalue()
    assert exit_status(["  PASS  a: 2.00x"], ["gloo, 2 peers: timed out"], io.StringIO()) == 1


@pytest.mark.parametrize("bench", ["allreduce", "envpool", "ringbuf", "rpc"])
def test_every_benchmark_explains_its_options_and_quick_means_one_short_round(bench):
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{bench}", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # argparse wraps the lines
    assert "--quick one short round of every measurement, to see that it runs" in text
    args = importlib.import_module(f"bench.{bench}.benchmark").Args
    for name, doc in _field_docs(args).items():
        assert " ".join(doc.split())[:40] in text, f"--{name.replace('_', '-')} has no help text"


def test_a_job_gets_sigint_at_its_default_even_from_a_benchmark_that_ignores_it(tmp_path):
    # a benchmark started in a shell's background (&, nohup) ignores SIGINT, and a child inherits that;
    # start_job's job must see Ctrl+C's SIGINT, which a benchmark sends to stop it
    probe = (
        "import os, signal, sys; sys.stdout.write(f'{signal.getsignal(signal.SIGINT)!r} {os.getsid(0) == os.getpid()}')"
    )
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with open(tmp_path / "out", "w") as out:
            job = start_job([sys.executable, "-c", probe], stdout=out, cpus=sorted(os.sched_getaffinity(0))[:1])
            assert job.wait(60) == 0
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (tmp_path / "out").read_text() == f"{signal.default_int_handler!r} True"  # and it leads a session
