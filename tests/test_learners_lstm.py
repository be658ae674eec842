"""An LSTM policy end to end: each unroll carries the core state the inference
started it from (checked against a single-process run of the model over the same
observations), the learner's forward from that state reproduces the behaviour
logits of every row, and a CartPole ``--use-lstm`` run goes through the full stack."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from test_bench_impala import read_log, run_bench

from actors import EnvConfig, EnvPool
from actors.inference import BatchedInference
from actors.rollout import RolloutWriter
from actors.trajectory import core_state_fields, trajectory_spec
from learners import make_model
from learners.learner import Learner, LearnerConfig
from shmpad.ringbuf import TypedRing

T, UNROLLS = 4, 3
HIDDEN = 64  # the mlp torso's features, the LSTM's width


def _lstm_model():
    torch.manual_seed(3)
    return make_model("mlp", (4,), 2, use_lstm=True)


def _record(model) -> tuple[list[dict], BatchedInference]:
    """UNROLLS unrolls of each of 4 CartPole environments (2 halves of 2), as
    [unroll][field] -> [4, ...] arrays in environment order."""
    config = EnvConfig("CartPole-v1")
    with EnvPool(config, 2, 2, seed=11) as pool:
        spec = trajectory_spec(pool.spec, T, core_state_shapes=[(1, HIDDEN), (1, HIDDEN)])
        ring = TypedRing.create(spec, capacity=4 * UNROLLS)
        try:
            inference = BatchedInference(pool, model, rollouts=RolloutWriter(ring, 2, pool.half_size, timeout=10))
            for _ in range(2 * (UNROLLS * T + 1)):
                inference.step(timeout=30)
            unrolls = []
            for _ in range(UNROLLS):
                unrolls.append({k: v.copy() for k, v in ring.get_batch(4, timeout=10).items()})
                ring.release()
        finally:
            ring.close()
    return unrolls, inference


def test_trajectory_spec_core_state_fields():
    spec = trajectory_spec(EnvConfig("CartPole-v1").spec(), T, core_state_shapes=[(2, 8), (2, 8)])
    assert core_state_fields(spec) == ["core_state_0", "core_state_1"]
    assert spec["core_state_1"] == (np.float32, (2, 8))
    assert core_state_fields(trajectory_spec(EnvConfig("CartPole-v1").spec(), T)) == []
    with pytest.raises(ValueError, match=r"core_state_shapes must be shapes of ints >= 1, got \(0, 8\) for state 1"):
        trajectory_spec(EnvConfig("CartPole-v1").spec(), T, core_state_shapes=[(2, 8), (0, 8)])


def test_recorded_core_states_replay_in_a_single_process_run(shm_leak_check):
    model = _lstm_model()
    unrolls, inference = _record(model)
    assert inference.statistics().env_steps == 4 * (UNROLLS * T + 1)
    for u in range(1, UNROLLS):
        for f in unrolls[u]:
            if not f.startswith("core_state_"):
                np.testing.assert_array_equal(unrolls[u][f][:, 0], unrolls[u - 1][f][:, T])
    rows = {
        f: np.concatenate([unrolls[0][f]] + [u[f][:, 1:] for u in unrolls[1:]], axis=1)
        for f in unrolls[0]
        if not f.startswith("core_state_")
    }
    # The model over the recorded observations, one half (the same batch of 2) at a time.
    for half in range(2):
        envs = slice(2 * half, 2 * half + 2)
        state = model.initial_state(2)
        with torch.inference_mode():
            for t in range(UNROLLS * T + 1):
                if t % T == 0 and t < UNROLLS * T:
                    u = t // T
                    for i, s in enumerate(state):
                        np.testing.assert_array_equal(unrolls[u][f"core_state_{i}"][envs], s.transpose(0, 1).numpy())
                obs = torch.from_numpy(rows["obs"][envs, t])[None]  # [1, 2, 4]
                done = torch.from_numpy(rows["done"][envs, t]).bool()[None]  # [1, 2]
                out = model(obs, done, state)
                np.testing.assert_array_equal(rows["logits"][envs, t], out.policy_logits[0].numpy())
                state = out.core_state
        for a, b in zip(state, inference.core_state(half)):
            assert torch.equal(a, b)
    assert np.abs(unrolls[1]["core_state_0"]).max() > 0  # the later unrolls start from a real state


def test_learner_reproduces_the_behaviour_logits_from_the_stored_state(shm_leak_check):
    model = _lstm_model()
    learner_model = copy.deepcopy(model)
    unrolls, _ = _record(model)
    spec = trajectory_spec(EnvConfig("CartPole-v1").spec(), T, core_state_shapes=[(1, HIDDEN), (1, HIDDEN)])
    ring = TypedRing.create(spec, capacity=4 * UNROLLS)
    try:
        learner = Learner(learner_model, ring, LearnerConfig(batch_size=4))
        for unroll in unrolls:
            for i in range(4):
                slot = ring.reserve(timeout=5)
                for f, v in unroll.items():
                    slot[f][...] = v[i]
                ring.commit()
        state_matters = 0.0
        for _ in range(UNROLLS):
            batch = ring.get_batch(4, timeout=5, torch=True)  # [B, T+1, ...]
            try:
                time_major = {k: v.transpose(0, 1) for k, v in batch.items()}  # [T+1, B, ...]
                with torch.no_grad():
                    target = learner.forward(time_major).policy_logits.transpose(0, 1)  # [B, T+1, A]
                    zeroed = {k: v.clone() for k, v in time_major.items()}
                    for f in learner.core_state_fields:
                        zeroed[f].zero_()
                    from_zero = learner.forward(zeroed).policy_logits.transpose(0, 1)
                # Every row, on-policy; the batch of 4 unrolls' rows goes through other matrix
                # shapes than the inference's batches of 2, hence float rounding, not bit equality.
                torch.testing.assert_close(target, batch["logits"], rtol=0, atol=1e-6)
                state_matters = max(state_matters, float((from_zero - batch["logits"]).abs().max()))
            finally:
                ring.release()
        assert state_matters > 1e-4  # starting the later unrolls from zeros would not reproduce them
        for i in range(4):
            slot = ring.reserve(timeout=5)
            for f, v in unrolls[1].items():
                slot[f][...] = v[i]
            ring.commit()
        loss = learner.step(timeout=5)  # an update from the stored state runs
        assert torch.isfinite(loss.total)
    finally:
        ring.close()


def test_an_lstm_model_needs_the_core_state_in_the_slots(shm_leak_check):
    ring = TypedRing.create(trajectory_spec(EnvConfig("CartPole-v1").spec(), T), capacity=4)
    try:
        with pytest.raises(
            ValueError, match=r"needs trajectory slots holding its state of shapes \[\(1, 64\), \(1, 64\)\], got \[\]"
        ):
            Learner(_lstm_model(), ring, LearnerConfig())
    finally:
        ring.close()
    with (
        EnvPool(EnvConfig("CartPole-v1"), 1, 2) as pool,
        pytest.raises(ValueError, match="policy= is for models that see only the observation"),
    ):
        BatchedInference(pool, _lstm_model(), policy=lambda m, obs: m(obs[None]).policy_logits[0])


def test_cartpole_lstm_run_through_the_full_stack(tmp_path):
    out = tmp_path / "cartpole-lstm"
    text = run_bench(
        "--env",
        "CartPole-v1",
        "--model",
        "mlp",
        "--use-lstm",
        "--total-frames",
        "20000",
        "--log-interval",
        "2",
        "--out",
        str(out),
        "--launch-type",
        "test_mp",
        timeout=300,
    )
    assert "done: " in text
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    assert state["frames"] >= 20000 and any(k.startswith("core.") for k in state["model"])
    assert int(read_log(out)[-1]["frames"]) >= 20000
