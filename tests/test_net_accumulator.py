"""Learners averaging gradients across processes, moolib-style: peers that took the same
steps hold bit-identical state, every member holds the leader's after every sync and a
step the group did not keep is counted (``assert_identical``), a joining peer receives
the group's state before it contributes, a peer SIGKILLed mid-reduction costs the others a few seconds,
and a restarted broker is rejoined.

Each peer is ``tests/helpers/net_peer.py`` in a process of its own; it prints a JSON line
per step with a hash of its parameters, buffers and optimiser state. The guarantees
are tested for both data planes: the shmpad ring and a gloo process group per epoch.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
import torch
from helpers import track_pid, wait_until
from helpers.net_procs import Broker as BrokerProcess
from helpers.net_procs import Peer, assert_identical, kill_a_member_mid_reduction, procs  # noqa: F401 (procs is a fixture)
from helpers.netns import netns  # noqa: F401 (a fixture)

from shmpad.net import Accumulator, Broker
from shmpad.net.accumulator import _next_lineage
from shmpad.net.envcluster import from_env
from shmpad.net.torchgroup import AUTO_GLOO_FROM, ask, decide

PLANES = ["shmpad", pytest.param("gloo", marks=pytest.mark.slow)]


def _group(
    procs, prefix: str, size: int, steps: int, *peer_args: str, broker: BrokerProcess | None = None
) -> tuple[BrokerProcess, list[Peer]]:
    """A broker (``broker``, or one that drops a silent member after 5 s) and ``size``
    peers named ``<prefix><i>`` (ended by the ``procs`` fixture), once each has taken
    ``steps`` steps in a group of ``size``."""
    if broker is None:
        broker = BrokerProcess()
    procs.append(broker)
    peers = [Peer(broker.address, f"{prefix}{i}", *peer_args) for i in range(size)]
    procs.extend(peers)
    for p in peers:
        p.wait(lambda p: len(p.steps_with(size)) >= steps, 60, f"{steps} steps in a group of {size}")
    return broker, peers


def assert_plane(peers: list[Peer], backend: str) -> None:
    planes = {s["plane"] for p in peers for s in p.steps}
    assert planes == {backend}, f"the steps went over {planes}, not {backend!r} alone"


@pytest.mark.parametrize("backend", PLANES)
def test_peers_hold_identical_weights_and_a_joiner_receives_the_state(procs, backend):
    broker, peers = _group(procs, "p", 3, 10, "g", "--backend", backend)
    late = Peer(broker.address, "late", "g", "--backend", backend)
    procs.append(late)
    late.wait(lambda p: len(p.steps_with(4)) >= 5, 60, "5 steps in a group of 4")
    for p in peers:
        p.wait(lambda p: len(p.steps_with(4)) >= 5, 30, "5 steps in a group of 4")
    for p in [*peers, late]:
        p.finish()
    assert late.steps[0]["version"] > 10, "the joiner started from scratch instead of the group's state"
    assert assert_identical([*peers, late]) >= 15
    assert_plane([*peers, late], backend)


@pytest.mark.parametrize("backend", PLANES)
def test_a_peer_killed_mid_reduction_costs_the_others_seconds(procs, backend):
    """The peers' operations time out after 600 s, so going on within the 60 s hang guard
    shows the survivors learned of the kill from its closed connections, not from a timeout."""
    broker, peers = _group(procs, "k", 3, 5, "g", "--width", "2048", "--backend", backend, "--op-timeout", "600")
    victim, survivors = peers[0], peers[1:]
    kill_a_member_mid_reduction(victim, survivors, victim.proc.kill)
    assert_identical(survivors, others=[victim])
    assert_plane(survivors, backend)


@pytest.mark.parametrize("backend", PLANES)
def test_peers_rejoin_a_restarted_broker_and_go_on(procs, backend):
    broker, peers = _group(procs, "r", 2, 5, "g", "--backend", backend)
    old_key = peers[0].steps[-1]["key"].split("/")[0]
    broker.kill()
    broker = BrokerProcess(port=broker.port)
    procs.append(broker)
    for p in peers:
        p.wait(
            lambda p: (
                any(s["key"].split("/")[0] != old_key for s in p.steps[-1:])
                and len([s for s in p.steps if s["key"].split("/")[0] != old_key]) >= 5
            ),
            30,
            "5 steps under the new broker",
        )
    for p in peers:
        p.finish()
    assert_identical(peers)
    assert_plane(peers, backend)


@pytest.mark.parametrize("backend", PLANES)
def test_peers_on_separate_network_hosts_train_together(procs, netns, backend):
    spaces = netns(3)
    broker = BrokerProcess(host=spaces[0].gateway)
    procs.append(broker)
    peers = [
        Peer(broker.address, f"h{i}", "g", "--host", ns.ip, "--backend", backend, popen=ns.popen)
        for i, ns in enumerate(spaces)
    ]
    procs.extend(peers)
    for p in peers:
        p.wait(lambda p: len(p.steps_with(3)) >= 10, 60, "10 steps in a group of 3")
    for p in peers:
        p.finish()
    assert assert_identical(peers) >= 10
    assert_plane(peers, backend)


@pytest.mark.parametrize("backend", PLANES)
def test_a_stalled_peer_is_dropped_and_rejoins_level_with_the_group(procs, backend):
    """For gloo, the case that needs the commit on the ring: the stalled peer's
    reduction can still complete after the others gave it up."""
    broker, peers = _group(procs, "s", 3, 5, "g", "--backend", backend)  # drops a silent member after 5 s
    stalled, others = peers[0], peers[1:]
    stalled.proc.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    for p in others:
        p.wait(
            lambda p: len(p.steps_with(2, after=stopped)) >= 3, 30, "3 steps in a group of 2 without the stalled peer"
        )
    resumed = time.monotonic()
    stalled.proc.send_signal(signal.SIGCONT)
    for p in peers:
        p.wait(lambda p: len(p.steps_with(3, after=resumed)) >= 3, 60, "3 steps in a group of 3 after the stall")
    for p in peers:
        p.finish()
    assert assert_identical(peers) >= 5
    assert_plane(peers, backend)


@pytest.mark.parametrize("backend", PLANES)
def test_a_hung_member_is_dropped_and_its_stale_gradients_are_refused_when_it_wakes(procs, backend):
    """Under the command line's defaults. The hung member computes its gradients before
    ``ready()``: when it wakes, the sync that brings it level leaves it holding gradients
    of weights the group has left, which must be refused, never averaged in."""
    broker = BrokerProcess(flags=())
    _, peers = _group(procs, "h", 3, 5, "g", "--backend", backend, broker=broker)
    sleeper = Peer(broker.address, "hz", "g", "--backend", backend, "--grads-before-ready")
    procs.append(sleeper)
    for p in [*peers, sleeper]:
        p.wait(lambda p: len(p.steps_with(4)) >= 3, 60, "3 steps in a group of 4")
    sleeper.proc.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    for p in peers:  # the others go on without it: a list of 3 formed and stepped (60 s: a hang guard only)
        p.wait(lambda p: len(p.steps_with(3, after=stopped)) >= 3, 60, "3 steps in a group of 3 without the hung one")
    left_at = max(s["version"] for p in peers for s in p.steps)
    resumed = time.monotonic()
    sleeper.proc.send_signal(signal.SIGCONT)
    for p in [*peers, sleeper]:
        p.wait(lambda p: len(p.steps_with(4, after=resumed)) >= 3, 60, "3 steps in a group of 4 after the wake-up")
    for p in [*peers, sleeper]:
        p.finish()
    back = [s for s in sleeper.steps if s["t"] >= resumed]
    assert back[0]["version"] > left_at, "the woken member did not receive the group's state"
    stale = [s for p in [*peers, sleeper] for s in p.steps if s["contributed"] and s["computed_at"] != s["version"] - 1]
    assert not stale, f"gradients of another version were averaged in: {stale[:3]}"
    assert back[-1]["refused"] >= 1, "the woken member's stale gradients were not refused"
    assert assert_identical([*peers, sleeper]) >= 10
    assert_plane([*peers, sleeper], backend)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"host": "0.0.0.0"}, "host '0.0.0.0' is where the other peers connect"),
        ({"min_size": 0}, "min_size must be an int >= 1, got 0"),
        ({"virtual_batch_size": -1}, "virtual_batch_size must be an int >= 0, got -1"),
        ({"backend": "mpi"}, "backend must be one of 'shmpad', 'gloo', 'nccl', 'auto', got 'mpi'"),
        ({"backend": "nccl"}, "backend 'nccl' needs CUDA parameters and a torch build with NCCL"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Accumulator(torch.nn.Linear(2, 2), broker="127.0.0.1:1", token="t", **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"check_every": 1.5}, "check_every must be an int, got float"),
        ({"min_size": "2"}, "min_size must be an int, got str"),
        ({"virtual_batch_size": True}, "virtual_batch_size must be an int, got bool"),
    ],
)
def test_arguments_of_a_wrong_type_are_type_errors(kwargs, match):
    with pytest.raises(TypeError, match=match):
        Accumulator(torch.nn.Linear(2, 2), broker="127.0.0.1:1", token="t", **kwargs)


def test_a_batch_size_of_a_wrong_type_is_a_type_error_before_anything_is_reduced():
    unjoined = object.__new__(Accumulator)  # the check comes first: no group is needed to see it
    with pytest.raises(TypeError, match="batch_size must be an int, got float"):
        unjoined.reduce_gradients(8.0)
    with pytest.raises(ValueError, match="batch_size must be an int >= 0, got -1"):
        unjoined.reduce_gradients(-1)
    with pytest.raises(TypeError, match="extra must be a floating-point tensor, got list"):
        unjoined.reduce_gradients(8, [0.5])
    with pytest.raises(TypeError, match="extra must be a floating-point tensor, got a torch.int64 tensor"):
        unjoined.reduce_gradients(8, torch.tensor([1]))
    with pytest.raises(TypeError, match="values must be a numpy array, got list"):
        unjoined.reduce_values([1.0])


def run_peers(bodies, prepare=None, **kwargs) -> list:
    """Run each ``body(acc)`` in a thread with an Accumulator of its own (two-weight
    linear models, identical after the first sync) in one group of an in-process broker;
    ``prepare(i, acc)`` first, before the first ``ready()``."""
    results: list = [None] * len(bodies)
    errors: list = []
    with Broker(port=0, token="t", settle_s=0.1, heartbeat_s=0.2, timeout_s=2.0) as broker:

        def peer(i, body):
            model = torch.nn.Linear(2, 1, bias=False)
            acc = Accumulator(
                model, broker=broker.address, group="g", name=f"t{i}", token="t", min_size=len(bodies), **kwargs
            )
            try:
                if prepare is not None:
                    prepare(i, acc)
                assert acc.ready(timeout=30)
                results[i] = body(acc, model)
            except BaseException as e:  # reported by the test's thread
                errors.append(e)
            finally:
                acc.close()

        threads = [threading.Thread(target=peer, args=(i, b)) for i, b in enumerate(bodies)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a peer did not finish"
    if errors:
        raise errors[0]
    return results


def set_grad(model, values) -> None:
    model.weight.grad = torch.tensor([values], dtype=torch.float32)


def test_gradients_are_averaged_over_the_peers_that_contributed():
    def contributes(acc, model):
        set_grad(model, [3.0, 6.0])
        return acc.reduce_gradients(8), model.weight.grad.tolist(), acc.version

    def skips(acc, model):
        return acc.skip_gradients(), model.weight.grad.tolist() if model.weight.grad is not None else None, acc.version

    a, b, c = run_peers([contributes, contributes, skips])
    assert a == b == (True, [[3.0, 6.0]], 1)  # (3 + 3 + 0) / 2 contributions, not / 3 peers
    assert c[0] is True and c[2] == 1


@pytest.mark.parametrize("backend", ["shmpad", "gloo"])
def test_extra_values_are_averaged_with_the_gradients_over_the_members_that_contributed(backend):
    def contributes(acc, model):
        set_grad(model, [3.0, 6.0])
        extra = torch.tensor([1.0 + int(acc.name[1:]), 10.0])  # t0: 1, t1: 2
        return acc.reduce_gradients(8, extra), extra.tolist(), model.weight.grad.tolist()

    def skips(acc, model):
        extra = torch.tensor([100.0, 100.0])
        return acc.skip_gradients(extra), extra.tolist(), model.weight.grad.tolist()

    a, b, c = run_peers([contributes, contributes, skips], backend=backend)
    assert a == b == c == (True, [1.5, 10.0], [[3.0, 6.0]])


@pytest.mark.parametrize("backend", ["shmpad", "gloo"])
def test_values_are_summed_over_the_group_whatever_the_data_plane(backend):
    def body(acc, model):
        values = np.array([1.0 + 2.0**-40 * (1 + int(acc.name[1:])), 2.0])  # float64: beyond float32's reach
        summed = acc.reduce_values(values)
        set_grad(model, [1.0, 1.0])
        return summed, values.tolist(), acc.reduce_gradients(8), acc.plane

    results = run_peers([body, body, body], backend=backend)
    assert results == [(True, [3.0 + 6 * 2.0**-40, 6.0], True, backend)] * 3


def test_a_virtual_batch_steps_once_enough_samples_were_summed():
    def body(acc, model):
        out = []
        for g in ([1.0, 2.0], [3.0, 4.0]):
            set_grad(model, g)
            out.append(acc.reduce_gradients(8))
        return out, model.weight.grad.tolist(), acc.version

    a, b = run_peers([body, body], virtual_batch_size=32)
    # 2 peers x 8 = 16 samples per reduction: the second reaches 32; mean of 4 contributions
    assert a == b == ([False, True], [[2.0, 3.0]], 1)


def test_a_group_change_while_a_ring_forms_is_not_waited_out():
    """a forms the ring of {a, b} while b is busy elsewhere; c joins. a must move on
    to {a, b, c} at once, not wait out its 600 s timeout for a ring b will never form."""
    with Broker(port=0, token="t", settle_s=0.1, heartbeat_s=0.2, timeout_s=2.0) as broker:

        def make(name: str) -> Accumulator:
            return Accumulator(
                torch.nn.Linear(2, 1), broker=broker.address, group="g", name=name, token="t", op_timeout=600.0
            )

        a, b = make("a"), make("b")
        try:
            ready: dict = {}
            thread_a = threading.Thread(target=lambda: ready.update(a=a.ready(timeout=60)))
            thread_a.start()
            forming_ab = lambda: a._forming is not None and len(a._group.membership().members) == 2  # noqa: E731
            assert wait_until(forming_ab, 60), "a never started forming the ring of {a, b}"
            c = make("c")
            thread_c = threading.Thread(target=lambda: ready.update(c=c.ready(timeout=60)))
            thread_c.start()
            assert wait_until(lambda: b._group.membership() is not None and len(b._group.membership().members) == 3, 60)
            ready["b"] = b.ready(timeout=60)  # b comes back from its busy spell
            thread_a.join(60)
            thread_c.join(60)
            # ready within its 60 s, not after the 600 s op_timeout: a moved on without waiting it out
            assert ready == {"a": True, "b": True, "c": True}
            assert a.size == b.size == c.size == 3
        finally:
            for acc in (a, b):
                acc.close()
            if "c" in locals():
                c.close()


def _as_if_stepped(acc: Accumulator, lineages: list[str]) -> None:
    """Give ``acc`` the version and lineage of steps taken in the epochs ``lineages`` names."""
    for key in lineages:
        acc._advance(key)


def _after_sync(acc, model):
    return acc.version, acc.lineage, acc.discarded, model.weight.detach().clone()


def _lineage_of(history: list[str]) -> int:
    lineage = 0
    for key in history:
        lineage = _next_lineage(lineage, key)
    return lineage


@pytest.mark.parametrize(
    "histories, lost",
    [
        # t1 completed a step the group abandoned, then the others took version 3 without it
        # (a tie: the lower rank leads, so either may be the one whose step goes)
        ([["e1", "e2", "e3"], ["e1", "e2", "e2b"]], 1),
        # the same, found by a leader that has gone two steps further since
        ([["e1", "e2", "e3", "e4", "e5"], ["e1", "e2", "e2b"]], 1),
        # t1 took two steps alone from version 1 (a ring of one): both are lost, and counted
        ([["e1", "e2", "e3", "e4", "e5"], ["e1", "e2b", "e3b"]], 2),
        # t0 is the one behind, on a lineage of its own since version 1: versions 2-4 are lost
        ([["e1", "e2b", "e3b", "e4b"], ["e1", "e2", "e3", "e4", "e5"]], 3),
        # t1 is only behind, on the leader's own history: nothing of it was lost
        ([["e1", "e2", "e3", "e4"], ["e1", "e2"]], 0),
        # t1 comes with nothing: a joiner
        ([["e1", "e2"], []], 0),
    ],
)
def test_a_step_the_group_did_not_keep_is_replaced_and_counted(histories, lost):
    """The sync's leader (the highest version, then the lowest rank) tells each member
    whether its last step is one the leader's history lacks: that member counts in
    ``discarded`` every version it held on another lineage (the versions forked);
    afterwards every member is on the leader's version and lineage."""
    results = run_peers([_after_sync, _after_sync], prepare=lambda i, acc: _as_if_stepped(acc, histories[i]))
    (v0, l0, d0, w0), (v1, l1, d1, w1) = results
    assert v0 == v1 == max(len(h) for h in histories) and l0 == l1 and torch.equal(w0, w1)
    assert d0 + d1 == lost
    kept = [h for h, d in zip(histories, (d0, d1)) if d == 0 and len(h) == v0]
    assert l0 in [_lineage_of(h) for h in kept], "the group is not on the history of a member that kept its steps"


