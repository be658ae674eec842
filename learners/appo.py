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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from learners.categorical import action_log_probs
from learners.loss import ImpalaLoss, appo_loss, clip_rewards
from learners.schedule import KLAdaptive
from learners.vtrace import from_logits

if TYPE_CHECKING:
    from learners.learner import Learner

__all__ = ["Appo"]


class Appo:
    """The APPO update of ``learner``'s batches (its model, optimiser, schedule and settings)."""

    def __init__(self, learner: Learner):
        self.learner = learner
        self.last: dict[str, torch.Tensor] = {}
        """the last batch's clip fraction and KL (tensors: read, and synchronised, only by statistics)"""

    def update(self, batch: dict[str, torch.Tensor]) -> ImpalaLoss:
        """``epochs`` x ``minibatches`` clipped steps on a time-major batch ``{field: [T+1, B, ...]}``."""
        learner = self.learner
        config, device = learner.config, learner.device
        targets = self.targets(batch)  # each [T, B]
        if config.shuffle == "steps":  # every step of the batch a column of one row: [1, T*B, ...]
            batch = {k: v[:-1].reshape(1, -1, *v.shape[2:]) for k, v in batch.items() if k not in learner.core_states}
            targets = {k: v.reshape(1, -1) for k, v in targets.items()}
        columns_in_batch = batch["done"].shape[1]
        size = columns_in_batch // config.minibatches
        clipped = torch.zeros((), device=device)
        kl = torch.zeros((), device=device)
        adaptive = learner.schedule if isinstance(learner.schedule, KLAdaptive) else None
        loss: ImpalaLoss | None = None
        for _ in range(config.epochs):
            order = torch.randperm(columns_in_batch, device=device)
            for k in range(config.minibatches):
                columns = order[k * size : (k + 1) * size]
                minibatch = {name: v[:, columns] for name, v in batch.items()}  # every field is [*, B, ...]
                loss, log_ratio = learner.compute_loss(minibatch, {name: v[:, columns] for name, v in targets.items()})
                with torch.no_grad():
                    clipped += (log_ratio.exp() - 1).abs().gt(config.clip).float().mean()
                    kl += ((log_ratio.exp() - 1) - log_ratio).mean()  # the k3 estimator of KL(prox || new)
                learner.optimizer_step()
                if adaptive is not None:  # one sync per minibatch
                    kl_step = float(0.5 * log_ratio.square().mean())
                    adaptive.observe(kl_step, config.kl_target, learner.optimizer, learner.base_rate)
        assert loss is not None  # epochs and minibatches are >= 1
        steps = config.epochs * config.minibatches
        self.last = {"clip_fraction": clipped / steps, "approx_kl": kl / steps}
        return loss

    @torch.no_grad()
    def targets(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """V-trace's ``vs`` and advantages from the learner's weights before the batch's first
        step, with its log-probabilities and baseline then (the proximal policy and old values).
        With a model that predicts standardised values, V-trace runs on the values in returns'
        units, the statistics then take in the batch's ``vs``, and ``vs`` and the old values are
        returned standardised by them (what the baseline head is trained to predict)."""
        learner = self.learner
        config, value_norm = learner.config, learner.value_norm
        with torch.autocast(learner.device.type, dtype=torch.bfloat16, enabled=config.bf16):
            out = learner.forward(batch)  # logits [T+1, B, A], baseline [T+1, B]
        logits, baseline = out.policy_logits.float(), out.baseline.float()
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
            value_norm.update(vs)
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
            normalize=config.normalize_advantages,
            reduction=config.reduction,
            log_probs=log_probs,
        )
        return loss, (log_probs - targets["log_probs"]).detach()
