"""Batched inference over an ``EnvPool``, in the pool's process, on the CPU or a GPU.

Each ``step`` takes the next half from the pool, runs the policy on a zero-copy
torch view of its observation slots (moved to ``device`` when that is a GPU),
samples actions from the logits, writes them into the half's action slots and
sends them, so the workers of that half step while the other half is in the
network. With a ``RolloutWriter`` the step also records the half's row of every
unroll. With a ``WeightStore`` the model pulls newer weights before each batch.

A model with an LSTM core (``model.use_lstm``, a ``learners.ActorCritic``) is
stepped as ``model(obs[None], done[None], core_state)``: each half keeps its
environments' core state between its batches (zeroed by the model where ``done``
says an episode starts), and the rollouts get, with every row, the state the step
took as input, so each unroll carries the state it started from. A model with
``last_action_reward`` is stepped the same way and also takes each environment's
previous action (still in its action slot when the half comes back) and the reward in
its slot; every row records that previous action as ``last_action``.

``bf16`` runs the model under bf16 autocast (on a CPU with native bf16, inference
costs about half; the logits recorded are float32).

``graph`` replays the forward pass from a CUDA graph (``actors.cuda_graphs.CapturedForward``),
captured at the first batch: on a GPU a batch of a few dozen observations is bound by
launching the model's kernels one by one from Python. Sampling stays outside the graph.
On a CPU nothing is captured (the same code runs on static inputs), which is how it is tested.

``statistics()`` says where the time went: waiting for the workers, in the network,
recording rollouts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from actors.cuda_graphs import CapturedForward
from actors.pool.pool import EnvPool, HalfBatch
from actors.rollout import RolloutWriter
from actors.trajectory import CORE_STATE_PREFIX, LAST_ACTION, POLICY_VERSION, STEP_FIELDS
from shmpad.weights import WeightStore

__all__ = ["BatchedInference", "InferenceStatistics", "sample_actions"]


@dataclass(frozen=True)
class InferenceStatistics:
    batches: int
    env_steps: int
    wait_seconds: float
    inference_seconds: float
    rollout_seconds: float
    weights_version: int


def sample_actions(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One action per row of ``logits`` [B, A], drawn from softmax(logits)."""
    return torch.multinomial(torch.softmax(logits.float(), dim=-1), 1, generator=generator).squeeze(-1)


def _first_output(model: torch.nn.Module, obs: torch.Tensor) -> torch.Tensor:
    return model(obs)[0]


