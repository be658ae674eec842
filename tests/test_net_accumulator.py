"""Learners averaging gradients across processes, moolib-style: every peer holds
bit-identical weights after every step, a joining peer receives the group's state
before it contributes, a peer SIGKILLed mid-reduction costs the others a few seconds,
and a restarted broker is rejoined.

Each peer is ``tests/net_peer.py`` in a process of its own; it prints a JSON line
per step with a hash of its parameters, buffers and optimiser state.
"""

from __future__ import annotations

import signal
import time

import pytest
import torch

from net_procs import Broker, Peer, assert_identical, procs  # noqa: F401 (procs is a fixture)
from netns import netns  # noqa: F401 (a fixture)
from shmpad.net import Accumulator


def test_peers_hold_identical_weights_and_a_joiner_receives_the_state(procs):
    broker = Broker()
    procs.append(broker)
    peers = [Peer(broker.address, f"p{i}") for i in range(3)]
    procs.extend(peers)
    for p in peers:
        p.wait(lambda p: len(p.steps_with(3)) >= 10, 60, "10 steps in a group of 3")
    late = Peer(broker.address, "late")
    procs.append(late)
    late.wait(lambda p: len(p.steps_with(4)) >= 5, 60, "5 steps in a group of 4")
    for p in peers:
        p.wait(lambda p: len(p.steps_with(4)) >= 5, 30, "5 steps in a group of 4")
    for p in [*peers, late]:
        p.finish()
    assert late.steps[0]["version"] > 10, "the joiner started from scratch instead of the group's state"
    assert assert_identical([*peers, late]) >= 15


def test_a_peer_killed_mid_reduction_costs_the_others_seconds(procs):
    broker = Broker()
    procs.append(broker)
    peers = [Peer(broker.address, f"k{i}", "g", "--width", "2048") for i in range(3)]
    procs.extend(peers)
    for p in peers:
        p.wait(lambda p: len(p.steps_with(3)) >= 5, 60, "5 steps in a group of 3")
    victim, survivors = peers[0], peers[1:]
    victim.proc.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    for p in survivors:  # a reduction that starts now cannot finish without the victim
        p.wait(lambda p: p.reduces and p.reduces[-1] > stopped, 30, "a reduction started after the stop")
    time.sleep(0.2)  # they are blocked in it, not merely entering it
    assert all(not p.steps or p.steps[-1]["t"] < stopped + 0.2 for p in survivors)
    victim.proc.kill()
    killed = time.monotonic()
    for p in survivors:
        p.wait(lambda p: len(p.steps_with(2, after=killed)) >= 3, 15, "3 steps in a group of 2 after the kill")
    recovery = max(p.steps_with(2, after=killed)[0]["t"] for p in survivors) - killed
    assert recovery < 10, f"the survivors took {recovery:.1f} s to go on"
    for p in survivors:
        p.finish()
    assert any(s["abandoned"] > 0 for p in survivors for s in p.steps), "no reduction was abandoned"
    assert_identical(survivors)


def test_peers_rejoin_a_restarted_broker_and_go_on(procs):
    broker = Broker()
    procs.append(broker)
    peers = [Peer(broker.address, f"r{i}") for i in range(2)]
    procs.extend(peers)
    for p in peers:
        p.wait(lambda p: len(p.steps_with(2)) >= 5, 60, "5 steps in a group of 2")
    old_key = peers[0].steps[-1]["key"].split("/")[0]
    broker.kill()
    broker = Broker(port=broker.port)
    procs.append(broker)
    for p in peers:
        p.wait(lambda p: any(s["key"].split("/")[0] != old_key for s in p.steps[-1:]) and len(
            [s for s in p.steps if s["key"].split("/")[0] != old_key]) >= 5, 30, "5 steps under the new broker")
    for p in peers:
        p.finish()
    assert_identical(peers)


def test_peers_on_separate_network_hosts_train_together(procs, netns):
    spaces = netns(3)
    broker = Broker(host=spaces[0].gateway)
    procs.append(broker)
    peers = [Peer(broker.address, f"h{i}", "g", "--host", ns.ip, popen=ns.popen) for i, ns in enumerate(spaces)]
    procs.extend(peers)
    for p in peers:
        p.wait(lambda p: len(p.steps_with(3)) >= 10, 60, "10 steps in a group of 3")
    for p in peers:
        p.finish()
    assert assert_identical(peers) >= 10


def test_a_stalled_peer_is_dropped_and_rejoins_level_with_the_group(procs):
    broker = Broker()  # drops a silent member after 5 s
    procs.append(broker)
    peers = [Peer(broker.address, f"s{i}") for i in range(3)]
    procs.extend(peers)
    for p in peers:
        p.wait(lambda p: len(p.steps_with(3)) >= 5, 60, "5 steps in a group of 3")
    stalled, others = peers[0], peers[1:]
    stalled.proc.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    for p in others:
        p.wait(lambda p: len(p.steps_with(2, after=stopped)) >= 3, 30, "3 steps in a group of 2 without the stalled peer")
    resumed = time.monotonic()
    stalled.proc.send_signal(signal.SIGCONT)
    for p in peers:
        p.wait(lambda p: len(p.steps_with(3, after=resumed)) >= 3, 60, "3 steps in a group of 3 after the stall")
    for p in peers:
        p.finish()
    assert assert_identical(peers) >= 5


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"host": "0.0.0.0"}, "host '0.0.0.0' is where the other peers connect"),
        ({"min_size": 0}, "min_size must be an int >= 1, got 0"),
        ({"virtual_batch_size": -1}, "virtual_batch_size must be an int >= 0, got -1"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Accumulator(torch.nn.Linear(2, 2), broker="127.0.0.1:1", token="t", **kwargs)
