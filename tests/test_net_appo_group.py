"""APPO in a group of learners (``Learner.join_group``): every minibatch step is one
reduction of the members' gradients, and what steers the steps is the group's.

- In one process (a thread per member, an in-process broker), members with batches of
  their own take one batch: they end bit-identical (weights, input and value statistics,
  optimiser state, KL-adapted factor), every member observed the same KL at each step, and
  all of it matches, to float rounding, one learner trained on the members' batches side by
  side with minibatches that are the unions of theirs (fixed orders).
- In processes (``tests/helpers/net_peer.py --algo appo``): a member that stops mid-batch and
  is SIGKILLed leaves the others going, a member that joins later receives the group's state,
  the members stay at the same minibatch of their batches at every step, and
  ``assert_identical`` holds.
- The job: two ``python -m bench.impala --algo appo --normalize-input --peers ...`` runs on
  CartPole end with the same weights, input statistics and adapted rate.
"""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch
from helpers import appo_group
from helpers.net_procs import ROOT, TOKEN, Peer, assert_identical, procs, run_group_jobs  # noqa: F401 (procs is a fixture)
from helpers.net_procs import Broker as BrokerProcess

from learners.schedule import KLAdaptive
from shmpad.net import Broker

PLANES = ["shmpad", pytest.param("gloo", marks=pytest.mark.slow)]


@pytest.fixture
def observed(monkeypatch):
    """Every KL that any learner's ``KLAdaptive`` observes, by the schedule's id."""
    seen: dict[int, list[float]] = {}
    observe = KLAdaptive.observe

    def recording(self, kl, *args):
        seen.setdefault(id(self), []).append(kl)
        return observe(self, kl, *args)

    monkeypatch.setattr(KLAdaptive, "observe", recording)
    return seen


