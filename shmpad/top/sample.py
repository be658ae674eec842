"""One program's state as a plain dict, with rates from the previous sample.

``Sampler(registry_name).sample()`` returns::

    {"program", "launcher_pid", "launch_type", "registry", "phase", "uptime_s", "interval_s",
     "nodes": [{"name", "label", "index", "pid", "state" ("pending", "running", "done",
                "dead"), "exit_code", "exit" (in words), "restarts", "cpu_percent",
                "rss_bytes"}, ...],
     "rings": [{"label", "kind", "segment", "capacity", "size", "fill", "puts", "gets",
                "puts_per_s", "gets_per_s", "waits_full", "waits_empty", "dead_claims",
                "closed", "producers_waiting", "held_by"}, ...],
     "weights": [{"label", "segment", "version", "pulls", "versions_per_s", "pulls_per_s"}, ...],
     "rpc": [{"label", "segment", "calls", "calls_per_s", "queued", "answered",
              "ms_per_call", "latency_ms"}, ...],
     "counters": [{"node", "pid", "name", "value", "per_s"}, ...]}

A ring's ``producers_waiting`` counts producers asleep until a slot is freed, and
``held_by`` is the pid of the consumer holding (taken, not released) the message in
the slot the next put needs, else 0: both non-zero, that consumer stalls the producers.
A rate is None in the first sample (there is nothing to compare with yet); CPU % is
the node process's own user+system time over the interval (not its children's). A
courier's ``ms_per_call`` is the mean time its server spent on each call answered in
the interval (from taking it up to putting its reply), ``latency_ms`` the mean time
from the caller's send to that reply (queue wait included); both None in the first
sample, when no call was answered in the interval, or when the server keeps no call
statistics (``shmpad.rpc.stats``, which also give ``answered``, the calls answered
since the start: None without them); ``calls`` counts what was taken from the ring.
"""

from __future__ import annotations

import os
import time
from typing import Any

from shmpad.errors import SegmentError, describe_exit
from shmpad.ringbuf import MPMCRing, SPSCRing, TypedRing
from shmpad.rpc.stats import CallStats
from shmpad.shm.pids import pid_alive, proc_stat
from shmpad.top.registry import ENDED, STATES, Registry, running_programs
from shmpad.weights import WeightStore

