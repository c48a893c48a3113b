"""Safe-RLHF: cost advantages, the Lagrange multiplier, and the combined advantage.

Dai et al. 2023, "Safe RLHF: Safe Reinforcement Learning from Human Feedback"
(arXiv 2310.12773). The policy maximises reward subject to E[cost] <= cost_limit via the
Lagrangian  min_theta max_{lambda >= 0}  -J_R(theta) + lambda (J_C(theta) - cost_limit):

- cost advantages A^C: GAE on the token-level costs with a separate cost critic;
- multiplier (`LagrangeMultiplier`, controllers.py; gradient ascent on log lambda, which keeps lambda > 0):
  ln lambda <- ln lambda + lr * lambda * (mean_episode_cost - cost_limit);
- combined advantage for the policy loss: A = (A^R - lambda A^C) / (1 + lambda).
Config keys: `algorithm.safe_rlhf.{lambda_init,lambda_lr,cost_limit,lambda_max}`.
"""

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
