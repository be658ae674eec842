"""Shared test utilities: /dev/shm listings, polling with a deadline, child processes,
self-checking messages.

Leak checks count only segments this test session made: a segment's default name is
``shmpad.<pid of its creator>.<n>.<hex>``, and the session records the pid of every
process its tests start (``track_pid``), so segments of another test run or benchmark
on the same machine are never blamed on this one. Tests that pick a name themselves
take it from ``unique_segment_name``, which follows the same pattern.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import selectors
import signal
import struct
import subprocess
import sys
import time
import traceback
from functools import partial
from typing import Callable, Iterable

from shmpad.launch.process import die_with_parent
from shmpad.shm.pids import pid_alive as pid_alive  # a zombie counts as dead: it holds no files any more
from shmpad.shm.pids import proc_stat

SHM_DIR = "/dev/shm"
SHM_PREFIX = "shmpad."

_session_pids: set[int] = {os.getpid()}


def shm_entries(prefix: str = SHM_PREFIX) -> set[str]:
    """Names (without the leading slash) of the /dev/shm entries that start with ``prefix``."""
    return {name for name in os.listdir(SHM_DIR) if name.startswith(prefix)}


def shm_exists(name: str) -> bool:
    """True while the segment ``name`` (with or without its leading slash) has a /dev/shm entry."""
    return os.path.exists(os.path.join(SHM_DIR, name.lstrip("/")))


def track_pid(pid: int) -> None:
    """Count segments named after ``pid`` as this session's in leak checks."""
    _session_pids.add(pid)


def creator_pid_of(name: str) -> int | None:
    """The pid in a default segment name ``shmpad.<pid>.<n>.<hex>``, or None for other names."""
    parts = name.lstrip("/").split(".")
    if len(parts) >= 2 and parts[0] + "." == SHM_PREFIX and parts[1].isdigit():
        return int(parts[1])
    return None


def ours(names: Iterable[str]) -> set[str]:
    """The names among ``names`` that this session made (explicit names in tests come from
    ``unique_segment_name``, which puts this process's pid where a default name has it)."""
    return {name for name in names if creator_pid_of(name) in _session_pids}


def unique_segment_name(tag: str) -> str:
    """An explicit segment name the leak checks attribute to this process."""
    return f"/{SHM_PREFIX}{os.getpid()}.{tag}.{os.urandom(4).hex()}"


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.005) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(interval)


def thread_wakeups(pid: int) -> dict[int, int]:
    """Each live thread of ``pid``: how many times it went to sleep and was woken (its
    ``voluntary_ctxt_switches``). A thread asleep in the kernel adds nothing however long it
    sleeps and however busy the machine is; one woken by a timeout adds one per timeout."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                line = next(ln for ln in f if ln.startswith("voluntary_ctxt_switches:"))
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
        out[int(tid)] = int(line.split()[1])
    return out


def all_threads_asleep(pid: int) -> bool:
    """True when every thread of ``pid`` is blocked in the kernel (state S or D): a thread
    that spins, even one the scheduler keeps waiting for a core, is R."""
    stats = [proc_stat(pid, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]
    states = [stat.state for stat in stats if stat is not None]  # None: the thread ended meanwhile
    return bool(states) and all(s in ("S", "D") for s in states)


def _wakeups_over(pids: list[int], window_s: float) -> tuple[float, dict[int, dict[int, int]]]:
    """(seconds measured, each pid's threads' wake-ups) over a window of about ``window_s``."""
    start = time.monotonic()  # before the first count and after the last: the window covers every wake-up counted
    before = {pid: thread_wakeups(pid) for pid in pids}
    wait_until(lambda: False, window_s, interval=0.05)
    after = {pid: thread_wakeups(pid) for pid in pids}
    window = time.monotonic() - start
    return window, {pid: {t: after[pid][t] - n for t, n in before[pid].items() if t in after[pid]} for pid in pids}


def assert_idle(pids: list[int], slice_s: float, window_s: float = 1.0, settle_s: float = 60.0) -> None:
    """Assert that ``pids`` settle into idling the way a futex/poll waiter does, not by
    burning a core: every thread of each is seen asleep in the kernel (a spinning thread
    never is), and over a window each thread is woken at most twice per ``slice_s`` (the
    shortest timeout it sleeps with), plus two. Start-up is not idling (a server polls
    briefly before it parks), so windows are tried until one passes, for ``settle_s`` at
    most, a hang guard. Load only delays wake-ups: neither check depends on how busy the
    machine is."""
    deadline = time.monotonic() + settle_s
    asleep = wait_until(lambda: all(all_threads_asleep(pid) for pid in pids), settle_s)
    assert asleep, f"a thread of {[pid for pid in pids if not all_threads_asleep(pid)]} never slept: it spins"
    while True:
        window, woken = _wakeups_over(pids, window_s)
        most = 2 * int(window / slice_s + 1) + 2
        if all(n <= most for per_thread in woken.values() for n in per_thread.values()):
            return
        assert time.monotonic() < deadline, (
            f"threads were still woken {woken} times in {window:.2f} s after {settle_s} s; "
            f"a {slice_s} s slice allows {most}"
        )


def current_syscall(pid: int) -> int | None:
    """The number of the system call ``pid`` is blocked in, or None if it is running."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            first = f.read().split()[0]
    except (FileNotFoundError, PermissionError, IndexError):
        return None
    return int(first) if first.lstrip("-").isdigit() else None


