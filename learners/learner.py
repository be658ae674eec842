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

``algo="appo"`` reuses each batch (``learners.loss``'s APPO): one forward pass without
gradient gives V-trace's targets and the proximal log-probabilities and values, then
``epochs`` passes over the batch, each in ``minibatches`` minibatches, one optimiser step
per minibatch. With ``shuffle="unrolls"`` a minibatch is whole unrolls (so that an LSTM core
still starts each one from its stored state); with ``shuffle="steps"`` (feed-forward models)
it is single steps drawn from across the batch, as PPO and Sample Factory draw them, so that
no minibatch is a few correlated stretches of a few episodes. A batch is still one update of
the policy version the actors see, and one step of the learning-rate schedule.
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
from learners.categorical import action_log_probs
from learners.loss import ImpalaLoss, appo_loss, clip_rewards, impala_loss
from learners.models import ActorCritic, ModelOutput
from learners.staging import BatchStager, WeightPublisher
from learners.vtrace import from_logits
from shmpad.errors import Timeout
from shmpad.ringbuf import TypedRing
from shmpad.weights import WeightStore

__all__ = ["LearnerConfig", "Learner", "LearnerStatistics"]

KL_LR_STEP = 1.5
"""``kl_target``: the factor by which one minibatch step's KL raises or lowers the learning rate"""
KL_LR_BOUNDS = (1e-6, 1e-2)
"""``kl_target``: the learning rate stays within these"""


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
    algo: Literal["impala", "appo"] = "impala"
    """impala: one step per batch; appo: PPO's clipped steps over minibatches of each batch, several epochs"""
    epochs: int = 1
    """appo: passes over each batch"""
    minibatches: int = 1
    """appo: minibatches each pass splits the batch into (unrolls: batch_size must be a multiple; steps: its steps)"""
    shuffle: Literal["unrolls", "steps"] = "unrolls"
    """appo: a minibatch is whole unrolls, or single steps from across the batch (feed-forward models only)"""
    clip: float = 0.1
    """appo: PPO's epsilon, how far a batch's steps may move the probability of an action"""
    value_clip: float | None = None
    """appo: how far a batch's steps may move the baseline before its loss stops pulling (None: no clipping)"""
    vtrace_lambda: float = 1.0
    """V-trace's lambda: 1 is the paper's IMPALA, 0.95 PPO's GAE lambda"""
    kl_target: float = 0.0
    """appo, > 0: after every minibatch step the learning rate is multiplied by ``KL_LR_STEP``
    when that step's KL to the batch's first policy (half the mean squared log-ratio) was under
    half of this, and divided by it when over twice this, within ``KL_LR_BOUNDS``; this replaces
    the linear decay (rl_games' adaptive schedule). 0: off"""
    normalize_advantages: bool = True
    """appo: normalise the advantages over each minibatch"""
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
        if self.algo not in ("impala", "appo"):
            raise ValueError(f"algo must be 'impala' or 'appo', got {self.algo!r}")
        for name in ("epochs", "minibatches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value!r}")
        number = isinstance(self.kl_target, (int, float)) and not isinstance(self.kl_target, bool)
        if not number or not (math.isfinite(self.kl_target) and self.kl_target >= 0):
            raise ValueError(f"kl_target must be a finite number >= 0 (0: off), got {self.kl_target!r}")
        if self.kl_target and self.algo != "appo":
            raise ValueError(
                f"kl_target ({self.kl_target}) adapts the learning rate between APPO's minibatch steps: needs algo 'appo'"
            )
        if self.shuffle not in ("unrolls", "steps"):
            raise ValueError(f"shuffle must be 'unrolls' or 'steps', got {self.shuffle!r}")
        if self.shuffle == "unrolls" and self.batch_size % self.minibatches:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of minibatches ({self.minibatches}): "
                "a minibatch is a whole number of unrolls"
            )
        if self.algo == "impala" and (self.epochs, self.minibatches) != (1, 1):
            raise ValueError(
                f"epochs and minibatches are APPO's: with algo 'impala' both must be 1, "
                f"got epochs={self.epochs}, minibatches={self.minibatches}"
            )
        if not self.clip >= 0:
            raise ValueError(f"clip must be >= 0, got {self.clip!r}")
        if self.value_clip is not None and not self.value_clip > 0:
            raise ValueError(f"value_clip must be > 0 or None, got {self.value_clip!r}")
        if not 0 <= self.vtrace_lambda <= 1:
            raise ValueError(f"vtrace_lambda must be in [0, 1], got {self.vtrace_lambda!r}")
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
        self._states = set(core_state_fields(ring.spec))  # not time-major: [layers, B, hidden]
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
        if config.algo == "appo" and config.shuffle == "steps":
            if model.use_lstm:
                raise ValueError(
                    "shuffle 'steps' makes minibatches of single steps, and an LSTM core needs whole unrolls "
                    "to start from their stored state: use shuffle 'unrolls' with an LSTM"
                )
            if (self.unroll_length * config.batch_size) % config.minibatches:
                raise ValueError(
                    f"with shuffle 'steps', a batch's {self.unroll_length * config.batch_size} steps (unroll length "
                    f"{self.unroll_length} x batch_size {config.batch_size}) must be a multiple of minibatches "
                    f"({config.minibatches})"
                )
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
        self._eager_loss = self._loss if config.algo == "impala" else self._appo_loss
        self._loss_fn = torch.compile(self._eager_loss) if config.compile else self._eager_loss
        self.frames_per_update = config.batch_size * self.unroll_length * config.frames_per_step
        total_updates = math.ceil(config.total_frames / self.frames_per_update) if config.total_frames else 0
        self._obs_norm = getattr(getattr(model, "torso", None), "obs_norm", None)
        """the model's input statistics (``learners.models.RunningNorm``), updated from every batch before its loss"""
        self._value_norm = getattr(model, "value_norm", None)
        """the statistics of the value targets, for a model whose baseline predicts them standardised (APPO)"""
        if self._value_norm is not None and config.algo != "appo":
            raise ValueError(
                f"a model that predicts standardised values (normalize_value) needs algo 'appo', got {config.algo!r}"
            )
        self.lr_factor = 1.0
        """the learning rate over ``config.learning_rate`` that ``kl_target`` has set (1.0 without it)"""
        if config.kl_target:
            schedule = lambda step: self.lr_factor  # noqa: E731 - the adaptive schedule's factor, kept by a step
        else:
            schedule = lambda step: max(0.0, 1.0 - step / total_updates) if total_updates else 1.0  # noqa: E731
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
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
        self._last_appo: dict[str, torch.Tensor] = {}  # appo: the last batch's clip fraction and KL, likewise
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

        if self.config.algo != "impala":
            raise ValueError(
                f"a group of learners averages one gradient per batch: algo {self.config.algo!r} takes "
                f"{self.config.epochs * self.config.minibatches} steps per batch, use algo 'impala' with a group"
            )
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
        if self._obs_norm is not None:  # the batch's own steps (its bootstrap row is the next unroll's first)
            self._obs_norm.update(batch["obs"][:-1])
        if self.config.algo == "appo":
            return self._update_appo(batch)
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

    def _update_appo(self, batch: dict[str, torch.Tensor]) -> ImpalaLoss:
        """APPO: V-trace's targets once, then ``epochs`` x ``minibatches`` clipped steps."""
        config = self.config
        targets = self._appo_targets(batch)  # each [T, B]
        if config.shuffle == "steps":  # every step of the batch a column of one row: [1, T*B, ...]
            batch = {name: v[:-1].reshape(1, -1, *v.shape[2:]) for name, v in batch.items() if name not in self._states}
            targets = {name: v.reshape(1, -1) for name, v in targets.items()}
        columns_in_batch = batch["done"].shape[1]
        size = columns_in_batch // config.minibatches
        clipped = torch.zeros((), device=self.device)
        kl = torch.zeros((), device=self.device)
        loss: ImpalaLoss | None = None
        for _ in range(config.epochs):
            order = torch.randperm(columns_in_batch, device=self.device)
            for k in range(config.minibatches):
                columns = order[k * size : (k + 1) * size]
                minibatch = {name: v[:, columns] for name, v in batch.items()}  # every field is [*, B, ...]
                loss, log_ratio = self._compute_loss(minibatch, {name: v[:, columns] for name, v in targets.items()})
                with torch.no_grad():
                    clipped += (log_ratio.exp() - 1).abs().gt(config.clip).float().mean()
                    kl += ((log_ratio.exp() - 1) - log_ratio).mean()  # the k3 estimator of KL(prox || new)
                if config.grad_norm_clip is not None:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_norm_clip, foreach=True)
                self.optimizer.step()
                if config.kl_target:
                    self._adapt_learning_rate(float(0.5 * log_ratio.square().mean()))  # one sync per minibatch
        assert loss is not None  # epochs and minibatches are >= 1
        steps = config.epochs * config.minibatches
        self._last_appo = {"clip_fraction": clipped / steps, "approx_kl": kl / steps}
        self.frames += self.frames_per_update
        self._last_loss = ImpalaLoss(*(v.detach() for v in loss))
        self.scheduler.step()
        self.steps += 1
        if self.publisher is not None:
            self.publisher(self.steps)
        return loss

    def _adapt_learning_rate(self, kl: float) -> None:
        """``kl_target``'s rule after one minibatch step whose KL estimate was ``kl``."""
        target, rate = self.config.kl_target, self.scheduler.base_lrs[0]  # a checkpoint's rate, on resume
        if kl > 2 * target:
            self.lr_factor = max(self.lr_factor / KL_LR_STEP, KL_LR_BOUNDS[0] / rate)
        elif kl < target / 2:
            self.lr_factor = min(self.lr_factor * KL_LR_STEP, KL_LR_BOUNDS[1] / rate)
        for group in self.optimizer.param_groups:
            group["lr"] = rate * self.lr_factor

    @torch.no_grad()
    def _appo_targets(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """V-trace's ``vs`` and advantages from the learner's weights before the batch's first
        step, with its log-probabilities and baseline then (the proximal policy and old values).
        With a model that predicts standardised values, V-trace runs on the values in returns'
        units, the statistics then take in the batch's ``vs``, and ``vs`` and the old values are
        returned standardised by them (what the baseline head is trained to predict)."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.bf16):
            out = self.forward(batch)  # logits [T+1, B, A], baseline [T+1, B]
        logits, baseline = out.policy_logits.float(), out.baseline.float()
        if self._value_norm is not None:
            baseline = self._value_norm.denormalize(baseline)
        actions = batch["action"][:-1].long()  # [T, B]
        rewards = clip_rewards(batch["reward"][1:].to(baseline.dtype), self.config.reward_clip)  # [T, B]
        discounts = (~batch["done"][1:].bool()).to(baseline.dtype) * self.config.discount
        returns = from_logits(
            batch["logits"][:-1].float(),
            logits[:-1],
            actions,
            discounts,
            rewards,
            baseline[:-1],
            baseline[-1],
            lambda_=self.config.vtrace_lambda,
        )
        vs, values = returns.vs, baseline[:-1]
        if self._value_norm is not None:
            self._value_norm.update(vs)
            vs, values = self._value_norm(vs), self._value_norm(values)
        return {
            "vs": vs,
            "advantages": returns.pg_advantages,
            "log_probs": action_log_probs(logits[:-1], actions),
            "values": values,
        }

    def _appo_loss(
        self, batch: dict[str, torch.Tensor], targets: dict[str, torch.Tensor]
    ) -> tuple[ImpalaLoss, torch.Tensor]:
        """One minibatch's APPO loss and its log-ratio to the proximal policy, ``[T, b]``: the
        first ``T`` rows of ``batch``, ``T`` being the targets' (whole unrolls carry one row more,
        the bootstrap row, which only V-trace's targets used)."""
        rows = targets["vs"].shape[0]
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.bf16):
            out = self.forward(batch)  # logits [T+1 or T, b, A], baseline [T+1 or T, b]
        logits, baseline = out.policy_logits.float()[:rows], out.baseline.float()[:rows]
        actions = batch["action"][:rows].long()
        log_probs = action_log_probs(logits, actions)  # [T, b]
        loss = appo_loss(
            logits,
            targets["log_probs"],
            actions,
            targets["advantages"],
            baseline,
            targets["values"],
            targets["vs"],
            clip=self.config.clip,
            value_clip=self.config.value_clip,
            baseline_cost=self.config.baseline_cost,
            entropy_cost=self.config.entropy_cost,
            normalize=self.config.normalize_advantages,
            reduction=self.config.reduction,
            log_probs=log_probs,
        )
        return loss, (log_probs - targets["log_probs"]).detach()

    def _compute_loss(self, *inputs: Any) -> Any:
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
            return self._compute_loss(*inputs)

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
            else {k: float(v) for k, v in {**self._last_loss._asdict(), **self._last_appo}.items()},
            self._lag_sum,
            self._lag_batches,
        )

    # -- checkpoints -------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "lr_factor": self.lr_factor,
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
        self.lr_factor = float(state.get("lr_factor", 1.0))  # checkpoints before kl_target have none
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
