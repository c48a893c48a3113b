"""KL coefficient controllers for the KL-in-reward penalty (config `algorithm.kl_ctrl.*`).

- `FixedKLController(kl_coef)`: beta never changes.
- `AdaptiveKLController(init_kl_coef, target_kl, horizon)`: Ziegler et al. 2019,
  "Fine-Tuning Language Models from Human Preferences" (arXiv 1909.08593):
  e = clip(KL / KL_target - 1, -0.2, 0.2);  beta <- beta * (1 + e * n_steps / horizon),
  kept >= a floor of init_kl_coef / 1000 so that beta can always grow again.
"""

from __future__ import annotations

import math
from typing import Any


def _check_coef(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return value


def _check_positive_coef(name: str, value: float) -> float:
    value = _check_coef(name, value)
    if value == 0.0:
        raise ValueError(f"{name} must be > 0 for the adaptive KL controller: it scales beta "
                         "multiplicatively, so from 0 it could never move. Set a positive "
                         "coefficient, or use algorithm.kl_ctrl.type=fixed for no KL penalty")
    return value


class FixedKLController:
    """Constant KL coefficient."""

    kind = "fixed"

    def __init__(self, kl_coef: float) -> None:
        self._value = _check_coef("kl_coef", kl_coef)

    @property
    def value(self) -> float:
        return self._value

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: a fixed coefficient ignores the measured KL."""

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self._value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_kind(state, self.kind)
        self._value = _check_coef("value", state["value"])


class AdaptiveKLController:
    """Proportional controller that steers the measured KL towards `target_kl`.

    beta never falls below `min_value = init_kl_coef * FLOOR_FRACTION`. Without a floor
    the multiplicative update has an absorbing state at 0: with a batch bigger than
    horizon / ERROR_CLIP (n_steps / horizon >= 5) one low-KL step makes the factor
    1 + e * n_steps / horizon <= 0, and a long stretch of low KL underflows beta to 0;
    from 0 the update can never grow it again. At the floor the penalty is negligible
    but positive, so a later high-KL batch multiplies it back up.
    """

    kind = "adaptive"
    # Ziegler et al. clip the proportional error so one noisy batch moves beta by at most
    # 20% of n_steps / horizon.
    ERROR_CLIP = 0.2
    # A thousandth of the initial coefficient: small enough that the penalty is off in
    # practice, large enough that recovery takes ln(1000) / (0.2 n/h) steps, not forever.
    FLOOR_FRACTION = 1e-3

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        self._value = _check_positive_coef("init_kl_coef (algorithm.kl_ctrl.kl_coef)", init_kl_coef)
        self.min_value = self._value * self.FLOOR_FRACTION
        if not (math.isfinite(target_kl) and target_kl > 0):
            raise ValueError(f"target_kl must be > 0, got {target_kl}")
        if not horizon > 0:
            raise ValueError(f"horizon must be > 0 (in samples), got {horizon}")
        self.target_kl = float(target_kl)
        self.horizon = int(horizon)

    @property
    def value(self) -> float:
        return self._value

    def update(self, current_kl: float, n_steps: int) -> None:
        """beta <- max(beta * (1 + clip(KL/target - 1, -0.2, 0.2) * n_steps / horizon), min_value)."""
        if not math.isfinite(current_kl):
            raise ValueError(f"current_kl must be finite, got {current_kl}")
        if n_steps < 0:
            raise ValueError(f"n_steps must be >= 0, got {n_steps}")
        error = min(max(current_kl / self.target_kl - 1.0, -self.ERROR_CLIP), self.ERROR_CLIP)
        self._value = max(self._value * (1.0 + error * n_steps / self.horizon), self.min_value)

    def state_dict(self) -> dict[str, Any]:
        # min_value is not state: it follows the configured init_kl_coef of the resumed run.
        return {"kind": self.kind, "value": self._value, "target_kl": self.target_kl, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_kind(state, self.kind)
        # A checkpoint written before the floor existed may hold 0: restart from the floor.
        self._value = max(_check_coef("value", state["value"]), self.min_value)
        self.target_kl = float(state["target_kl"])
        self.horizon = int(state["horizon"])


def _check_kind(state: dict[str, Any], kind: str) -> None:
    if state.get("kind") != kind:
        raise ValueError(f"state_dict is for a {state.get('kind')!r} KL controller, not {kind!r}")


def build_kl_controller(
    kind: str, kl_coef: float, target_kl: float | None = None, horizon: int | None = None
) -> FixedKLController | AdaptiveKLController:
    """Controller from `algorithm.kl_ctrl.type` ('fixed' | 'adaptive') and its fields."""
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError("adaptive KL controller needs algorithm.kl_ctrl.target_kl and .horizon")
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown algorithm.kl_ctrl.type {kind!r}; known: adaptive, fixed")


# Bounds on ln(lambda): without them a long run of violations overflows exp to inf, or a
# long run of slack drives lambda to 0.0 exactly, from which the update can never recover.
_LOG_LAMBDA_MIN, _LOG_LAMBDA_MAX = -30.0, 30.0


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
