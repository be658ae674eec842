"""Learners: V-trace, the IMPALA loss, actor-critic models and the learner."""

# V-trace
from learners.vtrace import VTraceFromLogitsReturns
from learners.vtrace import VTraceReturns
from learners.vtrace import from_importance_weights
from learners.vtrace import from_logits

# Categorical policies
from learners.categorical import action_log_probs
from learners.categorical import entropy

# The loss
from learners.loss import ImpalaLoss
from learners.loss import appo_loss
from learners.loss import baseline_loss
from learners.loss import clip_rewards
from learners.loss import entropy_loss
from learners.loss import impala_loss
from learners.loss import policy_gradient_loss

# Models
from learners.models import ActorCritic
from learners.models import MLPTorso
from learners.models import ModelConfig
from learners.models import ModelOutput
from learners.models import NatureTorso
from learners.models import ResNetTorso
from learners.models import make_model

# The learner
from learners.config import LearnerConfig
from learners.learner import Learner
from learners.schedule import KLAdaptive
from learners.schedule import linear_decay

__all__ = [
    "ActorCritic",
    "ImpalaLoss",
    "KLAdaptive",
    "Learner",
    "LearnerConfig",
    "MLPTorso",
    "ModelConfig",
    "ModelOutput",
    "NatureTorso",
    "ResNetTorso",
    "VTraceFromLogitsReturns",
    "VTraceReturns",
    "action_log_probs",
    "appo_loss",
    "baseline_loss",
    "clip_rewards",
    "entropy",
    "entropy_loss",
    "from_importance_weights",
    "from_logits",
    "impala_loss",
    "linear_decay",
    "make_model",
    "policy_gradient_loss",
]
