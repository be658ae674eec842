"""``LearnerConfig``: the loss, the optimiser, the learning-rate schedule and publishing,
with every rule of those settings in its ``check`` (the learner calls it, and so does the
job's command line, which turns its errors into the flags' names)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["LearnerConfig"]


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
    """initial learning rate, decayed linearly to 0 over lr_decay_frames (or adapted, kl_target)"""
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
    lr_decay_frames: int = 0
    """frames over which the learning rate decays linearly to 0 (0: no decay)"""
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
    """appo, > 0: the learning rate adapts after every minibatch step to keep that step's KL to
    the batch's first policy (half the mean squared log-ratio) near this (``learners.schedule.
    KLAdaptive``, rl_games' adaptive schedule), instead of the linear decay. 0: off"""
    normalize_advantages: bool = True
    """appo: normalise the advantages over each minibatch"""
    compile: bool = False
    """``torch.compile`` the forward pass and the loss (and so their backward); falls back to eager if it fails"""
    bf16: bool = False
    """run the model under bf16 autocast (the loss stays fp32)"""

    def check(self, *, use_lstm: bool = False, normalize_value: bool = False, unroll_length: int | None = None) -> None:
        """Raise ``ValueError`` (``TypeError`` for a wrong type) naming the first setting out of
        its range, the settings of the model trained (``use_lstm``, ``normalize_value``) and the
        unrolls' length (where known) included: every rule of the learner's settings is here."""
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {self.batch_size!r}")
        if self.optimizer not in ("adam", "rmsprop"):
            raise ValueError(f"optimizer must be 'adam' or 'rmsprop', got {self.optimizer!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")
        if self.grad_norm_clip is not None and not self.grad_norm_clip > 0:
            raise ValueError(f"grad_norm_clip must be > 0 or None, got {self.grad_norm_clip!r}")
        if self.reward_clip is not None and not self.reward_clip > 0:
            raise ValueError(f"reward_clip must be > 0 or None, got {self.reward_clip!r}")
        if self.lr_decay_frames < 0:
            raise ValueError(f"lr_decay_frames must be >= 0, got {self.lr_decay_frames!r}")
        if not self.adam_eps > 0:
            raise ValueError(f"adam_eps must be > 0, got {self.adam_eps!r}")
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
        if self.algo == "appo" and self.shuffle == "steps":
            if use_lstm:
                raise ValueError(
                    "shuffle 'steps' cuts a batch into single steps, and an LSTM core needs whole unrolls "
                    "to start from their stored state: use shuffle 'unrolls' with use_lstm"
                )
            if unroll_length is not None and (unroll_length * self.batch_size) % self.minibatches:
                raise ValueError(
                    f"with shuffle 'steps', a batch's {unroll_length * self.batch_size} steps (unroll_length "
                    f"{unroll_length} x batch_size {self.batch_size}) must be a multiple of minibatches "
                    f"({self.minibatches})"
                )
        if normalize_value and self.algo != "appo":
            raise ValueError(
                f"a model that predicts standardised values (normalize_value) needs algo 'appo', got {self.algo!r}"
            )
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
        if not self.discount >= 0:
            raise ValueError(f"discount must be >= 0, got {self.discount!r}")
        if not 0 <= self.vtrace_lambda <= 1:
            raise ValueError(f"vtrace_lambda must be in [0, 1], got {self.vtrace_lambda!r}")
        if isinstance(self.publish_seconds, bool) or not self.publish_seconds >= 0:
            raise ValueError(
                f"publish_seconds must be >= 0 (0: every publish_every updates), got {self.publish_seconds!r}"
            )

    def check_group(self, *, virtual_batch_size: int = 0) -> None:
        """Raise ``ValueError`` where a group of learners (``Learner.join_group``) cannot train
        with these settings and the group's ``virtual_batch_size`` (``shmpad.net.Accumulator``'s)."""
        if self.algo == "appo" and virtual_batch_size:
            raise ValueError(
                f"a group of APPO learners takes a step at every reduction of the members' minibatch "
                f"gradients, and virtual_batch_size ({virtual_batch_size}) would sum several reductions into one "
                f"step: use virtual_batch_size 0 with algo 'appo'"
            )
