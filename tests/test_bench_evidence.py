"""``--save DIR`` (bench/common/evidence.py): a run's stdout and stderr copied as printed,
its JSON report picked out of stdout, machine.json, also when the run fails; and one
benchmark's ``--save`` end to end. Nothing here is timed."""

from __future__ import annotations

import json
import os
import sys

import pytest
from helpers import run_command

from bench.common import evidence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MACHINE_KEYS = {"date", "argv", "git_commit", "nproc", "cpu_model", "loadavg_start", "loadavg_end", "python"}
MACHINE_KEYS |= {"numpy", "torch"}


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def test_save_dir_reads_only_the_spelled_out_option():
    assert evidence.save_dir(["--json", "--save", "out/a", "--rounds", "3"]) == "out/a"
    assert evidence.save_dir(["--save=out/b"]) == "out/b"
    assert evidence.save_dir(["--s", "1", "--json"]) == ""  # --seconds? --sizes? the benchmark's parser says
    assert evidence.save_dir(["--common", "--save x"]) == ""  # another option's value


def test_without_save_nothing_changes(tmp_path):
    stdout, stderr = sys.stdout, sys.stderr
    with evidence.saving(["--json", "--rounds", "3"], "bench.test"):
        assert sys.stdout is stdout and sys.stderr is stderr
    assert not os.listdir(tmp_path)


def test_save_keeps_output_report_and_machine_also_when_the_run_fails(tmp_path, capsys):
    folder = tmp_path / "run"
    argv = ["--rounds", "1", "--save", str(folder), "--json"]
    with pytest.raises(SystemExit) as exited, evidence.saving(argv, "bench.test"):
        print("a table line")
        print('{"subject": "a", "rate": 1.5}')
        print("{not json")
        print('report: {"arms": [1, 2]}')
        print("progress", file=sys.stderr)
        pid = os.fork()
        if pid == 0:  # a forked child's line reaches the copy although os._exit flushes nothing
            print("Error in 'child'", file=sys.stderr)
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        raise SystemExit(1)  # a benchmark's missed target
    assert exited.value.code == 1

    printed = capsys.readouterr()
    assert read(folder / "stdout.txt") == printed.out  # what was printed, nothing more or less
    assert "a table line" in printed.out
    assert read(folder / "stderr.txt") == "progress\nError in 'child'\n"
    assert f"saved the output, the JSON report and machine.json in {folder}" in printed.err
    assert read(folder / "report.jsonl").splitlines() == ['{"subject": "a", "rate": 1.5}', '{"arms": [1, 2]}']
    machine = json.loads(read(folder / "machine.json"))
    assert machine.keys() >= MACHINE_KEYS
    assert machine["argv"] == list(sys.orig_argv)
    assert machine["nproc"] >= 1


def test_a_forked_child_that_unwinds_leaves_the_files_to_the_parent(tmp_path):
    saving = evidence.saving(["--save", str(tmp_path)], "bench.test")
    saving.__enter__()
    try:
        print('{"row": 1}')
        pid = os.fork()
        if pid == 0:
            try:  # as a child that exits by SystemExit instead of os._exit unwinds through saving()
                saving.__exit__(SystemExit, SystemExit(0), None)
            finally:
                os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        assert not os.path.exists(tmp_path / "report.jsonl")
        assert "loadavg_end" not in json.loads(read(tmp_path / "machine.json"))
    finally:
        saving.__exit__(None, None, None)
    assert read(tmp_path / "report.jsonl") == '{"row": 1}\n'


@pytest.mark.parametrize(
    "error, kept",
    [
        (SystemExit("--rounds must be >= 1, got 0"), "--rounds must be >= 1, got 0\n"),
        (KeyError("k"), "KeyError: 'k'\n"),
    ],
)
def test_save_keeps_what_the_interpreter_prints_at_exit(tmp_path, error, kept):
    with pytest.raises(type(error)), evidence.saving(["--save", str(tmp_path)], "bench.test"):
        raise error
    assert read(tmp_path / "stderr.txt").endswith(kept)


def test_save_without_a_json_report_says_so(tmp_path, capsys):
    with evidence.saving(["--save", str(tmp_path)], "bench.test"):
        print("only a table")
    assert sorted(os.listdir(tmp_path)) == ["machine.json", "stderr.txt", "stdout.txt"]
    assert "no JSON report was printed (add --json" in capsys.readouterr().err


def test_save_refuses_a_folder_holding_earlier_evidence(tmp_path):
    (tmp_path / "stdout.txt").write_text("an earlier run\n")
    with pytest.raises(SystemExit, match="already holds stdout.txt; name a new folder"):
        with evidence.saving(["--save", str(tmp_path)], "bench.test"):
            pass
    assert read(tmp_path / "stdout.txt") == "an earlier run\n"


def test_ringbuf_save(tmp_path):
    # The quickest benchmark at its quickest: one ring, --quick (2 sizes x 2 producer counts).
    folder = tmp_path / "ringbuf"
    argv = [sys.executable, "-m", "bench.ringbuf", "--quick", "--subjects", "shmpad-spsc", "--json"]
    status, out, _ = run_command(
        [*argv, "--save", str(folder)], timeout=600, what="bench.ringbuf", cwd=REPO, split=True
    )
    assert status in (0, 1), out  # 1: a target missed on this machine, which is not what this test is about
    printed = [line for line in out.splitlines() if line.startswith("{")]
    assert read(folder / "report.jsonl").splitlines() == printed
    rows = [json.loads(line) for line in printed]
    assert {(r["transport"], r["size_bytes"], r["producers"]) for r in rows} == {
        ("shmpad-spsc", size, producers) for size in (64, 65536) for producers in (1, 4)
    }
    assert read(folder / "stdout.txt") == out
    assert "Targets:" in read(folder / "stderr.txt")  # under --json the targets go to stderr
    machine = json.loads(read(folder / "machine.json"))
    assert machine["argv"] == [*argv, "--save", str(folder)]
    assert machine.keys() >= MACHINE_KEYS


def test_cpu_model_and_flags_read_the_first_cpu_of_cpuinfo_and_nothing_else():
    text = (
        "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx2 avx512_bf16\n"
        "processor\t: 1\nmodel name\t: another\nflags\t\t: fpu\nbugs\t\t: avx512_bf16_is_not_a_flag_here\n"
    )
    assert evidence.cpu_model(text) == "AMD EPYC 9R14"
    assert evidence.cpu_flags(text) == ["fpu", "avx2", "avx512_bf16"]
    assert evidence.cpu_model("") is None and evidence.cpu_flags("") == []
    assert evidence.cpu_model("flags\t: fpu\n") is None  # a CPU without a model name (some ARM kernels)