def start_session(args: list[str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(args, **kwargs)`` leading a session of its own (so that a test can
    end its whole group) and SIGKILLed when this test process dies, even by SIGKILL: a
    broker or peer never outlives a killed pytest. Between fork and exec the child calls
    ``die_with_parent`` (PR_SET_PDEATHSIG, then the re-check that closes the race with a
    parent that died first). PDEATHSIG follows the thread that forked, so call this from
    the thread that outlives the child (the tests' main thread). A ``preexec_fn`` is unsafe
    where the child takes a lock another thread held at the fork; that one takes none."""
    return subprocess.Popen(args, start_new_session=True, preexec_fn=partial(die_with_parent, os.getpid()), **kwargs)


def spawn_python(code: str) -> subprocess.Popen:
    """Start ``python -c code`` with an unbuffered stdout pipe; its pid counts in the leak checks.

    It leads a new process group, so that ``kill_and_reap`` also ends the processes it forks
    (the janitor it may start leads a session of its own and ends by itself).
    """
    proc = start_session([sys.executable, "-c", code], stdout=subprocess.PIPE, bufsize=0)
    track_pid(proc.pid)
    return proc


def run_command(
    argv: list[str], timeout: float, what: str, cwd: str | None = None, env: dict | None = None, split: bool = False
) -> tuple[int, str, str]:
    """Run ``argv`` to its end in a session of its own (its pid counts in the leak checks):
    ``(exit status, stdout, stderr)``, stderr merged into stdout unless ``split``. Past
    ``timeout`` its whole group is killed and the test fails naming ``what``."""
    proc = start_session(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if split else subprocess.STDOUT,
    )
    track_pid(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{what} did not finish in {timeout} s:\n{out.decode()[-3000:]}") from None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever it left in its group
    return proc.returncode, out.decode(), (err or b"").decode()


def read_line(proc: subprocess.Popen, timeout: float = 30.0) -> str:
    """The next line ``proc`` prints, without its newline; fails instead of blocking forever.

    Reads a byte at a time so that nothing beyond the line is taken from the pipe.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    line = bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                raise AssertionError(f"process {proc.pid} printed no whole line within {timeout} s: {bytes(line)!r}")
            byte = os.read(fd, 1)
            if not byte:
                raise AssertionError(f"process {proc.pid} closed its stdout (exit code {proc.poll()}): {bytes(line)!r}")
            if byte == b"\n":
                return line.decode()
            line += byte


def kill_and_reap(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every process left in its group (see ``spawn_python``), and reap ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(timeout=30)
    if proc.stdout is not None:
        proc.stdout.close()


def kill_pid(pid: int) -> None:
    """SIGKILL a process that is not our child (ignore it if it is gone already)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# --- forked children that report back ---------------------------------------------------

FORK = multiprocessing.get_context("fork")

_log_fd: int | None = None  # in a ``Forked`` child: the pipe ``child_log`` writes to


def _forked_main(conn, log_fd: int, fn: Callable, args: tuple) -> None:
    global _log_fd
    _log_fd = log_fd
    try:
        result = (True, fn(*args))
    except BaseException:  # noqa: BLE001 - every failure goes back to the test
        result = (False, traceback.format_exc())
    conn.send(result)


def child_log(line: str) -> None:
    """In a ``Forked`` child: report progress. If the child then stalls (stuck in compiled
    code, say, which no signal or thread in it can interrupt), the test fails showing the
    lines logged since the last one that starts with ``LOG_MARK``."""
    if _log_fd is not None:
        os.write(_log_fd, line.replace("\n", " ").encode()[:2000] + b"\n")


LOG_MARK = "==="


def remove_segments_of(pid: int) -> list[str]:
    """Unlink the default-named segments process ``pid`` created (a child killed before it
    could close them); returns their names."""
    names = sorted(n for n in shm_entries() if creator_pid_of(n) == pid)
    for name in names:
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            pass
    return names


class Forked:
    """``fn(*args)`` running in a forked child; ``result`` returns what it returned (it
    must pickle) or fails with the child's traceback. ``kill`` SIGKILLs and reaps it and
    removes the segments it made; call it in a ``finally`` (idempotent)."""

    def __init__(self, fn: Callable, *args, name: str | None = None):
        self.name = name or fn.__name__
        self._conn, child_conn = FORK.Pipe(duplex=False)
        self._log_r, log_w = os.pipe()
        self.process = FORK.Process(
            target=_forked_main, args=(child_conn, log_w, fn, args), name=self.name, daemon=True
        )
        self.process.start()
        track_pid(self.process.pid)
        child_conn.close()
        os.close(log_w)
        self._log: list[str] = []
        self._partial = b""

    @property
    def pid(self) -> int:
        return self.process.pid

    def ready(self) -> bool:
        """True once the child has reported (or exited): ``result`` will not wait."""
        return self._conn.poll(0)

    def result(self, timeout: float, stall: float | None = None):
        """What the child returned, waiting at most ``timeout`` s, or ``stall`` s after the
        child's last ``child_log`` line (or its start)."""
        start = last = time.monotonic()
        with selectors.DefaultSelector() as sel:
            sel.register(self._conn.fileno(), selectors.EVENT_READ, "result")
            sel.register(self._log_r, selectors.EVENT_READ, "log")
            while not self._conn.poll(0):
                for key, _ in sel.select(0.1):
                    if key.data == "log":
                        data = os.read(self._log_r, 1 << 16)
                        if data:
                            last = time.monotonic()
                            self._add_log(data)
                        else:
                            sel.unregister(self._log_r)
                now = time.monotonic()
                if now - start > timeout:
                    raise AssertionError(
                        f"{self.name} (pid {self.pid}) gave no result within {timeout} s: hung?{self._log_tail()}"
                    )
                if stall is not None and now - last > stall:
                    raise AssertionError(
                        f"{self.name} (pid {self.pid}) made no progress for {stall} s: hung?{self._log_tail()}"
                    )
        try:
            ok, value = self._conn.recv()
        except EOFError:
            self.process.join(10)
            raise AssertionError(
                f"{self.name} (pid {self.pid}) exited with code {self.process.exitcode} without a result"
            ) from None
        if not ok:
            raise AssertionError(f"{self.name} (pid {self.pid}) failed:\n{value}")
        return value

    def _add_log(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        self._log += [line.decode(errors="replace") for line in lines]
        marks = [i for i, line in enumerate(self._log) if line.startswith(LOG_MARK)]
        if marks and marks[-1] > 0:
            del self._log[: marks[-1]]
        del self._log[:-500]

    def _log_tail(self) -> str:
        if not self._log:
            return ""
        return "\nits last steps:\n" + "\n".join(f"  {line}" for line in self._log)

    def kill(self) -> None:
        if self.process.exitcode is None:
            self.process.kill()
        self.process.join(30)
        self._conn.close()
        if self._log_r >= 0:
            os.close(self._log_r)
            self._log_r = -1
        remove_segments_of(self.pid)


def run_forked(fn: Callable, *args, timeout: float = 60.0, stall: float | None = None):
    """``fn(*args)`` in a forked child, failing instead of hanging when it does not return
    within ``timeout`` s or stops logging progress for ``stall`` s (a loop in compiled code
    cannot be interrupted in-process)."""
    child = Forked(fn, *args)
    try:
        return child.result(timeout, stall)
    finally:
        child.kill()


# --- self-checking messages -------------------------------------------------------------

MESSAGE_HEADER = struct.Struct("<IIH")  # producer, sequence number, total length
_PATTERN = bytes(range(256)) * 260


def make_message(producer: int, seq: int, n: int) -> bytes:
    """A message of ``n`` >= ``MESSAGE_HEADER.size`` bytes that names its producer, its
    sequence number and its length, with a payload derived from all three."""
    k = n - MESSAGE_HEADER.size
    start = (producer * 131 + seq * 31 + n) % 251
    return MESSAGE_HEADER.pack(producer, seq, n) + _PATTERN[start : start + k]


def parse_message(m) -> tuple[int, int]:
    """(producer, seq) of a ``make_message`` message; AssertionError if it is torn."""
    m = bytes(m)
    if len(m) < MESSAGE_HEADER.size:
        raise AssertionError(f"torn message: {len(m)} bytes, shorter than a header: {m!r}")
    producer, seq, n = MESSAGE_HEADER.unpack_from(m)
    if len(m) != n or m != make_message(producer, seq, n):
        raise AssertionError(
            f"torn message: header says producer {producer} seq {seq} length {n}, got {len(m)} bytes: {m[:40]!r}..."
        )
    return producer, seq


class Tmux:
    """A tmux server of its own (a private socket) with one session running ``command``
    in a ``width`` x ``height`` terminal, for tests of what a real terminal shows.
    ``close()`` (or leaving the ``with`` block) kills the server and all it runs."""

    def __init__(self, name: str, command: str, cwd: str, width: int = 150, height: int = 40):
        self.session = name
        self._tmux = ["tmux", "-L", f"shmpad-{name}-{os.getpid()}", "-f", "/dev/null"]
        try:
            self.run("new-session", "-d", "-s", name, "-x", str(width), "-y", str(height), "-c", cwd, command)
        except BaseException:
            self.close()
            raise

    def run(self, *args: str) -> str:
        """A tmux command (its ``-t`` is the caller's); its output. Raises if it fails."""
        return subprocess.run([*self._tmux, *args], check=True, capture_output=True, text=True).stdout

    def pane(self) -> str:
        """What the terminal shows now."""
        return subprocess.run(
            [*self._tmux, "capture-pane", "-p", "-t", self.session], capture_output=True, text=True
        ).stdout

    def above_and_in_view(self) -> tuple[list[str], list[str]] | None:
        """The pane's lines above the live view of ``shmpad.top`` and from its header on;
        None while no view is drawn."""
        lines = self.pane().splitlines()
        view = next((i for i, ln in enumerate(lines) if ln.startswith("shmpad top")), None)
        return None if view is None else (lines[:view], lines[view:])

    def send_keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", self.session, *keys)

    def cursor_shown(self) -> bool:
        return self.run("display", "-p", "-t", self.session, "#{cursor_flag}").strip() == "1"

    def close(self) -> None:
        subprocess.run([*self._tmux, "kill-server"], capture_output=True)

    def __enter__(self) -> "Tmux":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
