"""APPO's update of one batch: PPO's clipped steps on V-trace's targets.

One forward pass without gradient gives V-trace's targets (``vs``, the advantages) and the
proximal log-probabilities and values, from the weights before the batch's first step;
then ``epochs`` passes over the batch, each in ``minibatches`` minibatches, one optimiser
step per minibatch (``learners.loss.appo_loss``). With ``shuffle="unrolls"`` a minibatch is
whole unrolls (so that an LSTM core still starts each one from its stored state); with
``shuffle="steps"`` (feed-forward models) it is single steps drawn from across the batch, as
PPO and Sample Factory draw them, so that no minibatch is a few correlated stretches of a few
episodes. A batch is still one update of the policy version the actors see, and one step of
the learning-rate schedule; with ``kl_target`` the rate also adapts after every minibatch
step (``learners.schedule.KLAdaptive``).

In a group of learners (``Learner.join_group``) every minibatch step is one reduction of the
group's gradients, each member's from its own minibatch, and what steers the steps is summed
or averaged over the members first: the value statistics take in every member's ``vs``, each
minibatch's advantages are normalised by the mean and deviation of the members' minibatches
together, and the KL that adapts the rate is the members' mean (reduced with the gradients).
So with members of equal batches and the loss's mean reduction, the group takes the steps of
one learner whose minibatch is the union of theirs (the same to float rounding: sums run in
another order), the KL-adapted rate included. A member whose reduction the group abandons (a member left or joined) takes
no further step of that batch (``update`` returns None), so that every member starts the
next batch, in the next ring, at its first reduction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from learners.categorical import action_log_probs
from learners.loss import ImpalaLoss, appo_loss, clip_rewards, normalize_advantages
from learners.schedule import KLAdaptive
from learners.vtrace import from_logits

if TYPE_CHECKING:
    from learners.learner import Learner

__all__ = ["Appo"]

_NORMALIZE_EPS = 1e-8
"""added to the deviation that normalises advantages (``learners.loss.normalize_advantages``' own)"""


class Appo:
    """The APPO update of ``learner``'s batches (its model, optimiser, schedule and settings)."""

    def __init__(self, learner: Learner):
        self.learner = learner
        self._taken: dict[str, torch.Tensor] = {}
        """each field's minibatch (``take``)"""
        self.last: dict[str, torch.Tensor] = {}
        """the last batch's clip fraction and KL (tensors: read, and synchronised, only by statistics)"""

    def update(self, batch: dict[str, torch.Tensor]) -> ImpalaLoss | None:
        """``epochs`` x ``minibatches`` clipped steps on a time-major batch ``{field: [T+1, B, ...]}``:
        the last minibatch's loss, or None where a group change cut the batch short."""
        learner = self.learner
        config, device = learner.config, learner.device
        targets = self.targets(batch)  # each [T, B]
        if targets is None:
            return None
        if config.shuffle == "steps":  # every step of the batch a column of one row: [1, T*B, ...]
            batch = {k: v[:-1].reshape(1, -1, *v.shape[2:]) for k, v in batch.items() if k not in learner.core_states}
            targets = {k: v.reshape(1, -1) for k, v in targets.items()}
        columns_in_batch = batch["done"].shape[1]
        size = columns_in_batch // config.minibatches
        orders = self.orders(columns_in_batch)
        scales = self.advantage_moments(targets["advantages"], orders, size)  # [epochs, minibatches] each
        if scales is None:
            return None
        clipped = torch.zeros((), device=device)
        kl = torch.zeros((), device=device)
        adaptive = learner.schedule if isinstance(learner.schedule, KLAdaptive) else None
        loss: ImpalaLoss | None = None
        for epoch, order in enumerate(orders):
            for k in range(config.minibatches):
                columns = order[k * size : (k + 1) * size]
                minibatch = {
                    name: self.take(name, v, columns) for name, v in batch.items()
                }  # every field is [*, B, ...]
                chosen = {name: v[:, columns] for name, v in targets.items()}
                if config.normalize_advantages:
                    chosen["advantages"] = _standardised(chosen["advantages"], scales, epoch, k)
                loss, log_ratio = learner.compute_loss(minibatch, chosen)
                with torch.no_grad():
                    clipped += (log_ratio.exp() - 1).abs().gt(config.clip).float().mean()
                    kl += ((log_ratio.exp() - 1) - log_ratio).mean()  # the k3 estimator of KL(prox || new)
                    kl_step = (0.5 * log_ratio.square().mean()).reshape(1) if adaptive is not None else None
                if not learner.optimizer_step(len(columns), kl_step):  # abandoned: the group changed
                    return None
                if kl_step is not None:  # one sync per minibatch; in a group, the members' mean
                    adaptive.observe(float(kl_step), config.kl_target, learner.optimizer, learner.base_rate)
        assert loss is not None  # epochs and minibatches are >= 1
        steps = config.epochs * config.minibatches
        self.last = {"clip_fraction": clipped / steps, "approx_kl": kl / steps}
        return loss

    def take(self, name: str, values: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """``values[:, columns]`` (``[*, b, ...]``), copied into a tensor this learner keeps for
        ``name``'s minibatches: a fresh one per minibatch costs the pages of a new allocation,
        and a Pong minibatch's frames are 58 MB (index_select took 41 ms into a new tensor and
        12 ms into a kept one, docs/results/learner-cost-cpu/take.txt). The tensor is overwritten by the
        next minibatch, after this one's backward pass."""
        shape = (values.shape[0], len(columns), *values.shape[2:])
        out = self._taken.get(name)
        if out is None or out.shape != shape or out.dtype != values.dtype or out.device != values.device:
            out = self._taken[name] = torch.empty(shape, dtype=values.dtype, device=values.device)
        return torch.index_select(values, 1, columns, out=out)

    def orders(self, columns: int) -> list[torch.Tensor]:
        """The order of a batch's ``columns`` in each epoch (a random permutation each): epoch
        ``e``'s minibatch ``k`` is the ``k``-th slice of ``orders[e]``."""
        return [torch.randperm(columns, device=self.learner.device) for _ in range(self.learner.config.epochs)]

    @torch.no_grad()
    def advantage_moments(
        self, advantages: torch.Tensor, orders: list[torch.Tensor], size: int
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """In a group with ``normalize_advantages``, the mean and standard deviation of each
        minibatch's advantages over the members' minibatches together (``[epochs, minibatches]``
        each, float64), from one reduction of their counts, sums and sums of squares; None where
        the group changed meanwhile. Otherwise there is nothing to share (each minibatch is
        normalised by its own moments): an empty pair."""
        learner = self.learner
        if learner.accumulator is None or not learner.config.normalize_advantages:
            return torch.zeros(0), torch.zeros(0)
        per_column = advantages.double()  # [T, B]
        sums, squares = per_column.sum(0), per_column.square().sum(0)  # [B]
        chosen = torch.stack(orders).view(len(orders), -1, size)  # [epochs, minibatches, size]
        count = torch.full(chosen.shape[:2], float(advantages.shape[0] * size), dtype=torch.float64, device=sums.device)
        summed = learner.group_sum(count, sums[chosen].sum(-1), squares[chosen].sum(-1))
        if summed is None:
            return None
        count, total, square = summed
        mean = total / count
        return mean, (square / count - mean.square()).clamp(min=0.0).sqrt()

    @torch.no_grad()
    def targets(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """V-trace's ``vs`` and advantages from the learner's weights before the batch's first
        step, with its log-probabilities and baseline then (the proximal policy and old values).
        With a model that predicts standardised values, V-trace runs on the values in returns'
        units, the statistics then take in the batch's ``vs`` (in a group, every member's: None
        where the group changed meanwhile), and ``vs`` and the old values are returned
        standardised by them (what the baseline head is trained to predict)."""
        learner = self.learner
        config, value_norm = learner.config, learner.value_norm
        # in chunks of a minibatch's columns (or of its unrolls' when it takes single steps)
        columns = max(1, batch["done"].shape[1] // config.minibatches)
        logits, baseline = learner.evaluate(batch, columns)  # [T+1, B, A], [T+1, B]
        if value_norm is not None:
            baseline = value_norm.denormalize(baseline)
        actions = batch["action"][:-1].long()  # [T, B]
        rewards = clip_rewards(batch["reward"][1:].to(baseline.dtype), config.reward_clip)  # [T, B]
        discounts = (~batch["done"][1:].bool()).to(baseline.dtype) * config.discount
        returns = from_logits(
            batch["logits"][:-1].float(),
            logits[:-1],
            actions,
            discounts,
            rewards,
            baseline[:-1],
            baseline[-1],
            lambda_=config.vtrace_lambda,
        )
        vs, values = returns.vs, baseline[:-1]
        if value_norm is not None:
            if not learner.merge_moments(value_norm, vs):  # a group's: every member's vs
                return None
            vs, values = value_norm(vs), value_norm(values)
        return {
            "vs": vs,
            "advantages": returns.pg_advantages,
            "log_probs": action_log_probs(logits[:-1], actions),
            "values": values,
        }

    def loss(self, batch: dict[str, torch.Tensor], targets: dict[str, torch.Tensor]) -> tuple[ImpalaLoss, torch.Tensor]:
        """One minibatch's loss and its log-ratio to the proximal policy, ``[T, b]``: the first
        ``T`` rows of ``batch``, ``T`` being the targets' (whole unrolls carry one row more, the
        bootstrap row, which only V-trace's targets used)."""
        learner = self.learner
        config = learner.config
        rows = targets["vs"].shape[0]
        with torch.autocast(learner.device.type, dtype=torch.bfloat16, enabled=config.bf16):
            out = learner.forward(batch)  # logits [T+1 or T, b, A], baseline [T+1 or T, b]
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
            clip=config.clip,
            value_clip=config.value_clip,
            baseline_cost=config.baseline_cost,
            entropy_cost=config.entropy_cost,
            normalize=False,  # update normalised each minibatch's advantages (with the group's moments)
            reduction=config.reduction,
            log_probs=log_probs,
        )
        return loss, (log_probs - targets["log_probs"]).detach()


def _standardised(
    advantages: torch.Tensor, moments: tuple[torch.Tensor, torch.Tensor], epoch: int, minibatch: int
) -> torch.Tensor:
    """A minibatch's advantages shifted and scaled to mean 0 and deviation 1: by the group's
    moments of that minibatch where ``moments`` holds them (``Appo.advantage_moments``), else by
    its own (``learners.loss.normalize_advantages``)."""
    mean, std = moments
    if not mean.numel():
        return normalize_advantages(advantages)
    scaled = (advantages - mean[epoch, minibatch]) / (std[epoch, minibatch] + _NORMALIZE_EPS)
    return scaled.to(advantages.dtype)
