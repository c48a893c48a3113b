"""The PPO loss for environment tasks: clipped policy loss + (clipped) value loss - entropy bonus.

    loss = pg_loss + vf_coef * vf_loss - ent_coef * entropy

    pg_loss = mean(max(-A r, -A clip(r, 1 - c, 1 + c))),  r = exp(log pi - log pi_old)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from hybridflow.algorithms.policy_loss import ppo_clip_loss
from hybridflow.algorithms.settings import PolicyLossConfig
from hybridflow.algorithms.value import value_loss

Tensor = torch.Tensor


@dataclass(frozen=True)
class PPOLossConfig:
    """clip_ratio: the ratio is clipped to [1 - c, 1 + c]; clip_value: value clip range
    around the rollout values (None: unclipped); vf_coef, ent_coef: loss weights."""

    clip_ratio: float = 0.2
    clip_value: float | None = None
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    normalize_advantages: bool = True
    policy: PolicyLossConfig = field(init=False, repr=False, compare=False)  # the clipped policy loss's settings

    def __post_init__(self) -> None:
        # A symmetric clip range and no dual clip; built once, not per minibatch.
        object.__setattr__(self, "policy", PolicyLossConfig(clip_ratio_low=self.clip_ratio,
                                                            clip_ratio_high=self.clip_ratio, clip_ratio_c=math.inf))


def normalize(x: Tensor, mean_std: tuple[Tensor, Tensor] | None = None, eps: float = 1e-8) -> Tensor:
    """(x - mean) / (std + eps): over all elements of x (std unbiased, 0 for one element), or
    with given statistics (a data-parallel learner passes the whole minibatch's)."""
    if mean_std is None:
        mean_std = (x.mean(), x.std() if x.numel() > 1 else torch.zeros((), dtype=x.dtype))
    mean, std = mean_std
    return (x - mean) / (std + eps)


def actor_critic_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, new_values: Tensor,
                      old_values: Tensor, returns: Tensor, entropy: Tensor, config: PPOLossConfig,
                      adv_mean_std: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """The scalar loss of one minibatch (all inputs [B]) and detached metrics. `adv_mean_std`:
    the advantage statistics to normalise with (default: this minibatch's own)."""
    if config.normalize_advantages:
        advantages = normalize(advantages, adv_mean_std)
    pg_loss, _ = ppo_clip_loss(old_log_probs, log_probs, advantages, None, config=config.policy)
    ones = torch.ones(log_probs.shape[0], 1, dtype=torch.bool)
    vf_loss, vf_metrics = value_loss(new_values[:, None], old_values[:, None], returns[:, None], ones,
                                     cliprange_value=config.clip_value)
    ent = entropy.mean()
    loss = pg_loss + config.vf_coef * vf_loss - config.ent_coef * ent
    with torch.no_grad():
        log_ratio = log_probs - old_log_probs
        ratio = torch.exp(log_ratio)
        # k3 estimate of KL(old || new): unbiased and never negative (used for target_kl).
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clipfrac = ((ratio - 1.0).abs() > config.clip_ratio).float().mean()  # as Stable-Baselines3 counts it
    metrics = {"pg_loss": pg_loss.detach(), "vf_loss": vf_loss.detach(), "entropy": ent.detach(),
               "clipfrac": clipfrac, "approx_kl": approx_kl, "vf_clipfrac": vf_metrics["vf_clipfrac"]}
    return loss, metrics
