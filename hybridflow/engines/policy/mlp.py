"""Building blocks of the small policy networks: MLPs, orthogonal init, observation normaliser.

    trunk = mlp(obs_dim, [64, 64], "tanh")                  # Linear+act per hidden size
    head = linear(64, n_actions, gain=0.01)                 # orthogonal init, zero bias

Orthogonal initialisation (Saxe et al. 2014) with gain sqrt(2) for hidden layers, 0.01 for
policy outputs (an almost uniform first policy) and 1 for value outputs is what PPO
implementations settled on (Andrychowicz et al. 2021, "What Matters in On-Policy RL",
arXiv 2006.05990). `ortho=False` keeps PyTorch's default init (SAC implementations use it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

Tensor = torch.Tensor

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "elu": nn.ELU, "silu": nn.SiLU, "leaky_relu": nn.LeakyReLU,
}
HIDDEN_GAIN = math.sqrt(2.0)


def linear(n_in: int, n_out: int, gain: float | None = HIDDEN_GAIN) -> nn.Linear:
    """nn.Linear with orthogonal weights scaled by `gain` and zero bias (gain None: PyTorch default)."""
    layer = nn.Linear(n_in, n_out)
    if gain is not None:
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return layer


def mlp(n_in: int, hidden: Sequence[int], activation: str, ortho: bool = True) -> nn.Sequential:
    """Linear + activation for every hidden size (its output width is hidden[-1], or n_in)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [linear(n_in, width, HIDDEN_GAIN if ortho else None), ACTIVATIONS[activation]()]
        n_in = width
    return nn.Sequential(*layers)


def out_width(n_in: int, hidden: Sequence[int]) -> int:
    return hidden[-1] if hidden else n_in


class ObsNormalizer(nn.Module):
    """(obs - mean) / sqrt(var + eps), clipped to +-clip, with running statistics.

    The statistics are buffers, so they travel with the weights to the env runners and
    into checkpoints. `update` merges a batch of raw observations (Chan et al.'s parallel
    variance formula); with torch.distributed initialised, the batch statistics are summed
    over all ranks first, so every learner rank holds the same numbers. Disabled, it is
    the identity and `update` does nothing.
    """

    def __init__(self, dim: int, enabled: bool, clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.enabled, self.clip, self.eps = enabled, clip, eps
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def forward(self, obs: Tensor) -> Tensor:
        if not self.enabled:
            return obs
        scaled = (obs - self.mean.to(obs.dtype)) / torch.sqrt(self.var.to(obs.dtype) + self.eps)
        return scaled.clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, obs: Tensor) -> None:
        if not self.enabled:
            return
        x = obs.reshape(-1, self.mean.shape[0]).to(torch.float64)
        sums = torch.cat([torch.tensor([float(len(x))], dtype=torch.float64), x.sum(0), x.square().sum(0)])
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(sums)
        dim = self.mean.shape[0]
        n, total, total_sq = sums[0], sums[1:1 + dim], sums[1 + dim:]
        if n == 0:
            return
        batch_mean = total / n
        batch_var = (total_sq / n - batch_mean.square()).clamp_min(0.0)
        count = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta.square() * self.count * n / count
        self.mean.add_(delta * n / count)
        self.var.copy_(m2 / count)
        self.count.copy_(count)
