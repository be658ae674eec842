"""The IMPALA loss against torchbeast's formulas written out over the slow V-trace reference, and
APPO's clipped losses against a slow reference written from PPO's equations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_learners_vtrace import reference_vtrace

from learners.loss import (
    ImpalaLoss,
    appo_loss,
    baseline_loss,
    clip_rewards,
    clipped_baseline_loss,
    clipped_policy_loss,
    entropy_loss,
    impala_loss,
    policy_gradient_loss,
)
from learners.models import make_model


def batch(T=5, B=3, A=4, seed=0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    return dict(
        behaviour_logits=torch.randn(T, B, A, generator=generator, dtype=dtype) * 2,
        target_logits=(torch.randn(T, B, A, generator=generator, dtype=dtype) * 2).requires_grad_(True),
        actions=torch.randint(0, A, (T, B), generator=generator),
        rewards=torch.randn(T, B, generator=generator, dtype=dtype) * 3,  # many beyond the +-1 clip
        done=torch.rand(T, B, generator=generator) < 0.25,
        values=torch.randn(T, B, generator=generator, dtype=dtype).requires_grad_(True),
        bootstrap_value=torch.randn(B, generator=generator, dtype=dtype),
    )


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def reference_targets(b, discount, reward_clip):
    """torchbeast's ``learn`` up to V-trace, over NumPy: ``log pi(a_t)``, ``vs`` and ``pg_advantages``."""
    actions = b["actions"].numpy()[..., None]
    target_log_pi = np.take_along_axis(log_softmax(b["target_logits"].detach().numpy()), actions, -1)[..., 0]
    behaviour_log_mu = np.take_along_axis(log_softmax(b["behaviour_logits"].numpy()), actions, -1)[..., 0]
    rewards = np.clip(b["rewards"].numpy(), -reward_clip, reward_clip)
    discounts = (~b["done"].numpy()) * discount
    values = b["values"].detach().numpy()
    vs, pg_advantages = reference_vtrace(
        target_log_pi - behaviour_log_mu, discounts, rewards, values, b["bootstrap_value"].numpy(), 1.0, 1.0, 1.0
    )
    return target_log_pi, vs, pg_advantages


def reference_loss(b, discount, reward_clip, baseline_cost, entropy_cost, mean):
    """The three terms of torchbeast's loss (moolib's with ``mean``) and their weighted sum."""
    target_log_pi, vs, pg_advantages = reference_targets(b, discount, reward_clip)
    reduce = np.mean if mean else np.sum
    pg = reduce(-target_log_pi * pg_advantages)
    baseline = 0.5 * reduce((vs - b["values"].detach().numpy()) ** 2)
    log_pi = log_softmax(b["target_logits"].detach().numpy())
    negative_entropy = reduce((np.exp(log_pi) * log_pi).sum(-1))
    return pg + baseline_cost * baseline + entropy_cost * negative_entropy, pg, baseline, negative_entropy


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("T, B", [(5, 3), (1, 1), (20, 1)])
def test_matches_reference(reduction, T, B):
    b = batch(T, B, seed=T * 10 + B)
    loss = impala_loss(**b, discount=0.97, reward_clip=1.0, baseline_cost=0.5, entropy_cost=0.01, reduction=reduction)
    assert isinstance(loss, ImpalaLoss) and all(term.shape == () for term in loss)
    expected = reference_loss(b, 0.97, 1.0, 0.5, 0.01, mean=reduction == "mean")
    for got, want in zip(loss, expected):
        np.testing.assert_allclose(got.item(), want, rtol=1e-10)


def test_float32_matches_float64():
    b64 = batch(seed=4)
    b32 = {
        k: (v.detach().float().requires_grad_(v.requires_grad) if v.is_floating_point() else v) for k, v in b64.items()
    }
    for got, want in zip(impala_loss(**b32), impala_loss(**b64)):
        assert got.dtype == torch.float32
        np.testing.assert_allclose(got.item(), want.item(), rtol=1e-4)


def test_values_get_only_the_baseline_gradient():
    # vs is a constant: d total / d V(x_t) = baseline_cost * (V(x_t) - v_t), the policy terms give none.
    b = batch(seed=2)
    loss = impala_loss(**b, baseline_cost=0.25)
    loss.total.backward()
    vs = torch.from_numpy(reference_targets(b, 0.99, 1.0)[1])
    torch.testing.assert_close(b["values"].grad, 0.25 * (b["values"].detach() - vs))
    assert b["target_logits"].grad is not None and torch.isfinite(b["target_logits"].grad).all()


