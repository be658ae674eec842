"""Removes this program's shared-memory segments once every process of it is gone.

The first process that creates a segment starts one janitor: a tiny Python process
(no site-packages, no shmpad import) whose standard input is a pipe. Every process of
the program holds the pipe's write end (forked children inherit it), and sends
``+<name in hex>`` when it creates a segment and ``-<name in hex>`` when it unlinks one
(hex, so that no byte of a name can break a line or stand for another name), and
``g<pgid>`` / ``h<pgid>`` when a launcher starts a node process (the leader of its own
process group) and when it has reaped it. When the last
holder exits, however it exits (normally, on an exception, or SIGKILLed), the janitor
reads end-of-file, unlinks every name still registered and SIGKILLs every process
group still registered: the nodes of a SIGKILLed launcher die with it (parent-death
signal), and this ends what they had started (their groups outlive them).

Processes forked before the janitor started do not hold the pipe: a launcher calls
``start()`` before it forks. The janitor runs in its own session so that Ctrl+C in a terminal does not kill it
before the processes it watches.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

__all__ = ["start", "register", "unregister", "register_group", "unregister_group"]

# Runs under ``python -I -S``: standard library only, starts in a few milliseconds.
_JANITOR_SOURCE = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
names = set()
groups = set()
for line in sys.stdin.buffer:
    line = line.strip()
    if line[:1] in (b"g", b"h") and line[1:].isdigit():
        (groups.add if line[:1] == b"g" else groups.discard)(int(line[1:]))
        continue
    try:
        name = bytes.fromhex(line[1:].decode("ascii"))
    except ValueError:
        continue
    if line[:1] == b"+":
        names.add(name)
    elif line[:1] == b"-":
        names.discard(name)
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
for name in names:
    base = name.lstrip(b"/")
    if not base or b"/" in base or b"\0" in base:
        continue
    try:
        os.unlink(b"/dev/shm/" + base)
    except OSError:
        pass
"""

_lock = threading.Lock()
_fd: int | None = None  # write end of the janitor's pipe; forked children inherit it


def _write_fd() -> int | None:
    """The janitor pipe of this process's program, starting a janitor if there is none."""
    global _fd
    with _lock:
        if _fd is not None:
            return _fd  # in a forked child: the parent's janitor, through the inherited fd
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _JANITOR_SOURCE],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError:
            return None
        _fd = os.dup(proc.stdin.fileno())
        proc.stdin.close()
        os.set_inheritable(_fd, False)  # exec'd programs must not keep the janitor waiting
        # Popen would otherwise warn that the janitor "is still running" at exit.
        proc.returncode = 0
        return _fd


def start() -> None:
    """Start this program's janitor now, if it has none yet.

    Call it in the root process before forking workers: the janitor then waits for
    every one of them, including those forked before any segment existed."""
    _write_fd()


def _send(line: str) -> None:
    fd = _write_fd()
    if fd is None:
        return
    try:
        os.write(fd, line.encode("ascii") + b"\n")  # names are short: under PIPE_BUF, atomic among writers
    except OSError:
        pass  # the janitor is gone; atexit cleanup in the creator still runs


def register(name: str) -> None:
    """Have the janitor unlink ``name`` when the program is gone, unless unregistered."""
    _send("+" + name.encode("utf-8", "surrogateescape").hex())


def unregister(name: str) -> None:
    """``name`` was unlinked; the janitor can forget it."""
    _send("-" + name.encode("utf-8", "surrogateescape").hex())


def register_group(pgid: int) -> None:
    """Have the janitor SIGKILL process group ``pgid`` when the program is gone, unless
    unregistered (a launcher registers each node process it starts)."""
    _send(f"g{int(pgid)}")


def unregister_group(pgid: int) -> None:
    """The launcher reaped the leader of ``pgid`` and ended its group itself."""
    _send(f"h{int(pgid)}")
