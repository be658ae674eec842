"""The learner: batches of unrolls from a trajectory ring, V-trace, then one optimiser
step (IMPALA) or several over minibatches of the batch (APPO), new weights to the
weight store.

A batch is ``ring.get_batch(B, torch=True)``: zero-copy ``[B, T+1, ...]`` views of
the ring's slots. They are copied once, made time-major ``[T+1, B, ...]``, into staging
buffers and go back to the ring at once, before the update; on a GPU the staging is
pinned and the batch reaches the device on a side stream while the previous update
computes (``learners.staging``). Weights are published every ``publish_every`` updates
(or every ``publish_seconds``), from a GPU without waiting for the device. ``compile``
and ``bf16`` choose how the forward pass and the loss run. Rows follow
``actors.rollout``: row ``t`` holds the observation, the action taken from it and its
behaviour logits, and the reward and done that came *with* it. A model with an LSTM
core starts each unroll from the core state stored in its slot (``core_state_<i>``,
``[B, layers, hidden]``, made ``[layers, B, hidden]`` by the same copy), as torchbeast
and moolib do.

``algo="appo"`` reuses each batch for several steps (``learners.appo``); the learning-rate
schedule is one small object (``learners.schedule``), and the settings with their rules are
``learners.config.LearnerConfig``.

In a group of learners (``join_group``) every optimiser step is one reduction of the group's
gradients, each member's from its own batch (APPO: its own minibatch), and what steers the
steps is the group's: the input statistics (``RunningNorm``, summed over the members' batches
before each batch's loss), APPO's value statistics and minibatch advantage statistics, and the
KL that adapts the learning rate (averaged with each minibatch's gradients). Members with
equal batches thus take the steps one learner would take on the union of their batches, where
the loss is a mean (``reduction="mean"``, the default: with "sum", the union's gradient is the
group's times the number of members). Every
member makes the same reductions in the same order, batch by batch; where the group changes
during a batch (a reduction is abandoned), the member gives up the rest of that batch: the steps
it took stay, the schedule does not advance, and the next batch starts, after ``ready()``, in
the new group at the batch's first reduction, with every other member.
"""

from __future__ import annotations

import collections
import copy
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from actors.trajectory import LAST_ACTION, POLICY_VERSION, core_state_fields, unroll_length
from learners.appo import Appo
from learners.config import LearnerConfig
from learners.loss import ImpalaLoss, impala_loss
from learners.models import ActorCritic, ModelOutput, RunningNorm
from learners.schedule import KLAdaptive, make_schedule
from learners.staging import BatchStager, WeightPublisher
from shmpad.errors import Timeout
from shmpad.ringbuf import TypedRing
from shmpad.weights import WeightStore