__all__ = ["Sampler", "programs", "find_program", "proc_usage"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_RING_KINDS = {"typed": TypedRing, "mpmc": MPMCRing, "spsc": SPSCRing}


def proc_usage(pid: int) -> tuple[float, int] | None:
    """(CPU seconds used, resident bytes) of process ``pid``, or None if it is gone."""
    stat = proc_stat(pid)
    if stat is None:
        return None
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            statm = f.read()
    except OSError:  # ended since
        return None
    return (stat.utime + stat.stime) / _CLK_TCK, int(statm.split()[1]) * _PAGE


def programs() -> list[dict[str, Any]]:
    """The programs running on this host: ``{"registry", "program", "launcher_pid", "nodes", "uptime_s"}``."""
    out = []
    for name in running_programs():
        try:
            reg = Registry.attach(name)
        except (SegmentError, ValueError, OSError):
            continue  # being made or removed right now
        meta = reg.meta
        reg.close()
        if not pid_alive(int(meta.get("launcher_pid", 0))):
            continue  # its launcher is gone; the janitor is removing it
        out.append(
            {
                "registry": name,
                "program": meta["program"],
                "launcher_pid": meta["launcher_pid"],
                "nodes": len(meta["nodes"]),
                "uptime_s": round(time.time() - meta["started"], 1),
            }
        )
    return out


def find_program(which: str) -> str:
    """The registry of the program ``which`` names: a launcher pid, a program name, or a
    registry segment name. Raises ``LookupError`` saying what runs when none (or several) match."""
    running = programs()
    matches = [p for p in running if which in (str(p["launcher_pid"]), p["program"], p["registry"], p["registry"][1:])]
    if len(matches) == 1:
        return matches[0]["registry"]
    listing = ", ".join(f"{p['program']!r} (launcher pid {p['launcher_pid']})" for p in running) or "none"
    if not matches:
        raise LookupError(f"no running shmpad program is named {which!r} or has that launcher pid; running: {listing}")
    raise LookupError(f"{len(matches)} running programs are named {which!r}: name one by its launcher pid; {listing}")


def _rate(now: int, before: int | None, dt: float | None) -> float | None:
    if before is None or not dt:
        return None
    return round((now - before) / dt, 2)


def _delta(now: int, before: float | None, dt: float | None) -> int | None:
    return None if before is None or not dt else int(now - before)


class Sampler:
    """Reads one program; each ``sample()`` returns its state and the rates since the last."""

    def __init__(self, registry_name: str):
        self.registry = Registry.attach(registry_name)
        meta = self.registry.meta
        self._rings = [(r, self._attach(_RING_KINDS.get(r.get("kind")), r)) for r in meta.get("rings", [])]
        self._weights = [(w, self._attach(WeightStore, w)) for w in meta.get("weights", [])]
        self._rpc = [(r, self._attach(MPMCRing, r), CallStats.attach(r["segment"])) for r in meta.get("rpc", [])]
        self._last_t: float | None = None
        self._last: dict[str, float] = {}

    @staticmethod
    def _attach(cls: Any, entry: dict) -> Any:
        """A handle on a segment, or None if it is gone (never closed by us: a ring's
        ``close`` would close it for the program)."""
        if cls is None:
            return None
        try:
            return cls.attach(entry["segment"])
        except (SegmentError, ValueError, OSError):
            return None

    @property
    def launcher_alive(self) -> bool:
        return pid_alive(int(self.registry.meta["launcher_pid"]))

    def sample(self) -> dict[str, Any]:
        t = time.monotonic()
        dt = None if self._last_t is None else t - self._last_t
        now: dict[str, float] = {}

        def rate(key: str, value: float) -> float | None:
            now[key] = value
            return _rate(value, self._last.get(key), dt)

        meta = self.registry.meta
        nodes = []
        for row in self.registry.node_rows():
            ended = row["state"] == STATES[ENDED]
            state = ("done" if row["exit_code"] == 0 else "dead") if ended else row["state"]
            usage = proc_usage(row["pid"]) if row["pid"] and not ended else None
            cpu = None if usage is None else rate(f"cpu:{row['name']}:{row['pid']}", usage[0])
            nodes.append(
                {
                    "name": row["name"],
                    "label": row["label"],
                    "index": row["index"],
                    "pid": row["pid"],
                    "state": state,
                    "exit_code": row["exit_code"],
                    "exit": None if row["exit_code"] is None else describe_exit(row["exit_code"]),
                    "restarts": row["restarts"],
                    "cpu_percent": None if cpu is None else round(cpu * 100, 1),
                    "rss_bytes": None if usage is None else usage[1],
                }
            )
        rings = []
        for entry, ring in self._rings:
            if ring is None:
                continue
            s = ring.statistics()
            key = f"ring:{entry['segment']}"
            rings.append(
                {
                    "label": entry["label"],
                    "kind": entry.get("kind"),
                    "segment": entry["segment"],
                    "capacity": s.capacity,
                    "size": s.size,
                    "fill": round(s.size / s.capacity, 3),
                    "puts": s.puts,
                    "gets": s.gets,
                    "puts_per_s": rate(key + ":puts", s.puts),
                    "gets_per_s": rate(key + ":gets", s.gets),
                    "waits_full": s.waits_full,
                    "waits_empty": s.waits_empty,
                    "dead_claims": s.dead_claims_skipped,
                    "closed": s.closed,
                    "producers_waiting": s.producers_waiting,
                    "held_by": s.next_slot_held_by,
                }
            )
        weights = []
        for entry, store in self._weights:
            if store is None:
                continue
            key = f"weights:{entry['segment']}"
            try:
                version, pulls = store.version, store.pulls_by_all
            except Exception:  # closed: the program is ending
                continue
            weights.append(
                {
                    "label": entry["label"],
                    "segment": entry["segment"],
                    "version": version,
                    "pulls": pulls,
                    "versions_per_s": rate(key + ":version", version),
                    "pulls_per_s": rate(key + ":pulls", pulls),
                }
            )
        rpc = []
        for entry, ring, stats in self._rpc:
            if ring is None:
                continue
            s = ring.statistics()
            key = f"rpc:{entry['segment']}"
            answered = ms_per_call = latency_ms = None
            if stats is not None:
                answered, service_ns, latency_ns = stats.read()
                calls = _delta(answered, self._last.get(key + ":answered"), dt)
                now[key + ":answered"], now[key + ":service"], now[key + ":latency"] = answered, service_ns, latency_ns
                if calls:
                    ms_per_call = round((service_ns - self._last[key + ":service"]) / calls / 1e6, 3)
                    latency_ms = round((latency_ns - self._last[key + ":latency"]) / calls / 1e6, 3)
            rpc.append(
                {
                    "label": entry["label"],
                    "segment": entry["segment"],
                    "calls": s.gets,
                    "calls_per_s": rate(key, s.gets),
                    "queued": s.size,
                    "answered": answered,
                    "ms_per_call": ms_per_call,
                    "latency_ms": latency_ms,
                }
            )
        counters = []
        for c in self.registry.counter_entries():
            key = f"counter:{c['node']}:{c['pid']}:{c['name']}"
            counters.append({**c, "per_s": rate(key, c["value"])})
        self._last_t, self._last = t, now
        return {
            "program": meta["program"],
            "launcher_pid": meta["launcher_pid"],
            "launch_type": meta.get("launch_type"),
            "registry": self.registry.name,
            "phase": self.registry.phase() if self.launcher_alive else "launcher gone",
            "uptime_s": round(time.time() - meta["started"], 1),
            "interval_s": None if dt is None else round(dt, 3),
            "nodes": nodes,
            "rings": rings,
            "weights": weights,
            "rpc": rpc,
            "counters": counters,
        }

    def close(self) -> None:
        """Let go of the program's segments (unmapped when the handles are garbage)."""
        for _, _, stats in self._rpc:
            if stats is not None:
                stats.close()
        self._rings = self._weights = self._rpc = []
        self.registry.close()
