"""The learner on synthetic unrolls: an update changes and publishes the weights,
episodes are counted once, the learning rate decays, and a checkpoint resumes
with identical optimiser state (the same next update, bit for bit); with algo="appo",
epochs x minibatches optimiser steps per batch but one policy version and one
learning-rate step, an LSTM's minibatches made of whole unrolls, minibatches of single steps
the same update as of unrolls over a whole batch, bad settings named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from actors.envs.spec import EnvSpec
from actors.trajectory import trajectory_spec
from learners import make_model
from learners.learner import Learner, LearnerConfig
from learners.schedule import KL_BOUNDS, KL_STEP
from shmpad.ringbuf import TypedRing
from shmpad.weights import WeightStore

T, B, OBS, A = 5, 4, (3,), 2


def _spec():
    return trajectory_spec(
        EnvSpec(
            env_id="Test-v0",
            obs_shape=OBS,
            obs_dtype=np.dtype(np.float32),
            action_shape=(),
            action_dtype=np.dtype(np.int64),
            num_actions=A,
        ),
        T,
    )


def _fill(ring: TypedRing, n: int, seed: int, policy_version: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(n):
        slot = ring.reserve(timeout=5)
        slot["obs"][...] = rng.normal(size=slot["obs"].shape)
        slot["action"][...] = rng.integers(0, A, size=slot["action"].shape)
        slot["last_action"][...] = rng.integers(0, A, size=slot["last_action"].shape)
        slot["reward"][...] = rng.normal(size=T + 1)
        slot["done"][...] = 0
        slot["logits"][...] = rng.normal(size=slot["logits"].shape)
        slot["episode_return"][...] = 7.0
        slot["episode_step"][...] = 3
        slot["episode_end"][...] = 0
        slot["episode_end"][0] = 1  # row 0 repeats the previous unroll's last row: not counted again
        slot["episode_end"][2] = 1
        slot["policy_version"][...] = policy_version
        ring.commit()


@pytest.fixture
def ring(shm_leak_check):
    r = TypedRing.create(_spec(), capacity=4 * B)
    yield r
    r.close()


def _learner(ring, weights=None, **kw) -> Learner:
    torch.manual_seed(0)
    config = LearnerConfig(batch_size=B, **kw)
    return Learner(make_model("mlp", OBS, A), ring, config, weights)


def test_update_changes_and_publishes_weights_and_counts_episodes(ring):
    store = WeightStore.create(make_model("mlp", OBS, A))
    try:
        learner = _learner(ring, store)
        assert store.version == 1  # the initial weights
        before = [p.detach().clone() for p in learner.model.parameters()]
        _fill(ring, B, 0)
        loss = learner.step(timeout=5)
        assert torch.isfinite(loss.total)
        assert all(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))
        assert store.version == 2
        pulled = make_model("mlp", OBS, A)
        store.pull(pulled)
        for a, b in zip(pulled.parameters(), learner.model.parameters()):
            assert torch.equal(a, b)
        s = learner.statistics()
        assert (s.steps, s.frames, s.episodes, s.mean_return) == (1, B * T, B, 7.0)
        assert learner.new_episodes == [(7.0, 3)] * B  # each finished episode's return and length, for episodes.csv
        assert ring.statistics().size == 0  # the batch's slots went back
    finally:
        store.close()


def test_learning_rate_decays_linearly_to_zero(ring):
    learner = _learner(ring, learning_rate=1e-3, lr_decay_frames=4 * B * T)
    rates = []
    for i in range(4):
        _fill(ring, B, i)
        learner.step(timeout=5)
        rates.append(learner.statistics().learning_rate)
    assert rates == pytest.approx([0.75e-3, 0.5e-3, 0.25e-3, 0.0])


@pytest.mark.parametrize("optimizer", ["adam", "rmsprop"])
def test_checkpoint_resumes_with_identical_state(ring, tmp_path, optimizer):
    a = _learner(ring, optimizer=optimizer, lr_decay_frames=100 * B * T)
    for i in range(3):
        _fill(ring, B, i)
        a.step(timeout=5)
    path = str(tmp_path / "checkpoint.pt")
    a.save(path)
    b = _learner(ring, optimizer=optimizer, lr_decay_frames=100 * B * T)
    b.load(path)
    assert (b.steps, b.frames) == (a.steps, a.frames)
    _fill(ring, B, 99)
    a.step(timeout=5)
    _fill(ring, B, 99)
    b.step(timeout=5)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)
    assert a.statistics().learning_rate == b.statistics().learning_rate


def test_bad_configuration():
    with pytest.raises(ValueError, match="optimizer must be 'adam' or 'rmsprop', got 'sgd'"):
        LearnerConfig(optimizer="sgd").check()
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        LearnerConfig(batch_size=0).check()
    r = TypedRing.create(_spec(), capacity=4)
    try:
        with pytest.raises(
            ValueError,
            match=r"the model's LSTM core needs trajectory slots holding its state of shapes \[\(1, 64\), \(1, 64\)\], got \[\]",
        ):
            Learner(make_model("mlp", OBS, A, use_lstm=True), r, LearnerConfig())
    finally:
        r.close()


def test_a_model_with_last_action_and_reward_learns_from_the_rows_own(ring):
    torch.manual_seed(0)
    model = make_model("mlp", OBS, A, last_action_reward=True)
    learner = Learner(model, ring, LearnerConfig(batch_size=B))
    _fill(ring, B, 3)
    batch = {k: torch.from_numpy(v.copy()).transpose(0, 1) for k, v in ring.get_batch(B, timeout=5).items()}
    ring.release()
    out = learner.forward(batch)  # [T+1, B, A]
    expected = model(batch["obs"], batch["done"].bool(), (), batch["last_action"], batch["reward"])
    torch.testing.assert_close(out.policy_logits, expected.policy_logits, rtol=0, atol=0)
    shuffled = model(batch["obs"], batch["done"].bool(), (), batch["last_action"].flip(0), batch["reward"])
    assert not torch.allclose(out.policy_logits, shuffled.policy_logits)
    _fill(ring, B, 4)
    assert torch.isfinite(learner.step(timeout=5).total)


def test_a_model_with_last_action_and_reward_needs_them_in_the_slots(shm_leak_check):
    spec = {k: v for k, v in _spec().items() if k != "last_action"}
    ring = TypedRing.create(spec, capacity=B)
    try:
        with pytest.raises(ValueError, match="the trajectory slots need a 'last_action' field"):
            Learner(make_model("mlp", OBS, A, last_action_reward=True), ring, LearnerConfig(batch_size=B))
    finally:
        ring.close()


# -- APPO: epochs x minibatches steps per batch --


class _CountingAdam(torch.optim.Adam):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = 0

    def step(self, closure=None):
        self.calls += 1
        return super().step(closure)


def test_appo_takes_epochs_times_minibatches_steps_per_batch(ring):
    store = WeightStore.create(make_model("mlp", OBS, A))
    try:
        torch.manual_seed(0)
        config = LearnerConfig(
            batch_size=B, algo="appo", epochs=3, minibatches=2, learning_rate=1e-3, lr_decay_frames=4 * B * T
        )
        learner = Learner(make_model("mlp", OBS, A), ring, config, store)
        counting = _CountingAdam(learner.model.parameters(), lr=1e-3)
        counting.load_state_dict(learner.optimizer.state_dict())
        learner.optimizer = counting
        learner.scheduler = torch.optim.lr_scheduler.LambdaLR(counting, lambda step: max(0.0, 1 - step / 4))
        before = [p.detach().clone() for p in learner.model.parameters()]
        _fill(ring, B, 0)
        loss = learner.step(timeout=5)
        assert torch.isfinite(loss.total)
        assert counting.calls == 3 * 2
        assert all(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))
        s = learner.statistics()
        assert (s.steps, s.frames, s.episodes) == (1, B * T, B)  # one policy version per batch
        assert store.version == 2
        assert s.learning_rate == pytest.approx(0.75e-3)  # one schedule step per batch
        assert 0.0 <= s.last_loss["clip_fraction"] <= 1.0 and s.last_loss["approx_kl"] >= 0.0
        assert ring.statistics().size == 0
    finally:
        store.close()


def test_appo_first_minibatch_has_ratio_one(ring):
    """Before its first step the learner's policy is the proximal one: nothing is clipped yet."""
    torch.manual_seed(0)
    learner = Learner(make_model("mlp", OBS, A), ring, LearnerConfig(batch_size=B, algo="appo", minibatches=1))
    _fill(ring, B, 0)
    learner.step(timeout=5)
    assert learner.statistics().last_loss["clip_fraction"] == 0.0
    assert learner.statistics().last_loss["approx_kl"] == pytest.approx(0.0, abs=1e-6)


