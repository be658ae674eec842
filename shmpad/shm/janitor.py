"""Removes this program's shared-memory segments, and ends what its nodes started, once
the program is gone.

The first process that creates a segment (or a launcher, before it forks) starts one
janitor: a tiny Python process (no site-packages, no shmpad import) whose standard input
is a pipe. Every process of the program holds the pipe's write end (forked children
inherit it), and sends ``+<name in hex>`` when it creates a segment and ``-<name in hex>``
when it unlinks one (hex, so that no byte of a name can break a line or stand for another
name), and ``g<pgid>`` / ``h<pgid>`` when a launcher starts a node process (the leader of
its own process group) and when it has reaped it. When the last holder exits, however it
exits (normally, on an exception, or SIGKILLed), the janitor reads end-of-file, unlinks
every name still registered and SIGKILLs every process group still registered: the nodes
of a SIGKILLed launcher die with it (parent-death signal), and this ends what they had
started in their groups (the groups outlive them).

A launcher also sends ``t<ms>``, its termination notice, and its nodes put
``SHMPAD_PROGRAM=<token>.<node pid>`` into their environment (``mark_environment``). When
the launcher reaps a node it sends ``k<node pid>``, and the janitor SIGKILLs what was
exec'd with that node's mark, in whatever session (the node's group the launcher ends).
And the janitor sweeps the program when the process that started it (the root, the
launcher) exits: every process that is in a registered group, or holds the janitor's pipe
(whatever was forked and not exec'd, in whatever session), or was exec'd with any of the
program's marks (helpers that ``setsid``, daemons that double-fork) gets SIGTERM; those
alive after the notice get SIGKILL, and the sweep repeats until it finds none. Without
the sweep, a forked helper that ignores SIGTERM would hold the pipe open and keep the
janitor waiting forever. Each process is pinned with a pidfd before it is examined, so a
reused pid is never signalled. What it cannot find: a process that left the node's
process group, holds none of the program's descriptors and was exec'd with an environment
that drops the token (``env={}`` after ``setsid``), and processes of other users or pid
namespaces (their ``/proc`` entries are closed to it); docs/architecture.md says so.

Processes forked before the janitor started do not hold the pipe: a launcher calls
``start()`` before it forks. The janitor runs in its own session so that Ctrl+C in a terminal does not kill it
before the processes it watches.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

__all__ = [
    "start",
    "register",
    "unregister",
    "register_group",
    "unregister_group",
    "set_notice",
    "mark_environment",
    "end_node",
    "MARKER",
]

MARKER = "SHMPAD_PROGRAM"  # the environment variable that carries the program's token

# Runs under ``python -I -S``: standard library only, starts in a few milliseconds.
# argv: the root's pid, then the ``MARKER=token`` entry that marks the program's environments.
_JANITOR_SOURCE = r"""
import os, select, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
root, marker = int(sys.argv[1]), sys.argv[2].encode()
me = os.getpid()
pipe = os.readlink("/proc/self/fd/0")  # "pipe:[inode]": the same for the write ends the program holds
names = set()
groups = set()
notice = None  # seconds; set by a launcher, which turns the sweep on


def exited(pidfd):
    return bool(select.select([pidfd], [], [], 0)[0])


def marked(pid, node=None):
    # exec'd with one of the program's marks (with node: that node's, token.<node pid>)
    with open(f"/proc/{pid}/environ", "rb") as f:
        entries = f.read().split(b"\0")
    if node is not None:
        return marker + b"." + node in entries
    return any(e == marker or e.startswith(marker + b".") for e in entries)


def member(pid):
    try:
        if os.getpgid(pid) in groups or marked(pid):
            return True
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == pipe:
                return True
        except OSError:
            pass  # closed since the listing
    return False


