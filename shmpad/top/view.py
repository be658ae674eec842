"""The terminal view of a sample (``rich`` tables), refreshed in place by ``rich.live``."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

__all__ = ["render", "render_programs"]


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    if float(value).is_integer():
        digits = 0
    return f"{value:,.{digits}f}"


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return "-"


def _table(title: str, *columns: str) -> Table:
    table = Table(
        title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, expand=False, pad_edge=False
    )
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    return table


def _held_by(ring: dict[str, Any]) -> Text:
    """``pid N (k waiting)`` where producers wait on a slot a consumer holds, else empty."""
    if not (ring.get("producers_waiting") and ring.get("held_by")):
        return Text("")
    return Text(f"pid {ring['held_by']} ({ring['producers_waiting']} waiting)", style="bold yellow")


_STATE_STYLE = {"running": "green", "done": "cyan", "dead": "bold red", "pending": "yellow"}


def render(s: dict[str, Any]) -> Group:
    """The whole view of one sample."""
    head = Text.assemble(
        ("shmpad top", "bold"),
        f"  program {s['program']!r}  launcher pid {s['launcher_pid']}  {s['launch_type']}  ",
        (s["phase"], "green" if s["phase"] == "running" else "yellow"),
        f"  up {s['uptime_s']:,.0f} s",
    )
    parts: list[Any] = [head]
    nodes = _table("nodes", "node", "pid", "state", "CPU %", "RSS", "restarts", "exit")
    for n in s["nodes"]:
        nodes.add_row(
            n["name"],
            str(n["pid"] or "-"),
            Text(n["state"], style=_STATE_STYLE.get(n["state"], "")),
            _num(n["cpu_percent"], 1),
            _bytes(n["rss_bytes"]),
            str(n["restarts"]),
            n["exit"] or "",
        )
    parts.append(nodes)
    if s["rings"]:
        rings = _table(
            "rings  (full, empty: waits; dead: claims of dead processes skipped; "
            "held by: the consumer whose unreleased message waiting producers need)",
            "ring",
            "fill",
            "puts/s",
            "gets/s",
            "puts",
            "full",
            "empty",
            "dead",
            "held by",
        )
        for r in s["rings"]:
            rings.add_row(
                r["label"],
                f"{r['size']}/{r['capacity']}" + (" closed" if r["closed"] else ""),
                _num(r["puts_per_s"]),
                _num(r["gets_per_s"]),
                _num(r["puts"]),
                _num(r["waits_full"]),
                _num(r["waits_empty"]),
                _num(r["dead_claims"]),
                _held_by(r),
            )
        parts.append(rings)
    if s["weights"]:
        weights = _table("weight stores", "store", "version", "versions/s", "pulls/s", "pulls")
        for w in s["weights"]:
            weights.add_row(
                w["label"], _num(w["version"]), _num(w["versions_per_s"], 1), _num(w["pulls_per_s"]), _num(w["pulls"])
            )
        parts.append(weights)
    if s["rpc"]:
        rpc = _table(
            "courier (RPC) servers  (ms/call: serving a call; latency: from its send to its reply)",
            "server",
            "calls/s",
            "ms/call",
            "latency ms",
            "calls",
            "queued",
        )
        for r in s["rpc"]:
            rpc.add_row(
                r["label"],
                _num(r["calls_per_s"]),
                _num(r["ms_per_call"], 3),
                _num(r["latency_ms"], 3),
                _num(r["calls"]),
                str(r["queued"]),
            )
        parts.append(rpc)
    if s["counters"]:
        counters = _table("counters", "node", "name", "value", "per s")
        for c in s["counters"]:
            counters.add_row(c["node"] or "launcher", c["name"], _num(c["value"], 2), _num(c["per_s"], 2))
        parts.append(counters)
    return Group(*parts)


def render_programs(programs: list[dict[str, Any]]) -> Any:
    if not programs:
        return Text("no shmpad program is running on this host")
    table = _table("running shmpad programs", "program", "launcher pid", "nodes", "up (s)")
    for p in programs:
        table.add_row(p["program"], str(p["launcher_pid"]), str(p["nodes"]), _num(p["uptime_s"]))
    return Group(table, Text("watch one: python -m shmpad.top <program or launcher pid>"))
