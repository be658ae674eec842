"""Hosts with real links for the tests: the ``hosts`` fixture over ``bench/hosts/netns.py``.

``made = hosts(3, "1gbit,0.5ms")`` -> a ``Hosts`` of 3 namespaces on one switch, each link
1 Gbit/s with 0.5 ms of delay; ``popen(made[i])`` is what ``net_procs.Peer(popen=...)``
takes to run a learner in host ``i``. Everything the test made is removed when it ends,
whether it passed or not.

Where the machine cannot make them (no root, no iproute2, a kernel without namespaces),
the test fails with the reason when ``CI=true`` (CI runs as root, so the harness tests
must run there), and is skipped with the reason elsewhere.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from bench.hosts.netns import Host, Hosts, HostsUnavailable, Link
from helpers import track_pid


def unavailable(reason: str) -> None:
    """Fail on CI, skip elsewhere, naming why the hosts cannot be made."""
    message = f"cannot make hosts as network namespaces here: {reason}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " (CI=true: the harness tests must run on CI)")
    pytest.skip(message)


def popen(host: Host):
    """``Popen`` in ``host``, counted as this session's in the leak checks."""

    def start(argv: list[str], **kwargs) -> subprocess.Popen:
        proc = host.popen(argv, **kwargs)
        track_pid(proc.pid)
        return proc

    return start


@pytest.fixture
def hosts():
    """``hosts(count, link="0")`` -> a ``Hosts``, closed when the test ends."""
    made: list[Hosts] = []

    def make(count: int, link: str = "0") -> Hosts:
        try:
            made.append(Hosts(count, Link.parse(link)))
        except HostsUnavailable as e:
            unavailable(str(e))
        return made[-1]

    try:
        yield make
    finally:
        for h in made:
            h.close()
