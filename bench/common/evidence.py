"""``--save DIR``: a benchmark run keeps its own evidence, so that keeping it costs nothing.

A figure quoted in ``docs/`` names the command that produced it and links its raw output
under ``docs/results/<name>/`` (see ``docs/benchmarks.md``). With ``--save DIR`` every
benchmark writes that output itself, into ``DIR``:

    stdout.txt     everything the run printed on stdout (also printed as usual)
    stderr.txt     everything it printed on stderr (progress, and the targets under --json)
    report.jsonl   the JSON report: each line of stdout that is a JSON object (after a
                   ``report: `` prefix too); only when the run printed one (add ``--json``
                   where the benchmark has it)
    machine.json   the machine and the command: cores, CPU model, load average at the
                   start and the end, Python, numpy and torch versions, the git commit,
                   the date and the exact argv

The copy is made where Python writes (``sys.stdout``, ``sys.stderr``), forked children
included, with the error or traceback the interpreter prints as a failed run exits: what a child process started with ``subprocess`` prints to the terminal itself
is not in it (``bench.impala.compare`` keeps its runs' logs with ``--keep DIR``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import io
import json
import os
import platform
import subprocess
import sys
import traceback
from collections.abc import Iterator, Sequence
from typing import TextIO

__all__ = [
    "FILES",
    "REPORT_PREFIX",
    "SAVE_HELP",
    "add_save_option",
    "cpu_flags",
    "cpu_model",
    "machine",
    "report_lines",
    "save_dir",
    "saving",
]

FILES = ("stdout.txt", "stderr.txt", "report.jsonl", "machine.json")
"""what ``--save DIR`` writes into DIR (report.jsonl only when the run printed a JSON report)"""

SAVE_HELP = "write the run's evidence into this folder: its stdout, stderr, JSON report and machine.json"
"""the help of ``--save`` (an ``Args`` dataclass field repeats it as its docstring)"""

REPORT_PREFIX = "report: "
"""how bench.impala.compare and bench.impala.throughput mark their one-line JSON report"""


def add_save_option(parser: argparse.ArgumentParser) -> None:
    """``--save DIR`` on an argparse parser (benchmarks whose options are an ``Args``
    dataclass declare a ``save: str = ""`` field instead)."""
    parser.add_argument("--save", default="", metavar="DIR", help=SAVE_HELP)


def save_dir(argv: Sequence[str]) -> str:
    """The folder ``--save`` names in ``argv`` ("" when none). Spelled out: an abbreviation that
    the benchmark's own parser would find ambiguous (``--s``) must not make a folder here."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_save_option(parser)
    known, _ = parser.parse_known_args(list(argv))
    return known.save


@contextlib.contextmanager
def saving(argv: Sequence[str], name: str) -> Iterator[None]:
    """While open, keep the run's evidence in the folder ``--save`` names in ``argv`` (the
    benchmark's arguments); nothing happens without ``--save``. ``name`` (``bench.ringbuf``)
    starts the messages. The files are completed also when the run fails or is interrupted:
    a failed run's output is evidence too."""
    directory = save_dir(argv)
    if not directory:
        yield
        return
    os.makedirs(directory, exist_ok=True)
    taken = [f for f in FILES if os.path.exists(os.path.join(directory, f))]
    if taken:
        raise SystemExit(f"{name}: --save {directory}: the folder already holds {', '.join(taken)}; name a new folder")
    owner, about = os.getpid(), machine()
    _write_json(os.path.join(directory, "machine.json"), about)
    out_path, err_path = os.path.join(directory, "stdout.txt"), os.path.join(directory, "stderr.txt")
    try:
        # Line-buffered, so that a forked child's lines are in the file before it exits (os._exit flushes nothing).
        with open(out_path, "w", buffering=1) as out, open(err_path, "w", buffering=1) as err:
            stdout, stderr = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = _Tee(stdout, out), _Tee(stderr, err)
            try:
                yield
            except SystemExit as e:
                if e.code is not None and not isinstance(e.code, int):
                    err.write(f"{e.code}\n")  # what the interpreter prints as it exits, after the copy ends
                raise
            except KeyboardInterrupt:
                err.write("interrupted (Ctrl+C)\n")
                raise
            except BaseException:
                err.write(traceback.format_exc())  # the interpreter prints it too, after the copy ends
                raise
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                sys.stdout, sys.stderr = stdout, stderr
    finally:  # the run ends with SystemExit, and a failed or interrupted run's output is evidence too
        if os.getpid() == owner:  # not in a forked child that unwinds instead of calling os._exit
            _finish(directory, name, about)


def _finish(directory: str, name: str, about: dict) -> None:
    """The end of ``saving``: the load average at the end, and the JSON report out of stdout."""
    about["loadavg_end"] = list(os.getloadavg())
    _write_json(os.path.join(directory, "machine.json"), about)
    with open(os.path.join(directory, "stdout.txt")) as f:
        lines = report_lines(f)
    if lines:
        with open(os.path.join(directory, "report.jsonl"), "w") as f:
            f.writelines(line + "\n" for line in lines)
        print(f"{name}: saved the output, the JSON report and machine.json in {directory}", file=sys.stderr)
    else:
        print(
            f"{name}: saved the output and machine.json in {directory}; no JSON report was printed"
            " (add --json where the benchmark has it)",
            file=sys.stderr,
        )


def report_lines(lines: Sequence[str] | TextIO) -> list[str]:
    """The lines of a run's stdout that are a JSON object (a ``report: `` prefix dropped), as printed."""
    found = []
    for line in lines:
        text = line.strip()
        if text.startswith(REPORT_PREFIX):
            text = text[len(REPORT_PREFIX) :]
        if not text.startswith("{"):
            continue
        try:
            json.loads(text)
        except ValueError:
            continue
        found.append(text)
    return found


def machine() -> dict:
    """What a figure depends on besides the code: the machine, its load, the versions, the command."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "argv": list(sys.orig_argv),
        "cwd": os.getcwd(),
        "git_commit": _git_commit(),
        "hostname": platform.node(),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "loadavg_start": list(os.getloadavg()),
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "torch": _version("torch"),
        "platform": platform.platform(),
    }


class _Tee(io.TextIOBase):
    """A text stream that writes to ``stream`` and to ``copy``; the rest is ``stream``'s."""

    def __init__(self, stream: TextIO, copy: TextIO) -> None:
        self._stream, self._copy = stream, copy

    def write(self, text: str) -> int:
        self._stream.write(text)
        self._copy.write(text)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()
        self._copy.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    @property
    def encoding(self) -> str:
        return self._stream.encoding


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:  # not Linux
        return ""


def cpu_model(cpuinfo: str | None = None) -> str | None:
    """The CPU's model name from ``/proc/cpuinfo`` (or the text given); None where it has none."""
    lines = (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)


def cpu_flags(cpuinfo: str | None = None) -> list[str]:
    """The first CPU's feature flags from ``/proc/cpuinfo`` (or the text given); empty where it has none."""
    lines = (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines()
    return next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])


def _git_commit() -> str | None:
    """The commit of the checkout run from, ``+changes`` appended when its tracked files differ from it."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit.strip() + ("+changes" if dirty.stdout.strip() else "")


def _version(package: str) -> str | None:
    """A package's installed version, read from its metadata (importing torch would take seconds)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _write_json(path: str, value: dict) -> None:
    with open(path, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")
