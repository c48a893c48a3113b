"""Settings sections under `algorithm`: KL in the reward, and the sections that only one
family of algorithms reads (`algorithm.dapo`, `algorithm.safe_rlhf`).

Which algorithm reads which section is declared on its spec row (`AlgorithmSpec.settings`
in algorithm.py); setting a section the configured algorithm does not read is a ConfigError.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from hybridflow.algorithms.controllers import LagrangeMultiplier
from hybridflow.config.loader import at_least

if TYPE_CHECKING:
    from hybridflow.config.schema import RunConfig


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
    metric: what must differ within a group: "score" (the reward function's score) or
        "shaped_score" (the score with the overlong penalty, overlong_buffer.enable; sync
        mode only).
    """

    enable: bool = True
    max_extra_rounds: int = 8
    metric: Literal["score", "shaped_score"] = "score"

    def __post_init__(self) -> None:
        at_least(self, 0, "max_extra_rounds")


@dataclass
class ExplorationSection:
    """More samples where the signal may be: the prompts whose group of rollout.n responses
    all scored alike (every advantage 0) are sampled again, a group at a time, until one of
    their groups scores differently or the budget is spent; each prompt then trains on its
    first group that differs (else on its first group), so a step's batch keeps its shape.

    max_extra_groups: groups generated in a step beyond its first round, at most (0: off;
        each costs what generating and scoring one prompt's rollout.n responses costs).
    max_tries_per_prompt: groups generated for one prompt beyond its first, at most.
    Read by the algorithms whose row declares the exploration capability (grpo, rloo,
    drgrpo, reinforce_plus_plus_baseline), in trainer.mode sync; metrics explore/*.
    """

    max_extra_groups: int = 0
    max_tries_per_prompt: int = 4

    def __post_init__(self) -> None:
        at_least(self, 0, "max_extra_groups")
        at_least(self, 1, "max_tries_per_prompt")

    @property
    def enabled(self) -> bool:
        return self.max_extra_groups > 0


@dataclass
class OverlongBufferSection:
    """DAPO overlong reward shaping: responses longer than rollout.response_length - len lose
    up to penalty_factor, linearly over the last `len` tokens. len null: a quarter of
    rollout.response_length (at least 1)."""

    enable: bool = True
    len: int | None = None
    penalty_factor: float = 1.0

    def __post_init__(self) -> None:
        at_least(self, 1, "len", null="tokens")
        at_least(self, 0, "penalty_factor")


@dataclass
class DAPOSection:
    """Read by algorithm.name=dapo: dynamic sampling and overlong shaping."""

    filter_groups: DynamicSamplingSection = field(default_factory=DynamicSamplingSection)
    overlong_buffer: OverlongBufferSection = field(default_factory=OverlongBufferSection)

    def resolved(self, cfg: RunConfig) -> DAPOSection:
        """This section with overlong_buffer.len filled in (`overlong_buffer_len`)."""
        return replace(self, overlong_buffer=replace(self.overlong_buffer, len=overlong_buffer_len(cfg)))


@dataclass
class SafeRLHFSection:
    """Read by algorithm.name=safe_rlhf: the Lagrange multiplier lambda of E[cost] <= cost_limit.

    Each step: ln lambda += lambda_lr * lambda * (mean episode cost - cost_limit), capped at
    lambda_max (null: no cap); the policy follows (A_reward - lambda A_cost) / (1 + lambda).
    """

    lambda_init: float = 1.0
    lambda_lr: float = 0.1
    cost_limit: float = 0.0
    lambda_max: float | None = None

    def __post_init__(self) -> None:
        self.multiplier()  # raises if the settings are invalid

    def multiplier(self) -> LagrangeMultiplier:
        """A fresh multiplier with these settings."""
        return LagrangeMultiplier(self.lambda_init, self.lambda_lr, self.cost_limit, self.lambda_max)


def overlong_buffer_len(cfg: RunConfig) -> int:
    """algorithm.dapo.overlong_buffer.len, or a quarter of rollout.response_length when null."""
    buffer = cfg.algorithm.dapo.overlong_buffer.len
    return buffer if buffer is not None else max(1, cfg.rollout.response_length // 4)
