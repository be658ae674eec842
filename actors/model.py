"""The IMPALA "deep" network (Espeholt et al. 2018), as moolib and torchbeast use it.

Three stages of (conv 3x3, max-pool 3x3 stride 2, two residual blocks) with 16, 32
and 32 channels, then a 256-unit fully connected layer, a policy head (logits) and
a baseline head; about 1.1M parameters for 84x84x4 inputs. Observations are uint8
frames, scaled to [0, 1] inside.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["ImpalaNet"]


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


class ImpalaNet(nn.Module):
    """``forward(obs [B, C, H, W] uint8) -> (logits [B, num_actions], baseline [B])``."""

    def __init__(self, num_actions: int, obs_shape: tuple[int, int, int] = (4, 84, 84), channels=(16, 32, 32), hidden: int = 256):
        super().__init__()
        if num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}")
        c, h, w = obs_shape
        stages = []
        for out in channels:
            stages.append(_Stage(c, out))
            c, h, w = out, (h + 1) // 2, (w + 1) // 2
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(c * h * w, hidden)
        self.policy = nn.Linear(hidden, num_actions)
        self.baseline = nn.Linear(hidden, 1)
        self.obs_shape = tuple(obs_shape)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = obs.float().mul_(1.0 / 255.0)  # [B, C, H, W]
        x = F.relu(self.stages(x)).flatten(1)
        x = F.relu(self.fc(x))  # [B, hidden]
        return self.policy(x), self.baseline(x).squeeze(-1)
