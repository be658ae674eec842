"""Hosts on one machine: network namespaces joined by links of a chosen rate and delay.

``Hosts(3, Link.parse("1gbit,0.5ms"))`` makes, as root::

    namespace <name>-switch      bridge br0, ports p0 p1 p2 (one per host, no address)
                                   |     |     |      veth pairs
    namespace <name>-h0 .. -h2   eth0 10.10.0.1/24, .2, .3 (and lo)

``<name>`` is ``shmpad-hosts-<pid of the harness>-<n>``. Nothing is made in the machine's
own namespace: the hosts reach each other and nothing else (no route out, no address of
the machine), so runs of several users never collide, and they all use 10.10.0.0/24.

A link (``Link``) is what each host's cable does to traffic, in both directions:
- rate: a token bucket (``tc qdisc ... tbf``) on ``eth0`` (what the host sends) and on its
  switch port (what it receives), so a host also receives at most the rate, whoever sends;
  the bucket holds 1 ms of traffic (64 KiB at least) and queues 20 ms at most.
- delay: every IPv4 packet the host sends waits that long before it reaches the bucket,
  so a packet from one host reaches another ``delay`` later (the sender's link's), and a
  round trip takes twice the delay plus the stack's own time. ``netem`` would do it in the
  kernel; where the kernel has none, ``bench/hosts/delay.py`` holds each packet in a
  netfilter queue (its docstring says how, and what it costs). ``Hosts.delay_by`` says
  which one a run uses: netem when ``tc`` accepts it, else the queue.

``host.popen(argv)`` runs a command in a host (``ip netns exec``), leading a session of its
own and SIGKILLed if the harness dies; ``host.cut()`` / ``host.restore()`` take its switch
port down and up (a pulled cable: the host's own link stays up, nothing crosses);
``hosts.close()`` ends every process in every namespace and deletes them.

Cleanup survives a SIGKILL of the harness: a janitor (``bench/hosts/janitor.py``) that
the harness alone feeds removes what is left when the harness is gone, and a ``Hosts``
made later removes the namespaces of any owner that is gone (a janitor killed too).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

from shmpad.launch.process import die_with_parent
from shmpad.shm.pids import pid_alive

__all__ = ["Host", "Hosts", "HostsUnavailable", "Link", "SUBNET"]

HERE = os.path.dirname(os.path.abspath(__file__))
PREFIX = "shmpad-hosts-"
NAME = re.compile(rf"^{PREFIX}(\d+)-\d+-(?:switch|h\d+)$")
SUBNET = "10.10.0"  # host i is SUBNET.(i + 1)
MAX_HOSTS = 250
START_TIMEOUT_S = 30.0
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_DELAY_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_PER_SECOND = {"us": 10**6, "ms": 10**3, "s": 1}  # dividing by these gives the nearest float: 50us == 50e-6
_counter = itertools.count()


class HostsUnavailable(Exception):
    """The machine does not let this process make the hosts (no root, no iproute2, a kernel
    without network namespaces, veth or bridges): the message says which step failed."""


@dataclass(frozen=True)
class Link:
    """A host's cable: ``rate`` in bits per second (0: as fast as the machine goes) and
    ``delay`` in seconds, one way (0: none)."""

    rate: int = 0
    delay: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, int) or self.rate < 0:
            raise ValueError(f"a link's rate must be an int of bits per second >= 0, got {self.rate!r}")
        if isinstance(self.delay, bool) or not isinstance(self.delay, (int, float)) or not 0 <= self.delay <= 10:
            raise ValueError(f"a link's delay must be a number of seconds in [0, 10], got {self.delay!r}")

    @classmethod
    def parse(cls, text: str) -> "Link":
        """``RATE,DELAY`` as tc writes them: ``10gbit,50us``, ``1gbit,0.5ms``, ``100mbit,2ms``;
        a rate alone (``1gbit``) has no delay; ``0`` for either is none (``0,1ms``)."""
        parts = [p.strip().lower() for p in str(text).split(",")]
        if len(parts) not in (1, 2) or not parts[0]:
            raise ValueError(f"a link is RATE,DELAY such as 10gbit,50us or 1gbit,0.5ms, got {text!r}")
        rate = _number(parts[0], _RATE_UNITS, "rate", text)
        delay = _number(parts[1], _DELAY_UNITS, "delay", text) if len(parts) == 2 else 0.0
        return cls(int(round(rate)), float(delay))

    def __str__(self) -> str:
        rate = _with_unit(self.rate, _RATE_UNITS) if self.rate else "0"
        return f"{rate},{_with_unit(self.delay, _DELAY_UNITS) if self.delay else '0'}"


def _number(word: str, units: dict[str, float], what: str, text: str) -> float:
    if word == "0":
        return 0.0
    match = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)([a-z]+)", word)
    if not match or match.group(2) not in units:
        raise ValueError(f"a link's {what} is a number and one of {', '.join(units)} (or 0), got {word!r} in {text!r}")
    number, unit = float(match.group(1)), match.group(2)
    return number / _PER_SECOND[unit] if unit in _PER_SECOND else number * units[unit]


def _with_unit(value: float, units: dict[str, float]) -> str:
    unit, scale = max(((u, s) for u, s in units.items() if value >= s), key=lambda us: us[1], default=(None, 0))
    if unit is None:
        unit, scale = min(units.items(), key=lambda us: us[1])
    return f"{value / scale:g}{unit}"


def _run(argv: list[str], check: bool = True) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise HostsUnavailable(f"`{' '.join(argv)}` failed: {result.stderr.strip() or result.returncode}")
    return result.stdout


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _run(["ip", "netns", "list"], check=False).splitlines() if line.strip()]


def _script(name: str) -> list[str]:
    """A stdlib-only script of this folder under ``python -I -S`` (no site, no shmpad)."""
    return [sys.executable, "-I", "-S", os.path.join(HERE, name)]


@dataclass
class Host:
    """One host: namespace ``namespace``, address ``ip`` on ``eth0``, switch port ``port``."""

    index: int
    namespace: str
    ip: str
    port: str
    switch: str
    procs: list[subprocess.Popen] = field(default_factory=list)

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` as run inside this host."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def popen(self, argv: list[str], cpus: Sequence[int] | None = None, **kwargs) -> subprocess.Popen:
        """Start ``argv`` in this host, leading a session of its own (``kill`` ends it and
        what it forks), SIGKILLed when the harness dies, with SIGINT at its default (so that
        one started from a shell's background still stops as Ctrl+C stops it), on ``cpus``
        if given; ``kwargs`` go to ``Popen``. Call it from the thread that outlives the
        process (PR_SET_PDEATHSIG follows the thread)."""
        proc = subprocess.Popen(
            self.command(argv), start_new_session=True, preexec_fn=partial(_prepare, os.getpid(), cpus), **kwargs
        )
        self.procs.append(proc)
        return proc

    def kill(self) -> None:
        """SIGKILL every process ``popen`` started here, and what each forked (the host
        crashes; its link stays up). They are reaped and forgotten."""
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(timeout=30)
        self.procs.clear()

    def cut(self) -> None:
        """Pull the cable: take this host's switch port down."""
        _run(["ip", "-n", self.switch, "link", "set", self.port, "down"])

    def restore(self) -> None:
        """Plug it back in."""
        _run(["ip", "-n", self.switch, "link", "set", self.port, "up"])


class Hosts:
    """``count`` hosts on one switch, each behind ``link`` (one ``Link`` for all, or one
    per host). Use as a context manager, or call ``close``."""

    def __init__(self, count: int, link: Link | list[Link] = Link()):
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"count must be an int in [1, {MAX_HOSTS}], got {count!r}")
        links = list(link) if isinstance(link, (list, tuple)) else [link] * count
        if len(links) != count or not all(isinstance(x, Link) for x in links):
            raise ValueError(f"link must be a Link or a list of {count} Links, got {link!r}")
        for need in ("ip", "tc"):
            if shutil.which(need) is None:
                raise HostsUnavailable(f"the `{need}` command (iproute2) is not on PATH")
        if os.geteuid() != 0:
            raise HostsUnavailable(f"network namespaces need root; this process runs as uid {os.geteuid()}")
        self.links = links
        self.name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.switch = f"{self.name}-switch"
        self.hosts: list[Host] = []
        self.delay_by: str | None = None  # "netem" or "nfqueue" once a link has a delay
        self._made: list[str] = []
        self._delayers: list[subprocess.Popen] = []
        self._janitor = subprocess.Popen(
            _script("janitor.py"),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
        )
        try:
            remove_stale()
            self._build()
        except BaseException:
            self.close()
            raise

    def _add_namespace(self, namespace: str) -> None:
        self._janitor.stdin.write(f"+{namespace}\n")  # before it exists: a SIGKILL between leaves nothing behind
        self._janitor.stdin.flush()
        self._made.append(namespace)
        _run(["ip", "netns", "add", namespace])

    def _build(self) -> None:
        self._add_namespace(self.switch)
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for i, link in enumerate(self.links):
            host = Host(i, f"{self.name}-h{i}", f"{SUBNET}.{i + 1}", f"p{i}", self.switch)
            self._add_namespace(host.namespace)
            self.hosts.append(host)
            ns, sw = ["ip", "-n", host.namespace], ["ip", "-n", self.switch]
            _run([*sw, "link", "add", host.port, "type", "veth", "peer", "name", "eth0", "netns", host.namespace])
            _run([*sw, "link", "set", host.port, "master", "br0"])
            _run([*sw, "link", "set", host.port, "up"])
            _run([*ns, "addr", "add", f"{host.ip}/24", "dev", "eth0"])
            _run([*ns, "link", "set", "eth0", "up"])
            _run([*ns, "link", "set", "lo", "up"])
            self._shape(host, link)

    def _shape(self, host: Host, link: Link) -> None:
        tbf = []
        if link.rate:
            burst = max(link.rate // 8 // 1000, 64 << 10)  # 1 ms of traffic, and a whole GSO segment
            tbf = ["tbf", "rate", f"{link.rate}bit", "burst", str(burst), "latency", "20ms"]
            _run(["tc", "-n", self.switch, "qdisc", "replace", "dev", host.port, "root", *tbf])
        egress = ["tc", "-n", host.namespace, "qdisc", "replace", "dev", "eth0"]
        if link.delay and self._netem(host, link.delay):
            if tbf:  # under netem: a packet waits out the delay, then for the bucket
                _run([*egress, "parent", "1:1", "handle", "10:", *tbf])
            return
        if tbf:
            _run([*egress, "root", *tbf])
        if link.delay:
            self._delayer(host, link.delay)

    def _netem(self, host: Host, delay: float) -> bool:
        """Put ``netem delay`` at the root of the host's ``eth0``, if this kernel has netem."""
        if self.delay_by == "nfqueue":
            return False
        netem = ["tc", "-n", host.namespace, "qdisc", "replace", "dev", "eth0", "root", "handle", "1:", "netem"]
        result = subprocess.run(
            [*netem, "delay", f"{round(delay * 1e6)}us", "limit", "100000"], capture_output=True, text=True, timeout=30
        )
        if result.returncode != 0 and self.delay_by == "netem":
            raise HostsUnavailable(f"netem took one link's delay and refused the next: {result.stderr.strip()}")
        self.delay_by = "netem" if result.returncode == 0 else "nfqueue"
        return result.returncode == 0

    def _delayer(self, host: Host, delay: float) -> None:
        """Start ``delay.py`` in the host (the link's, not the host's: ``host.kill()`` leaves it)."""
        proc = subprocess.Popen(
            host.command([*_script("delay.py"), "eth0", str(round(delay * 1e6))]),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=partial(_prepare, os.getpid(), None),
        )
        self._delayers.append(proc)
        line = _read_line(proc, START_TIMEOUT_S)
        if line != "ready":
            raise HostsUnavailable(f"the delayer of {host.namespace} did not start (exit {proc.poll()}): {line!r}")

    def measure(self, a: int, b: int, rounds: int = 50, mib: int = 16, port: int = 5201) -> dict:
        """Round trips and a bulk transfer from host ``a`` to host ``b`` (``bench/hosts/probe.py``):
        ``{"rtt_us": [sorted round trips], "mib": mib, "seconds": the transfer's}``."""
        server = self.hosts[b].popen(
            [*_script("probe.py"), "serve", self.hosts[b].ip, str(port)], stdout=subprocess.PIPE
        )
        try:
            line = _read_line(server, START_TIMEOUT_S)
            if line != "listening":
                raise RuntimeError(f"the probe's server did not start in host {b} (exit {server.poll()}): {line!r}")
            argv = [*_script("probe.py"), "measure", self.hosts[b].ip, str(port), str(rounds), str(mib)]
            result = subprocess.run(self.hosts[a].command(argv), capture_output=True, text=True, timeout=300)
            if result.returncode != 0:
                raise RuntimeError(f"the probe from host {a} to host {b} failed: {result.stderr.strip()}")
            return json.loads(result.stdout)
        finally:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
            server.stdout.close()
            if server in self.hosts[b].procs:
                self.hosts[b].procs.remove(server)

    def check(self) -> None:
        """Raise if a link's delayer has exited (its link drops everything from then on)."""
        for proc in self._delayers:
            if proc.poll() is not None:
                said = proc.stdout.read().decode(errors="replace").strip()[-2000:]
                raise RuntimeError(f"the delayer of {proc.args[3]}'s link exited with {proc.returncode}: {said}")

    def close(self) -> None:
        """End every process in the hosts and delete every namespace made (idempotent)."""
        for host in self.hosts:
            host.kill()
        for proc in self._delayers:
            proc.kill()
            proc.wait(timeout=30)
            proc.stdout.close()
        self._delayers.clear()
        for namespace in reversed(self._made):
            _remove(namespace)
            if self._janitor.stdin and not self._janitor.stdin.closed:
                self._janitor.stdin.write(f"-{namespace}\n")
        self._made.clear()
        if self._janitor.stdin and not self._janitor.stdin.closed:
            self._janitor.stdin.close()  # end-of-file: the janitor exits, with nothing left to remove
            self._janitor.wait(timeout=30)

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __len__(self) -> int:
        return len(self.hosts)

    def __iter__(self):
        return iter(self.hosts)


def _prepare(parent: int, cpus: Sequence[int] | None) -> None:
    """In a child, before it execs: what ``Host.popen`` promises."""
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if cpus is not None:
        os.sched_setaffinity(0, cpus)


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The first line ``proc`` prints, or what it printed before it exited or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    fd = proc.stdout.fileno()
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").split("\n")[0].strip()


def _remove(namespace: str) -> None:
    """What the janitor does for one namespace, done by the harness itself."""
    subprocess.run([*_script("janitor.py"), "--remove", namespace], capture_output=True, timeout=60, check=False)


def remove_stale() -> list[str]:
    """Remove the namespaces of harnesses that are gone (a janitor SIGKILLed too); their names."""
    stale = [n for n in _namespaces() if (m := NAME.match(n)) and not pid_alive(int(m.group(1)))]
    for namespace in sorted(stale, key=lambda n: n.endswith("-switch")):  # hosts before their switch
        _remove(namespace)
    return stale
