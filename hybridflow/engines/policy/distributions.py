"""Action distributions of the policy heads: categorical, multi-categorical, tanh-squashed Gaussian.

A head turns features into distribution parameters and knows three things about its
actions: how to sample one (with the caller's torch.Generator, so runs are reproducible),
the log-probability and entropy of a stored action, and how a stored action becomes what
the environment takes (`to_env`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hybridflow.engines.policy.mlp import linear
from hybridflow.engines.policy.spaces import ActionSpec

Tensor = torch.Tensor
LOG_2PI = math.log(2.0 * math.pi)


def gaussian_log_prob(mean: Tensor, log_std: Tensor, u: Tensor) -> Tensor:
    """log N(u; mean, exp(log_std)) summed over the last dimension."""
    z = (u - mean) * torch.exp(-log_std)
    return (-0.5 * z.square() - log_std - 0.5 * LOG_2PI).sum(-1)


def tanh_log_abs_det(u: Tensor) -> Tensor:
    """log(1 - tanh(u)^2) elementwise, in a form that does not underflow for large |u|."""
    return 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))


def squashed_gaussian_log_prob(mean: Tensor, log_std: Tensor, u: Tensor, half_range: Tensor | None = None) -> Tensor:
    """log-density of x = center + half_range * tanh(u) (module docstring); half_range None
    means the normalised box [-1, 1] (no affine term)."""
    log_prob = gaussian_log_prob(mean, log_std, u) - tanh_log_abs_det(u).sum(-1)
    if half_range is not None:
        log_prob = log_prob - torch.log(half_range).sum()
    return log_prob


def gaussian_entropy(log_std: Tensor) -> Tensor:
    """Entropy of a diagonal Gaussian, summed over the last dimension."""
    return (0.5 + 0.5 * LOG_2PI + log_std).sum(-1)


class CategoricalHead(nn.Module):
    """One categorical distribution per action dimension (nvec options each; one dimension
    for a Discrete space)."""

    def __init__(self, spec: ActionSpec, n_in: int, gain: float | None) -> None:
        super().__init__()
        self.spec = spec
        self.sizes = list(spec.nvec)
        self.logits = linear(n_in, sum(self.sizes), gain)
        self.register_buffer("start", torch.tensor(spec.start or [0] * len(self.sizes), dtype=torch.int64))

    def _log_softmax_parts(self, features: Tensor) -> list[Tensor]:
        if len(self.sizes) == 1:
            return [torch.log_softmax(self.logits(features), -1)]
        return [torch.log_softmax(part, -1) for part in torch.split(self.logits(features), self.sizes, dim=-1)]

    def sample(self, features: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """(stored action [B, K] int64, log-prob [B])."""
        parts = self._log_softmax_parts(features)
        picks = [torch.multinomial(logp.exp(), 1, generator=generator) for logp in parts]
        action = torch.cat(picks, dim=-1)
        return action, self._log_prob(parts, action)

    def log_prob_entropy(self, features: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        parts = self._log_softmax_parts(features)
        entropy = sum(-(logp.exp() * logp).sum(-1) for logp in parts)
        return self._log_prob(parts, action), entropy

    def deterministic(self, features: Tensor) -> Tensor:
        return torch.cat([logp.argmax(-1, keepdim=True) for logp in self._log_softmax_parts(features)], dim=-1)

    def to_env(self, action: Tensor) -> np.ndarray:
        shifted = (action.detach() + self.start).numpy()
        return shifted[:, 0] if self.spec.kind == "discrete" else shifted

    @staticmethod
    def _log_prob(parts: list[Tensor], action: Tensor) -> Tensor:
        return sum(logp.gather(-1, action[:, i:i + 1]).squeeze(-1) for i, logp in enumerate(parts))


class SquashedGaussianHead(nn.Module):
    """Mean from the features, a state-independent log std (a learned parameter), tanh squash
    onto the box bounds."""

    def __init__(self, spec: ActionSpec, n_in: int, gain: float | None, log_std_init: float) -> None:
        super().__init__()
        self.spec = spec
        self.mean = linear(n_in, spec.dim, gain)
        self.log_std = nn.Parameter(torch.full((spec.dim,), float(log_std_init)))
        low, high = torch.tensor(spec.low, dtype=torch.float64), torch.tensor(spec.high, dtype=torch.float64)
        self.register_buffer("center", ((high + low) / 2).float())
        self.register_buffer("half_range", ((high - low) / 2).float())

    def sample(self, features: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        mean = self.mean(features)
        log_std = self.log_std.expand_as(mean)
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype)
        u = mean + noise * log_std.exp()
        return u, squashed_gaussian_log_prob(mean, log_std, u, self.half_range)

    def log_prob_entropy(self, features: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
        mean = self.mean(features)
        log_std = self.log_std.expand_as(mean)
        return squashed_gaussian_log_prob(mean, log_std, u, self.half_range), gaussian_entropy(log_std)

    def deterministic(self, features: Tensor) -> Tensor:
        return self.mean(features)

    def to_env(self, u: Tensor) -> np.ndarray:
        return (self.center + self.half_range * torch.tanh(u.detach())).numpy()


def make_head(spec: ActionSpec, n_in: int, ortho: bool, log_std_init: float) -> CategoricalHead | SquashedGaussianHead:
    """The head for `spec`; policy outputs start near-uniform (gain 0.01) with orthogonal init."""
    gain = 0.01 if ortho else None
    if spec.is_continuous:
        return SquashedGaussianHead(spec, n_in, gain, log_std_init)
    return CategoricalHead(spec, n_in, gain)
