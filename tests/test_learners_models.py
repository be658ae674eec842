"""Actor-critic models: shapes, parameter counts, the LSTM core's state and resets, determinism, learning."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from learners.models import (
    ActorCritic,
    MLPTorso,
    ModelOutput,
    NatureTorso,
    ResNetTorso,
    RunningNorm,
    make_model,
)


def conv(c_in, c_out, k):
    return c_in * c_out * k * k + c_out


def linear(n_in, n_out):
    return n_in * n_out + n_out


def lstm(n_in, hidden):
    return 4 * hidden * (n_in + hidden) + 8 * hidden


def count(model):
    return sum(p.numel() for p in model.parameters())


HEADS = linear(512, 18) + linear(512, 1)


def test_nature_cnn_parameter_count():
    # 84 -> 20 -> 9 -> 7 after the three convolutions.
    expected = (
        conv(4, 32, 8) + conv(32, 64, 4) + conv(64, 64, 3) + linear(64 * 7 * 7, 512) + linear(512, 18) + linear(512, 1)
    )
    assert expected == 1_693_875  # "about 1.7M"
    assert count(make_model("shallow", (4, 84, 84), 18)) == expected


def test_impala_resnet_parameter_count():
    # 84 -> 42 -> 21 -> 11 after the three max-pools.
    stages = sum(conv(c_in, c_out, 3) + 4 * conv(c_out, c_out, 3) for c_in, c_out in ((4, 16), (16, 32), (32, 32)))
    expected = stages + linear(32 * 11 * 11, 256) + linear(256, 18) + linear(256, 1)
    assert expected == 1_094_115  # "about 1.1M"
    assert count(make_model("deep", (4, 84, 84), 18)) == expected


@pytest.mark.parametrize("kind, features", [("shallow", 512), ("deep", 256), ("mlp", 64)])
def test_lstm_adds_one_layer_of_torso_width(kind, features):
    shape = (4,) if kind == "mlp" else (4, 84, 84)
    with_core = count(make_model(kind, shape, 6, use_lstm=True))
    assert with_core - count(make_model(kind, shape, 6)) == lstm(features, features)


def observations(kind, T, B, seed=0):
    generator = torch.Generator().manual_seed(seed)
    if kind == "mlp":
        return torch.randn(T, B, 4, generator=generator)
    return torch.randint(0, 256, (T, B, 4, 84, 84), generator=generator, dtype=torch.uint8)


def model_of(kind, use_lstm=False, num_actions=6, seed=0):
    torch.manual_seed(seed)
    return make_model(kind, (4,) if kind == "mlp" else (4, 84, 84), num_actions, use_lstm=use_lstm)


@pytest.mark.parametrize("use_lstm", [False, True], ids=["feedforward", "lstm"])
@pytest.mark.parametrize("kind", ["shallow", "deep", "mlp"])
@pytest.mark.parametrize("T, B", [(3, 2), (1, 1)])
def test_output_shapes(kind, use_lstm, T, B):
    model = model_of(kind, use_lstm)
    out = model(observations(kind, T, B), torch.zeros(T, B, dtype=torch.bool), model.initial_state(B))
    assert isinstance(out, ModelOutput)
    assert out.policy_logits.shape == (T, B, 6) and out.baseline.shape == (T, B)
    assert out.policy_logits.dtype == torch.float32 and out.baseline.dtype == torch.float32
    if use_lstm:
        assert [s.shape for s in out.core_state] == [(1, B, model.core.hidden_size)] * 2
    else:
        assert out.core_state == ()


def test_feedforward_model_needs_no_done_and_treats_steps_independently():
    model = model_of("shallow")
    obs = observations("shallow", 3, 2)
    out = model(obs)
    one_step = model(obs[1:2, 1:2])
    torch.testing.assert_close(one_step.policy_logits[0, 0], out.policy_logits[1, 1])


def test_heads_run_in_fp32_under_bf16_autocast():
    """Autocast runs the torso in bf16; the policy and baseline heads stay in the weights'
    fp32, on the torso's features: a bf16 baseline's 8-bit mantissa would add noise to
    V-trace's advantages for the price of two small matrix products."""
    model = model_of("shallow")
    obs = observations("shallow", 2, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(obs)
        features = model.torso(obs.flatten(0, 1))
    assert features.dtype == torch.bfloat16  # autocast did reach the torso
    assert out.policy_logits.dtype == torch.float32 and out.baseline.dtype == torch.float32
    features = features.float().view(2, 3, -1)
    torch.testing.assert_close(out.baseline, model.baseline(features).squeeze(-1), rtol=0, atol=0)
    torch.testing.assert_close(out.policy_logits, model.policy(features), rtol=0, atol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16_heads = model.baseline(features.bfloat16()).squeeze(-1)
    assert not torch.equal(bf16_heads.float(), out.baseline)  # which bf16 heads would have changed


def test_lstm_state_carries_across_calls():
    model = model_of("mlp", use_lstm=True)
    obs, done = observations("mlp", 6, 3), torch.zeros(6, 3, dtype=torch.bool)
    whole = model(obs, done)
    state = model.initial_state(3)
    for t in range(6):
        step = model(obs[t : t + 1], done[t : t + 1], state)
        state = step.core_state
        torch.testing.assert_close(step.policy_logits[0], whole.policy_logits[t])
        torch.testing.assert_close(step.baseline[0], whole.baseline[t])
    for carried, final in zip(state, whole.core_state):
        torch.testing.assert_close(carried, final)
    # The state matters: the same observation after a different history gives a different output.
    assert not torch.allclose(whole.policy_logits[1:], model(obs[1:], done[1:]).policy_logits)


def test_lstm_state_resets_where_done():
    model = model_of("mlp", use_lstm=True)
    obs = observations("mlp", 6, 3)
    done = torch.zeros(6, 3, dtype=torch.bool)
    done[3, 1] = True  # environment 1 starts a new episode at step 3
    stale = tuple(torch.randn(s.shape) for s in model.initial_state(3))
    out = model(obs, done, stale)
    fresh = model(obs[3:, 1:2], torch.zeros(3, 1, dtype=torch.bool))  # from the zero state
    torch.testing.assert_close(out.policy_logits[3:, 1], fresh.policy_logits[:, 0])
    torch.testing.assert_close(out.baseline[3:, 1], fresh.baseline[:, 0])
    # The others keep their (stale) state: the same as a run with no done at all.
    no_reset = model(obs, torch.zeros(6, 3, dtype=torch.bool), stale)
    torch.testing.assert_close(out.policy_logits[:, [0, 2]], no_reset.policy_logits[:, [0, 2]])
    torch.testing.assert_close(out.policy_logits[:3], no_reset.policy_logits[:3])
    # A done on the first step discards the state passed in.
    first = done.clone()
    first[0] = True
    torch.testing.assert_close(model(obs, first, stale).policy_logits, model(obs, first).policy_logits)


@pytest.mark.parametrize("kind", ["shallow", "deep", "mlp"])
def test_deterministic_given_the_seed(kind):
    a, b = model_of(kind, use_lstm=True, seed=3), model_of(kind, use_lstm=True, seed=3)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name
    obs, done = observations(kind, 2, 2), torch.zeros(2, 2, dtype=torch.bool)
    first, second = a(obs, done), b(obs, done)
    assert torch.equal(first.policy_logits, second.policy_logits) and torch.equal(first.baseline, second.baseline)
    assert not torch.equal(next(model_of(kind, seed=4).parameters()), next(a.parameters()))


@pytest.mark.parametrize("use_lstm", [False, True], ids=["feedforward", "lstm"])
@pytest.mark.parametrize("kind", ["shallow", "deep", "mlp"])
def test_an_update_step_changes_every_weight(kind, use_lstm):
    model = model_of(kind, use_lstm)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    obs, done = observations(kind, 3, 2), torch.zeros(3, 2, dtype=torch.bool)
    done[1, 0] = True
    out = model(obs, done)
    actions = torch.tensor([[0, 1], [2, 3], [4, 5]])
    log_probs = torch.log_softmax(out.policy_logits, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    loss = -(log_probs * torch.randn(3, 2)).sum() + ((out.baseline - 1.0) ** 2).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    for name, p in model.named_parameters():
        assert not torch.equal(p, before[name]), f"{name} did not change"


def test_bad_arguments_are_named():
    model = model_of("shallow", use_lstm=True)
    obs, done = observations("shallow", 2, 3), torch.zeros(2, 3, dtype=torch.bool)
    with pytest.raises(
        TypeError, match=r"observations must be a torch.uint8 tensor of frames, got a torch.float32 tensor"
    ):
        model(obs.float(), done)
    with pytest.raises(ValueError, match=r"obs must be \[T, B, \*\(4, 84, 84\)\], got shape \(3, 4, 84, 84\)"):
        model(obs[0], done)
    with pytest.raises(TypeError, match=r"done must be a torch.bool tensor when the model has an LSTM, got NoneType"):
        model(obs)
    with pytest.raises(ValueError, match=r"done must be \[T, B\] = \(2, 3\), got shape \(2,\)"):
        model(obs, done[:, 0])
    with pytest.raises(
        ValueError,
        match=r"core_state must be \(h, c\), each of shape \(1, 3, 512\), got shapes \[\(1, 2, 512\), \(1, 2, 512\)\]",
    ):
        model(obs, done, model.initial_state(2))
    with pytest.raises(TypeError, match=r"observations must be a floating point tensor, got a torch.uint8 tensor"):
        model_of("mlp")(torch.zeros(1, 1, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"kind must be 'shallow', 'deep' or 'mlp', got 'wide'"):
        make_model("wide", (4, 84, 84), 6)
    with pytest.raises(ValueError, match=r"num_actions must be an int >= 1, got 0"):
        make_model("deep", (4, 84, 84), 0)
    with pytest.raises(ValueError, match=r"height and width >= 36, got \(4, 32, 84\)"):
        NatureTorso((4, 32, 84))
    with pytest.raises(ValueError, match=r"obs_shape must be \(channels, height, width\), got \(84, 84\)"):
        ResNetTorso((84, 84))
    with pytest.raises(ValueError, match=r"obs_dim must be an int >= 1, got 0"):
        MLPTorso(0)
    with pytest.raises(TypeError, match=r"torso must be a module with obs_shape and out_features, got Linear"):
        ActorCritic(torch.nn.Linear(2, 2), 3)


@pytest.mark.parametrize("use_lstm", [False, True], ids=["feedforward", "lstm"])
def test_last_action_and_reward_reach_the_heads_one_hot_and_clipped(use_lstm):
    """torchbeast's and moolib's Atari inputs: the heads (or the core) see the features, the
    reward clipped to [-1, 1] and the previous action one-hot, and nothing else changes."""
    torch.manual_seed(0)
    model = make_model("mlp", (4,), 6, use_lstm=use_lstm, last_action_reward=True)
    plain = model_of("mlp", use_lstm)
    extra = 1 + 6  # the clipped reward and the one-hot action
    if use_lstm:
        assert model.core.input_size == plain.core.input_size + extra and model.policy.in_features == 64
    else:
        assert model.policy.in_features == model.baseline.in_features == 64 + extra
    assert count(model) == count(plain) + extra * (4 * 64 if use_lstm else 6 + 1)
    obs, done = observations("mlp", 3, 2), torch.zeros(3, 2, dtype=torch.bool)
    last_action = torch.tensor([[0, 5], [3, 3], [1, 2]])
    reward = torch.tensor([[0.0, 1.0], [-0.5, 7.0], [0.0, 0.0]])
    out = model(obs, done, (), last_action, reward)
    assert out.policy_logits.shape == (3, 2, 6) and out.baseline.shape == (3, 2)
    # clipped: a reward of 7 reads as 1
    clipped = model(obs, done, (), last_action, reward.clamp(-1, 1))
    torch.testing.assert_close(out.policy_logits, clipped.policy_logits, rtol=0, atol=0)
    # each input changes what the model says
    for other in (model(obs, done, (), last_action.roll(1, 1), reward), model(obs, done, (), last_action, -reward)):
        assert not torch.allclose(other.policy_logits, out.policy_logits)
    if not use_lstm:  # the heads see exactly [features, clip(reward), one_hot(last_action)]
        features = model.torso(obs.flatten(0, 1))
        x = torch.cat([features, reward.reshape(6, 1).clamp(-1, 1), F.one_hot(last_action.reshape(6), 6).float()], 1)
        torch.testing.assert_close(out.policy_logits, model.policy(x).view(3, 2, 6))


def test_a_model_with_last_action_and_reward_names_the_inputs_it_lacks():
    model = make_model("shallow", (4, 84, 84), 6, last_action_reward=True)
    obs = observations("shallow", 2, 3)
    action, reward = torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3)
    with pytest.raises(TypeError, match=r"last_action must be an integer tensor \[T, B\] for this model, got NoneType"):
        model(obs)
    with pytest.raises(TypeError, match=r"last_action must be an integer tensor .* got a torch.float32 tensor"):
        model(obs, None, (), reward, reward)
    with pytest.raises(
        TypeError, match=r"reward must be a floating point tensor \[T, B\] for this model, got NoneType"
    ):
        model(obs, None, (), action)
    with pytest.raises(ValueError, match=r"reward must be \[T, B\] = \(2, 3\), got shape \(3,\)"):
        model(obs, None, (), action, reward[0])


@pytest.mark.parametrize("kind, obs", [("shallow", (4, 84, 84)), ("mlp", (4,))])
def test_orthogonal_init_gives_orthogonal_layers_and_a_near_uniform_first_policy(kind, obs):
    torch.manual_seed(0)
    model = make_model(kind, obs, 6, init="orthogonal")
    for module in model.torso.modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            w = module.weight.flatten(1)  # [out, in]: rows (or columns, if fewer) orthonormal, times the gain
            gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
            assert torch.allclose(gram, 2.0 * torch.eye(gram.shape[0]), atol=1e-4)
            assert not module.bias.any()
    assert torch.allclose(model.policy.weight @ model.policy.weight.T, 1e-4 * torch.eye(6), atol=1e-7)
    x = torch.randint(0, 256, (1, 8, *obs), dtype=torch.uint8) if kind == "shallow" else torch.randn(1, 8, *obs)
    probs = model(x).policy_logits.softmax(-1)
    assert (probs - 1 / 6).abs().max() < 0.02  # near-uniform, unlike torch's default init
    with pytest.raises(ValueError, match="init must be 'torch' or 'orthogonal', got 'xavier'"):
        make_model(kind, obs, 6, init="xavier")


def test_running_norm_merges_batches_exactly_and_standardises_with_a_clip():
    norm = RunningNorm((3,), clip=5.0)
    torch.testing.assert_close(
        norm(torch.tensor([[2.0, -1.0, 9.0]])), torch.tensor([[2.0, -1.0, 5.0]]), atol=1e-4, rtol=0
    )
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(100, 3, generator=gen) * 5 + 2, torch.randn(2, 37, 3, generator=gen) * 0.5 - 1
    norm.update(a)
    norm.update(b)  # leading dimensions are all samples
    seen = torch.cat([a, b.reshape(-1, 3)])
    assert int(norm.count) == 174
    torch.testing.assert_close(norm.mean, seen.mean(0))
    torch.testing.assert_close(norm.var, seen.var(0, unbiased=False))
    x = torch.randn(4, 3, generator=gen)
    expected = ((x - seen.mean(0)) / torch.sqrt(seen.var(0, unbiased=False) + 1e-5)).clamp(-5, 5)
    torch.testing.assert_close(norm(x), expected)
    torch.testing.assert_close(norm.denormalize(norm(x)), x)  # the inverse, where nothing was clipped
    with pytest.raises(ValueError, match=r"RunningNorm of shape \(3,\): got a batch of shape \(4, 2\)"):
        norm.update(torch.zeros(4, 2))


@pytest.mark.parametrize(
    "kind, obs", [("shallow", torch.full((1, 1, 4, 84, 84), 200, dtype=torch.uint8)), ("mlp", torch.ones(1, 1, 4))]
)
def test_a_model_that_normalizes_its_input_keeps_the_statistics_in_its_state_dict(kind, obs):
    shape = tuple(obs.shape[2:])
    model = make_model(kind, shape, 2, normalize_input=True)
    assert {"torso.obs_norm.mean", "torso.obs_norm.var", "torso.obs_norm.count"} <= set(model.state_dict())
    model.torso.obs_norm.update(obs.flatten(0, 1).float())
    # every element now sits at its mean: the torso sees zeros, whatever the raw values
    zeros = make_model(kind, shape, 2)
    zeros.load_state_dict({k: v for k, v in model.state_dict().items() if "obs_norm" not in k})
    features = model.torso(obs.flatten(0, 1))
    if kind == "mlp":
        torch.testing.assert_close(features, zeros.torso(torch.zeros(1, 4)))
    else:
        torch.testing.assert_close(features, zeros.torso(torch.zeros(1, *shape, dtype=torch.uint8)))
    assert "obs_norm" not in {n.split(".")[1] for n in make_model(kind, shape, 2).state_dict() if "." in n}


def test_running_norm_moments_of_frames_are_exact_integer_sums():
    gen = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 256, (3, 10, 2, 5, 6), dtype=torch.uint8, generator=gen)
    n, total, square = RunningNorm((2, 5, 6)).moments(frames[:, ::2])  # not contiguous: every other column
    as_int = frames[:, ::2].reshape(-1, 2, 5, 6).long()
    assert n == 15 and total.dtype == square.dtype == torch.float64
    assert torch.equal(total, as_int.sum(0).double()) and torch.equal(square, as_int.square().sum(0).double())
    float_path = RunningNorm((2, 5, 6)).moments(frames[:, ::2].float())  # the chunked float32 sums
    assert torch.equal(float_path[1], total) and torch.equal(float_path[2], square)
    # more rows of 255 than an int32 sum of squares holds (2^31 / 255^2 = 33,025): chunks keep it exact
    rows = 40_000
    n, total, square = RunningNorm((1,)).moments(torch.full((rows, 1), 255, dtype=torch.uint8))
    assert (n, float(total), float(square)) == (rows, 255.0 * rows, 255.0**2 * rows)
    n, total, square = RunningNorm((2, 3)).moments(torch.zeros(0, 2, 3, dtype=torch.uint8))  # no rows
    assert n == 0 and torch.equal(total, torch.zeros(2, 3, dtype=torch.float64)) and torch.equal(square, total)
