"""What each environment-task `algorithm` is: one `EnvAlgorithmSpec` row per algorithm, in
the project's one `Registry` (hybridflow/registry.py), as the language-model algorithms'
rows are in config/algorithm.py.

    spec = env_algorithm_spec("sac")
    spec.collection        # "replay": transitions every sac.train_freq steps into a replay buffer
    spec.continuous_actions  # True: refused on an environment with discrete actions
    steps_per_iteration(cfg)  # environment steps of one iteration (workers x env.num_envs x ...)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from hybridflow.errors import ConfigError

# What a collection of each kind asks of every environment copy per iteration: the field
# of the algorithm's section that holds that many steps.
STEPS_FIELD = {"rollout": "rollout_steps", "replay": "train_freq"}


@dataclass(frozen=True)
class PolicyDefaults:
    """The network an algorithm's `policy` section defaults to (Stable-Baselines3's)."""

    hidden_size: tuple[int, ...]
    activation: str
    ortho_init: bool


@dataclass(frozen=True)
class EnvAlgorithm:
    """What an algorithm implies on environment tasks.

    program: the EnvProgram (hybridflow/trainer/programs/algorithms.py: the step program,
        the acting network, the learner), or its "module:attr" import path (built-in rows:
        the config layer reads rows without importing the trainer).
    section: the config section of its hyper-parameters (e.g. "ppo"); it holds gamma and
        the steps field of its collection.
    collection: "rollout" (on-policy: segments of <section>.rollout_steps steps per copy, used
        once) or "replay" (off-policy: <section>.train_freq steps per copy, stored in a replay
        buffer on the learner).
    policy: the `policy` section's defaults.
    continuous_actions: it needs continuous (Box) actions.
    check: its own check of the config (batch sizes against learner ranks...); raises ConfigError.
    """

    section: str
    collection: Literal["rollout", "replay"]
    policy: PolicyDefaults
    program: Any = None
    continuous_actions: bool = False
    check: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        if self.collection not in STEPS_FIELD:
            raise ValueError(f"EnvAlgorithm: collection must be one of {list(STEPS_FIELD)}, got {self.collection!r}")
        if isinstance(self.program, str) and not re.fullmatch(r"[\w.]+:\w+", self.program):
            raise ValueError(f"EnvAlgorithm: program {self.program!r} must be an EnvProgram or a 'module:attr' path")

    @property
    def steps_field(self) -> str:
        """The field of `section` that holds the steps per environment copy per iteration."""
        return STEPS_FIELD[self.collection]


def hyper_parameters(cfg: Any) -> Any:
    """The config section of the run's algorithm (cfg.ppo for PPO)."""
    return getattr(cfg, cfg.algorithm.spec.environment.section)


def steps_per_iteration(cfg: Any) -> int:
    """Environment steps per iteration: workers (at least the in-process one) x copies x the
    steps per copy of the algorithm's collection."""
    per_env = getattr(hyper_parameters(cfg), cfg.algorithm.spec.environment.steps_field)
    return max(cfg.distributed.num_workers, 1) * cfg.env.num_envs * per_env


def check_rollout_sizes(cfg: Any) -> None:
    """On-policy: the minibatch divides the batch and splits over the learner ranks."""
    learners, batch = cfg.distributed.num_learners, steps_per_iteration(cfg)
    section = cfg.algorithm.spec.environment.section
    mb = hyper_parameters(cfg).minibatch_size
    if batch % mb:
        raise ConfigError(
            f"{mb} does not divide the batch of {batch} steps per iteration (workers x env.num_envs x "
            f"{section}.rollout_steps); pick a divisor of {batch}, or change rollout_steps", f"{section}.minibatch_size")
    if mb % learners:
        raise ConfigError(f"{mb} does not split over distributed.num_learners={learners} learner ranks; use a "
                          "multiple of num_learners", f"{section}.minibatch_size")


def check_replay_sizes(cfg: Any) -> None:
    """Off-policy: each iteration's transitions and each sampled batch split over the learner ranks."""
    learners, batch = cfg.distributed.num_learners, steps_per_iteration(cfg)
    section = cfg.algorithm.spec.environment.section
    if batch % learners:
        raise ConfigError(f"the {batch} transitions per iteration (workers x env.num_envs x {section}.train_freq) do "
                          f"not split over {learners} learner ranks; make them a multiple", "distributed.num_learners")
    if hyper_parameters(cfg).batch_size % learners:
        raise ConfigError(f"{hyper_parameters(cfg).batch_size} does not split over {learners} learner ranks",
                          f"{section}.batch_size")