def _lstm_and_ring():
    """An LSTM model and a ring whose slots hold its core state."""
    model = make_model("mlp", OBS, A, use_lstm=True)
    shapes = [(s.shape[0], *s.shape[2:]) for s in model.initial_state(1)]
    spec = trajectory_spec(
        EnvSpec("Test-v0", OBS, np.dtype(np.float32), (), np.dtype(np.int64), A), T, core_state_shapes=shapes
    )
    return model, TypedRing.create(spec, capacity=4 * B)


def test_appo_with_an_lstm_keeps_whole_unrolls(shm_leak_check):
    model, ring = _lstm_and_ring()
    try:
        learner = Learner(model, ring, LearnerConfig(batch_size=B, algo="appo", epochs=2, minibatches=2))
        _fill(ring, B, 0)
        loss = learner.step(timeout=5)
        assert torch.isfinite(loss.total)
        assert learner.statistics().steps == 1
    finally:
        ring.close()


def test_appo_minibatches_of_steps_over_the_whole_batch_step_as_unrolls_do(ring):
    """One minibatch of every step is the batch in another order: the same update. A step whose
    observation, action or target came from another row would change it."""
    after = {}
    for shuffle in ("unrolls", "steps"):
        learner = _learner(ring, algo="appo", epochs=2, minibatches=1, shuffle=shuffle)
        _fill(ring, B, 0)
        learner.step(timeout=5)
        after[shuffle] = [p.detach().clone() for p in learner.model.parameters()]
    for a, b in zip(after["unrolls"], after["steps"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_appo_minibatches_of_steps_take_epochs_times_minibatches_steps(ring):
    learner = _learner(ring, algo="appo", epochs=2, minibatches=5, shuffle="steps")  # 20 steps: 4 per minibatch
    counting = _CountingAdam(learner.model.parameters(), lr=1e-3)
    learner.optimizer = counting
    learner.scheduler = torch.optim.lr_scheduler.LambdaLR(counting, lambda step: 1.0)
    before = [p.detach().clone() for p in learner.model.parameters()]
    _fill(ring, B, 0)
    assert torch.isfinite(learner.step(timeout=5).total)
    assert counting.calls == 2 * 5 and learner.statistics().steps == 1
    assert all(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))


def test_appo_minibatches_of_steps_are_refused_where_they_cannot_be_made(ring, shm_leak_check):
    with pytest.raises(ValueError, match=r"a batch's 20 steps \(unroll_length 5 x batch_size 4\) must be a multiple"):
        _learner(ring, algo="appo", minibatches=3, shuffle="steps")
    model, lstm_ring = _lstm_and_ring()
    try:
        with pytest.raises(ValueError, match="an LSTM core needs whole unrolls"):
            Learner(model, lstm_ring, LearnerConfig(batch_size=B, algo="appo", shuffle="steps"))
    finally:
        lstm_ring.close()


def test_appo_kl_target_adapts_the_learning_rate_after_every_minibatch_step(ring, tmp_path):
    # A target far above any step's KL: each of the 2 x 2 steps raises the rate by KL_STEP
    learner = _learner(
        ring, algo="appo", epochs=2, minibatches=2, learning_rate=1e-4, kl_target=10.0, lr_decay_frames=40
    )
    _fill(ring, B, 0)
    learner.step(timeout=5)
    assert learner.schedule.factor == pytest.approx(KL_STEP**4)
    assert learner.statistics().learning_rate == pytest.approx(1e-4 * KL_STEP**4)  # no linear decay on top
    learner.save(str(tmp_path / "ckpt.pt"))
    resumed = _learner(ring, algo="appo", epochs=2, minibatches=2, learning_rate=5e-4, kl_target=10.0)
    resumed.load(str(tmp_path / "ckpt.pt"))
    assert resumed.schedule.factor == pytest.approx(KL_STEP**4)
    # the rule itself: down when over twice the target, unchanged between, and within KL_BOUNDS
    resumed.schedule.observe(20.1, 10.0, resumed.optimizer, resumed.base_rate)
    assert resumed.schedule.factor == pytest.approx(KL_STEP**3)
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(1e-4 * KL_STEP**3)  # the checkpoint's rate
    resumed.schedule.observe(10.0, 10.0, resumed.optimizer, resumed.base_rate)
    assert resumed.schedule.factor == pytest.approx(KL_STEP**3)
    for _ in range(100):
        resumed.schedule.observe(0.0, 10.0, resumed.optimizer, resumed.base_rate)
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(KL_BOUNDS[1])
    for _ in range(100):
        resumed.schedule.observe(1e9, 10.0, resumed.optimizer, resumed.base_rate)
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(KL_BOUNDS[0])


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_a_models_input_statistics_follow_every_batch_and_are_published(ring, algo):
    torch.manual_seed(0)
    model = make_model("mlp", OBS, A, normalize_input=True)
    store = WeightStore.create(model)
    try:
        learner = Learner(model, ring, LearnerConfig(batch_size=B, algo=algo), store)
        copy = TypedRing.create(_spec(), capacity=B)  # the same unrolls, to read
        try:
            _fill(copy, B, 0)
            batch_obs = copy.get_batch(B, timeout=5)["obs"][:, :-1].copy()  # [B, T, ...]: each unroll's own steps
            copy.release()
        finally:
            copy.close()
        _fill(ring, B, 0)
        learner.step(timeout=5)
        norm = model.torso.obs_norm
        assert int(norm.count) == B * T
        torch.testing.assert_close(norm.mean, torch.from_numpy(batch_obs.reshape(-1, *OBS)).double().mean(0).float())
        actor = make_model("mlp", OBS, A, normalize_input=True)
        store.pull(actor)
        torch.testing.assert_close(actor.torso.obs_norm.mean, norm.mean)
        assert int(actor.torso.obs_norm.count) == B * T
    finally:
        store.close()


def test_a_checkpoint_keeps_the_adapted_rate_but_not_the_decay_horizon(ring, tmp_path):
    # the adapted factor is the scheduler's state, so a checkpoint (and a group's sync) carries it
    learner = _learner(ring, algo="appo", epochs=1, minibatches=1, learning_rate=1e-4, kl_target=10.0)
    learner.schedule.factor = 2.25
    state = learner.state_dict()
    assert state["scheduler"]["lr_lambdas"] == [{"factor": 2.25}]
    # a checkpoint from before learners.schedule kept the factor beside the scheduler
    state["scheduler"]["lr_lambdas"], state["lr_factor"] = [None], 3.375
    old = _learner(ring, algo="appo", epochs=1, minibatches=1, learning_rate=1e-4, kl_target=10.0)
    old.load_state_dict(state)
    assert old.schedule.factor == 3.375
    # the linear decay's horizon is the resumed run's setting, not the checkpoint's
    short = _learner(ring, learning_rate=1e-3, lr_decay_frames=2 * B * T)
    _fill(ring, B, 0)
    short.step(timeout=5)
    short.save(str(tmp_path / "ckpt.pt"))
    longer = _learner(ring, learning_rate=1e-3, lr_decay_frames=4 * B * T)
    longer.load(str(tmp_path / "ckpt.pt"))
    _fill(ring, B, 1)
    longer.step(timeout=5)
    assert longer.statistics().learning_rate == pytest.approx(1e-3 * (1 - 2 / 4))


def test_appo_with_standardised_values_runs_v_trace_in_returns_units_and_learns_the_standardised_targets(ring):
    torch.manual_seed(0)
    model = make_model("mlp", OBS, A, normalize_value=True)
    plain = make_model("mlp", OBS, A)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("value_norm.")})
    with torch.no_grad():
        model.value_norm.update(torch.tensor([3.0, 5.0, 7.0]))  # mean 5, variance 8/3: a head output of 0 means 5
    config = LearnerConfig(batch_size=B, algo="appo")
    normed, reference = Learner(model, ring, config), Learner(plain, ring, config)
    _fill(ring, B, 0)
    batch = {k: v.transpose(0, 1) for k, v in ring.get_batch(B, timeout=5, torch=True).items()}  # [T+1, B, ...]
    ring.release()
    with torch.no_grad():
        plain.baseline.weight.mul_(
            math.sqrt(8 / 3 + 1e-5)
        )  # the plain model's values are the other's, in returns' units
        plain.baseline.bias.mul_(math.sqrt(8 / 3 + 1e-5)).add_(5.0)
    got, want = normed.appo.targets(batch), reference.appo.targets(batch)
    torch.testing.assert_close(got["advantages"], want["advantages"])
    norm = model.value_norm
    assert int(norm.count) == 3 + T * B  # the batch's targets joined the statistics
    torch.testing.assert_close(got["vs"], norm(want["vs"]))
    torch.testing.assert_close(got["values"], norm(want["values"]))
    with pytest.raises(ValueError, match="normalize_value\\) needs algo 'appo', got 'impala'"):
        Learner(make_model("mlp", OBS, A, normalize_value=True), ring, LearnerConfig(batch_size=B))


