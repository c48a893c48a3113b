"""Safe-RLHF: cost advantages, the Lagrange multiplier, and the combined advantage."""

from __future__ import annotations

import math

import torch

from hybridflow.algorithms.advantages import AdvantageConfig, compute_gae
from hybridflow.algorithms.controllers import LagrangeMultiplier

Tensor = torch.Tensor

def compute_cost_advantages(
    token_level_costs: Tensor,
    response_mask: Tensor,
    cost_values: Tensor,
    config: AdvantageConfig,
) -> tuple[Tensor, Tensor]:
    """GAE of the costs with the cost critic: (cost advantages, cost returns), see `compute_gae`."""
    return compute_gae(token_level_costs, response_mask, values=cost_values, config=config)


def combine_reward_cost_advantages(reward_adv: Tensor, cost_adv: Tensor, lagrange_value: float) -> Tensor:
    """A = (A^R - lambda A^C) / (1 + lambda)  (Dai et al. 2023, Eq. for the policy update).

    Dividing by 1 + lambda keeps the advantage scale bounded as lambda grows, so the
    policy step size does not depend on how hard the constraint currently binds.
    """
    if reward_adv.shape != cost_adv.shape:
        raise ValueError(f"reward_adv shape {tuple(reward_adv.shape)} != cost_adv shape {tuple(cost_adv.shape)}")
    lam = float(lagrange_value)
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lagrange_value must be finite and >= 0, got {lagrange_value}")
    return (reward_adv - lam * cost_adv) / (1.0 + lam)
