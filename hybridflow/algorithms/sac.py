"""Soft Actor-Critic losses (Haarnoja et al. 2018, arXiv 1801.01290 and 1812.05905)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

Tensor = torch.Tensor


def soft_q_target(rewards: Tensor, terminated: Tensor, next_q1: Tensor, next_q2: Tensor, next_log_probs: Tensor,
                  *, alpha: Tensor | float, gamma: float) -> Tensor:
    """The critic's regression target y (module docstring), without gradient; all inputs [B]."""
    with torch.no_grad():
        soft_value = torch.minimum(next_q1, next_q2) - alpha * next_log_probs
        return rewards + gamma * (1.0 - terminated.to(rewards.dtype)) * soft_value


def sac_critic_loss(q1: Tensor, q2: Tensor, target: Tensor) -> Tensor:
    """1/2 MSE of each critic against the shared target y."""
    target = target.detach()
    return 0.5 * ((q1 - target).square().mean() + (q2 - target).square().mean())


def sac_actor_loss(q1_pi: Tensor, q2_pi: Tensor, log_probs: Tensor, alpha: Tensor | float) -> Tensor:
    """mean(alpha * log pi - min Q) on reparameterised actions (alpha is a constant here)."""
    alpha = alpha.detach() if isinstance(alpha, Tensor) else alpha
    return (alpha * log_probs - torch.minimum(q1_pi, q2_pi)).mean()


def sac_alpha_loss(log_alpha: Tensor, log_probs: Tensor, target_entropy: float) -> Tensor:
    """Temperature loss: pushes the policy entropy towards `target_entropy` (usually -A)."""
    return -(log_alpha * (log_probs.detach() + target_entropy)).mean()


@torch.no_grad()
def polyak_update(target: Iterable[Tensor], online: Iterable[Tensor], tau: float) -> None:
    """target <- tau * online + (1 - tau) * target, in place (tau = 1 copies)."""
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got {tau}")
    target, online = list(target), list(online)
    if len(target) != len(online):
        raise ValueError(f"polyak_update: {len(target)} target tensors but {len(online)} online ones")
    torch._foreach_lerp_(target, online, tau)