@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(algo="ppo"), ValueError, "algo must be 'impala' or 'appo', got 'ppo'"),
        (
            dict(algo="appo", kl_target=-0.01),
            ValueError,
            r"kl_target must be a finite number >= 0 \(0: off\), got -0.01",
        ),
        (dict(algo="appo", kl_target=float("inf")), ValueError, "kl_target must be a finite number >= 0 .* got inf"),
        (dict(kl_target=0.01), ValueError, "kl_target .* needs algo 'appo'"),
        (dict(algo="appo", epochs=0), ValueError, "epochs must be >= 1, got 0"),
        (dict(algo="appo", epochs=1.5), TypeError, "epochs must be an int, got float 1.5"),
        (dict(algo="appo", batch_size=6, minibatches=4), ValueError, r"batch_size \(6\) must be a multiple"),
        (dict(epochs=2), ValueError, "epochs and minibatches are APPO's"),
        (dict(algo="appo", clip=-0.1), ValueError, "clip must be >= 0, got -0.1"),
        (dict(algo="appo", vtrace_lambda=1.5), ValueError, r"vtrace_lambda must be in \[0, 1\], got 1.5"),
        (dict(algo="appo", shuffle="frames"), ValueError, "shuffle must be 'unrolls' or 'steps', got 'frames'"),
    ],
)
def test_bad_appo_settings_are_named(kw, error, match):
    with pytest.raises(error, match=match):
        LearnerConfig(**kw).check()


