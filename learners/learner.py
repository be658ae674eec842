"""The IMPALA learner: batches of unrolls from a trajectory ring, V-trace, one
optimiser step, new weights to the weight store.

A batch is ``ring.get_batch(B, torch=True)``: zero-copy ``[B, T+1, ...]`` views of
the ring's slots. They are copied once, made time-major ``[T+1, B, ...]``, into staging
buffers and go back to the ring at once, before the update; on a GPU the staging is
pinned and the batch reaches the device on a side stream while the previous update
computes (``learners.transfer``). Weights are published every ``publish_every`` updates
(or every ``publish_seconds``), from a GPU without waiting for the device. ``compile``
and ``bf16`` choose how the forward pass and the loss run. Rows follow
``actors.rollout``: row ``t`` holds the observation, the action taken from it and its
behaviour logits, and the reward and done that came *with* it. A model with an LSTM
core starts each unroll from the core state stored in its slot (``core_state_<i>``,
``[B, layers, hidden]``, made ``[layers, B, hidden]`` by the same copy), as torchbeast
and moolib do.
"""

from __future__ import annotations

import collections
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from actors.trajectory import LAST_ACTION, POLICY_VERSION, core_state_fields, unroll_length
from learners.loss import ImpalaLoss, impala_loss
from learners.models import ActorCritic, ModelOutput
from learners.transfer import BatchStager, WeightPublisher
from shmpad.errors import Timeout
from shmpad.ringbuf import TypedRing
from shmpad.weights import WeightStore

__all__ = ["LearnerConfig", "Learner", "LearnerStatistics"]


