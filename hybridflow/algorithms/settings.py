"""The torch-free part of the math layer: its config classes and its registries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from hybridflow.registry import Registry
from hybridflow.errors import ConfigError

_ALG = "hybridflow.algorithms."

ADV_ESTIMATORS: Registry[Any] = Registry("advantage estimator", "algorithm.adv_estimator", {
    **dict.fromkeys(("gae", "reinforce_plus_plus", "remax"), _ALG + "advantages"),
    **dict.fromkeys(("grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline", "opo", "gpg"),
                    _ALG + "group_advantages"),
})
POLICY_LOSSES: Registry[Any] = Registry("policy loss", "actor.loss.policy.loss_mode", dict.fromkeys(
    ("vanilla", "gspo", "cispo", "reinforce", "gpg"), _ALG + "policy_loss"))
LOSS_AGG_MODES: Registry[Any] = Registry("loss aggregation mode", "actor.loss.policy.loss_agg_mode", dict.fromkeys(
    ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"), _ALG + "aggregation"))
KL_ESTIMATORS: Registry[Any] = Registry("KL estimator", "algorithm.kl_penalty / actor.loss.kl_loss_type", dict.fromkeys(
    ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"), _ALG + "kl"))


@dataclass
class AdvantageConfig:
    """Hyper-parameters of the advantage estimators (the `algorithm.*` config keys: the run
    config's AlgorithmSection subclasses this class, so a field added here is a YAML key).

    gamma, lam: discount and GAE lambda (`gae`, `reinforce_plus_plus`).
    norm_adv_by_std_in_grpo: divide group-centred rewards by the group std (`grpo`,
        `grpo_passk`); False gives Dr.GRPO.
    epsilon: added to the std before dividing, so all-equal groups give 0, not NaN.
    whiten_gae_advantages: whiten `gae` advantages over the batch (returns stay unwhitened).
    gpg_norm_by_std: GPG's F_norm: the group std (True) or 1 (False, the paper's default).
    """

    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    epsilon: float = 1e-6
    whiten_gae_advantages: bool = True
    gpg_norm_by_std: bool = False

    def __post_init__(self) -> None:
        for key in ("gamma", "lam"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"must be in [0, 1], got {getattr(self, key)}", key)
        if not self.epsilon > 0.0:
            raise ConfigError(f"must be > 0, got {self.epsilon}", "epsilon")


@dataclass(frozen=True)
class PolicyLossConfig:
    """Hyper-parameters of the policy losses (the `actor.*` config keys).

    clip_ratio_low / clip_ratio_high: the ratio is clipped to [1 - low, 1 + high]
        (DAPO clip-higher: high > low). For `gspo` use small values (e.g. 3e-4 / 4e-4).
    clip_ratio_c: dual-clip bound for negative advantages (must be > 1).
    loss_agg_mode: aggregation mode name (`actor.loss.policy.loss_agg_mode`).
    log_ratio_clamp: |log pi - log pi_old| is clamped to this before exp.
    """

    loss_mode: str = "vanilla"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    log_ratio_clamp: float = 20.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_ratio_low < 1.0:
            raise ValueError(
                f"clip_ratio_low must be in [0, 1) so the lower bound 1 - clip_ratio_low stays "
                f"positive, got {self.clip_ratio_low}"
            )
        if not self.clip_ratio_high >= 0.0:
            raise ValueError(f"clip_ratio_high must be >= 0, got {self.clip_ratio_high}")
        if not self.clip_ratio_c > 1.0:
            raise ValueError(
                f"clip_ratio_c (dual-clip bound for negative advantages) must be > 1, got {self.clip_ratio_c}"
            )
        if not self.log_ratio_clamp > 0.0:
            raise ValueError(f"log_ratio_clamp must be > 0, got {self.log_ratio_clamp}")
        LOSS_AGG_MODES.check(self.loss_agg_mode)  # fail at config time on a typo
        POLICY_LOSSES.check(self.loss_mode)


ISLevel = Literal["none", "token", "sequence"]
IS_LEVELS: tuple[str, ...] = ("none", "token", "sequence")


@dataclass(frozen=True)
class OffPolicyConfig:
    """Behaviour-policy correction of the actor loss (config `actor.loss.off_policy`).

    is_level: "none" (the loss ignores rollout_log_probs, as before), "token" or "sequence"
        truncated importance weights pi_prox / mu (see off_policy.py).
    is_cap: C, the truncation of the weight (>= 1; 2.0 is the value Yao et al. report).
    """

    is_level: ISLevel = "none"
    is_cap: float = 2.0

    def __post_init__(self) -> None:
        if self.is_level not in IS_LEVELS:
            raise ValueError(f"is_level must be one of {IS_LEVELS}, got {self.is_level!r}")
        if not self.is_cap >= 1.0:
            raise ValueError(f"is_cap must be >= 1 (weights are truncated at it), got {self.is_cap}")

    @property
    def enabled(self) -> bool:
        return self.is_level != "none"
