"""What a running job holds, read from /proc: its processes (every descendant of its
first process, and anything left in its session), their memory, open files and
threads, and the shared-memory files under /dev/shm that are its own.

A /dev/shm file is the job's when one of its processes maps it or holds it open, or
when its name is a shmpad segment's (``shmpad.<pid>.<n>.<hex>``) made by a process
that was ever part of the job: a segment nobody maps any more still counts, so a leak
shows up as growth.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from shmpad.shm.pids import proc_stat
from shmpad.shm.segment import PREFIX  # segment names: shmpad.<creator pid>.<n>.<hex>
from shmpad.shm.segment import SHM_DIR as SHM


@dataclass
class Sample:
    processes: int
    rss_kb: int  # summed resident set sizes (pages shared between processes counted in each)
    pss_kb: int  # summed proportional set sizes (shared pages split between their processes)
    open_files: int
    threads: int
    shm_files: int
    shm_bytes: int  # allocated bytes of the job's /dev/shm files


class Tree:
    """The process tree under ``root`` (a pid that leads its own session)."""

    def __init__(self, root: int):
        self.root = root
        self.seen: set[int] = {root}  # every pid ever part of the job

    def pids(self) -> list[int]:
        """The job's live processes: ``root``'s descendants and its session's members."""
        parents: dict[int, int] = {}
        session: set[int] = set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            stat = proc_stat(pid)
            if stat is None:
                continue
            parents[pid] = stat.ppid
            if stat.session == self.root:
                session.add(pid)
        tree = {self.root} if self.root in parents else set()
        grew = True
        while grew:
            more = {pid for pid, parent in parents.items() if parent in tree and pid not in tree}
            tree |= more
            grew = bool(more)
        found = sorted(tree | session)
        self.seen.update(found)
        return found

    def sample(self) -> Sample:
        pids = self.pids()
        rss = pss = files = threads = 0
        shm: set[str] = set()
        for pid in pids:
            rss += _status_kb(pid, "VmRSS:")
            threads += _status_kb(pid, "Threads:")
            rollup = _read(f"/proc/{pid}/smaps_rollup")
            pss += _field_kb(rollup, "Pss:") if rollup else 0
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                fds = []
            files += len(fds)
            for fd in fds:
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith(SHM + "/"):
                    shm.add(target.split(" (deleted)")[0])
            maps = _read(f"/proc/{pid}/maps") or ""
            for line in maps.splitlines():
                parts = line.split(maxsplit=5)  # address perms offset device inode [path]
                path = parts[5].strip() if len(parts) == 6 else ""
                if path.startswith(SHM + "/") and not path.endswith(" (deleted)"):  # unlinked: goes with its mappers
                    shm.add(path)
        for name in _listdir(SHM):
            parts = name.split(".")
            if name.startswith(PREFIX) and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) in self.seen:
                shm.add(f"{SHM}/{name}")
        shm_bytes = 0
        present = 0
        for path in shm:
            try:
                shm_bytes += os.stat(path).st_blocks * 512
                present += 1
            except OSError:
                pass  # unlinked meanwhile
        return Sample(len(pids), rss, pss, files, threads, present, shm_bytes)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # the process ended, or is not ours to read
        return None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _field_kb(text: str, key: str) -> int:
    for line in text.splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def _status_kb(pid: int, key: str) -> int:
    text = _read(f"/proc/{pid}/status")
    return _field_kb(text, key) if text else 0