class BatchedInference:
    """``model`` driving ``pool``: ``policy(model, obs [B, ...]) -> logits [B, A]``, by
    default ``model(obs)[0]`` (for ``learners.ActorCritic``, which is time-major, pass
    ``policy=lambda m, obs: m(obs[None]).policy_logits[0]``). A model with
    ``use_lstm`` or ``last_action_reward`` is stepped as
    ``model(obs[None], done[None], core_state, last_action[None], reward[None])`` instead,
    and takes no ``policy``."""

    def __init__(
        self,
        pool: EnvPool,
        model: torch.nn.Module,
        device: str | torch.device = "cpu",
        rollouts: RolloutWriter | None = None,
        weights: WeightStore | None = None,
        seed: int = 0,
        policy: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] | None = None,
        bf16: bool = False,
        graph: bool = False,
    ):
        if not pool.spec.discrete:
            raise ValueError(
                f"BatchedInference samples discrete actions; {pool.spec.env_id!r} has {pool.spec.describe_actions()}"
            )
        self.recurrent = bool(getattr(model, "use_lstm", False))
        self.last_action_reward = bool(getattr(model, "last_action_reward", False))
        self.stepped = self.recurrent or self.last_action_reward
        """the model is called as model(obs[None], done[None], core_state, last_action[None], reward[None])"""
        if self.stepped and policy is not None:
            raise ValueError(
                "a model with an LSTM core or last_action_reward is stepped as "
                "model(obs[None], done[None], core_state, last_action[None], reward[None]); "
                f"policy= is for models that see only the observation, got {policy!r}"
            )
        self.pool = pool
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.rollouts = rollouts
        self.weights = weights
        self.policy = _first_output if policy is None else policy
        self.bf16 = bool(bf16)
        self.graph = bool(graph)
        self._forward = CapturedForward(self._run, self.device) if self.graph else self._run
        # per half: (h, c), each [layers, B/2, hidden]
        self._core = [model.initial_state(pool.half_size) for _ in range(pool.halves)] if self.recurrent else []
        self._version = 0
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._pinned: dict[Any, torch.Tensor] = {}  # CUDA: host staging of observations, actions and logits
        self._wait_ns = self._infer_ns = self._rollout_ns = 0
        self._batches = self._steps = 0

    def step(self, timeout: float | None = None) -> int:
        """Serve one half: recv, infer, send (and record). Returns the half served.
        (Its slots belong to the workers again once this returns.)"""
        t0 = time.perf_counter_ns()
        batch = self.pool.recv(timeout)
        t1 = time.perf_counter_ns()
        if self.weights is not None:
            self._version = self.weights.pull(self.model, newer_than=self._version)
        core_state: tuple[torch.Tensor, ...] = ()
        last_action = batch.action.copy() if self.rollouts is not None or self.last_action_reward else None
        with torch.inference_mode():
            inputs = [self._to_device(batch.obs, "obs")]  # [B/2, *obs_shape], no copy on CPU
            if self.stepped:
                core_state = self._core[batch.half] if self.recurrent else ()
                inputs += [self._to_device(batch.done, "done").bool(), *core_state]  # done [B/2]
                if self.last_action_reward:
                    inputs += [self._to_device(last_action, LAST_ACTION), self._to_device(batch.reward, "reward")]
            logits, *new_core = self._forward(*inputs)  # [B/2, A], then the core state after the step
            if self.recurrent:  # a graph's outputs are overwritten by its next replay (the other half's)
                self._core[batch.half] = tuple(c.clone() for c in new_core) if self.graph else tuple(new_core)
            actions, logits = self._to_host(sample_actions(logits, self._generator), logits)
        batch.action[:] = actions
        t2 = time.perf_counter_ns()
        if self.rollouts is not None:
            rows = _rows(batch, logits)
            rows[LAST_ACTION] = last_action
            rows[POLICY_VERSION] = self._version
            for i, s in enumerate(core_state):
                rows[f"{CORE_STATE_PREFIX}{i}"] = s.transpose(0, 1).float().cpu().numpy()  # [B/2, layers, hidden]
            self.rollouts.add(batch.half, rows)
        t3 = time.perf_counter_ns()
        self.pool.send()
        self._wait_ns += t1 - t0
        self._infer_ns += t2 - t1
        self._rollout_ns += t3 - t2
        self._batches += 1
        self._steps += len(batch.envs)
        return batch.half

    def _run(self, obs: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The forward pass over one half: ``(logits [B/2, A] float32, *core state after it)``
        from ``obs`` and, for a stepped model, ``done``, the core state and, with
        ``last_action_reward``, the previous actions and the rewards (``step`` gives them in
        that order). Tensors in, tensors out, so that ``CapturedForward`` can record it; under
        a graph, autocast keeps no cache of cast weights (a replay must cast the current ones)."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16, cache_enabled=not self.graph):
            if not self.stepped:
                return (self.policy(self.model, obs).float(),)
            done, rest = rest[0], rest[1:]
            layers = len(self._core[0]) if self.recurrent else 0
            core_state, rest = tuple(rest[:layers]), rest[layers:]
            extra = {"last_action": rest[0][None], "reward": rest[1][None]} if self.last_action_reward else {}
            out = self.model(obs[None], done[None], core_state, **extra)
            return (out.policy_logits[0].float(), *(out.core_state if self.recurrent else ()))

    def _to_device(self, array: np.ndarray, name: str) -> torch.Tensor:
        """The CPU: a view of the slots. CUDA: through a pinned buffer, asynchronously."""
        if self.device.type != "cuda":
            return torch.from_numpy(array)
        src = torch.from_numpy(array)
        pinned = self._pinned.get(name)
        if pinned is None or pinned.shape != src.shape:
            pinned = self._pinned[name] = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        pinned.copy_(src)
        return pinned.to(self.device, non_blocking=True)

    def _to_host(self, *tensors: torch.Tensor) -> list[np.ndarray]:
        """Numpy arrays of ``tensors``; from CUDA through pinned buffers with one synchronisation.
        On CUDA they are views of those buffers, which the next call overwrites: ``step`` copies
        them into the action slots and the rollout writer's staging before it returns, and
        keeps no reference to them, so they need no copy of their own."""
        if self.device.type != "cuda":
            return [t.numpy() for t in tensors]
        out = []
        for i, t in enumerate(tensors):
            pinned = self._pinned.get(i)
            if pinned is None or pinned.shape != t.shape or pinned.dtype != t.dtype:
                pinned = self._pinned[i] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            pinned.copy_(t, non_blocking=True)
            out.append(pinned)
        torch.cuda.current_stream(self.device).synchronize()  # the one wait of the batch
        return [p.numpy() for p in out]

    def core_state(self, half: int) -> tuple[torch.Tensor, ...]:
        """The core state the half's next batch starts from (``()`` for a feed-forward model)."""
        return self._core[half] if self.recurrent else ()

    def statistics(self) -> InferenceStatistics:
        return InferenceStatistics(
            self._batches, self._steps, self._wait_ns / 1e9, self._infer_ns / 1e9, self._rollout_ns / 1e9, self._version
        )


def _rows(batch: HalfBatch, logits: np.ndarray) -> dict[str, Any]:
    rows = {f: getattr(batch, f) for f in STEP_FIELDS}  # [B / halves, ...] each
    rows["logits"] = logits  # [B / halves, A]
    return rows
