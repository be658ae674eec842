"""Actor-critic models: a torso, an optional LSTM core, a policy head and a baseline head.

Torsos map one observation per row, ``[N, *obs_shape]``, to ``[N, features]``:

- ``NatureTorso``: the DQN Nature CNN (Mnih et al. 2015), IMPALA's "shallow" network;
  ``1,693,875`` parameters with the heads for ``4x84x84`` frames and 18 actions.
- ``ResNetTorso``: IMPALA's "deep" network (Espeholt et al. 2018), three stages of
  16, 32, 32 channels then a 256-unit layer; ``1,094,115`` parameters with the heads.
- ``MLPTorso``: for vector observations (CartPole).

The image torsos take uint8 frames and scale them by 1/255 inside; with ``normalize``, a torso
standardises each input element by running statistics instead (``RunningNorm``, rl_games'
``normalize_input``), which the learner updates from every batch and publishes with the weights. ``ActorCritic``
runs a torso over time-major inputs ``[T, B, ...]``, with an optional LSTM whose
state is carried between calls and zeroed where an episode starts, as in
torchbeast and moolib. With ``last_action_reward`` the core (or, without one, the
heads) also sees the previous action, one-hot, and the reward that came with the
observation, clipped to [-1, 1]: the inputs of torchbeast's and moolib's Atari nets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from numba import njit
from torch import nn
from torch.nn import functional as F

from learners._checks import describe

__all__ = [
    "ActorCritic",
    "MLPTorso",
    "ModelConfig",
    "ModelOutput",
    "NatureTorso",
    "ResNetTorso",
    "RunningNorm",
    "make_model",
    "orthogonal_init",
]


class ModelOutput(NamedTuple):
    """``ActorCritic``'s outputs."""

    policy_logits: torch.Tensor  # [T, B, A]
    baseline: torch.Tensor  # [T, B]
    core_state: tuple[torch.Tensor, ...]  # () without an LSTM, else (h, c), each [layers, B, hidden]


def _check_image_shape(obs_shape: Sequence[int], smallest: int) -> tuple[int, int, int]:
    shape = tuple(obs_shape)
    if len(shape) != 3 or any(isinstance(n, bool) or not isinstance(n, int) for n in shape):
        raise ValueError(f"obs_shape must be (channels, height, width), got {obs_shape!r}")
    if shape[0] < 1 or min(shape[1:]) < smallest:
        raise ValueError(f"obs_shape must have >= 1 channel and height and width >= {smallest}, got {shape}")
    return shape


def _frames(obs: torch.Tensor, norm: RunningNorm | None) -> torch.Tensor:
    """uint8 frames as floats: scaled by 1/255, or standardised by ``norm``."""
    if obs.dtype != torch.uint8:
        raise TypeError(f"observations must be a torch.uint8 tensor of frames, got {describe(obs)}")
    return obs.float().mul_(1.0 / 255.0) if norm is None else norm(obs)


_NORM_CHUNK = 256
"""rows per chunk of ``RunningNorm.update``'s sums (float32 within a chunk: 256 x 255^2 is exact below 2^24)"""

_U8_CHUNK = 32768
"""rows per chunk of ``_uint8_moments``' int32 sums (32768 x 255^2 < 2^31)"""


@njit(nogil=True, cache=True)
def _uint8_moments(x: np.ndarray, total: np.ndarray, square: np.ndarray) -> None:
    """Add each column's sum and sum of squares of the uint8 rows ``x [N, D]`` to ``total`` and
    ``square`` (int64 ``[D]``): int32 within chunks of ``_U8_CHUNK`` rows, int64 across them."""
    n, d = x.shape
    chunk_sum = np.zeros(d, np.int32)
    chunk_square = np.zeros(d, np.int32)
    for start in range(0, n, _U8_CHUNK):
        chunk_sum[:] = 0
        chunk_square[:] = 0
        for i in range(start, min(n, start + _U8_CHUNK)):
            row = x[i]
            for j in range(d):
                v = np.int32(row[j])
                chunk_sum[j] += v
                chunk_square[j] += v * v
        for j in range(d):
            total[j] += chunk_sum[j]
            square[j] += chunk_square[j]


