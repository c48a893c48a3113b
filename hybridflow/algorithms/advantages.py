"""Advantage estimators: config, registry, and the token-level (return-based) estimators.

Uniform signature of every estimator (config key `algorithm.adv_estimator`):

    fn(token_level_rewards [B, T], response_mask [B, T], *, values=None, uid=None,
       config: AdvantageConfig, **extra) -> (advantages [B, T], returns [B, T])
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np
import torch

from hybridflow.registry import Registry
from hybridflow.algorithms.settings import ADV_ESTIMATORS, AdvantageConfig
from hybridflow.algorithms.stats import as_bool_mask, masked_whiten

Tensor = torch.Tensor


class AdvantageEstimator(Protocol):
    def __call__(
        self,
        token_level_rewards: Tensor,
        response_mask: Tensor,
        *,
        values: Tensor | None = None,
        uid: np.ndarray | None = None,
        config: AdvantageConfig,
        **extra: object,
    ) -> tuple[Tensor, Tensor]: ...


_ESTIMATORS: Registry[AdvantageEstimator] = ADV_ESTIMATORS


def register_adv_estimator(
    name: str, *, override: bool = False
) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: register an estimator with the uniform signature under `name`."""
    return _ESTIMATORS.register(name, override=override)


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as `name`; ValueError listing known names if unknown."""
    return _ESTIMATORS.get(name)


def adv_estimators() -> list[str]:
    """Names of all registered advantage estimators."""
    return _ESTIMATORS.names()


def compute_advantage(
    name: str,
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    config: AdvantageConfig,
    values: Tensor | None = None,
    uid: np.ndarray | None = None,
    **extra: object,
) -> tuple[Tensor, Tensor]:
    """Look up `name` and run it (what the trainer calls with `algorithm.adv_estimator`)."""
    fn = get_adv_estimator(name)
    return fn(token_level_rewards, response_mask, values=values, uid=uid, config=config, **extra)


# ----------------------------------------------------------------------------- helpers


def check_inputs(rewards: Tensor, mask: Tensor) -> Tensor:
    """Validate a [B, T] reward/mask pair and return the mask as bool."""
    if rewards.dim() != 2:
        raise ValueError(f"token_level_rewards must be [B, T], got shape {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        raise ValueError(f"token_level_rewards must be a float tensor, got {rewards.dtype}")
    return as_bool_mask(mask, rewards, "response_mask")


def zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    """x with masked positions set to exactly 0 (NaN/inf there included)."""
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_{t'} with t' the next unmasked position; 0 at masked positions.

    Each row starts from 0 past its last token, so returns reset at the end of every
    response; masked positions inside a row are skipped (they neither add reward nor
    count as a discount step).
    """
    rewards = zero_masked(rewards, mask)
    if gamma == 1.0:
        # Undiscounted: a reverse cumulative sum is exact (masked rewards are already 0).
        return zero_masked(rewards.flip(-1).cumsum(-1).flip(-1), mask)
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        g = rewards[:, t] + gamma * running
        running = torch.where(mask[:, t], g, running)
        out[:, t] = torch.where(mask[:, t], g, torch.zeros_like(g))
    return out


# ----------------------------------------------------------------------------- estimators


@register_adv_estimator("gae")
def compute_gae(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    values: Tensor | None = None,
    uid: np.ndarray | None = None,
    config: AdvantageConfig,
    **extra: object,
) -> tuple[Tensor, Tensor]:
    """GAE: A_t = sum_l (gamma lam)^l delta_{t+l}, delta_t = r_t + gamma V_{t+1} - V_t; R_t = A_t + V_t.

    Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation" (arXiv 1506.02438). V past the last response token is 0 (the episode ends).
    Returns are computed from the raw advantages; only then are the advantages whitened
    over the batch (if `config.whiten_gae_advantages`).
    """
    mask = check_inputs(token_level_rewards, response_mask)
    if values is None:
        raise ValueError("gae needs `values` (critic predictions, [B, T]); use a critic or a critic-free estimator")
    if values.shape != token_level_rewards.shape:
        raise ValueError(f"values shape {tuple(values.shape)} != rewards shape {tuple(token_level_rewards.shape)}")
    with torch.no_grad():
        rewards = zero_masked(token_level_rewards, mask)
        vals = zero_masked(values.to(rewards.dtype), mask)
        adv = torch.zeros_like(rewards)
        next_value = torch.zeros_like(rewards[:, 0])
        next_adv = torch.zeros_like(rewards[:, 0])
        for t in range(rewards.shape[1] - 1, -1, -1):
            m = mask[:, t]
            delta = rewards[:, t] + config.gamma * next_value - vals[:, t]
            a = delta + config.gamma * config.lam * next_adv
            adv[:, t] = torch.where(m, a, torch.zeros_like(a))
            # Carry through masked positions so they are skipped, not treated as boundaries.
            next_value = torch.where(m, vals[:, t], next_value)
            next_adv = torch.where(m, a, next_adv)
        returns = zero_masked(adv + vals, mask)
        if config.whiten_gae_advantages:
            adv = masked_whiten(adv, mask)
    return adv, returns


@register_adv_estimator("reinforce_plus_plus")
def compute_reinforce_plus_plus(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    values: Tensor | None = None,
    uid: np.ndarray | None = None,
    config: AdvantageConfig,
    **extra: object,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++: G_t = r_t + gamma G_{t+1} (reset per response); A = whiten_batch(G).

    Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
    Models" (arXiv 2501.03262). Returns are the unwhitened G.
    """
    mask = check_inputs(token_level_rewards, response_mask)
    with torch.no_grad():
        returns = discounted_returns(token_level_rewards, mask, config.gamma)
        adv = masked_whiten(returns, mask)
    return adv, returns


@register_adv_estimator("remax")
def compute_remax(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    values: Tensor | None = None,
    uid: np.ndarray | None = None,
    config: AdvantageConfig,
    baseline_rewards: Tensor | None = None,
    **extra: object,
) -> tuple[Tensor, Tensor]:
    """ReMax: A_t = G_t - b, G_t = sum_{s>=t} r_s (undiscounted), b = reward of the greedy rollout.

    Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning
    Method for Aligning Large Language Models" (arXiv 2310.10505). `baseline_rewards` [B]
    is the sequence reward of a greedy response to the same prompt.
    """
    mask = check_inputs(token_level_rewards, response_mask)
    if baseline_rewards is None:
        raise ValueError(
            "remax needs `baseline_rewards` [B]: the reward of a greedy rollout of each prompt"
        )
    if baseline_rewards.shape != token_level_rewards.shape[:1]:
        raise ValueError(
            f"baseline_rewards must have shape ({token_level_rewards.shape[0]},), "
            f"got {tuple(baseline_rewards.shape)}"
        )
    with torch.no_grad():
        returns = discounted_returns(token_level_rewards, mask, 1.0)
        baseline = baseline_rewards.to(returns.dtype).unsqueeze(-1)
        adv = zero_masked(returns - baseline, mask)
    return adv, returns