__all__ = ["Learner", "LearnerConfig", "LearnerStatistics"]


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
        self.unroll_length = unroll_length(ring.spec)
        self.value_norm = getattr(model, "value_norm", None)
        """the statistics of the value targets, for a model whose baseline predicts them standardised (APPO)"""
        config.check(
            use_lstm=model.use_lstm, normalize_value=self.value_norm is not None, unroll_length=self.unroll_length
        )
        self.core_state_fields = core_state_fields(ring.spec) if model.use_lstm else []
        self.core_states = set(core_state_fields(ring.spec))  # not time-major: [layers, B, hidden]
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
        self.appo = Appo(self) if config.algo == "appo" else None
        """APPO's update (``learners.appo``); None for IMPALA's one step per batch"""
        self._eager_loss = self._loss if self.appo is None else self.appo.loss
        self._loss_fn = torch.compile(self._eager_loss) if config.compile else self._eager_loss
        self._evaluate_fn = torch.compile(self.forward) if config.compile else self.forward
        """the model without gradients (``evaluate``), compiled where the loss is"""
        self._evaluate_compiled = config.compile
        """whether ``evaluate`` runs compiled (False after a failed compile fell back to eager)"""
        self.frames_per_update = config.batch_size * self.unroll_length * config.frames_per_step
        self._obs_norm = getattr(getattr(model, "torso", None), "obs_norm", None)
        """the model's input statistics (``learners.models.RunningNorm``), updated from every batch before its loss"""
        self.schedule = make_schedule(config.kl_target, config.lr_decay_frames, self.frames_per_update)
        """the learning rate's factor per update (``learners.schedule``); its state is the scheduler's"""
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.schedule)
        self.steps = 0
        self.frames = 0
        self.episodes = 0
        self.returns: collections.deque[float] = collections.deque(maxlen=100)
        self.new_episodes: list[tuple[float, int]] = []
        """every episode's true return and length in agent steps as it ends, for the caller to take (and clear)"""
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
        """batches that led to no update of their own: the group's virtual batch was not
        complete yet, or the group changed during the batch (a reduction was abandoned)"""
        self.publisher = (
            WeightPublisher(self.model, weights, config.publish_every, config.publish_seconds)
            if weights is not None
            else None
        )
        if self.publisher is not None:
            self.publisher.publish(self.steps)

    def join_group(self, broker: str, group: str = "default", **kwargs: Any) -> None:
        """Average gradients with the other learners of ``group`` at ``broker``
        (``kwargs`` go to ``shmpad.net.Accumulator``: name, host, port, token...; see the
        module docstring for what the group then shares)."""
        from shmpad.net.accumulator import Accumulator

        self.config.check_group(virtual_batch_size=kwargs.get("virtual_batch_size", 0))
        self.accumulator = Accumulator(self.model, self.optimizer, self.scheduler, broker=broker, group=group, **kwargs)

    def warm_up(self, timeout: float | None = None) -> bool:
        """One update on the next batch (waiting up to ``timeout``), then that update undone:
        the model (its input and value statistics included), the optimiser, the schedule, the
        update count and torch's random state are put back as they were, and nothing is
        published meanwhile (the weight store keeps the weights put back). The batch's frames
        and episodes stay counted: they were played. A learner does this before
        ``join_group`` so that its loss compiles and its actors' first batch arrives while the
        group goes on without it, not while the group waits for its first reduction. Its
        actors meanwhile play with the weights it had, so the batches waiting in its ring when
        it joins (at most the ring's slots) were played by that policy, not the group's.
        False, with nothing changed, where no batch came within ``timeout``."""
        if self.accumulator is not None:
            raise RuntimeError("warm_up() is for a learner outside a group: call it before join_group()")
        kept = copy.deepcopy(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
            }
        )
        kept["steps"] = self.steps
        kept["rng"] = torch.get_rng_state()
        kept["cuda_rng"] = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        publisher, self.publisher = self.publisher, None  # the undone weights are never published
        try:
            self.step(timeout)
        except Timeout:
            return False  # no batch came: nothing changed
        finally:
            self.publisher = publisher
            self._put_back(kept)
        return True

    def _put_back(self, kept: dict[str, Any]) -> None:
        """What ``warm_up`` ``kept``: the model, optimiser and schedule, the update count and the random state."""
        self.model.load_state_dict(kept["model"])
        self.optimizer.load_state_dict(kept["optimizer"])
        self.scheduler.load_state_dict(kept["scheduler"])
        self.steps = kept["steps"]
        torch.set_rng_state(kept["rng"])
        if kept["cuda_rng"] is not None:
            torch.cuda.set_rng_state(kept["cuda_rng"], self.device)
        self.optimizer.zero_grad(set_to_none=True)  # the undone update's gradients go with it

    def step(self, timeout: float | None = None) -> ImpalaLoss | None:
        """One update from the next ``batch_size`` unrolls (waiting up to ``timeout``): its
        loss, or None where a change of the group cut the batch short (module docstring)."""
        t0 = time.perf_counter()
        if self.accumulator is not None:
            version = self.accumulator.version
            if not self.accumulator.ready(timeout):
                self._wait_s += time.perf_counter() - t0
                raise Timeout(f"the learner's group did not become ready within {timeout} s")
            if self.accumulator.version != version and self.publisher is not None:
                self.publisher.publish(self.steps)  # the group's state replaced ours
        try:
            batch = self.ring.get_batch(self.config.batch_size, timeout=timeout, torch=True)  # [B, T+1, ...]
        except Timeout:
            self._wait_s += time.perf_counter() - t0  # a wait that found no batch was waiting too
            raise
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

    def update(self, batch: dict[str, torch.Tensor]) -> ImpalaLoss | None:
        """One update on a time-major batch ``{field: [T+1, B, ...]}`` (in a group, once
        ``accumulator.ready()``, as ``step`` does); what ``step`` returns."""
        self._count_episodes(batch)
        if any(v.device != self.device for v in batch.values()):
            batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        return self._update(batch)

    def _update(self, batch: dict[str, torch.Tensor]) -> ImpalaLoss | None:
        self.frames += self.frames_per_update
        # the batch's own steps (its bootstrap row is the next unroll's first)
        if self._obs_norm is not None and not self.merge_moments(self._obs_norm, batch["obs"][:-1]):
            self.skipped += 1  # the group changed before the batch's first reduction of gradients
            return None
        if self.appo is not None:
            loss = self.appo.update(batch)  # None: cut short by a group change
            stepped = loss is not None
        else:
            loss = self.compute_loss(batch)
            stepped = self.optimizer_step(batch["done"].shape[1])
        if loss is not None:
            self._last_loss = ImpalaLoss(*(v.detach() for v in loss))
        if not stepped:
            self.skipped += 1
            return loss
        self.scheduler.step()
        self.steps += 1
        if self.publisher is not None:
            self.publisher(self.steps)
        return loss

    def optimizer_step(self, columns: int = 0, extra: torch.Tensor | None = None) -> bool:
        """One optimiser step on the gradients the last ``compute_loss`` left, averaged first with
        the group's (``columns``: the unrolls or steps they came from) where this learner is in
        one, with ``extra`` (values that steer the step: the group's mean replaces them, see
        ``Accumulator.reduce_gradients``); False, without a step, where the group abandoned the
        reduction or its virtual batch is not complete."""
        if self.accumulator is not None and not self.accumulator.reduce_gradients(columns, extra):
            return False
        if self.config.grad_norm_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_norm_clip, foreach=True)
        self.optimizer.step()
        return True

    def group_sum(self, *tensors: torch.Tensor) -> list[torch.Tensor] | None:
        """``tensors`` summed over the group's learners (each member's own, at the same point
        of its batch; float64, on each tensor's device); outside a group, ``tensors`` as they
        are. None where the group changed during the reduction."""
        if self.accumulator is None:
            return list(tensors)
        flat = torch.cat([t.detach().reshape(-1).to("cpu", torch.float64) for t in tensors])
        if not self.accumulator.reduce_values(flat.numpy()):
            return None
        return [part.view(t.shape).to(t.device) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]

    def merge_moments(self, norm: RunningNorm, x: torch.Tensor) -> bool:
        """``norm`` takes in the samples ``x`` of the group's learners (this learner's alone
        outside a group); False, with ``norm`` unchanged, where the group changed meanwhile."""
        n, total, square = norm.moments(x)
        summed = self.group_sum(torch.tensor(float(n), dtype=torch.float64), total, square)
        if summed is None:
            return False
        norm.merge(round(float(summed[0])), summed[1], summed[2])
        return True

    @property
    def base_rate(self) -> float:
        """The learning rate the schedule's factor multiplies (the scheduler's; a checkpoint's on resume)."""
        return self.scheduler.base_lrs[0]

    def compute_loss(self, *inputs: Any) -> Any:
        """The loss and its gradients (compiled when asked; a compile that fails falls back to eager once)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self._loss_fn is self._eager_loss:
            result = self._eager_loss(*inputs)
            _total(result).backward()
            return result
        try:
            result = self._loss_fn(*inputs)
            _total(result).backward()
            return result
        except Exception as e:  # noqa: BLE001 - any compiler failure: say so once and run eager
            print(f"learner: torch.compile failed ({type(e).__name__}: {str(e)[:200]}); running eager", flush=True)
            self._loss_fn = self._eager_loss
            self.compiled = False
            return self.compute_loss(*inputs)

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
            lambda_=self.config.vtrace_lambda,
            reduction=self.config.reduction,
        )

    @torch.no_grad()
    def evaluate(self, batch: dict[str, torch.Tensor], columns: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's logits ``[T+1, B, A]`` and baseline ``[T+1, B]`` (float32) over a
        time-major batch, without gradients, in the loss's precision (bf16 autocast where the
        config says): ``columns`` (>= 1) columns at a time, so that a Pong batch's activations
        are not gigabytes at once, compiled where the loss is (a compile that fails falls back
        to eager once)."""
        columns = max(1, columns)
        total = batch["done"].shape[1]
        outs = []
        for start in range(0, max(total, 1), columns):
            chunk = {k: v[:, start : start + columns] for k, v in batch.items()}  # core states are [layers, B, ...]
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.bf16):
                out = self._evaluate_chunk(chunk)
            outs.append((out.policy_logits.float(), out.baseline.float()))
        if len(outs) == 1:
            return outs[0]
        return torch.cat([o[0] for o in outs], 1), torch.cat([o[1] for o in outs], 1)

    def _evaluate_chunk(self, chunk: dict[str, torch.Tensor]) -> ModelOutput:
        if not self._evaluate_compiled:
            return self.forward(chunk)
        try:
            return self._evaluate_fn(chunk)
        except Exception as e:  # noqa: BLE001 - any compiler failure: say so once and run eager
            print(f"learner: torch.compile failed ({type(e).__name__}: {str(e)[:200]}); evaluating eager", flush=True)
            self._evaluate_compiled = False
            return self.forward(chunk)

    def forward(self, batch: dict[str, torch.Tensor]) -> ModelOutput:
        """The model over a time-major batch, from the core state stored at the start of each unroll."""
        core_state = tuple(batch[f].contiguous() for f in self.core_state_fields)  # each [layers, B, hidden]
        if not getattr(self.model, "last_action_reward", False):
            return self.model(batch["obs"], batch["done"].bool(), core_state)
        return self.model(batch["obs"], batch["done"].bool(), core_state, batch[LAST_ACTION], batch["reward"])

    def _count_episodes(self, batch: dict[str, torch.Tensor]) -> None:
        """Episodes that ended and the policy lag of a batch (CPU tensors, time-major)."""
        # rows 1..T: row 0 repeats the previous unroll's last row
        ended, ret, length = batch["episode_end"][1:], batch["episode_return"][1:], batch["episode_step"][1:]
        if ended.device.type == "cpu":  # numpy's small operations cost a fraction of torch's
            ended, ret, length = ended.numpy(), ret.numpy(), length.numpy()
        if ended.any():
            returns = ret[ended != 0].tolist()
            self.returns.extend(returns)
            self.new_episodes.extend(zip(returns, length[ended != 0].tolist()))
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
            {}
            if self._last_loss is None
            else {
                k: float(v) for k, v in {**self._last_loss._asdict(), **(self.appo.last if self.appo else {})}.items()
            },
            self._lag_sum,
            self._lag_batches,
        )

    # -- checkpoints -------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),  # the schedule's state too (KLAdaptive's factor)
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
        if "lr_factor" in state and isinstance(self.schedule, KLAdaptive):  # a checkpoint from before learners.schedule
            self.schedule.factor = float(state["lr_factor"])
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


def _total(result: ImpalaLoss | tuple[ImpalaLoss, torch.Tensor]) -> torch.Tensor:
    """The scalar to differentiate: IMPALA's loss function returns the terms, APPO's the terms and its log-ratio."""
    return result.total if isinstance(result, ImpalaLoss) else result[0].total