def test_evaluate_in_chunks_of_columns_gives_the_whole_batchs_outputs(shm_leak_check, capsys):
    torch.manual_seed(0)
    model = make_model("mlp", OBS, A, use_lstm=True, last_action_reward=True)
    shapes = [(s.shape[0], *s.shape[2:]) for s in model.initial_state(1)]
    spec = trajectory_spec(
        EnvSpec("Test-v0", OBS, np.dtype(np.float32), (), np.dtype(np.int64), A), T, core_state_shapes=shapes
    )
    ring = TypedRing.create(spec, capacity=4 * B)
    try:
        learner = Learner(model, ring, LearnerConfig(batch_size=B, algo="appo"))
        _fill(ring, B, 5)
        batch = {k: torch.from_numpy(v.copy()).transpose(0, 1) for k, v in ring.get_batch(B, timeout=5).items()}
        ring.release()
        batch["done"][2, 1] = batch["done"][4, 3] = 1  # the core restarts mid-unroll in two columns
        for field in learner.core_state_fields:  # [layers, B, hidden]: a different stored state per column
            batch[field] = torch.randn(batch[field].shape)
        whole = learner.forward(batch)
        for columns in (1, 3, B, 2 * B, 0):
            logits, baseline = learner.evaluate(batch, columns)
            torch.testing.assert_close(logits, whole.policy_logits.detach(), rtol=0, atol=1e-6)
            torch.testing.assert_close(baseline, whole.baseline.detach(), rtol=0, atol=1e-6)
            assert not logits.requires_grad and logits.dtype == baseline.dtype == torch.float32

        def broken(chunk):
            raise RuntimeError("inductor says no")

        learner._evaluate_fn, learner._evaluate_compiled = broken, True  # as a compile that fails
        logits, _ = learner.evaluate(batch, 3)
        torch.testing.assert_close(logits, whole.policy_logits.detach(), rtol=0, atol=1e-6)
        learner.evaluate(batch, 3)
        out = capsys.readouterr().out
        assert out.count("torch.compile failed (RuntimeError: inductor says no); evaluating eager") == 1, out
    finally:
        ring.close()


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_a_warm_up_update_is_undone_but_its_batch_stays_counted(ring, algo):
    """``warm_up`` (what a group member does before it joins): one update on the next batch,
    then the model (its input and value statistics too), the optimiser, the schedule, the
    update count and torch's random state put back, nothing published meanwhile; the batch's
    frames and episodes stay counted. The learner then steps as one that never warmed up."""
    kw = dict(algo="appo", epochs=2, minibatches=2, kl_target=0.01) if algo == "appo" else {}

    def net() -> torch.nn.Module:  # input statistics; APPO's value statistics too
        return make_model("mlp", OBS, A, normalize_input=True, normalize_value=algo == "appo")

    def learner(weights=None) -> Learner:
        torch.manual_seed(0)
        model = net()
        return Learner(model, ring, LearnerConfig(batch_size=B, lr_decay_frames=100 * B * T, **kw), weights)

    store = WeightStore.create(net())
    try:
        warmed, plain = learner(store), learner()
        assert warmed.warm_up(timeout=0.05) is False  # no batch yet: nothing changed
        _fill(ring, B, 0)
        rng = torch.get_rng_state()
        versions = store.version
        assert warmed.warm_up(timeout=5) is True
        assert ring.statistics().size == 0  # the batch was taken
        assert torch.equal(torch.get_rng_state(), rng)  # APPO's minibatch orders drew from it: put back
        assert store.version == versions  # nothing published: the store holds the weights put back
        for name, value in plain.model.state_dict().items():
            assert torch.equal(warmed.model.state_dict()[name], value), name
        assert int(warmed.model.torso.obs_norm.count) == 0
        assert algo == "impala" or int(warmed.model.value_norm.count) == 0
        assert warmed.optimizer.state_dict()["state"] == {} and all(p.grad is None for p in warmed.model.parameters())
        assert warmed.scheduler.state_dict() == plain.scheduler.state_dict()
        assert warmed.statistics().learning_rate == plain.statistics().learning_rate
        s = warmed.statistics()
        assert (s.steps, s.frames, s.episodes) == (0, B * T, B)  # the update undone, the batch's play counted
        pulled = net()
        store.pull(pulled)  # what the actors play with
        for name, value in plain.model.state_dict().items():
            assert torch.equal(pulled.state_dict()[name], value), name
        for each in (warmed, plain):  # from one random state, as if the other had never stepped
            _fill(ring, B, 1)
            torch.set_rng_state(rng)
            each.step(timeout=5)
        for name, value in plain.model.state_dict().items():
            assert torch.equal(warmed.model.state_dict()[name], value), name
        assert warmed.statistics().learning_rate == plain.statistics().learning_rate
        warmed.accumulator = object()  # a member of a group: too late to warm up
        with pytest.raises(RuntimeError, match="before join_group"):
            warmed.warm_up(timeout=0.05)
        warmed.accumulator = None
    finally:
        store.close()