def _ready_together(*accs: Accumulator) -> None:
    """``accs`` ready in one ring of exactly them (once the group's list names them all)."""
    names = {acc.name for acc in accs}

    def together(acc: Accumulator) -> bool:
        listed = acc._group.membership()
        return listed is not None and set(listed.names) == names and acc.ready(timeout=1) and acc.size == len(accs)

    threads = [threading.Thread(target=wait_until, args=(lambda acc=acc: together(acc), 60)) for acc in accs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert [acc.size for acc in accs] == [len(accs)] * len(accs)


def test_a_leader_synced_since_the_fork_still_finds_it():
    """A member's history is the group's, handed over at each sync: b, synced from a,
    finds that c's version 2 is not the group's, though b never took that step itself."""
    with Broker(port=0, token="t", settle_s=0.1, heartbeat_s=0.2, timeout_s=2.0) as broker:
        made: list[Accumulator] = []

        def make(name: str, history: list[str]) -> Accumulator:
            acc = Accumulator(torch.nn.Linear(2, 1), broker=broker.address, group="g", name=name, token="t")
            made.append(acc)
            _as_if_stepped(acc, history)
            return acc

        try:
            a, b = make("a", ["e1", "e2", "e3"]), make("b", [])
            _ready_together(a, b)
            assert (b.version, b.lineage, b.discarded) == (3, a.lineage, 0)
            a.close()
            c = make("c", ["e1", "e2b"])  # a step to version 2 that the group did not take
            _ready_together(b, c)
            assert (c.version, c.lineage, c.discarded, b.discarded) == (3, b.lineage, 1, 0)
        finally:
            for acc in made:
                acc.close()


def test_weights_that_drift_apart_are_found_and_resynced():
    """Steps keep the weights bit-identical only if every peer computes them the same
    way; the periodic digest check finds a peer that drifted and brings it back."""

    def body(acc, model):
        for i in range(3):
            set_grad(model, [1.0, 1.0])
            assert acc.reduce_gradients(8)
            if i == 0 and acc.name == "t1":
                with torch.no_grad():
                    model.weight += 0.5  # as a different device's arithmetic might, only far more
        return model.weight.detach().clone(), acc.diverged, acc.version

    (w0, d0, v0), (w1, d1, v1) = run_peers([body, body], check_every=1)
    assert torch.equal(w0, w1) and d0 == d1 == 1 and v0 == v1 == 3


@pytest.mark.parametrize(
    "everyone, plane",
    [
        ([("auto", False)] * 2, "shmpad"),
        ([("auto", False)] * (AUTO_GLOO_FROM - 1), "shmpad"),
        ([("auto", False)] * AUTO_GLOO_FROM, "gloo"),
        ([("auto", False), ("gloo", False)], "gloo"),
        ([("shmpad", False)] * AUTO_GLOO_FROM, "shmpad"),
        ([("auto", True)] * 2, "nccl"),
        ([("auto", False), ("auto", True)], "shmpad"),  # NCCL only if every member can run it
    ],
)
def test_the_members_agree_on_the_data_plane(everyone, plane):
    assert decide([ask(backend, nccl) for backend, nccl in everyone], "b/1") == plane


def test_a_member_that_cannot_run_nccl_is_named_when_another_asks_for_it():
    with pytest.raises(ValueError, match="asked for 'nccl', but rank 1 cannot run it"):
        decide([ask("nccl", True), ask("auto", False)], "b/1")


def test_members_on_one_gpu_never_get_nccl():
    """NCCL refuses a group with two members on one GPU ("Duplicate GPU detected", seen on
    a one-GPU box): auto falls back to the CPU planes, and an ask for NCCL names the ranks."""
    both = [ask("auto", True)] * 3
    assert decide(both, "b/1", [11, 22, 33]) == "nccl"
    assert decide(both, "b/1", [11, 22, 11]) == "shmpad"
    with pytest.raises(ValueError, match=r"ranks 0 and 2 train on the same GPU, which NCCL refuses"):
        decide([ask("nccl", True)] * 3, "b/1", [11, 22, 11])
    assert decide([ask("nccl", True)] * 2, "b/1", [11, 22]) == "nccl"


def test_auto_picks_the_ring_for_small_groups_and_gloo_from_four():
    def body(acc, model):
        set_grad(model, [1.0, 2.0])
        return acc.plane, acc.reduce_gradients(8), model.weight.grad.tolist()

    assert run_peers([body] * 2, backend="auto") == [("shmpad", True, [[1.0, 2.0]])] * 2
    assert run_peers([body] * AUTO_GLOO_FROM, backend="auto") == [("gloo", True, [[1.0, 2.0]])] * AUTO_GLOO_FROM


def test_peers_that_ask_for_different_backends_are_told_so_by_ready():
    with Broker(port=0, token="t", settle_s=0.1, heartbeat_s=0.2, timeout_s=2.0) as broker:
        accs = [
            Accumulator(
                torch.nn.Linear(2, 1), broker=broker.address, group="g", name=n, token="t", min_size=2, backend=b
            )
            for n, b in (("a", "gloo"), ("b", "shmpad"))
        ]
        errors: dict = {}

        def ready(acc):
            try:
                acc.ready(timeout=30)
            except ValueError as e:
                errors[acc.name] = str(e)

        try:
            threads = [threading.Thread(target=ready, args=(acc,)) for acc in accs]
            for t in threads:
                t.start()
            for t in threads:
                t.join(40)
            assert set(errors) == {"a", "b"}, f"ready() raised on {sorted(errors)} only"
            assert all("asked for different backends" in e for e in errors.values())
            assert all(acc.size == 0 for acc in accs), "a ring was kept after the disagreement"
        finally:
            for acc in accs:
                acc.close()


def test_members_that_ask_for_different_backends_are_told_so():
    asks = [ask("gloo", False), ask("auto", False), ask("shmpad", False)]
    with pytest.raises(
        ValueError, match=r"asked for different backends \(rank 0: 'gloo', rank 1: 'auto', rank 2: 'shmpad'\)"
    ):
        decide(asks, "b/1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_cluster_peer(port: int, rank: int, size: int):
    """A ``Peer`` popen that starts ``tests/helpers/net_peer.py`` as rank ``rank`` of a torchrun-style cluster."""

    def popen(args, env, **pipes):
        cluster = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(size)}
        proc = subprocess.Popen(args, env={**env, **cluster}, start_new_session=True, **pipes)
        track_pid(proc.pid)
        return proc

    return popen


@pytest.mark.slow
def test_a_torchrun_style_cluster_from_the_environment_trains_together(procs):
    port = free_port()
    peers = [Peer("env://", f"rank{r}", "g", popen=env_cluster_peer(port, r, 3)) for r in (2, 1, 0)]
    procs.extend(peers)
    for p in peers:
        p.wait(lambda p: len(p.steps_with(3)) >= 5, 60, "5 steps in a group of 3")
    leaving = time.monotonic()  # from here on the ranks leave one by one, and the rest go on
    for p in peers:
        p.finish()
    assert assert_identical(peers) >= 5
    early = [s for p in peers for s in p.steps if s["size"] != 3 and s["t"] < leaving]
    assert not early, f"steps taken before all 3 ranks were in: {early[:3]}"


@pytest.mark.parametrize(
    "environ, match",
    [
        ({}, "env:// needs MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE set; missing: MASTER_ADDR, MASTER_PORT"),
        (
            {"MASTER_ADDR": "h", "MASTER_PORT": "x", "RANK": "0", "WORLD_SIZE": "2"},
            "MASTER_PORT must be an integer, got 'x'",
        ),
        (
            {"MASTER_ADDR": "h", "MASTER_PORT": "1", "RANK": "2", "WORLD_SIZE": "2"},
            "RANK must be in 0..1 for WORLD_SIZE 2, got 2",
        ),
        (
            {"MASTER_ADDR": "h", "MASTER_PORT": "0", "RANK": "0", "WORLD_SIZE": "2"},
            "MASTER_PORT must be in 1..65535, got 0",
        ),
    ],
)
def test_a_bad_cluster_environment_is_named(environ, match):
    env = {"RANK": "0", "WORLD_SIZE": "2"} if not environ else environ
    with pytest.raises(ValueError, match=match):
        from_env(env)