def _one_batch_in_a_group(size: int, backend: str, base: torch.nn.Module) -> list:
    """``size`` members, each from ``base``'s weights, train one batch of their own (member
    ``i``: ``appo_group.batch(i)``, minibatch orders ``appo_group.orders(i)``) in one group."""
    results: list = [None] * size
    errors: list = []
    with Broker(port=0, token="t", settle_s=0.1, heartbeat_s=0.2, timeout_s=2.0) as broker:

        def member(i: int) -> None:
            try:
                learner = appo_group.learner(copy.deepcopy(base), appo_group.config())
                learner.appo.orders = lambda columns: appo_group.orders(i)
                learner.join_group(broker.address, "g", name=f"m{i}", token="t", min_size=size, backend=backend)
                try:
                    assert learner.accumulator.ready(timeout=60)
                    assert learner.update(appo_group.batch(i)) is not None, "the batch was cut short"
                    results[i] = learner, learner.accumulator.plane
                finally:
                    learner.accumulator.close()
            except BaseException as e:  # reported by the test's thread
                errors.append(e)

        threads = [threading.Thread(target=member, args=(i,)) for i in range(size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a member did not finish"
    if errors:
        raise errors[0]
    return results


def _state(learner) -> dict[str, torch.Tensor]:
    """The model (weights and statistics) and the optimiser's state, by name."""
    optimizer = learner.optimizer.state_dict()["state"]
    return {
        **learner.model.state_dict(),
        **{f"optimizer.{i}.{k}": v for i, s in optimizer.items() for k, v in s.items() if torch.is_tensor(v)},
    }


@pytest.mark.parametrize("backend", ["shmpad", "gloo"])
@pytest.mark.parametrize("size", [2, 3])
def test_a_group_takes_the_steps_of_one_learner_on_the_union_of_its_batches(size, backend, observed):
    base = appo_group.model()
    members, planes = zip(*_one_batch_in_a_group(size, backend, base))
    steps = appo_group.EPOCHS * appo_group.MINIBATCHES
    assert [m.accumulator.version for m in members] == [steps] * size
    assert set(planes) == {backend}
    first = _state(members[0])
    for m in members[1:]:
        state = _state(m)
        for name, value in first.items():
            assert torch.equal(state[name], value), f"members differ in {name}"
        assert m.schedule.factor == members[0].schedule.factor
        assert observed[id(m.schedule)] == observed[id(members[0].schedule)], "the members observed other KLs"
    assert len(observed[id(members[0].schedule)]) == steps

    union = {k: torch.cat([appo_group.batch(i)[k] for i in range(size)], dim=1) for k in appo_group.batch(0)}
    one = appo_group.learner(copy.deepcopy(base), appo_group.config(batch_size=size * appo_group.B))
    one.appo.orders = lambda columns: appo_group.union_orders([appo_group.orders(i) for i in range(size)])
    one.update(union)
    for name, value in _state(one).items():
        torch.testing.assert_close(first[name], value, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
    assert int(first["torso.obs_norm.count"]) == size * appo_group.B * appo_group.T  # every member's inputs
    torch.testing.assert_close(observed[id(members[0].schedule)], observed[id(one.schedule)], rtol=1e-4, atol=1e-7)
    assert members[0].schedule.factor == one.schedule.factor != 1.0


def test_the_reference_is_not_what_one_member_alone_would_take(observed):
    """The union learner above is a reference that tells a group from its members: one member
    training alone on its own batch ends elsewhere (weights, statistics, KLs)."""
    base = appo_group.model()
    alone = appo_group.learner(copy.deepcopy(base), appo_group.config())
    alone.appo.orders = lambda columns: appo_group.orders(0)
    alone.update(appo_group.batch(0))
    union = {k: torch.cat([appo_group.batch(i)[k] for i in range(2)], dim=1) for k in appo_group.batch(0)}
    one = appo_group.learner(copy.deepcopy(base), appo_group.config(batch_size=2 * appo_group.B))
    one.appo.orders = lambda columns: appo_group.union_orders([appo_group.orders(i) for i in range(2)])
    one.update(union)
    for name in ("torso.layers.0.weight", "torso.obs_norm.mean", "value_norm.var"):
        assert not torch.allclose(_state(alone)[name], _state(one)[name], rtol=1e-3, atol=1e-5), name
    assert observed[id(alone.schedule)][1:] != pytest.approx(observed[id(one.schedule)][1:], rel=1e-3)


@pytest.mark.parametrize("backend", PLANES)
def test_a_member_killed_mid_batch_leaves_the_group_going_and_a_joiner_takes_its_state(procs, backend):
    steps = appo_group.EPOCHS * appo_group.MINIBATCHES
    broker = BrokerProcess()
    procs.append(broker)
    common = ("--algo", "appo", "--backend", backend, "--pace", "0")
    victim = Peer(broker.address, "victim", "g", *common, "--min-size", "3", "--stop-after", str(steps + 2))
    survivors = [Peer(broker.address, f"s{i}", "g", *common, "--min-size", "3") for i in range(2)]
    late = Peer(broker.address, "late", "g", *common, "--join-on-cue")
    procs.extend([victim, *survivors, late])
    victim.wait(lambda p: len(p.steps) >= steps + 2, 90, f"{steps + 2} steps")
    assert victim.steps[-1]["minibatch"] == 1 and victim.steps[-1]["size"] == 3  # stopped in its second batch
    victim.kill()
    killed = time.monotonic()
    for p in survivors:
        p.wait(lambda p: len(p.steps_with(2, after=killed)) >= 2 * steps, 60, "2 batches in a group of 2")
    late.proc.stdin.write("join\n")
    late.proc.stdin.flush()
    joined = time.monotonic()
    for p in [*survivors, late]:
        p.wait(lambda p: len(p.steps_with(3, after=joined)) >= 2 * steps, 60, "2 batches in a group of 3")
    for p in [*survivors, late]:
        p.finish()

    assert any(s["abandoned"] > 0 for p in survivors for s in p.steps), "no reduction was abandoned"
    assert late.steps[0]["version"] > 3 * steps, "the joiner started from scratch instead of the group's state"
    assert assert_identical([*survivors, late], others=[victim]) >= 4 * steps
    at: dict[tuple[int, int], set[int]] = {}
    for p in [victim, *survivors, late]:
        for s in p.steps:
            at.setdefault((s["version"], s["lineage"]), set()).add(s["minibatch"])
    out_of_step = {state: minibatches for state, minibatches in at.items() if len(minibatches) > 1}
    assert not out_of_step, f"members took one step at different minibatches of their batches: {out_of_step}"
    for p in [*survivors, late]:  # after the join every batch ran from its first minibatch to its last
        after = [s["minibatch"] for s in p.steps_with(3, after=joined)]
        assert after[: 2 * steps] == list(range(steps)) * 2, f"{p.name}: {after}"
    assert {s["plane"] for p in [*survivors, late] for s in p.steps} == {backend}


@pytest.mark.slow
def test_two_hosts_of_the_job_train_one_model_with_appo(tmp_path, procs):
    broker = BrokerProcess()
    procs.append(broker)
    argvs = []
    for i in range(2):
        args = ["--env", "CartPole-v1", "--model", "mlp", "--total-frames", "10000", "--num-workers", "1"]
        args += ["--envs-per-worker", "8", "--batch-size", "16", "--out", str(tmp_path / f"h{i}")]
        args += ["--launch-type", "test_mp", "--peers", broker.address, "--min-peers", "2", "--seed", str(i)]
        args += ["--algo", "appo", "--epochs", "2", "--minibatches", "2", "--kl-target", "0.01", "--normalize-input"]
        argvs.append(args)
    run_group_jobs(argvs)
    a, b = (torch.load(tmp_path / f"h{i}" / "checkpoint.pt", weights_only=False) for i in range(2))
    assert a["steps"] == b["steps"] > 0 and int(a["model"]["torso.obs_norm.count"]) > 0
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), f"{k} differs between the two hosts"
    assert a["scheduler"]["lr_lambdas"] == b["scheduler"]["lr_lambdas"]  # KLAdaptive's factor
    assert a["optimizer"]["param_groups"][0]["lr"] == b["optimizer"]["param_groups"][0]["lr"]