def test_done_cuts_the_return():
    # On-policy, reward 1 every step, an episode end after step 1: v_1 = 1 and v_0 = 1 + gamma.
    T, B = 3, 1
    logits = torch.zeros(T, B, 2, dtype=torch.float64)
    done = torch.tensor([[False], [True], [False]])
    values = torch.zeros(T, B, dtype=torch.float64, requires_grad=True)
    loss = impala_loss(
        logits,
        logits,
        torch.zeros(T, B, dtype=torch.long),
        torch.ones(T, B, dtype=torch.float64),
        done,
        values,
        torch.full((B,), 10.0, dtype=torch.float64),
        discount=0.5,
        entropy_cost=0.0,
    )
    vs = [1.5, 1.0, 1.0 + 0.5 * 10.0]
    np.testing.assert_allclose(loss.baseline.item(), 0.5 * sum(v * v for v in vs))


def test_clip_rewards():
    rewards = torch.tensor([-3.0, -0.5, 0.0, 0.7, 2.0])
    torch.testing.assert_close(clip_rewards(rewards), torch.tensor([-1.0, -0.5, 0.0, 0.7, 1.0]))
    torch.testing.assert_close(clip_rewards(rewards, 0.6), torch.tensor([-0.6, -0.5, 0.0, 0.6, 0.6]))
    assert clip_rewards(rewards, None) is rewards


def test_terms():
    advantages = torch.tensor([[1.0, -2.0], [3.0, 0.0]])
    assert baseline_loss(advantages).item() == 0.5 * 14.0
    assert baseline_loss(advantages, "mean").item() == 0.5 * 14.0 / 4
    log_probs = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    pg = policy_gradient_loss(log_probs, advantages.requires_grad_(True))
    assert pg.item() == pytest.approx(1.0 - 4.0 + 1.5)
    pg.backward()
    assert advantages.grad is None  # held constant
    uniform = torch.zeros(3, 4)
    assert entropy_loss(uniform).item() == pytest.approx(-3 * np.log(4))


