"""What each environment-task `algorithm` is: one `EnvAlgorithmSpec` row per algorithm, in
the project's one `Registry` (hybridflow/registry.py), as the language-model algorithms'
rows are in config/algorithm.py.

    spec = env_algorithm_spec("sac")
    spec.collection        # "replay": transitions every sac.train_freq steps into a replay buffer
    spec.continuous_actions  # True: refused on an environment with discrete actions
    steps_per_iteration(cfg)  # environment steps of one iteration (workers x env.num_envs x ...)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from hybridflow.errors import ConfigError
from hybridflow.registry import Registry

if TYPE_CHECKING:
    from hybridflow.config.env_schema import EnvRunConfig

ProgramT = TypeVar("ProgramT")
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
class EnvAlgorithmSpec:
    """Everything an environment task's `algorithm` name implies.

    name: the value of `algorithm` (lowercase letters, digits, _).
    program: the EnvProgram, or its "module:attr" import path.
    section: the EnvRunConfig section of its hyper-parameters (e.g. "ppo"); it holds gamma
        and the steps field of its collection.
    collection: "rollout" (on-policy: segments of <section>.rollout_steps steps per copy, used
        once) or "replay" (off-policy: <section>.train_freq steps per copy, stored in a replay
        buffer on the learner).
    continuous_actions: it needs continuous (Box) actions.
    policy: the `policy` section's defaults.
    check: its own check of the config (batch sizes against learner ranks...); raises ConfigError.
    """

    name: str
    program: Any
    section: str
    collection: Literal["rollout", "replay"]
    policy: PolicyDefaults
    continuous_actions: bool = False
    check: Callable[[EnvRunConfig], None] | None = None

    def __post_init__(self) -> None:
        where = f"EnvAlgorithmSpec(name={self.name!r})"
        if not isinstance(self.name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ValueError(f"{where}: the name must be lowercase letters, digits and _, starting with a letter")
        if self.collection not in STEPS_FIELD:
            raise ValueError(f"{where}: collection must be one of {list(STEPS_FIELD)}, got {self.collection!r}")
        if isinstance(self.program, str) and not re.fullmatch(r"[\w.]+:\w+", self.program):
            raise ValueError(f"{where}: program {self.program!r} must be an EnvProgram or a 'module:attr' path")

    @property
    def steps_field(self) -> str:
        """The field of `section` that holds the steps per environment copy per iteration."""
        return STEPS_FIELD[self.collection]


def _program_id(spec: EnvAlgorithmSpec) -> str:
    program = spec.program
    return f"program {program if isinstance(program, str) else f'{program.__module__}:{type(program).__name__}'}"


ENV_ALGORITHMS: Registry[EnvAlgorithmSpec] = Registry("environment algorithm", "algorithm", rows=True,
                                                      identity=_program_id)


def add_env_algorithm(spec: EnvAlgorithmSpec, *, override: bool = False) -> EnvAlgorithmSpec:
    """Register `spec` (its program set); another program under a taken name needs override=True."""
    if spec.program is None:
        raise ValueError(f"environment algorithm {spec.name!r} has no program; decorate it with "
                         "@register_env_algorithm(spec)")
    return ENV_ALGORITHMS.add(spec.name, spec, override=override)


def register_env_algorithm(spec: EnvAlgorithmSpec, *, override: bool = False) -> Callable[[ProgramT], ProgramT]:
    """Decorator: register `spec` with the decorated EnvProgram as its program."""

    def decorate(program: ProgramT) -> ProgramT:
        add_env_algorithm(dataclasses.replace(spec, program=program), override=override)
        return program

    return decorate


def env_algorithm_spec(name: str) -> EnvAlgorithmSpec:
    """The row of `name`; a ConfigError keyed `algorithm` naming the registered ones if none."""
    return ENV_ALGORITHMS.get(name)


def hyper_parameters(cfg: EnvRunConfig) -> Any:
    """The config section of the run's algorithm (cfg.ppo for PPO)."""
    return getattr(cfg, env_algorithm_spec(cfg.algorithm).section)


def steps_per_iteration(cfg: EnvRunConfig) -> int:
    """Environment steps per iteration: workers (at least the in-process one) x copies x the
    steps per copy of the algorithm's collection."""
    per_env = getattr(hyper_parameters(cfg), env_algorithm_spec(cfg.algorithm).steps_field)
    return max(cfg.distributed.num_workers, 1) * cfg.env.num_envs * per_env


# ----------------------------------------------------------------------------- built-in rows


def check_rollout_sizes(cfg: EnvRunConfig) -> None:
    """On-policy: the minibatch divides the batch and splits over the learner ranks."""
    learners, batch = cfg.distributed.num_learners, steps_per_iteration(cfg)
    section = env_algorithm_spec(cfg.algorithm).section
    mb = hyper_parameters(cfg).minibatch_size
    if batch % mb:
        raise ConfigError(
            f"{mb} does not divide the batch of {batch} steps per iteration (workers x env.num_envs x "
            f"{section}.rollout_steps); pick a divisor of {batch}, or change rollout_steps", f"{section}.minibatch_size")
    if mb % learners:
        raise ConfigError(f"{mb} does not split over distributed.num_learners={learners} learner ranks; use a "
                          "multiple of num_learners", f"{section}.minibatch_size")


def check_replay_sizes(cfg: EnvRunConfig) -> None:
    """Off-policy: each iteration's transitions and each sampled batch split over the learner ranks."""
    learners, batch = cfg.distributed.num_learners, steps_per_iteration(cfg)
    section = env_algorithm_spec(cfg.algorithm).section
    if batch % learners:
        raise ConfigError(f"the {batch} transitions per iteration (workers x env.num_envs x {section}.train_freq) do "
                          f"not split over {learners} learner ranks; make them a multiple", "distributed.num_learners")
    if hyper_parameters(cfg).batch_size % learners:
        raise ConfigError(f"{hyper_parameters(cfg).batch_size} does not split over {learners} learner ranks",
                          f"{section}.batch_size")


add_env_algorithm(EnvAlgorithmSpec(
    name="ppo", program="hybridflow.trainer.programs.algorithms:PPO", section="ppo", collection="rollout",
    policy=PolicyDefaults((64, 64), "tanh", True), check=check_rollout_sizes))
add_env_algorithm(EnvAlgorithmSpec(
    name="sac", program="hybridflow.trainer.programs.algorithms:SAC", section="sac", collection="replay",
    continuous_actions=True, policy=PolicyDefaults((256, 256), "relu", False), check=check_replay_sizes))
