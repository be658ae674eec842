"""V-trace against a deliberately slow NumPy reference written next to the paper's equations.

Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
Actor-Learner Architectures", section 4. The reference uses the n-step sum of eq. (1)
directly (not the recursive form that ``learners.vtrace`` uses), with the
per-step discounts of a trajectory that may contain episode ends, so that the two
agree only if the recursion is right.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

from learners import vtrace
from learners.categorical import action_log_probs, entropy


def reference_vtrace(
    log_rhos, discounts, rewards, values, bootstrap_value, clip_rho_threshold, clip_pg_rho_threshold, lambda_
):
    """One element at a time, one sum term at a time; inputs are [T, B, ...] NumPy arrays."""
    T = values.shape[0]
    vs = np.zeros_like(values)
    pg_advantages = np.zeros_like(values)
    for index in np.ndindex(*values.shape[1:]):  # every batch element, including trailing dims
        rho = [math.exp(log_rhos[(t, *index)]) for t in range(T)]
        gamma = [discounts[(t, *index)] for t in range(T)]
        r = [rewards[(t, *index)] for t in range(T)]
        # V(x_t) for t = 0..T, with V(x_T) the bootstrap value.
        V = [values[(t, *index)] for t in range(T)] + [bootstrap_value[index]]
        # rho_t clipped at rho_bar (eq. 1), c_i = lambda min(c_bar = 1, rho_i) (section 4.1, as in Retrace(lambda)).
        rho_clip = [rho[t] if clip_rho_threshold is None else min(clip_rho_threshold, rho[t]) for t in range(T)]
        c = [lambda_ * min(1.0, rho[i]) for i in range(T)]
        # delta_t V = rho_t (r_t + gamma V(x_{t+1}) - V(x_t))  (eq. 1), with a per-step gamma_t.
        delta = [rho_clip[t] * (r[t] + gamma[t] * V[t + 1] - V[t]) for t in range(T)]
        v = []
        for s in range(T):
            # v_s = V(x_s) + sum_{t=s}^{s+n-1} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t V  (eq. 1),
            # n reaching the end of the trajectory; gamma^{t-s} is prod_{i=s}^{t-1} gamma_i here.
            total = V[s]
            for t in range(s, T):
                weight = 1.0
                for i in range(s, t):
                    weight *= gamma[i] * c[i]
                total += weight * delta[t]
            v.append(total)
        v.append(bootstrap_value[index])  # v_T = V(x_T)
        for s in range(T):
            vs[(s, *index)] = v[s]
            # rho_s (r_s + gamma v_{s+1} - V(x_s)), rho_s clipped at the pg threshold  (section 4.2).
            rho_pg = rho[s] if clip_pg_rho_threshold is None else min(clip_pg_rho_threshold, rho[s])
            pg_advantages[(s, *index)] = rho_pg * (r[s] + gamma[s] * v[s + 1] - V[s])
    return vs, pg_advantages


def make_inputs(shape, seed, dtype=np.float64):
    """Inputs whose log-rhos cross both thresholds, with episode ends (zero discounts)."""
    rng = np.random.default_rng(seed)
    log_rhos = rng.uniform(-2.5, 2.5, size=shape)  # rhos from 0.08 to 12
    discounts = np.where(rng.random(size=shape) < 0.2, 0.0, 0.9)
    rewards = rng.normal(size=shape)
    values = rng.normal(size=shape)
    bootstrap_value = rng.normal(size=shape[1:])
    return [np.asarray(x, dtype=dtype) for x in (log_rhos, discounts, rewards, values, bootstrap_value)]


SHAPES = [(5, 4), (5, 1), (1, 3), (1, 1), (6, 2, 3), (4, 2, 2, 3)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("thresholds", [(1.0, 1.0), (3.7, 2.2), (0.5, 1.5), (None, None)], ids=str)
@pytest.mark.parametrize("lambda_", [1.0, 0.9, 0.0])
def test_from_importance_weights_matches_reference_float64(shape, thresholds, lambda_):
    inputs = make_inputs(shape, seed=zlib.crc32(repr((shape, thresholds, lambda_)).encode()))
    expected = reference_vtrace(*inputs, *thresholds, lambda_)
    got = vtrace.from_importance_weights(*map(torch.from_numpy, inputs), *thresholds, lambda_=lambda_)
    assert got.vs.dtype == torch.float64 and got.vs.shape == shape
    np.testing.assert_allclose(got.vs.numpy(), expected[0], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.pg_advantages.numpy(), expected[1], rtol=1e-10, atol=1e-10)


def test_inputs_cross_both_thresholds():
    log_rhos = make_inputs((5, 4), seed=0)[0]
    rhos = np.exp(log_rhos)
    assert (rhos < 1.0).any() and (rhos > 3.7).any()


@pytest.mark.parametrize("shape", [(20, 32), (7, 2, 3)], ids=str)
def test_from_importance_weights_matches_reference_float32(shape):
    inputs = make_inputs(shape, seed=3)
    expected = reference_vtrace(*inputs, 1.0, 1.0, 1.0)
    got = vtrace.from_importance_weights(*(torch.from_numpy(x).float() for x in inputs))
    assert got.vs.dtype == torch.float32 and got.pg_advantages.dtype == torch.float32
    np.testing.assert_allclose(got.vs.numpy(), expected[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.pg_advantages.numpy(), expected[1], rtol=1e-5, atol=1e-5)


def test_on_policy_without_discount_ends_is_n_step_return():
    # rho = 1 everywhere: v_s is the discounted return bootstrapped from V(x_T) (section 4.1).
    T, gamma = 6, 0.9
    rewards = torch.arange(T, dtype=torch.float64).unsqueeze(1)  # [T, 1]
    values = torch.zeros(T, 1, dtype=torch.float64)
    bootstrap = torch.tensor([2.0], dtype=torch.float64)
    out = vtrace.from_importance_weights(
        torch.zeros(T, 1, dtype=torch.float64),
        torch.full((T, 1), gamma, dtype=torch.float64),
        rewards,
        values,
        bootstrap,
    )
    returns = [sum(gamma ** (t - s) * t for t in range(s, T)) + gamma ** (T - s) * 2.0 for s in range(T)]
    np.testing.assert_allclose(out.vs[:, 0].numpy(), returns, rtol=1e-12)


def test_non_contiguous_inputs():
    inputs = [torch.from_numpy(x) for x in make_inputs((3, 4, 5), seed=7)]
    transposed = [x.transpose(1, 2).contiguous().transpose(1, 2) if x.dim() == 3 else x for x in inputs]
    assert not transposed[0].is_contiguous()
    expected = vtrace.from_importance_weights(*inputs)
    got = vtrace.from_importance_weights(*transposed)
    torch.testing.assert_close(got.vs, expected.vs)
    torch.testing.assert_close(got.pg_advantages, expected.pg_advantages)


def logits_inputs(shape, num_actions, seed, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    behaviour_logits = torch.randn(*shape, num_actions, generator=generator, dtype=dtype) * 2
    target_logits = torch.randn(*shape, num_actions, generator=generator, dtype=dtype) * 2
    actions = torch.randint(0, num_actions, shape, generator=generator)
    _, discounts, rewards, values, bootstrap_value = (torch.from_numpy(x).to(dtype) for x in make_inputs(shape, seed))
    return behaviour_logits, target_logits, actions, discounts, rewards, values, bootstrap_value


@pytest.mark.parametrize("shape", [(5, 3), (1, 1), (4, 2, 3)], ids=str)
def test_from_logits_matches_reference(shape):
    behaviour_logits, target_logits, actions, discounts, rewards, values, bootstrap = logits_inputs(shape, 5, seed=11)
    out = vtrace.from_logits(behaviour_logits, target_logits, actions, discounts, rewards, values, bootstrap)
    # pi(a) / mu(a) from softmax probabilities, written out.
    pi = torch.softmax(target_logits, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    mu = torch.softmax(behaviour_logits, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    log_rhos = torch.log(pi / mu)
    torch.testing.assert_close(out.log_rhos, log_rhos)
    torch.testing.assert_close(out.target_action_log_probs, torch.log(pi))
    torch.testing.assert_close(out.behaviour_action_log_probs, torch.log(mu))
    expected = reference_vtrace(*(x.numpy() for x in (log_rhos, discounts, rewards, values, bootstrap)), 1.0, 1.0, 1.0)
    np.testing.assert_allclose(out.vs.numpy(), expected[0], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected[1], rtol=1e-10, atol=1e-10)


def test_gradients_do_not_flow_into_targets():
    behaviour_logits, target_logits, actions, discounts, rewards, values, bootstrap = logits_inputs((4, 2), 3, seed=1)
    target_logits.requires_grad_(True)
    values.requires_grad_(True)
    bootstrap.requires_grad_(True)
    out = vtrace.from_logits(behaviour_logits, target_logits, actions, discounts, rewards, values, bootstrap)
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad
    assert not out.log_rhos.requires_grad and not out.behaviour_action_log_probs.requires_grad
    assert out.target_action_log_probs.requires_grad
    out.target_action_log_probs.sum().backward()
    assert values.grad is None and bootstrap.grad is None and target_logits.grad is not None
    direct = vtrace.from_importance_weights(out.log_rhos.requires_grad_(True), discounts, rewards, values, bootstrap)
    assert not direct.vs.requires_grad and not direct.pg_advantages.requires_grad


def bad(**changes):
    inputs = dict(
        zip(
            ("log_rhos", "discounts", "rewards", "values", "bootstrap_value"),
            (torch.zeros(3, 2),) * 4 + (torch.zeros(2),),
        )
    )
    inputs.update(changes)
    return inputs


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (bad(rewards=torch.zeros(3, 3)), ValueError, r"rewards must have the shape of values \(3, 2\), got \(3, 3\)"),
        (
            bad(bootstrap_value=torch.zeros(3)),
            ValueError,
            r"bootstrap_value must have the shape of values without T, \(2,\), got \(3,\)",
        ),
        (bad(values=torch.zeros(2)), ValueError, r"values must be \[T, B, ...\] with T >= 1, got shape \(2,\)"),
        (bad(values=torch.zeros(0, 2), log_rhos=torch.zeros(0, 2)), ValueError, r"T >= 1, got shape \(0, 2\)"),
        (
            bad(discounts=torch.zeros(3, 2, dtype=torch.int64)),
            TypeError,
            r"discounts must be a floating point tensor, got a torch.int64 tensor",
        ),
        (bad(rewards=[[0.0] * 2] * 3), TypeError, r"rewards must be a floating point tensor, got list"),
        (
            bad(rewards=torch.zeros(3, 2, dtype=torch.float64)),
            TypeError,
            r"rewards must be torch.float32 on cpu like values, got torch.float64 on cpu",
        ),
        (bad(clip_rho_threshold=0.0), ValueError, r"clip_rho_threshold must be > 0 or None, got 0.0"),
        (bad(clip_pg_rho_threshold="1"), TypeError, r"clip_pg_rho_threshold must be a number or None, got str"),
        (bad(lambda_=1.5), ValueError, r"lambda_ must be in \[0, 1\], got 1.5"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        vtrace.from_importance_weights(**kwargs)


def test_from_logits_bad_arguments_are_named():
    behaviour_logits, target_logits, actions, discounts, rewards, values, bootstrap = logits_inputs((3, 2), 4, seed=0)
    with pytest.raises(ValueError, match=r"must have the same shape, got \(3, 2, 4\) and \(3, 2, 5\)"):
        vtrace.from_logits(
            behaviour_logits, torch.zeros(3, 2, 5, dtype=torch.float64), actions, discounts, rewards, values, bootstrap
        )
    with pytest.raises(ValueError, match=r"shape of actions \(3, 3\) plus one dimension of actions, got \(3, 2, 4\)"):
        vtrace.from_logits(
            behaviour_logits, target_logits, torch.zeros(3, 3, dtype=torch.long), discounts, rewards, values, bootstrap
        )
    with pytest.raises(TypeError, match=r"actions must be an integer tensor, got a torch.float32 tensor"):
        vtrace.from_logits(behaviour_logits, target_logits, actions.float(), discounts, rewards, values, bootstrap)


def test_action_log_probs_and_entropy():
    logits = torch.tensor([[0.0, math.log(3.0)], [5.0, 5.0]], dtype=torch.float64)  # [2, 2]: p = (1/4, 3/4), (1/2, 1/2)
    actions = torch.tensor([1, 0])
    torch.testing.assert_close(
        action_log_probs(logits, actions), torch.tensor([math.log(0.75), math.log(0.5)], dtype=torch.float64)
    )
    expected = [-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), math.log(2.0)]
    torch.testing.assert_close(entropy(logits), torch.tensor(expected, dtype=torch.float64))
    higher = torch.randn(3, 2, 4, 6, dtype=torch.float64)  # [T, B, N, A]
    assert entropy(higher).shape == (3, 2, 4)
    torch.testing.assert_close(entropy(higher), torch.distributions.Categorical(logits=higher).entropy())


def test_entropy_of_masked_logits_is_finite_with_finite_gradient():
    logits = torch.tensor([0.0, 0.0, -math.inf], requires_grad=True)
    value = entropy(logits)
    value.backward()
    torch.testing.assert_close(value, torch.tensor(math.log(2.0)))
    assert torch.isfinite(logits.grad).all()


def test_helpers_name_bad_arguments():
    with pytest.raises(TypeError, match=r"logits must be a floating point tensor, got a torch.int64 tensor"):
        entropy(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"at least one action in their last dimension, got shape \(2, 0\)"):
        entropy(torch.zeros(2, 0))
    with pytest.raises(ValueError, match=r"shape of logits without its last dimension, \(2,\), got \(3,\)"):
        action_log_probs(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"actions must be an integer tensor, got a torch.bool tensor"):
        action_log_probs(torch.zeros(2, 3), torch.zeros(2, dtype=torch.bool))
