"""Hosts on one machine with real links (``bench/hosts/netns.py``): the links do what they
are told, nothing outlives the harness, and a gradient group steps across them, loses a
host mid-step and goes on, and takes back a host whose cable was pulled and plugged in.

Each host is a network namespace on a bridge; its link has a rate (a token bucket) and
a delay (netem, or a netfilter queue where the kernel has no netem). The learners are
the accumulator tests' (``tests/helpers/net_peer.py``), one per host, each listening on its
host's address, the broker on host 0. Where the machine cannot make namespaces, these
tests fail on CI and are skipped elsewhere, with the reason (``tests/helpers/hosts.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import pid_alive, read_line, spawn_python, wait_until
from helpers.hosts import hosts, popen  # noqa: F401 (hosts is a fixture)
from helpers.net_procs import SLOW_FLAGS, Broker, Peer, assert_identical, kill_a_member_mid_reduction, procs  # noqa: F401 (procs is a fixture)

from bench.hosts.__main__ import core_shares, parse_args
from bench.hosts.netns import NAME, Hosts, Link, remove_stale

FAST_FLAGS = ("--settle", "0.3", "--heartbeat", "0.2", "--timeout", "1.5")
"""a broker that drops a member 1.5 s silent: a pulled cable shows within seconds"""


def _group(procs, made: Hosts, steps: int, *peer_args: str, flags=SLOW_FLAGS) -> list[Peer]:
    """A broker on host 0 and a learner on every host, once each took ``steps`` steps in
    the whole group (ended by the ``procs`` fixture)."""
    broker = Broker(host=made[0].ip, flags=flags, popen=popen(made[0]))
    procs.append(broker)
    peers = [Peer(broker.address, f"h{h.index}", "g", "--host", h.ip, *peer_args, popen=popen(h)) for h in made]
    procs.extend(peers)
    for p in peers:
        p.wait(lambda p: len(p.steps_with(len(made))) >= steps, 60, f"{steps} steps in a group of {len(made)}")
    return peers


@pytest.mark.parametrize(
    "text, link",
    [
        ("10gbit,50us", Link(10**10, 50e-6)),
        ("1gbit,0.5ms", Link(10**9, 0.5e-3)),
        ("100mbit", Link(10**8, 0.0)),
        ("0,2ms", Link(0, 2e-3)),
        ("0", Link()),
    ],
)
def test_a_link_is_written_as_tc_writes_rate_and_delay(text, link):
    assert Link.parse(text) == link
    assert Link.parse(str(link)) == link


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: Link.parse("fast"), "a link's rate is a number and one of bit, kbit, mbit, gbit"),
        (lambda: Link.parse("1gbit,5"), "a link's delay is a number and one of us, ms, s .* got '5'"),
        (lambda: Link.parse("1gbit,1ms,2"), "a link is RATE,DELAY such as 10gbit,50us"),
        (lambda: Link(-1), "a link's rate must be an int of bits per second >= 0, got -1"),
        (lambda: Link(0, 11.0), r"a link's delay must be a number of seconds in \[0, 10\], got 11.0"),
        (lambda: Hosts(0), r"count must be an int in \[1, 250\], got 0"),
        (lambda: Hosts(2, [Link()]), "link must be a Link or a list of 2 Links"),
    ],
)
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_link_delays_and_limits_what_crosses_it_and_a_cut_one_passes_nothing(hosts):
    """Lower bounds only, which load cannot break: a round trip takes at least twice the
    delay, and 4 MiB take at least their size over the rate (less the buckets' bursts)."""
    made = hosts(2, "100mbit,5ms")
    assert made.delay_by in ("netem", "nfqueue")
    seen = made.measure(0, 1, rounds=10, mib=4)
    assert seen["rtt_us"][0] >= 2 * 5000, f"a round trip took {seen['rtt_us'][0]:.0f} us over a 5 ms link"
    burst = 64 << 10  # each bucket's (100 Mbit/s is 12.5 KB a millisecond, below the 64 KiB floor)
    least = (4 * 2**20 - 2 * burst) * 8 / 1e8
    assert seen["seconds"] >= least, f"4 MiB crossed a 100 Mbit/s link in {seen['seconds']:.3f} s (< {least:.3f})"
    made[1].cut()
    probe = [sys.executable, "-c", f"import socket; socket.create_connection(('{made[1].ip}', 9), timeout=1)"]
    cut = subprocess.run(made[0].command(probe), capture_output=True, text=True, timeout=60)
    assert cut.returncode != 0 and ("timed out" in cut.stderr or "No route to host" in cut.stderr), (
        f"a cut link let a connection through or refused it: {cut.stderr}"
    )
    made[1].restore()

    def reached() -> bool:  # port 9 is closed: a refusal comes from host 1
        run = subprocess.run(made[0].command(probe), capture_output=True, text=True, timeout=60)
        return "ConnectionRefusedError" in run.stderr

    assert wait_until(reached, 30, interval=0.1), "host 1 was not reached again within 30 s of the restore"
    made.check()
    if made.delay_by == "nfqueue":  # a dead delayer is a dead link, never a fast one
        delayer = made._delayers[0]
        delayer.kill()
        delayer.wait(30)
        with pytest.raises(RuntimeError, match=f"the delayer of {made[0].namespace}'s link exited with -9"):
            made.check()
        dead = subprocess.run(made[0].command(probe), capture_output=True, text=True, timeout=60)
        assert "timed out" in dead.stderr, f"a link whose delayer is dead let a packet through: {dead.stderr}"


def test_the_janitor_removes_the_hosts_of_a_sigkilled_harness_and_what_ran_in_them(hosts):
    """The process left in a host is one the harness's death does not end by itself (a
    shell's child: PR_SET_PDEATHSIG is not inherited across fork)."""
    hosts(1)  # skips or fails here, with the reason, where namespaces cannot be made
    child = spawn_python(
        "import subprocess, time\n"
        "from bench.hosts.netns import Hosts, Link\n"
        "made = Hosts(2, Link.parse('0,1ms'))\n"
        "shell = made[1].popen(['sh', '-c', 'sleep 600 & echo $!; wait'], stdout=subprocess.PIPE, text=True)\n"
        "print(made.switch, *[h.namespace for h in made], shell.stdout.readline().strip(), flush=True)\n"
        "time.sleep(600)\n"
    )
    try:
        *names, orphan = read_line(child, timeout=60).split()
        assert all(NAME.match(n) for n in names), names
        assert pid_alive(int(orphan))
    finally:
        child.kill()
        child.wait(30)
    gone = wait_until(lambda: not set(names) & set(_namespaces()), 30, interval=0.05)
    assert gone, f"namespaces {set(names) & set(_namespaces())} outlived the SIGKILLed harness by 30 s"
    assert wait_until(lambda: not pid_alive(int(orphan)), 30), f"process {orphan}, left in a host, outlived it"


def test_a_later_harness_removes_what_a_harness_and_its_janitor_left_when_both_were_killed(hosts):
    hosts(1)  # skips or fails here, with the reason, where namespaces cannot be made
    child = spawn_python(
        "import time\n"
        "from bench.hosts.netns import Hosts, Link\n"
        "made = Hosts(2)\n"
        "print(made._janitor.pid, made.switch, *[h.namespace for h in made], flush=True)\n"
        "time.sleep(600)\n"
    )
    try:
        janitor, *names = read_line(child, timeout=60).split()
        os.kill(int(janitor), signal.SIGKILL)  # before its harness: it never reads end-of-file
    finally:
        child.kill()
        child.wait(30)
    remove_stale()
    assert not set(names) & set(_namespaces()), "a later harness left the namespaces of a dead one"


@pytest.mark.slow
def test_a_group_steps_over_links_and_a_host_killed_mid_step_leaves_the_others_going(procs, hosts):
    """Three hosts on 10 Gbit/s, 50 us links step together; then one is stopped, and killed
    once the others wait for it in a reduction. The learners' operations time out after
    600 s: the survivors go on within the hang guard because the dead host's connections
    closed, not because a timeout passed."""
    made = hosts(3, "10gbit,50us")
    peers = _group(procs, made, 5, "--width", "2048", "--op-timeout", "600")
    victim, survivors = peers[2], peers[:2]
    kill_a_member_mid_reduction(victim, survivors, made[2].kill)
    assert assert_identical(survivors, others=[victim]) >= 5
    made.check()


@pytest.mark.slow
def test_a_host_whose_cable_is_pulled_is_dropped_and_rejoins_level_when_it_is_plugged_back(procs, hosts):
    """On 1 Gbit/s, 0.5 ms links; the broker drops a member 1.5 s silent, and the learners give
    up a reduction after 3 s (the cut host waits on one it cannot finish)."""
    made = hosts(3, "1gbit,0.5ms")
    peers = _group(procs, made, 5, "--op-timeout", "3", flags=FAST_FLAGS)
    cut, others = peers[2], peers[:2]
    made[2].cut()
    pulled = time.monotonic()
    for p in others:
        p.wait(lambda p: len(p.steps_with(2, after=pulled)) >= 3, 60, "3 steps in a group of 2 without the cut host")
    left_at = max(s["version"] for p in others for s in p.steps)
    made[2].restore()
    plugged = time.monotonic()
    for p in peers:
        p.wait(lambda p: len(p.steps_with(3, after=plugged)) >= 3, 60, "3 steps in a group of 3 after the restore")
    for p in peers:
        p.finish()
    back = [s for s in cut.steps if s["t"] >= plugged]
    assert back[0]["version"] > left_at, "the host that came back did not receive the group's state"
    assert assert_identical(peers) >= 5
    made.check()


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--link", "1gbps"], "--link: a link's rate is a number and one of bit, kbit, mbit, gbit"),
        (["--hosts", "0"], "--hosts must be at least 1, got 0"),
        (["--", "--peers", "10.0.0.1:4431"], "--peers: bench.hosts sets it for every job"),
        (["--", "--out=runs/x"], "--out: bench.hosts sets it for every job"),
        (["--", "--member-seed", "5"], "one member seed would have every host play the same games"),
    ],
)
def test_the_bench_command_names_what_it_refuses(argv, match, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert match in capsys.readouterr().err


def test_the_bench_command_gives_each_host_its_own_cores():
    cores = sorted(os.sched_getaffinity(0))
    first, second = core_shares(2, "split")
    if len(cores) >= 2:
        assert first and second and not set(first) & set(second), (first, second)
    else:
        assert first == second == cores
    assert core_shares(3, "all") == [None, None, None]
    args, link, job = parse_args(["--link", "10gbit,50us", "--", "--compile", "off"])
    assert (args.hosts, link, job) == (2, Link(10**10, 50e-6), ["--compile", "off"])
