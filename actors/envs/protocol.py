"""The Atari protocol: the settings that decide which game an agent plays and how its score
is counted, so that two results can only be compared when they share them.

=================  ==========  ========================================================
setting            envpool     sticky
=================  ==========  ========================================================
sticky actions     0           0.25: each frame repeats the previous action with this
                               probability (ALE v5's ``repeat_action_probability``)
action set         minimal     full (all 18 actions)
no-op starts       up to 30    none (sticky actions already vary the start)
episodic life      on          off: a lost life ends a *training* episode (V-trace's
                               bootstrap stops there), never a reported one
reward clipping    [-1, 1]     [-1, 1], for the learner only
=================  ==========  ========================================================

``envpool`` is EnvPool's Atari defaults with episodic life and reward clipping, as the
fast published PPO runs train (CleanRL's ``ppo_atari_envpool``, rl_games); ``sticky`` is
Machado et al. (2018)'s recommendation, which ALE v5 and DreamerV3's baselines follow.
Under both, a reported return is a whole game's sum of unclipped rewards. A run that
changes any one setting is ``custom``: its figures match neither preset's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["BEFORE_PROTOCOLS", "PROTOCOLS", "Protocol", "protocol_of"]


@dataclass(frozen=True)
class Protocol:
    """One Atari protocol's settings (see the module's table)."""

    sticky_actions: float
    """the probability that a frame repeats the previous action instead of the one chosen"""
    full_action_space: bool
    """all 18 actions instead of the game's minimal set"""
    noop_max: int
    """a reset plays 1..noop_max no-op frames (0: none)"""
    episodic_life: bool
    """a lost life ends a training episode (the game goes on; reported returns count whole games)"""
    reward_clip: float
    """the learner's rewards are clipped to [-reward_clip, reward_clip] (0: not clipped)"""

    @property
    def name(self) -> str:
        """The preset these settings are, or ``custom``."""
        return next((name for name, p in PROTOCOLS.items() if p == self), "custom")

    def describe(self) -> str:
        """One line naming every setting, for the plan line, config.json and every figure."""
        clip = f"rewards clipped to +-{self.reward_clip:g}" if self.reward_clip else "rewards not clipped"
        noops = f"up to {self.noop_max} no-ops" if self.noop_max else "no no-ops"
        return (
            f"{self.name} protocol: sticky actions {self.sticky_actions:g}, "
            f"{'full' if self.full_action_space else 'minimal'} action set, {noops}, "
            f"{'life loss ends a training episode' if self.episodic_life else 'no life loss'}, {clip}; "
            "returns are whole games"
        )

    def fields(self) -> dict[str, object]:
        return asdict(self)


PROTOCOLS = {
    "envpool": Protocol(sticky_actions=0.0, full_action_space=False, noop_max=30, episodic_life=True, reward_clip=1.0),
    "sticky": Protocol(sticky_actions=0.25, full_action_space=True, noop_max=0, episodic_life=False, reward_clip=1.0),
}
"""The presets, by the name ``--protocol`` takes."""


BEFORE_PROTOCOLS = Protocol(
    sticky_actions=0.0, full_action_space=False, noop_max=30, episodic_life=False, reward_clip=1.0
)
"""What a run recorded before the protocol was a setting played: envpool's, without episodic life."""


def protocol_of(settings: object) -> Protocol:
    """The ``Protocol`` of any object with its five fields (the job's ``Args``, a run's
    config.json as a dict); a field a run folder does not record is ``BEFORE_PROTOCOLS``'."""
    get = settings.get if isinstance(settings, dict) else lambda k, d=None: getattr(settings, k, d)
    return Protocol(**{k: type(v)(get(k, v)) for k, v in BEFORE_PROTOCOLS.fields().items()})
