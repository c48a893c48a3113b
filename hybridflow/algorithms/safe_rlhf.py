"""Safe-RLHF: cost advantages, the Lagrange multiplier, and the combined advantage.

Dai et al. 2023, "Safe RLHF: Safe Reinforcement Learning from Human Feedback"
(arXiv 2310.12773). The policy maximises reward subject to E[cost] <= cost_limit via the
Lagrangian  min_theta max_{lambda >= 0}  -J_R(theta) + lambda (J_C(theta) - cost_limit):

- cost advantages A^C: GAE on the token-level costs with a separate cost critic;
- multiplier (gradient ascent on log lambda, which keeps lambda > 0):
  ln lambda <- ln lambda + lr * lambda * (mean_episode_cost - cost_limit);
- combined advantage for the policy loss: A = (A^R - lambda A^C) / (1 + lambda).
Config keys: `algorithm.safe_rlhf.{lambda_init,lambda_lr,cost_limit,lambda_max}`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hybridflow.algorithms.advantages import AdvantageConfig, compute_gae

Tensor = torch.Tensor

# Bounds on ln(lambda): without them a long run of violations overflows exp to inf, or a
# long run of slack drives lambda to 0.0 exactly, from which the update can never recover.
_LOG_LAMBDA_MIN, _LOG_LAMBDA_MAX = -30.0, 30.0


def compute_cost_advantages(
    token_level_costs: Tensor,
    response_mask: Tensor,
    cost_values: Tensor,
    config: AdvantageConfig,
) -> tuple[Tensor, Tensor]:
    """GAE of the costs with the cost critic: (cost advantages, cost returns), see `compute_gae`."""
    return compute_gae(token_level_costs, response_mask, values=cost_values, config=config)


class LagrangeMultiplier:
    """The Safe-RLHF Lagrange multiplier lambda >= 0, updated once per step from the batch cost."""

    def __init__(self, init: float, lr: float, cost_limit: float, max: float | None = None) -> None:
        if not (math.isfinite(init) and init > 0):
            raise ValueError(f"LagrangeMultiplier init must be > 0 (it is updated in log space), got {init}")
        if not lr >= 0:
            raise ValueError(f"LagrangeMultiplier lr must be >= 0, got {lr}")
        if max is not None and not max >= init:
            raise ValueError(f"LagrangeMultiplier max ({max}) must be >= init ({init})")
        self.lr = float(lr)
        self.cost_limit = float(cost_limit)
        self.max = None if max is None else float(max)
        self._log_value = math.log(init)

    @property
    def value(self) -> float:
        return math.exp(self._log_value)

    def update(self, mean_episode_cost: float) -> float:
        """ln lambda += lr * lambda * (mean_episode_cost - cost_limit); returns the new lambda."""
        if not math.isfinite(mean_episode_cost):
            raise ValueError(f"mean_episode_cost must be finite, got {mean_episode_cost}")
        step = self.lr * self.value * (mean_episode_cost - self.cost_limit)
        upper = _LOG_LAMBDA_MAX if self.max is None else min(_LOG_LAMBDA_MAX, math.log(self.max))
        self._log_value = min(max(self._log_value + step, _LOG_LAMBDA_MIN), upper)
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"log_value": self._log_value, "lr": self.lr, "cost_limit": self.cost_limit, "max": self.max}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._log_value = float(state["log_value"])
        self.lr = float(state["lr"])
        self.cost_limit = float(state["cost_limit"])
        self.max = None if state["max"] is None else float(state["max"])


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
