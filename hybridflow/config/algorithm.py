"""The `algorithm` section of the run config and what each `algorithm.name` implies.

`ALGORITHM_SPECS` has one row per step program of hybridflow/trainer/algorithms.py: the
advantage estimators it accepts, whether it trains a critic, the fewest samples per prompt
and the presets it applies (docs/algorithms.md lists them). The sections below hold the
algorithm's own settings: KL in the reward, DAPO and Safe-RLHF.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from hybridflow.algorithms import AdvantageConfig, LagrangeMultiplier, get_adv_estimator, get_kl_estimator

if TYPE_CHECKING:
    from hybridflow.config.schema import RunConfig

# Critic-free estimators that need several samples per prompt (a group baseline).
GROUP_ESTIMATORS = ("grpo", "grpo_passk", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline")


@dataclass(frozen=True)
class AlgorithmSpec:
    """What an `algorithm.name` implies (one row of ALGORITHM_SPECS).

    estimators: the adv_estimator values it accepts; the first is its default (null).
    critic: trains a value model (and, for safe_rlhf, a second one for the costs).
    min_samples: rollout.n at least (group baselines compare the samples of a prompt).
    presets: dotted config keys and the values the name sets, unless the YAML file or an
        override sets that key itself (`load_run_config`).
    required: preset keys the algorithm is defined by; another value is a ConfigError.
    """

    estimators: tuple[str, ...]
    critic: bool = False
    min_samples: int = 1
    presets: tuple[tuple[str, object], ...] = ()
    required: tuple[str, ...] = ()


# Every step program of hybridflow/trainer/algorithms.py and what it implies (docs/algorithms.md).
ALGORITHM_SPECS: dict[str, AlgorithmSpec] = {
    "grpo": AlgorithmSpec(GROUP_ESTIMATORS, min_samples=2),
    "ppo": AlgorithmSpec(("gae",), critic=True),
    "remax": AlgorithmSpec(("remax",)),
    "rloo": AlgorithmSpec(("rloo",), min_samples=2),
    "reinforce_plus_plus": AlgorithmSpec(("reinforce_plus_plus",)),
    "reinforce_plus_plus_baseline": AlgorithmSpec(("reinforce_plus_plus_baseline",), min_samples=2),
    # Dr.GRPO (Liu et al. 2025): group-centred rewards without the std, length-unbiased loss.
    "drgrpo": AlgorithmSpec(
        ("grpo",), min_samples=2,
        presets=(("algorithm.norm_adv_by_std_in_grpo", False),
                 ("actor.loss.policy.loss_agg_mode", "seq-mean-token-sum-norm")),
        required=("algorithm.norm_adv_by_std_in_grpo", "actor.loss.policy.loss_agg_mode"),
    ),
    # DAPO (Yu et al. 2025): token-level loss and clip-higher (paper: eps_high 0.28).
    "dapo": AlgorithmSpec(
        GROUP_ESTIMATORS, min_samples=2,
        presets=(("actor.loss.policy.loss_agg_mode", "token-mean"), ("actor.loss.policy.clip_ratio_high", 0.28)),
        required=("actor.loss.policy.loss_agg_mode",),
    ),
    "safe_rlhf": AlgorithmSpec(("gae",), critic=True),
}
AlgorithmName = Literal["grpo", "ppo", "remax", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
                        "drgrpo", "dapo", "safe_rlhf"]
# The estimator each algorithm uses when algorithm.adv_estimator is null.
STANDARD_ESTIMATOR = {name: spec.estimators[0] for name, spec in ALGORITHM_SPECS.items()}


@dataclass
class KLControlSection:
    """Coefficient of the KL penalty in the reward: "fixed" or "adaptive" (Ziegler et al.)."""

    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000


@dataclass
class DynamicSamplingSection:
    """DAPO dynamic sampling: drop the groups whose rewards are all equal (no signal) and
    generate more prompts until data.train_batch_size groups are kept.

    max_extra_rounds: generation rounds after the first, at most, per step; when they are
        spent, the step trains on the groups kept so far (cut to whole actor mini-batches;
        metric dapo/cap_hit), or fails if that is none.
    """

    enable: bool = True
    max_extra_rounds: int = 8

    def __post_init__(self) -> None:
        if self.max_extra_rounds < 0:
            raise ValueError(f"max_extra_rounds must be >= 0, got {self.max_extra_rounds}")


@dataclass
class OverlongBufferSection:
    """DAPO overlong reward shaping: responses longer than rollout.response_length - len lose
    up to penalty_factor, linearly over the last `len` tokens. len null: a quarter of
    rollout.response_length (at least 1)."""

    enable: bool = True
    len: int | None = None
    penalty_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.len is not None and self.len < 1:
            raise ValueError(f"len must be >= 1 (tokens) or null, got {self.len}")
        if not self.penalty_factor >= 0:
            raise ValueError(f"penalty_factor must be >= 0, got {self.penalty_factor}")


@dataclass
class DAPOSection:
    """algorithm.name=dapo only: dynamic sampling and overlong shaping."""

    filter_groups: DynamicSamplingSection = field(default_factory=DynamicSamplingSection)
    overlong_buffer: OverlongBufferSection = field(default_factory=OverlongBufferSection)


@dataclass
class SafeRLHFSection:
    """algorithm.name=safe_rlhf only: the Lagrange multiplier lambda of E[cost] <= cost_limit.

    Each step: ln lambda += lambda_lr * lambda * (mean episode cost - cost_limit), capped at
    lambda_max (null: no cap); the policy follows (A_reward - lambda A_cost) / (1 + lambda).
    """

    lambda_init: float = 1.0
    lambda_lr: float = 0.1
    cost_limit: float = 0.0
    lambda_max: float | None = None

    def __post_init__(self) -> None:
        LagrangeMultiplier(self.lambda_init, self.lambda_lr, self.cost_limit, self.lambda_max)  # raises if invalid


@dataclass
class AlgorithmSection:
    """Which step program runs and its advantage / KL settings (docs/algorithms.md).

    name: one of ALGORITHM_SPECS (grpo, ppo, remax, rloo, reinforce_plus_plus,
        reinforce_plus_plus_baseline, drgrpo, dapo, safe_rlhf); the name also sets the
        defaults in its presets (e.g. drgrpo: no std normalisation, seq-mean-token-sum-norm).
    adv_estimator: null = the algorithm's own; grpo and dapo also accept the other group
        estimators (rloo, opo, ...).
    use_kl_in_reward / kl_penalty / kl_ctrl: r_t = score_t - beta * KL_t (needs the
        reference policy). KL as a loss instead is actor.loss.use_kl_loss.
    dapo / safe_rlhf: settings read only by those two algorithms.
    """

    name: AlgorithmName = "grpo"
    adv_estimator: str | None = None
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    whiten_gae_advantages: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "k1"
    kl_ctrl: KLControlSection = field(default_factory=KLControlSection)
    dapo: DAPOSection = field(default_factory=DAPOSection)
    safe_rlhf: SafeRLHFSection = field(default_factory=SafeRLHFSection)

    def __post_init__(self) -> None:
        estimator = self.estimator
        get_adv_estimator(estimator)  # unknown names raise, listing the known ones
        spec = ALGORITHM_SPECS[self.name]
        if estimator not in spec.estimators:
            if spec.critic:
                hint = f"algorithm.name={self.name} trains a critic and uses adv_estimator=gae"
            elif spec.estimators == GROUP_ESTIMATORS:
                hint = (f"algorithm.name={self.name} is critic-free and needs a group estimator "
                        f"{list(GROUP_ESTIMATORS)}")
            else:
                hint = f"algorithm.name={self.name} uses adv_estimator={spec.estimators[0]} (leave it null)"
            owners = [n for n, s in ALGORITHM_SPECS.items() if s.estimators[0] == estimator]  # table order
            raise ValueError(f"{hint}, got {estimator!r}" + (f"; for {estimator} use algorithm.name={owners[0]}"
                                                             if owners else ""))
        if self.use_kl_in_reward:
            get_kl_estimator(self.kl_penalty)

    @property
    def estimator(self) -> str:
        return self.adv_estimator if self.adv_estimator is not None else STANDARD_ESTIMATOR[self.name]

    def advantage_config(self) -> AdvantageConfig:
        return AdvantageConfig(
            gamma=self.gamma, lam=self.lam, norm_adv_by_std_in_grpo=self.norm_adv_by_std_in_grpo,
            whiten_gae_advantages=self.whiten_gae_advantages,
        )


def overlong_buffer_len(cfg: RunConfig) -> int:
    """algorithm.dapo.overlong_buffer.len, or a quarter of rollout.response_length when null."""
    buffer = cfg.algorithm.dapo.overlong_buffer.len
    return buffer if buffer is not None else max(1, cfg.rollout.response_length // 4)