class RunningNorm(nn.Module):
    """Each input element standardised by the mean and variance of every input ``update`` has
    seen, then clipped: ``forward(x [N, *shape]) -> clamp((x - mean) / sqrt(var + eps), -clip, clip)``,
    float32. Before any update the mean is 0 and the variance 1 (a prior that counts for nothing: the
    first update replaces it). The statistics are buffers, so
    they travel with the state dict (checkpoints, ``WeightStore``); ``update`` changes them in
    place, merging each batch's moments into them (Chan et al.'s parallel formula, in float64; a
    batch's sums are integers for uint8 frames on the CPU, ``_uint8_moments``, and otherwise float32
    within chunks of ``_NORM_CHUNK`` rows, exact for frames)."""

    def __init__(self, shape: Sequence[int], eps: float = 1e-5, clip: float = 5.0):
        super().__init__()
        self.shape = tuple(shape)
        self.eps, self.clip = float(eps), float(clip)
        self.register_buffer("mean", torch.zeros(self.shape))
        self.register_buffer("var", torch.ones(self.shape))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x.float() - self.mean) * torch.rsqrt(self.var + self.eps)).clamp_(-self.clip, self.clip)

    def denormalize(self, y: torch.Tensor) -> torch.Tensor:
        """``forward``'s inverse (where it did not clip): ``y * sqrt(var + eps) + mean``."""
        return y.float() * torch.sqrt(self.var + self.eps) + self.mean

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge the moments of ``x`` ``[..., *shape]`` (every leading dimension is samples)."""
        self.merge(*self.moments(x))

    @torch.no_grad()
    def moments(self, x: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
        """The samples of ``x`` ``[..., *shape]``: how many, their sum and their sum of squares
        (float64, ``shape``), what ``merge`` takes (a group's learners sum them first)."""
        if tuple(x.shape[x.dim() - len(self.shape) :]) != self.shape:
            raise ValueError(f"RunningNorm of shape {self.shape}: got a batch of shape {tuple(x.shape)}")
        flat = x.reshape(-1, *self.shape)
        if (
            flat.dtype == torch.uint8 and flat.device.type == "cpu" and flat.shape[0]
        ):  # frames: exact integer sums, one pass
            total_sum = np.zeros(int(np.prod(self.shape)), dtype=np.int64)
            total_square = np.zeros_like(total_sum)
            _uint8_moments(flat.contiguous().numpy().reshape(flat.shape[0], -1), total_sum, total_square)
            return flat.shape[0], *(
                torch.from_numpy(t.astype(np.float64)).view(self.shape) for t in (total_sum, total_square)
            )
        # the batch's moments from sums over chunks of rows: a batch of frames as floats at once would take
        # gigabytes (8192 stacks of 4x84x84)
        total_sum = torch.zeros(self.shape, dtype=torch.float64, device=flat.device)
        total_square = torch.zeros_like(total_sum)
        for chunk in flat.split(_NORM_CHUNK):  # float32 within a chunk, float64 across chunks
            chunk = chunk.to(torch.float32)
            total_sum += chunk.sum(0)
            total_square += chunk.square().sum(0)  # not in place: a float32 chunk is the caller's own rows
        return flat.shape[0], total_sum, total_square

    @torch.no_grad()
    def merge(self, n: int, total_sum: torch.Tensor, total_square: torch.Tensor) -> None:
        """Merge the moments of ``n`` samples, given as their sum and sum of squares (``moments``)."""
        seen = int(self.count)
        if n == 0:
            return
        mean = total_sum / n
        var = (total_square / n - mean.square()).clamp_(min=0.0)
        total = seen + n
        delta = mean - self.mean.double()
        merged_mean = self.mean.double() + delta * (n / total)
        merged_var = (self.var.double() * seen + var * n + delta.square() * (seen * n / total)) / total
        self.mean.copy_(merged_mean)
        self.var.copy_(merged_var)
        self.count.fill_(total)


class NatureTorso(nn.Module):
    """The Nature CNN: conv 32x8x8/4, 64x4x4/2, 64x3x3/1, then 512 units; ``forward(obs [N, C, H, W] uint8) -> [N, 512]``."""

    def __init__(self, obs_shape: Sequence[int] = (4, 84, 84), hidden: int = 512, normalize: bool = False):
        super().__init__()
        self.obs_shape = _check_image_shape(obs_shape, smallest=36)
        self.obs_norm = RunningNorm(self.obs_shape) if normalize else None
        c, h, w = self.obs_shape
        self.convs = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
        )
        for kernel, stride in ((8, 4), (4, 2), (3, 1)):
            h, w = (h - kernel) // stride + 1, (w - kernel) // stride + 1
        self.fc = nn.Linear(64 * h * w, hidden)
        self.out_features = hidden

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.convs(_frames(obs, self.obs_norm)).flatten(1)  # [N, 64 * h * w]
        return F.relu(self.fc(x))  # [N, hidden]


