"""The APPO learners of the group tests: one small setting (an MLP with input and value
statistics, 2 epochs of 2 minibatches, the KL-adapted rate), the batches each member
trains on, and fixed minibatch orders, shared by the in-process tests
(``tests/test_net_appo_group.py``) and the peer processes (``net_peer.py --algo appo``)."""

from __future__ import annotations

import numpy as np
import torch

from actors.envs.spec import EnvSpec
from actors.trajectory import trajectory_spec
from learners import LearnerConfig, make_model
from learners.learner import Learner
from learners.models import ActorCritic
from shmpad.ringbuf import TypedRing

T, B, OBS, A = 5, 4, (3,), 2
EPOCHS, MINIBATCHES = 2, 2


def spec() -> dict:
    env = EnvSpec(
        env_id="Test-v0",
        obs_shape=OBS,
        obs_dtype=np.dtype(np.float32),
        action_shape=(),
        action_dtype=np.dtype(np.int64),
        num_actions=A,
    )
    return trajectory_spec(env, T)


def config(**overrides) -> LearnerConfig:
    """APPO with every group-steered part on: RMSProp (whose step is smooth in the gradient,
    so that rounding moves it by rounding only; Adam's first step is the gradient's sign)."""
    values = dict(
        batch_size=B,
        algo="appo",
        epochs=EPOCHS,
        minibatches=MINIBATCHES,
        optimizer="rmsprop",
        learning_rate=3e-3,
        kl_target=1e-4,
        normalize_advantages=True,
    )
    return LearnerConfig(**{**values, **overrides})


def model(seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    return make_model("mlp", OBS, A, normalize_input=True, normalize_value=True)


def learner(net: ActorCritic, cfg: LearnerConfig, kind: type[Learner] = Learner) -> Learner:
    """A learner (of class ``kind``) fed through ``update``: its trajectory ring gives it the
    slots' layout only, and is gone before it returns."""
    ring = TypedRing.create(spec(), capacity=1)
    try:
        return kind(net, ring, cfg)
    finally:
        ring.close()


def batch(seed: int, columns: int = B) -> dict[str, torch.Tensor]:
    """A time-major batch ``{field: [T+1, columns, ...]}`` of made-up unrolls; inputs far from
    mean 0 and deviation 1, so that the input statistics matter."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (dtype, shape) in spec().items():
        out[name] = np.zeros((shape[0], columns, *shape[1:]), dtype=dtype)
    out["obs"][...] = rng.normal(2.0 + seed, 3.0, size=out["obs"].shape)
    out["action"][...] = rng.integers(0, A, size=out["action"].shape)
    out["reward"][...] = rng.normal(size=out["reward"].shape)
    out["done"][...] = rng.random(size=out["done"].shape) < 0.1
    out["logits"][...] = rng.normal(size=out["logits"].shape)
    return {name: torch.from_numpy(v) for name, v in out.items()}


def orders(seed: int, columns: int = B) -> list[torch.Tensor]:
    """A member's minibatch order of each epoch, fixed by ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randperm(columns, generator=generator) for _ in range(EPOCHS)]


def union_orders(members: list[list[torch.Tensor]], columns: int = B) -> list[torch.Tensor]:
    """The order of one learner on the members' batches side by side whose minibatch ``k``
    of each epoch is the union of the members' minibatches ``k``."""
    size = columns // MINIBATCHES
    return [
        torch.cat(
            [
                order[epoch][k * size : (k + 1) * size] + i * columns
                for k in range(MINIBATCHES)
                for i, order in enumerate(members)
            ]
        )
        for epoch in range(EPOCHS)
    ]