def test_a_bandit_learns_the_better_arm():
    # One state, action 1 pays 1, action 0 pays 0; a few updates on on-policy batches prefer action 1.
    torch.manual_seed(0)
    model = make_model("mlp", (4,), 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    obs = torch.ones(4, 16, 4)  # [T, B, 4]
    done = torch.ones(4, 16, dtype=torch.bool)
    for _ in range(15):
        with torch.no_grad():
            behaviour = model(obs).policy_logits
        actions = torch.distributions.Categorical(logits=behaviour).sample()
        out = model(obs)
        loss = impala_loss(
            behaviour, out.policy_logits, actions, actions.float(), done, out.baseline, out.baseline[-1].detach()
        )
        optimizer.zero_grad()
        loss.total.backward()
        optimizer.step()
    probs = torch.softmax(model(obs[:1, :1]).policy_logits, -1)[0, 0]
    assert probs[1] > 0.9


def test_bad_arguments_are_named():
    b = batch()
    with pytest.raises(TypeError, match=r"done must be a torch.bool tensor, got a torch.float64 tensor"):
        impala_loss(**{**b, "done": b["done"].double()})
    with pytest.raises(ValueError, match=r"done must have the shape of values \(5, 3\), got \(5, 2\)"):
        impala_loss(**{**b, "done": b["done"][:, :2]})
    with pytest.raises(ValueError, match=r"discount must be in \[0, 1\], got 1.5"):
        impala_loss(**b, discount=1.5)
    with pytest.raises(ValueError, match=r"entropy_cost must be >= 0, got -0.1"):
        impala_loss(**b, entropy_cost=-0.1)
    with pytest.raises(TypeError, match=r"baseline_cost must be a number, got str"):
        impala_loss(**b, baseline_cost="0.5")
    with pytest.raises(ValueError, match=r"reward_clip must be > 0 or None, got -1"):
        impala_loss(**b, reward_clip=-1)
    with pytest.raises(ValueError, match=r"reduction must be 'sum' or 'mean', got 'max'"):
        impala_loss(**b, reduction="max")
    with pytest.raises(TypeError, match=r"rewards must be a floating point tensor, got a torch.int64 tensor"):
        clip_rewards(torch.zeros(3, dtype=torch.long))


# -- APPO's clipped losses, against PPO's equations (Schulman et al. 2017, eq. 7 and 9) --


def _reference_policy(log_ratio, adv, eps):
    total = 0.0
    for lr, a in zip(log_ratio.flatten().tolist(), adv.flatten().tolist()):
        r = math.exp(lr)
        total += -min(r * a, min(max(r, 1 - eps), 1 + eps) * a)
    return total / log_ratio.numel()


def _reference_value(values, old, targets, clip):
    total = 0.0
    for v, o, t in zip(values.flatten().tolist(), old.flatten().tolist(), targets.flatten().tolist()):
        clipped = o + min(max(v - o, -clip), clip)
        total += 0.5 * max((t - v) ** 2, (t - clipped) ** 2)
    return total / values.numel()


@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_clipped_policy_loss_matches_reference(eps):
    g = torch.Generator().manual_seed(1)
    log_ratio = torch.randn(6, 5, generator=g, dtype=torch.float64) * 0.4  # crosses both clip edges
    adv = torch.randn(6, 5, generator=g, dtype=torch.float64)
    got = clipped_policy_loss(log_ratio, adv, eps)
    assert float(got) == pytest.approx(_reference_policy(log_ratio, adv, eps), rel=1e-12)


def test_clipped_policy_loss_stops_the_gradient_past_the_clip():
    # a positive advantage whose ratio is already above 1 + eps gets no gradient; below it does
    log_ratio = torch.tensor([math.log(1.5), math.log(1.05)], requires_grad=True)
    clipped_policy_loss(log_ratio, torch.tensor([1.0, 1.0]), 0.1, "sum").backward()
    assert log_ratio.grad[0] == 0 and log_ratio.grad[1] < 0


def test_clipped_baseline_loss_matches_reference():
    g = torch.Generator().manual_seed(2)
    values, old, targets = (torch.randn(4, 3, generator=g, dtype=torch.float64) for _ in range(3))
    got = clipped_baseline_loss(values, old, targets, 0.2)
    assert float(got) == pytest.approx(_reference_value(values, old, targets, 0.2), rel=1e-12)
    plain = clipped_baseline_loss(values, old, targets, None)
    assert float(plain) == pytest.approx(0.5 * float(((targets - values) ** 2).mean()), rel=1e-12)


def test_appo_loss_terms_and_normalisation():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 4, 3, generator=g, requires_grad=True)
    actions = torch.randint(0, 3, (5, 4), generator=g)
    prox = torch.log_softmax(logits.detach(), -1).gather(-1, actions[..., None])[..., 0]
    adv = torch.randn(5, 4, generator=g) * 10 + 3
    values = torch.randn(5, 4, generator=g, requires_grad=True)
    vs = torch.randn(5, 4, generator=g)
    loss = appo_loss(logits, prox, actions, adv, values, values.detach(), vs, entropy_cost=0.0, baseline_cost=0.0)
    # the ratio is 1 at the proximal policy: the policy term is minus the mean normalised advantage, i.e. 0
    assert float(loss.policy_gradient.detach()) == pytest.approx(0.0, abs=1e-6)
    raw = appo_loss(logits, prox, actions, adv, values, values.detach(), vs, normalize=False)
    assert float(raw.policy_gradient.detach()) == pytest.approx(-float(adv.mean()), rel=1e-6)
    given = appo_loss(logits, prox, actions, adv, values, values.detach(), vs, normalize=False, log_probs=prox + 0.5)
    assert float(given.policy_gradient.detach()) != pytest.approx(float(raw.policy_gradient.detach()))  # used as given
    raw.total.backward()
    assert logits.grad is not None and values.grad is not None


def test_appo_loss_names_a_bad_shape():
    x = torch.zeros(5, 4)
    with pytest.raises(ValueError, match=r"advantages must have the shape of values \(5, 4\), got \(5, 3\)"):
        appo_loss(torch.zeros(5, 4, 3), x, x.long(), torch.zeros(5, 3), x, x, x)
    with pytest.raises(ValueError, match=r"log_probs must have the shape of values \(5, 4\), got \(5,\)"):
        appo_loss(torch.zeros(5, 4, 3), x, x.long(), x, x, x, x, log_probs=torch.zeros(5))
