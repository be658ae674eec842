"""Removes a run's network namespaces, and ends every process in them, once the run is gone.

    python -I -S bench/hosts/janitor.py                  (its standard input: a pipe from the harness)
    python -I -S bench/hosts/janitor.py --remove NAME...  (remove these now)

``bench/hosts/netns.py`` starts one per ``Hosts``, in a session of its own (Ctrl+C in a
terminal and a test runner ending a process group leave it be), and sends it
``+<namespace>`` before it creates a namespace and ``-<namespace>`` after it removed one.
The harness alone holds the pipe's write end: when it exits, however it exits (normally,
on an exception, or SIGKILLed), the janitor reads end-of-file and, for every namespace
still registered, SIGKILLs each process in it (``ip netns pids``, again until none is
left, since one may fork while it dies) and deletes it; deleting a namespace deletes the
veth ends, the qdiscs and the nf_tables rules in it. The idea is shmpad's own janitor
(``shmpad/shm/janitor.py``), for namespaces instead of segments.

A janitor that is itself SIGKILLed leaves its namespaces to the next ``Hosts`` made on
the machine, which removes those whose owner (the pid in the name) is gone.

Standard library only (it starts under ``python -I -S``), no import of shmpad.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time


def ip(*args: str) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    return result.stdout


def remove(namespace: str) -> None:
    """SIGKILL every process in ``namespace`` until none is left (10 s at most), then delete it.
    Each process is pinned with a pidfd before it is signalled, so a reused pid is never hit."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pidfds = []
        for pid in ip("netns", "pids", namespace).split():
            try:
                pidfds.append(os.pidfd_open(int(pid)))
            except (OSError, ValueError):
                continue  # gone already
        if not pidfds:
            break
        for fd in pidfds:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
        select.select(pidfds, [], [], max(0.0, deadline - time.monotonic()))  # readable: exited
        for fd in pidfds:
            os.close(fd)
    ip("netns", "del", namespace)


def main() -> None:
    if sys.argv[1:2] == ["--remove"]:  # the harness's own teardown, with the same code
        for name in sys.argv[2:]:
            remove(name)
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    names: list[str] = []
    for line in sys.stdin:
        kind, name = line[:1], line[1:].strip()
        if kind == "+" and name not in names:
            names.append(name)
        elif kind == "-" and name in names:
            names.remove(name)
    for name in reversed(names):  # the hosts first, the switch they hang on last
        remove(name)


if __name__ == "__main__":
    main()