class _Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class _Stage(nn.Module):
    def __init__(self, in_channels: int, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.res0 = _Residual(channels)
        self.res1 = _Residual(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(self.conv(x), 3, stride=2, padding=1)
        return self.res1(self.res0(x))


class ResNetTorso(nn.Module):
    """IMPALA's deep network: stages of (conv 3x3, max-pool 3x3/2, two residual blocks), then ``hidden`` units;
    ``forward(obs [N, C, H, W] uint8) -> [N, hidden]``."""

    def __init__(
        self,
        obs_shape: Sequence[int] = (4, 84, 84),
        channels: Sequence[int] = (16, 32, 32),
        hidden: int = 256,
        normalize: bool = False,
    ):
        super().__init__()
        self.obs_shape = _check_image_shape(obs_shape, smallest=1)
        self.obs_norm = RunningNorm(self.obs_shape) if normalize else None
        c, h, w = self.obs_shape
        stages = []
        for out in channels:
            stages.append(_Stage(c, out))
            c, h, w = out, (h + 1) // 2, (w + 1) // 2
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(c * h * w, hidden)
        self.out_features = hidden

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stages(_frames(obs, self.obs_norm))).flatten(1)  # [N, c * h * w]
        return F.relu(self.fc(x))  # [N, hidden]


class MLPTorso(nn.Module):
    """Fully connected tanh layers; ``forward(obs [N, obs_dim] floating) -> [N, hidden[-1]]``."""

    def __init__(self, obs_dim: int, hidden: Sequence[int] = (64, 64), normalize: bool = False):
        super().__init__()
        if isinstance(obs_dim, bool) or not isinstance(obs_dim, int) or obs_dim < 1:
            raise ValueError(f"obs_dim must be an int >= 1, got {obs_dim!r}")
        if not hidden or any(n < 1 for n in hidden):
            raise ValueError(f"hidden must be one or more layer sizes >= 1, got {hidden!r}")
        layers: list[nn.Module] = []
        size = obs_dim
        for n in hidden:
            layers += [nn.Linear(size, n), nn.Tanh()]
            size = n
        self.layers = nn.Sequential(*layers)
        self.obs_shape = (obs_dim,)
        self.out_features = size
        self.obs_norm = RunningNorm(self.obs_shape) if normalize else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if not obs.is_floating_point():
            raise TypeError(f"observations must be a floating point tensor, got {describe(obs)}")
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        return self.layers(obs.to(self.layers[0].weight.dtype))  # [N, out_features]


class ActorCritic(nn.Module):
    """A torso, an optional LSTM core, and policy and baseline heads.

    ``forward(obs [T, B, *obs_shape], done [T, B] bool, core_state) -> ModelOutput``.
    ``done[t, b]`` means ``obs[t, b]`` is the first observation of a new episode
    (the row convention of ``actors.rollout``), so the LSTM state of ``b`` is zeroed
    before step ``t``. For one step of inference pass ``obs[None]`` and ``done[None]``.

    With ``last_action_reward``, ``forward`` also takes ``last_action`` ``[T, B]`` (integer,
    the action taken before ``obs[t, b]``) and ``reward`` ``[T, B]`` (what that action
    earned); they are concatenated to the torso's features as ``[clip(reward, -1, 1),
    one_hot(last_action)]``, so the core and heads take ``features + 1 + num_actions``.

    With ``normalize_value`` the baseline head predicts the value standardised by running
    statistics of the learner's value targets (``value_norm``, a ``RunningNorm`` that the
    learner updates; rl_games' ``normalize_value``): ``value_norm.denormalize(baseline)`` is the
    value in returns' units.
    """

    def __init__(
        self,
        torso: nn.Module,
        num_actions: int,
        use_lstm: bool = False,
        lstm_layers: int = 1,
        last_action_reward: bool = False,
        normalize_value: bool = False,
    ):
        super().__init__()
        if isinstance(num_actions, bool) or not isinstance(num_actions, int) or num_actions < 1:
            raise ValueError(f"num_actions must be an int >= 1, got {num_actions!r}")
        if not hasattr(torso, "obs_shape") or not hasattr(torso, "out_features"):
            raise TypeError(f"torso must be a module with obs_shape and out_features, got {type(torso).__name__}")
        if isinstance(lstm_layers, bool) or not isinstance(lstm_layers, int) or lstm_layers < 1:
            raise ValueError(f"lstm_layers must be an int >= 1, got {lstm_layers!r}")
        self.torso = torso
        self.obs_shape = tuple(torso.obs_shape)
        self.num_actions = num_actions
        self.last_action_reward = bool(last_action_reward)
        features = torso.out_features
        inputs = features + (1 + num_actions if self.last_action_reward else 0)
        self.core = nn.LSTM(inputs, features, num_layers=lstm_layers) if use_lstm else None
        heads = features if use_lstm else inputs
        self.policy = nn.Linear(heads, num_actions)
        self.baseline = nn.Linear(heads, 1)
        self.value_norm = RunningNorm(()) if normalize_value else None

    @property
    def use_lstm(self) -> bool:
        return self.core is not None

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        """The zero core state for ``batch_size`` environments: ``(h, c)``, each ``[layers, B, hidden]``; ``()`` without an LSTM."""
        if self.core is None:
            return ()
        weight = self.policy.weight
        shape = (self.core.num_layers, batch_size, self.core.hidden_size)
        return tuple(torch.zeros(shape, dtype=weight.dtype, device=weight.device) for _ in range(2))

    def forward(
        self,
        obs: torch.Tensor,
        done: torch.Tensor | None = None,
        core_state: tuple[torch.Tensor, ...] = (),
        last_action: torch.Tensor | None = None,
        reward: torch.Tensor | None = None,
    ) -> ModelOutput:
        if not isinstance(obs, torch.Tensor):
            raise TypeError(f"obs must be a tensor, got {describe(obs)}")
        if obs.dim() != len(self.obs_shape) + 2 or tuple(obs.shape[2:]) != self.obs_shape:
            raise ValueError(f"obs must be [T, B, *{self.obs_shape}], got shape {tuple(obs.shape)}")
        T, B = obs.shape[:2]
        x = self.torso(obs.flatten(0, 1))  # [T * B, features]
        if self.last_action_reward:
            x = torch.cat([x, *self._action_reward(last_action, reward, T, B, x.dtype)], dim=1)  # [T * B, inputs]
        if self.core is not None:
            x, core_state = self._unroll_core(x.view(T, B, -1), done, core_state)  # [T, B, features]
        else:
            x = x.view(T, B, -1)  # [T, B, features]
        # The heads run in the weights' precision even under autocast, so logits and baseline are not rounded to
        # bf16's 8-bit mantissa; they cost two small matrix products.
        with torch.autocast(x.device.type, enabled=False):
            x = x.to(self.policy.weight.dtype)
            return ModelOutput(self.policy(x), self.baseline(x).squeeze(-1), core_state)

    def _action_reward(
        self, last_action: torch.Tensor | None, reward: torch.Tensor | None, T: int, B: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T * B, 1]`` clipped rewards and ``[T * B, A]`` one-hot last actions."""
        if not isinstance(last_action, torch.Tensor) or last_action.is_floating_point() or last_action.is_complex():
            raise TypeError(f"last_action must be an integer tensor [T, B] for this model, got {describe(last_action)}")
        if not isinstance(reward, torch.Tensor) or not reward.is_floating_point():
            raise TypeError(f"reward must be a floating point tensor [T, B] for this model, got {describe(reward)}")
        for name, t in (("last_action", last_action), ("reward", reward)):
            if t.shape != (T, B):
                raise ValueError(f"{name} must be [T, B] = {(T, B)}, got shape {tuple(t.shape)}")
        clipped = reward.reshape(T * B, 1).clamp(-1.0, 1.0).to(dtype)  # [T * B, 1]
        one_hot = F.one_hot(last_action.reshape(T * B).long(), self.num_actions).to(dtype)  # [T * B, A]
        return clipped, one_hot

    def _unroll_core(
        self, x: torch.Tensor, done: torch.Tensor | None, core_state: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        T, B = x.shape[:2]
        if not isinstance(done, torch.Tensor) or done.dtype != torch.bool:
            raise TypeError(f"done must be a torch.bool tensor when the model has an LSTM, got {describe(done)}")
        if done.shape != (T, B):
            raise ValueError(f"done must be [T, B] = {(T, B)}, got shape {tuple(done.shape)}")
        if not core_state:
            core_state = self.initial_state(B)
        expected = (self.core.num_layers, B, self.core.hidden_size)
        if len(core_state) != 2 or any(s.shape != expected for s in core_state):
            raise ValueError(
                f"core_state must be (h, c), each of shape {expected}, got shapes {[tuple(s.shape) for s in core_state]}"
            )
        not_done = (~done).to(x.dtype).view(T, 1, B, 1)  # [T, 1, B, 1]
        outputs = []
        for t in range(T):
            core_state = tuple(s * not_done[t] for s in core_state)
            output, core_state = self.core(x[t : t + 1], core_state)  # [1, B, hidden]
            outputs.append(output)
        return torch.cat(outputs), core_state


def orthogonal_init(model: ActorCritic) -> ActorCritic:
    """PPO's initialisation (OpenAI baselines, CleanRL): every convolution and linear layer of the torso
    orthogonal with gain sqrt(2) and zero bias, the policy head with gain 0.01 (a near-uniform first
    policy), the baseline head with gain 1; an LSTM core keeps torch's. Returns ``model``."""
    with torch.no_grad():
        for module in model.torso.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.orthogonal_(module.weight, gain=2**0.5)
                nn.init.zeros_(module.bias)
        for head, gain in ((model.policy, 0.01), (model.baseline, 1.0)):
            nn.init.orthogonal_(head.weight, gain=gain)
            nn.init.zeros_(head.bias)
    return model


@dataclass(frozen=True)
class ModelConfig:
    """The network a job trains, checked when made; ``build`` makes it. The same fields, under
    the same names (``kind`` is ``model``), are a run's config.json entries, from which
    ``from_record`` rebuilds it for evaluation and resuming."""

    kind: Literal["shallow", "deep", "mlp"] = "shallow"
    """the Nature CNN (shallow), the IMPALA ResNet (deep) or an MLP (vector observations)"""
    init: Literal["torch", "orthogonal"] = "torch"
    """torch's default initialisation of each layer, or ``orthogonal_init``'s"""
    use_lstm: bool = False
    """an LSTM core after the torso"""
    last_action_reward: bool = False
    """the core and heads also see the previous action (one-hot) and the clipped reward"""
    normalize_input: bool = False
    """the torso standardises its inputs by running statistics (``RunningNorm``) instead of scaling frames by 1/255"""
    normalize_value: bool = False
    """the baseline predicts values standardised by running statistics of the value targets"""

    def __post_init__(self) -> None:
        if self.kind not in ("shallow", "deep", "mlp"):
            raise ValueError(f"kind must be 'shallow', 'deep' or 'mlp', got {self.kind!r}")
        if self.init not in ("torch", "orthogonal"):
            raise ValueError(f"init must be 'torch' or 'orthogonal', got {self.init!r}")

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ModelConfig:
        """The model of a run's config.json (a setting it does not record is off)."""
        return cls(
            record["model"],
            record.get("init", "torch"),
            *(
                bool(record.get(name))
                for name in ("use_lstm", "last_action_reward", "normalize_input", "normalize_value")
            ),
        )

    def record(self) -> dict[str, Any]:
        """This model as config.json's entries (``from_record``'s inverse)."""
        return {"model" if k == "kind" else k: v for k, v in asdict(self).items()}

    def flags(self) -> str:
        """The command-line flags that give this model (for messages)."""
        switches = [f"--{k.replace('_', '-')}" for k, v in asdict(self).items() if v is True]
        return " ".join([f"--model {self.kind}", f"--init {self.init}", *switches])

    def build(self, obs_shape: Sequence[int], num_actions: int) -> ActorCritic:
        """A new network for observations of ``obs_shape`` and ``num_actions`` actions."""
        if self.kind == "shallow":
            torso: nn.Module = NatureTorso(obs_shape, normalize=self.normalize_input)
        elif self.kind == "deep":
            torso = ResNetTorso(obs_shape, normalize=self.normalize_input)
        else:
            if len(tuple(obs_shape)) != 1:
                raise ValueError(
                    f"the mlp model takes vector observations, obs_shape (obs_dim,), got {tuple(obs_shape)!r}"
                )
            torso = MLPTorso(obs_shape[0], normalize=self.normalize_input)
        model = ActorCritic(
            torso,
            num_actions,
            use_lstm=self.use_lstm,
            last_action_reward=self.last_action_reward,
            normalize_value=self.normalize_value,
        )
        return orthogonal_init(model) if self.init == "orthogonal" else model


def make_model(
    kind: Literal["shallow", "deep", "mlp"],
    obs_shape: Sequence[int],
    num_actions: int,
    use_lstm: bool = False,
    last_action_reward: bool = False,
    init: Literal["torch", "orthogonal"] = "torch",
    normalize_input: bool = False,
    normalize_value: bool = False,
) -> ActorCritic:
    """``ModelConfig(...).build(obs_shape, num_actions)``: the Nature CNN (``"shallow"``), the IMPALA
    ResNet (``"deep"``) or an MLP (``"mlp"``, ``obs_shape = (obs_dim,)``), as ``ModelConfig`` says."""
    config = ModelConfig(kind, init, use_lstm, last_action_reward, normalize_input, normalize_value)
    return config.build(obs_shape, num_actions)