@dataclass
class LearnerConfig:
    """Loss and optimisation; defaults from moolib's and the paper's Atari setups."""

    batch_size: int = 32
    """unrolls per update (B)"""
    discount: float = 0.99
    """gamma"""
    reward_clip: float | None = 1.0
    """clip the learner's rewards to [-c, c] (None: no clipping)"""
    baseline_cost: float = 0.5
    """weight of the baseline loss"""
    entropy_cost: float = 6e-4
    """weight of the entropy bonus"""
    grad_norm_clip: float | None = 40.0
    """clip the global gradient norm (None: no clipping)"""
    optimizer: Literal["adam", "rmsprop"] = "adam"
    """the optimiser"""
    learning_rate: float = 6e-4
    """initial learning rate, decayed linearly to 0 over total_frames"""
    adam_eps: float = 1e-8
    """Adam's epsilon"""
    rmsprop_alpha: float = 0.99
    """RMSProp's smoothing constant"""
    rmsprop_eps: float = 0.01
    """RMSProp's epsilon (torchbeast's Atari setting)"""
    rmsprop_momentum: float = 0.0
    """RMSProp's momentum"""
    reduction: Literal["sum", "mean"] = "mean"
    """how the loss reduces over time and batch: "mean" (moolib) or "sum" (torchbeast)"""
    total_frames: int = 0
    """frames over which the learning rate decays to 0 (0: no decay)"""
    frames_per_step: int = 1
    """environment frames per agent step (the frame skip: 4 on Atari)"""
    publish_every: int = 1
    """updates between two publishes of the weights (a tiny model is otherwise dominated by publishing)"""
    publish_seconds: float = 0.0
    """> 0: publish at the first update this many seconds after the last publish, instead of every publish_every"""
    compile: bool = False
    """``torch.compile`` the forward pass and the loss (and so their backward); falls back to eager if it fails"""
    bf16: bool = False
    """run the model under bf16 autocast (the loss stays fp32)"""

    def check(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {self.batch_size!r}")
        if self.optimizer not in ("adam", "rmsprop"):
            raise ValueError(f"optimizer must be 'adam' or 'rmsprop', got {self.optimizer!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")
        if self.grad_norm_clip is not None and not self.grad_norm_clip > 0:
            raise ValueError(f"grad_norm_clip must be > 0 or None, got {self.grad_norm_clip!r}")
        if self.total_frames < 0:
            raise ValueError(f"total_frames must be >= 0, got {self.total_frames!r}")
        if self.frames_per_step < 1:
            raise ValueError(f"frames_per_step must be >= 1, got {self.frames_per_step!r}")
        if isinstance(self.publish_every, bool) or not isinstance(self.publish_every, int) or self.publish_every < 1:
            raise ValueError(f"publish_every must be an int >= 1, got {self.publish_every!r}")
        if isinstance(self.publish_seconds, bool) or not self.publish_seconds >= 0:
            raise ValueError(
                f"publish_seconds must be >= 0 (0: every publish_every updates), got {self.publish_seconds!r}"
            )


@dataclass(frozen=True)
class LearnerStatistics:
    steps: int
    frames: int
    episodes: int
    mean_return: float
    """mean true return of the last 100 episodes (nan before the first)"""
    wait_seconds: float
    """time spent waiting for batches"""
    update_seconds: float
    """time spent in forward, backward and the optimiser"""
    learning_rate: float
    last_loss: dict
    policy_lag_sum: float = 0.0
    """the sum over batches of each batch's mean policy lag: how many updates older than the
    learner the weights that chose the actions were"""
    policy_lag_batches: int = 0
    """the batches whose policy lag is in ``policy_lag_sum``"""


class Learner:
    """Trains ``model`` on batches from ``ring`` and publishes it to ``weights``."""

    def __init__(
        self,
        model: ActorCritic,
        ring: TypedRing,
        config: LearnerConfig,
        weights: WeightStore | None = None,
        device: str | torch.device = "cpu",
    ):
        config.check()
        self.core_state_fields = core_state_fields(ring.spec) if model.use_lstm else []
        if model.use_lstm:
            expected = [(s.shape[0], *s.shape[2:]) for s in model.initial_state(1)]  # [layers, hidden] per tensor
            got = [tuple(ring.spec[f][1]) for f in self.core_state_fields]
            if got != expected:
                raise ValueError(
                    f"the model's LSTM core needs trajectory slots holding its state of shapes {expected}, "
                    f"got {got} (trajectory_spec(..., core_state_shapes={expected}))"
                )
        if getattr(model, "last_action_reward", False) and LAST_ACTION not in ring.spec:
            raise ValueError(
                f"the model takes the last action and reward: the trajectory slots need a {LAST_ACTION!r} field "
                f"(trajectory_spec makes one), got fields {sorted(ring.spec)}"
            )
        self.model = model.to(device).train()
        self.ring = ring
        self.config = config
        self.weights = weights
        self.device = torch.device(device)
        self.unroll_length = unroll_length(ring.spec)
        cuda = self.device.type == "cuda"
        # fused Adam on a GPU (one kernel for every parameter); foreach elsewhere (fewer, larger ops)
        fast = {"fused": True} if cuda else {"foreach": True}
        if config.optimizer == "adam":
            self.optimizer: torch.optim.Optimizer = torch.optim.Adam(
                model.parameters(), lr=config.learning_rate, eps=config.adam_eps, **fast
            )
        else:
            self.optimizer = torch.optim.RMSprop(
                model.parameters(),
                lr=config.learning_rate,
                alpha=config.rmsprop_alpha,
                eps=config.rmsprop_eps,
                momentum=config.rmsprop_momentum,
                foreach=True,
            )
        self.stager = BatchStager(self.device)
        """batches go ring -> time-major staging (pinned on a GPU) -> device, double-buffered"""
        self.compiled = config.compile
        """whether the loss runs compiled (False after a failed compile fell back to eager)"""
        self._loss_fn = torch.compile(self._loss) if config.compile else self._loss
        self.frames_per_update = config.batch_size * self.unroll_length * config.frames_per_step
        total_updates = math.ceil(config.total_frames / self.frames_per_update) if config.total_frames else 0
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: max(0.0, 1.0 - step / total_updates) if total_updates else 1.0
        )
        self.steps = 0
        self.frames = 0
        self.episodes = 0
        self.returns: collections.deque[float] = collections.deque(maxlen=100)
        self.new_returns: list[float] = []
        """every episode's true return as it ends, for the caller to take (and clear)"""
        self._lag_sum = 0.0
        self._lag_batches = 0
        self._wait_s = 0.0
        self._update_s = 0.0
        self._last_loss: ImpalaLoss | None = None  # tensors: read (and synchronised) only by statistics()
        self.accumulator: Any = None
        """a ``shmpad.net.Accumulator`` built on this learner's model, optimiser and
        scheduler: gradients are then averaged with the group's learners before each
        step (see ``join_group``)"""
        self.skipped = 0
        """batches that led to no step of their own: the group's virtual batch was not
        complete yet, or the reduction was abandoned because the group changed"""
        self.publisher = (
            WeightPublisher(self.model, weights, config.publish_every, config.publish_seconds)
            if weights is not None
            else None
        )
        if self.publisher is not None:
            self.publisher.publish(self.steps)

    def join_group(self, broker: str, group: str = "default", **kwargs: Any) -> None:
        """Average gradients with the other learners of ``group`` at ``broker``
        (``kwargs`` go to ``shmpad.net.Accumulator``: name, host, port, token...)."""
        from shmpad.net.accumulator import Accumulator

        self.accumulator = Accumulator(self.model, self.optimizer, self.scheduler, broker=broker, group=group, **kwargs)

    def step(self, timeout: float | None = None) -> ImpalaLoss:
        """One update from the next ``batch_size`` unrolls (waiting up to ``timeout``)."""
        t0 = time.perf_counter()
        if self.accumulator is not None:
            version = self.accumulator.version
            if not self.accumulator.ready(timeout):
                self._wait_s += time.perf_counter() - t0
                raise Timeout(f"the learner's group did not become ready within {timeout} s")
            if self.accumulator.version != version and self.publisher is not None:
                self.publisher.publish(self.steps)  # the group's state replaced ours
        batch = self.ring.get_batch(self.config.batch_size, timeout=timeout, torch=True)  # [B, T+1, ...]
        t1 = time.perf_counter()
        try:
            i = self.stager.stage(batch)  # staging buffer i now holds the batch, [T+1, B, ...]
        finally:
            self.ring.release()  # the slots are free while the copy to the device and the update run
        self._count_episodes(self.stager.host(i))
        try:
            loss = self._update(self.stager.to_device(i))
        finally:
            self.stager.done(i)
        self._wait_s += t1 - t0
        self._update_s += time.perf_counter() - t1
        return loss

    def update(self, batch: dict[str, torch.Tensor]) -> ImpalaLoss:
        """One optimiser step on a time-major batch ``{field: [T+1, B, ...]}``."""
        self._count_episodes(batch)
        if any(v.device != self.device for v in batch.values()):
            batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        return self._update(batch)

    def _update(self, batch: dict[str, torch.Tensor]) -> ImpalaLoss:
        loss = self._compute_loss(batch)
        self.frames += self.frames_per_update
        self._last_loss = ImpalaLoss(*(v.detach() for v in loss))
        if self.accumulator is not None and not self.accumulator.reduce_gradients(batch["done"].shape[1]):
            self.skipped += 1
            return loss
        if self.config.grad_norm_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_norm_clip, foreach=True)
        self.optimizer.step()
        self.scheduler.step()
        self.steps += 1
        if self.publisher is not None:
            self.publisher(self.steps)
        return loss

    def _compute_loss(self, batch: dict[str, torch.Tensor]) -> ImpalaLoss:
        """The loss and its gradients (compiled when asked; a compile that fails falls back to eager once)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self._loss_fn is self._loss:
            loss = self._loss(batch)
            loss.total.backward()
            return loss
        try:
            loss = self._loss_fn(batch)
            loss.total.backward()
            return loss
        except Exception as e:  # noqa: BLE001 - any compiler failure: say so once and run eager
            print(f"learner: torch.compile failed ({type(e).__name__}: {str(e)[:200]}); running eager", flush=True)
            self._loss_fn = self._loss
            self.compiled = False
            return self._compute_loss(batch)

    def _loss(self, batch: dict[str, torch.Tensor]) -> ImpalaLoss:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.bf16):
            out = self.forward(batch)  # logits [T+1, B, A], baseline [T+1, B]
        logits, baseline = out.policy_logits.float(), out.baseline.float()
        return impala_loss(
            behaviour_logits=batch["logits"][:-1],  # [T, B, A]
            target_logits=logits[:-1],
            actions=batch["action"][:-1].long(),  # [T, B]
            rewards=batch["reward"][1:],  # [T, B]: what each action earned
            done=batch["done"][1:].bool(),
            values=baseline[:-1],
            bootstrap_value=baseline[-1],  # [B]
            discount=self.config.discount,
            reward_clip=self.config.reward_clip,
            baseline_cost=self.config.baseline_cost,
            entropy_cost=self.config.entropy_cost,
            reduction=self.config.reduction,
        )

    def forward(self, batch: dict[str, torch.Tensor]) -> ModelOutput:
        """The model over a time-major batch, from the core state stored at the start of each unroll."""
        core_state = tuple(batch[f].contiguous() for f in self.core_state_fields)  # each [layers, B, hidden]
        if not getattr(self.model, "last_action_reward", False):
            return self.model(batch["obs"], batch["done"].bool(), core_state)
        return self.model(batch["obs"], batch["done"].bool(), core_state, batch[LAST_ACTION], batch["reward"])

    def _count_episodes(self, batch: dict[str, torch.Tensor]) -> None:
        """Episodes that ended and the policy lag of a batch (CPU tensors, time-major)."""
        # rows 1..T: row 0 repeats the previous unroll's last row
        ended, ret = batch["episode_end"][1:], batch["episode_return"][1:]
        if ended.device.type == "cpu":  # numpy's small operations cost a fraction of torch's
            ended, ret = ended.numpy(), ret.numpy()
        if ended.any():
            returns = ret[ended != 0].tolist()
            self.returns.extend(returns)
            self.new_returns.extend(returns)
            self.episodes += len(returns)
        if self.publisher is not None and POLICY_VERSION in batch and batch[POLICY_VERSION].device.type == "cpu":
            lag = self.publisher.lag(batch[POLICY_VERSION][1:], self.steps)
            if lag is not None:
                self._lag_sum += lag
                self._lag_batches += 1

    def statistics(self) -> LearnerStatistics:
        mean = sum(self.returns) / len(self.returns) if self.returns else float("nan")
        return LearnerStatistics(
            self.steps,
            self.frames,
            self.episodes,
            mean,
            self._wait_s,
            self._update_s,
            self.optimizer.param_groups[0]["lr"],
            {} if self._last_loss is None else {k: float(v) for k, v in self._last_loss._asdict().items()},
            self._lag_sum,
            self._lag_batches,
        )

    # -- checkpoints -------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "steps": self.steps,
            "frames": self.frames,
            "episodes": self.episodes,
            "returns": list(self.returns),
            "config": asdict(self.config),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps = int(state["steps"])
        self.frames = int(state["frames"])
        self.episodes = int(state["episodes"])
        self.returns = collections.deque(state["returns"], maxlen=100)
        if self.publisher is not None:
            self.publisher.publish(self.steps)

    def save(self, path: str) -> None:
        """Write a checkpoint atomically (a crash mid-write leaves the previous one)."""
        tmp = f"{path}.tmp.{os.getpid()}"
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, path)

    def load(self, path: str) -> None:
        self.load_state_dict(torch.load(path, map_location=self.device, weights_only=False))