def members(test=member):
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            pidfd = os.pidfd_open(int(entry))
        except OSError:
            continue
        try:
            yes = test(int(entry))
        except OSError:
            yes = False
        # alive after the check: the process examined is the one the pidfd pins
        if yes and not exited(pidfd):
            found[int(entry)] = pidfd
        else:
            os.close(pidfd)
    return found


def end_node(node):
    # what the node exec'd, in whatever session (its group the launcher ended itself)
    procs = members(lambda pid: marked(pid, node))
    signal_all(procs, signal.SIGKILL)
    for pidfd in procs.values():
        os.close(pidfd)


def wait_exits(procs, seconds):
    deadline = time.monotonic() + seconds
    while procs:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        for pidfd in select.select(list(procs.values()), [], [], left)[0]:
            pid = next(p for p, fd in procs.items() if fd == pidfd)
            os.close(procs.pop(pid))


def signal_all(procs, sig):
    for pidfd in procs.values():
        try:
            signal.pidfd_send_signal(pidfd, sig)
        except OSError:
            pass


def sweep():
    procs = members()
    signal_all(procs, signal.SIGTERM)
    wait_exits(procs, notice)
    for _ in range(100):  # what was started during the notice, or forks while it dies
        for pid, pidfd in members().items():
            if pid in procs:
                os.close(pidfd)
            else:
                procs[pid] = pidfd
        if not procs:
            return
        signal_all(procs, signal.SIGKILL)
        wait_exits(procs, 1.0)


def handle(line):
    global notice
    line = line.strip()
    if line[:1] in (b"g", b"h") and line[1:].isdigit():
        (groups.add if line[:1] == b"g" else groups.discard)(int(line[1:]))
        return
    if line[:1] == b"k" and line[1:].isdigit():
        end_node(line[1:])
        return
    if line[:1] == b"t" and line[1:].isdigit():
        notice = max(notice or 0.0, int(line[1:]) / 1000)
        return
    try:
        name = bytes.fromhex(line[1:].decode("ascii"))
    except ValueError:
        return
    if line[:1] == b"+":
        names.add(name)
    elif line[:1] == b"-":
        names.discard(name)


try:
    root_fd = os.pidfd_open(root)
except OSError:
    root_fd = None  # the root is gone already: end-of-file follows
swept = False
pending = b""
while True:
    watch = [0] if root_fd is None or notice is None or swept else [0, root_fd]
    if root_fd in select.select(watch, [], [])[0]:
        sweep()  # the root is gone; so are its nodes (parent-death signal): end what they started
        swept = True
        continue
    data = os.read(0, 1 << 16)
    if not data:
        break
    *lines, pending = (pending + data).split(b"\n")
    for line in lines:
        handle(line)
if notice is not None and not swept:
    sweep()
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
_token: str | None = None  # marks the environment of what the program's nodes exec


def _write_fd() -> int | None:
    """The janitor pipe of this process's program, starting a janitor if there is none."""
    global _fd, _token
    with _lock:
        if _fd is not None:
            return _fd  # in a forked child: the parent's janitor, through the inherited fd
        token = f"{os.getpid()}.{os.urandom(8).hex()}"
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _JANITOR_SOURCE, str(os.getpid()), f"{MARKER}={token}"],
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
        _token = token
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


def set_notice(seconds: float) -> None:
    """Sweep the program when its root exits (see the module docstring): SIGTERM, then
    SIGKILL after ``seconds`` (a launcher's termination notice; the longest one sent holds)."""
    _send(f"t{max(0, round(seconds * 1000))}")


def mark_environment() -> None:
    """Put the program's token and this process's pid into its environment, so that
    whatever it execs can be found by the janitor (a launcher's node calls it first thing)."""
    if _write_fd() is not None and _token is not None:
        os.environ[MARKER] = f"{_token}.{os.getpid()}"


def end_node(pid: int) -> None:
    """SIGKILL what node ``pid`` (reaped) exec'd with its mark, whatever session it leads."""
    _send(f"k{int(pid)}")
