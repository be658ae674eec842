"""Unrolls into [T+1] trajectory slots: batched inference over a pool, and local-policy actors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_actors_pool import ReferencePool

from actors import EnvConfig, EnvPool
from actors.inference import BatchedInference
from actors.local import LocalPolicyActors
from actors.rollout import RolloutWriter
from actors.trajectory import trajectory_spec
from learners.models import ModelOutput
from shmpad.ringbuf import TypedRing
from shmpad.weights import WeightStore


class TinyPolicy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

    def forward(self, obs):
        return self.net(obs.float()), None


def test_inference_unrolls_replay_in_a_single_process_run(shm_leak_check):
    T = 4
    config = EnvConfig("CartPole-v1")
    with EnvPool(config, 2, 2, seed=5) as pool:
        ring = TypedRing.create(trajectory_spec(pool.spec, T), capacity=16)
        try:
            inference = BatchedInference(
                pool, TinyPolicy(), rollouts=RolloutWriter(ring, 2, pool.half_size, timeout=10)
            )
            for _ in range(2 * (2 * T + 1)):  # two unrolls for each half
                inference.step(timeout=30)
            first = {k: v.copy() for k, v in ring.get_batch(4, timeout=10).items()}  # environments 0..3
            ring.release()
            second = {k: v.copy() for k, v in ring.get_batch(4, timeout=10).items()}
            ring.release()
        finally:
            ring.close()
    stats = inference.statistics()
    assert stats.batches == 18 and stats.env_steps == 36
    for f in first:
        np.testing.assert_array_equal(second[f][:, 0], first[f][:, T])  # row T starts the next unroll
    # Replaying the recorded actions in one process gives the recorded rows.
    ref = ReferencePool(config, 4, seed=5)
    rows = {f: np.concatenate([first[f], second[f][:, 1:]], axis=1) for f in first}  # [4, 2T+1, ...]
    for t in range(2 * T + 1):
        if t:
            ref.step(range(4), rows["action"][:, t - 1])
        np.testing.assert_array_equal(rows["obs"][:, t], ref.obs)
        np.testing.assert_array_equal(rows["reward"][:, t], ref.reward)
        np.testing.assert_array_equal(rows["done"][:, t], ref.done)
        np.testing.assert_array_equal(rows["episode_step"][:, t], ref.len)
    assert first["logits"].shape == (4, T + 1, 2) and np.isfinite(first["logits"]).all()
    # each row records the action that led to its observation (none yet at the start)
    np.testing.assert_array_equal(rows["last_action"][:, 1:], rows["action"][:, :-1])
    assert (rows["last_action"][:, 0] == 0).all()


class LastActionReward(torch.nn.Module):
    """A model stepped with the last action and reward, that records what it was given."""

    use_lstm = False
    last_action_reward = True

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 2)
        self.seen = []

    def forward(self, obs, done, core_state, last_action, reward):
        self.seen.append((done.clone(), last_action.clone(), reward.clone()))
        logits = self.net(obs.float())  # [1, B, 2]
        return ModelOutput(logits, logits[..., 0], ())


def test_a_model_with_last_action_and_reward_gets_each_environments_own():
    config = EnvConfig("CartPole-v1")
    model = LastActionReward()
    with EnvPool(config, 2, 2, seed=3) as pool:
        inference = BatchedInference(pool, model)
        recv, received = pool.recv, []

        def recording_recv(timeout=None):
            batch = recv(timeout)
            received.append((batch, batch.reward.copy()))
            return batch

        pool.recv = recording_recv
        sent = {}  # half -> the actions sent at each of its turns
        for _ in range(12):
            half = inference.step(timeout=30)
            sent.setdefault(half, []).append(received[-1][0].action.copy())
    assert len(model.seen) == 12 and set(sent) == {0, 1}
    turns = {0: 0, 1: 0}
    for (done, last_action, reward), (batch, rewards) in zip(model.seen, received):
        n = len(batch.envs)
        assert last_action.shape == reward.shape == done.shape == (1, n)
        turn = turns[batch.half]
        turns[batch.half] += 1
        previous = sent[batch.half][turn - 1] if turn else np.zeros(n)  # nothing sent before the first turn
        np.testing.assert_array_equal(last_action[0].numpy(), previous)
        np.testing.assert_array_equal(reward[0].numpy(), rewards)
    assert any(r.any() for _, r in received[2:])  # CartPole pays 1 a step: the rewards were there to see
    with pytest.raises(ValueError, match="policy= is for models that see only the observation"):
        BatchedInference(pool, model, policy=lambda m, obs: m(obs))


class HostBuffersReused(BatchedInference):
    """``_to_host`` as on CUDA, on the CPU: the arrays are views of buffers that the next
    call overwrites (the pinned staging buffers)."""

    def _to_host(self, *tensors: torch.Tensor) -> list[np.ndarray]:
        out = []
        for i, t in enumerate(tensors):
            buf = self._pinned.get(i)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = self._pinned[i] = torch.empty_like(t)
            buf.copy_(t)
            out.append(buf.numpy())
        return out


def unrolls(
    inference_type: type[BatchedInference] = BatchedInference, T: int = 3, model_factory=TinyPolicy, **inference_kw
) -> dict[str, np.ndarray]:
    """Two unrolls of each of 4 CartPole environments (2 halves of 2), [4, 2 (T+1), ...] per field,
    from a seeded run of ``inference_type(pool, model_factory(), ..., **inference_kw)``."""
    torch.manual_seed(0)
    model = model_factory()
    with EnvPool(EnvConfig("CartPole-v1"), 2, 2, seed=5) as pool:
        states = (
            [(s.shape[0], *s.shape[2:]) for s in model.initial_state(1)] if getattr(model, "use_lstm", False) else []
        )
        ring = TypedRing.create(trajectory_spec(pool.spec, T, core_state_shapes=states), capacity=16)
        try:
            writer = RolloutWriter(ring, 2, pool.half_size, timeout=10)
            inference = inference_type(pool, model, rollouts=writer, **inference_kw)
            for _ in range(2 * (2 * T + 1)):
                inference.step(timeout=30)
            batches = []
            for _ in range(2):
                batches.append({k: v.copy() for k, v in ring.get_batch(4, timeout=10).items()})
                ring.release()
        finally:
            ring.close()
    return {f: np.concatenate([b[f] for b in batches], axis=1) for f in batches[0]}


def test_inference_is_done_with_its_host_arrays_when_a_step_returns(shm_leak_check):
    # On CUDA the actions and logits come back as views of pinned buffers that the next step
    # overwrites; the unrolls must be those of a run whose every step has arrays of its own.
    fresh, reused = unrolls(BatchedInference), unrolls(HostBuffersReused)
    assert fresh.keys() == reused.keys()
    for f in fresh:
        np.testing.assert_array_equal(reused[f], fresh[f], err_msg=f)


def test_local_policy_actors_pull_weights_and_write_unrolls(shm_leak_check):
    model = TinyPolicy()
    store = WeightStore.create(model)
    ring = TypedRing.create(trajectory_spec(EnvConfig("CartPole-v1").spec(), 3), capacity=8, multi=True)
    try:
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
            model.net[2].bias.copy_(torch.tensor([-50.0, 50.0]))  # always action 1
        with LocalPolicyActors("CartPole-v1", TinyPolicy, store, ring, num_actors=2, envs_per_actor=2) as actors:
            store.publish(model)
            batch = ring.get_batch(4, timeout=30)
            assert (batch["action"][:, :-1] == 1).all()
            np.testing.assert_allclose(batch["logits"][:, 0], [[-50.0, 50.0]] * 4)
            ring.release()
            actors.check()
    finally:
        ring.close()
        store.close()


def test_local_actors_need_a_multi_producer_ring():
    ring = TypedRing.create(trajectory_spec(EnvConfig("CartPole-v1").spec(), 3), capacity=4, multi=False)
    store = WeightStore.create(TinyPolicy())
    try:
        with pytest.raises(ValueError, match=r"must be multi-producer: TypedRing.create\(..., multi=True\)"):
            LocalPolicyActors("CartPole-v1", TinyPolicy, store, ring, 1, 1)
    finally:
        ring.close()
        store.close()
