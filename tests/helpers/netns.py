"""Network namespaces joined to the root namespace by veth pairs: stand-ins for separate hosts.

Namespace ``i`` of a test run gets a veth pair; the root side holds ``10.77.X.1/24``, the
namespace side ``10.77.X.2/24`` with a default route through the root side, so a process
in the namespace reaches any root-namespace address, and the root reaches it.
Forwarding is switched on for the root-side veths (only those), so namespaces reach
each other too. ``X`` is
chosen under a lock among the subnets no interface of the root namespace uses, so test
runs of several engineers on one machine do not collide.

Names carry the pid of the test process (namespace ``shmpad-<pid>-<i>``, root-side veth
``shp<pid>h<i>``): teardown removes them, and a later run removes those whose pid is
dead (a run that was SIGKILLed before its teardown). Deleting a namespace deletes the
veth end inside it, which deletes its peer in the root namespace too.

Use the ``netns`` fixture: ``spaces = netns(2)``; ``spaces[0].ip``, ``spaces[0].gateway``
(the root side's address), ``spaces[0].popen([sys.executable, "-c", code], ...)``.
The test is skipped, with the reason, where the machine does not allow namespaces.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

import pytest

import helpers

LOCK_PATH = "/tmp/shmpad-netns.lock"
NS_PATTERN = re.compile(r"^shmpad-(\d+)-(\d+)\b")
VETH_PATTERN = re.compile(r"^shp(\d+)h(\d+)$")


class SetupFailed(Exception):
    """A command that builds the namespaces failed: the machine does not allow it."""


def _ip(*args: str, check: bool = True) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise SetupFailed(f"`ip {' '.join(args)}` failed: {result.stderr.strip() or result.returncode}")
    return result.stdout


@dataclass
class Namespace:
    """One namespace: ``ip`` inside it, ``gateway`` the root side of its veth pair."""

    name: str
    veth: str
    ip: str
    gateway: str
    procs: list[subprocess.Popen] = field(default_factory=list)

    def popen(self, args: list[str], **kwargs) -> subprocess.Popen:
        """Start ``args`` inside the namespace (``ip netns exec``), leading a new session so
        that teardown ends it and whatever it forks; ``kwargs`` go to ``Popen``."""
        proc = helpers.start_session(["ip", "netns", "exec", self.name, *args], **kwargs)
        helpers.track_pid(proc.pid)
        self.procs.append(proc)
        return proc


def _remove(name: str, veth: str) -> None:
    _ip("netns", "del", name, check=False)
    _ip("link", "del", veth, check=False)


def _remove_stale() -> None:
    """Remove namespaces and veths of test runs whose process is gone."""
    for line in _ip("netns", "list", check=False).splitlines():
        m = NS_PATTERN.match(line)
        if m and not helpers.pid_alive(int(m.group(1))):
            _ip("netns", "del", line.split()[0], check=False)
    for line in _ip("-o", "link", "show", check=False).splitlines():
        parts = line.split(":")
        veth = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        m = VETH_PATTERN.match(veth)
        if m and not helpers.pid_alive(int(m.group(1))):
            _ip("link", "del", veth, check=False)


def _free_subnet(taken: set[int]) -> int:
    used = {int(x) for x in re.findall(r"\binet 10\.77\.(\d+)\.", _ip("-4", "-o", "addr", "show"))} | taken
    for x in range(1, 255):
        if x not in used:
            return x
    raise SetupFailed("no free 10.77.X.0/24 subnet for a namespace")


def _create(index: int, made: list[Namespace], taken: set[int]) -> Namespace:
    pid = os.getpid()
    name, veth, inner = f"shmpad-{pid}-{index}", f"shp{pid}h{index}", f"shp{pid}n{index}"
    x = _free_subnet(taken)
    ns = Namespace(name, veth, ip=f"10.77.{x}.2", gateway=f"10.77.{x}.1")
    made.append(ns)  # before creating anything, so that teardown removes a half-built one
    taken.add(x)
    _ip("netns", "add", name)
    _ip("link", "add", veth, "type", "veth", "peer", "name", inner)
    _ip("link", "set", inner, "netns", name)
    _ip("addr", "add", f"{ns.gateway}/24", "dev", veth)
    _ip("link", "set", veth, "up")
    # forwarding on our own veths only (the machine's other interfaces keep theirs), so
    # that namespaces reach each other through the root namespace, as hosts of a LAN do
    with open(f"/proc/sys/net/ipv4/conf/{veth}/forwarding", "w") as f:
        f.write("1")
    _ip("-n", name, "addr", "add", f"{ns.ip}/24", "dev", inner)
    _ip("-n", name, "link", "set", inner, "up")
    _ip("-n", name, "link", "set", "lo", "up")
    _ip("-n", name, "route", "add", "default", "via", ns.gateway)
    return ns


@pytest.fixture
def netns():
    """``netns(count)`` -> ``count`` fresh namespaces, removed (with every process started
    in them) when the test ends, whether it passed or not."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("network namespaces need the `ip` command (iproute2)")
    made: list[Namespace] = []

    def make(count: int) -> list[Namespace]:
        first = len(made)
        with open(LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _remove_stale()
            taken: set[int] = set()
            try:
                for i in range(first, first + count):
                    _create(i, made, taken)
            except (SetupFailed, OSError, subprocess.TimeoutExpired) as e:
                pytest.skip(f"this machine does not allow network namespaces with veth pairs: {e}")
        return made[first:]

    try:
        yield make
    finally:
        for ns in made:
            for proc in ns.procs:
                helpers.kill_and_reap(proc)
            _remove(ns.name, ns.veth)
