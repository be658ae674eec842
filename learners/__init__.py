"""Learners: V-trace, the IMPALA loss, actor-critic models and the learner."""

# V-trace
# Categorical policies
from learners.categorical import action_log_probs, entropy

# The learner
from learners.learner import Learner, LearnerConfig

# The loss
from learners.loss import ImpalaLoss, baseline_loss, clip_rewards, entropy_loss, impala_loss, policy_gradient_loss

# Models
from learners.models import ActorCritic, MLPTorso, ModelOutput, NatureTorso, ResNetTorso, make_model
from learners.vtrace import VTraceFromLogitsReturns, VTraceReturns, from_importance_weights, from_logits

__all__ = [
    "ActorCritic",
    "ImpalaLoss",
    "Learner",
    "LearnerConfig",
    "MLPTorso",
    "ModelOutput",
    "NatureTorso",
    "ResNetTorso",
    "VTraceFromLogitsReturns",
    "VTraceReturns",
    "action_log_probs",
    "baseline_loss",
    "clip_rewards",
    "entropy",
    "entropy_loss",
    "from_importance_weights",
    "from_logits",
    "impala_loss",
    "make_model",
    "policy_gradient_loss",
]
