"""`SACModel`: the networks of Soft Actor-Critic (losses in hybridflow/algorithms/sac.py).

    model = SACModel(NetworkSpec(obs_dim=3, action=ActionSpec("box", low=(-2.0,), high=(2.0,)),
                                 hidden_size=(256, 256), activation="relu", ortho_init=False))
    a, log_prob = model.actor.sample(model.obs_norm(obs), generator)   # a in [-1, 1]^A
    q1, q2 = model.critic(model.obs_norm(obs), a)
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import nn

from hybridflow.engines.policy.actor_critic import NetworkSpec
from hybridflow.engines.policy.distributions import squashed_gaussian_log_prob
from hybridflow.engines.policy.mlp import ObsNormalizer, linear, mlp, out_width

Tensor = torch.Tensor
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


class TwinQ(nn.Module):
    """Q1(s, a) and Q2(s, a): two independent MLPs on the concatenated (obs, action).

    (Two plain MLPs: on CPU one batched matmul over both members was measured slower
    than two ordinary matmuls.)"""

    def __init__(self, n_in: int, hidden: tuple[int, ...], activation: str, ortho: bool) -> None:
        super().__init__()
        width = out_width(n_in, hidden)
        self.q1 = nn.Sequential(mlp(n_in, hidden, activation, ortho), linear(width, 1, 1.0 if ortho else None))
        self.q2 = nn.Sequential(mlp(n_in, hidden, activation, ortho), linear(width, 1, 1.0 if ortho else None))

    def forward(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        x = torch.cat([obs, action], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


class SACActor(nn.Module):
    def __init__(self, spec: NetworkSpec) -> None:
        super().__init__()
        self.trunk = mlp(spec.obs_dim, spec.hidden_size, spec.activation, spec.ortho_init)
        width = out_width(spec.obs_dim, spec.hidden_size)
        gain = 0.01 if spec.ortho_init else None
        self.mean = linear(width, spec.action.dim, gain)
        self.log_std = linear(width, spec.action.dim, gain)

    def forward(self, obs_n: Tensor) -> tuple[Tensor, Tensor]:
        h = self.trunk(obs_n)
        return self.mean(h), self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs_n: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Reparameterised (action in [-1, 1], log-prob in the normalised box) for normalised obs."""
        mean, log_std = self(obs_n)
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype)
        u = mean + noise * log_std.exp()
        return torch.tanh(u), squashed_gaussian_log_prob(mean, log_std, u)


class SACModel(nn.Module):
    def __init__(self, spec: NetworkSpec, init_alpha: float = 1.0) -> None:
        super().__init__()
        if not spec.action.is_continuous:
            raise ValueError(f"SAC needs a continuous (Box) action space; this environment's is {spec.action.kind}. "
                             "Use algorithm: ppo for discrete actions")
        self.spec = spec
        self.obs_norm = ObsNormalizer(spec.obs_dim, spec.normalize_obs, spec.clip_obs)
        self.actor = SACActor(spec)
        self.critic = TwinQ(spec.obs_dim + spec.action.dim, spec.hidden_size, spec.activation, spec.ortho_init)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init_alpha)))
        low, high = np.asarray(spec.action.low, dtype=np.float64), np.asarray(spec.action.high, dtype=np.float64)
        self._center, self._half = ((high + low) / 2).astype(np.float32), ((high - low) / 2).astype(np.float32)

    @torch.no_grad()
    def act(self, obs: Tensor, generator: torch.Generator | None) -> Tensor:
        """Sampled normalised actions [B, A] for raw observations."""
        return self.actor.sample(self.obs_norm(obs), generator)[0]

    @torch.no_grad()
    def deterministic(self, obs: Tensor) -> Tensor:
        return torch.tanh(self.actor(self.obs_norm(obs))[0])

    def to_env(self, action: Tensor) -> np.ndarray:
        """Normalised actions onto the environment's box."""
        return self._center + self._half * action.numpy()
