"""The config tree of an environment task (PPO or SAC on Gymnasium-style environments).

    cfg = load_env_config("examples/ppo_cartpole.yaml", ["ppo.lr=1e-3"])
    cfg = env_config_from_dict({"algorithm": "PPO", "env": "CartPole-v1",
                                "policy": {"hidden_size": [64, 64], "activation": "tanh"},
                                "distributed": {"num_workers": 2, "placement_strategy": "spread"}})
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hybridflow.config.env_algorithms import ENV_ALGORITHMS, env_algorithm_spec
from hybridflow.config.loader import _build, at_least, in_unit, nest_dotted, positive, user_tree
from hybridflow.config.sections.trainer import LoopSection, check_run_name
from hybridflow.errors import ConfigError


@dataclass
class EnvSection:
    """id: a Gymnasium id, a name registered with @hybridflow.envs.register_env, or
    'package.module:Class'. num_envs: copies per env-runner worker (one vector each).
    kwargs: passed to the environment's constructor. max_episode_steps: a time limit (null:
    the environment's own). normalize_obs: running mean/std normalisation inside the policy
    (clipped to +-clip_obs). normalize_reward: rewards divided by the running std of the
    discounted return (clipped to +-clip_reward)."""

    id: str = "CartPole-v1"
    num_envs: int = 1
    kwargs: dict = field(default_factory=dict)
    max_episode_steps: int | None = None
    normalize_obs: bool = False
    clip_obs: float = 10.0
    normalize_reward: bool = False
    clip_reward: float = 10.0

    def __post_init__(self) -> None:
        positive(self, "num_envs", "clip_obs", "clip_reward")
        at_least(self, 1, "max_episode_steps", null="")


@dataclass
class PolicySection:
    """hidden_size: widths of the MLP's hidden layers (null: the algorithm's default).
    activation: tanh, relu, gelu, elu, silu, leaky_relu (null: the algorithm's default).
    shared_network: PPO's value head on the policy's trunk (false: its own MLP of
    value_hidden_size, null = hidden_size). ortho_init: orthogonal init (null: PPO yes, SAC
    no). log_std_init: PPO's initial log std of continuous actions."""

    hidden_size: list[int] | None = None
    activation: Literal["tanh", "relu", "gelu", "elu", "silu", "leaky_relu"] | None = None
    shared_network: bool = False
    value_hidden_size: list[int] | None = None
    ortho_init: bool | None = None
    log_std_init: float = 0.0

    def __post_init__(self) -> None:
        for key in ("hidden_size", "value_hidden_size"):
            sizes = getattr(self, key)
            if sizes is not None and any(s < 1 for s in sizes):
                raise ConfigError(f"layer widths must be >= 1, got {sizes}", key)
            setattr(self, key, None if sizes is None else list(sizes))  # a tuple (an algorithm's default) too


@dataclass
class DistributedSection:
    """num_workers: env-runner processes (Ray actors), each with env.num_envs copies; 0 runs
    the environments and the learner in the controller's process, without Ray.
    placement_strategy: where the workers go: pack (as few nodes as possible), spread
    (over all nodes, a preference: one node is fine), strict_spread (one worker per node;
    an error when the cluster has fewer nodes). num_learners: data-parallel learner ranks
    (torch.distributed, gloo). cpus_per_worker: Ray CPUs per env runner (null: the cluster's
    CPUs shared out, at most 1). learner_cpus: Ray CPUs (= torch threads) per learner rank.
    sampling: sync (collect, then update) or async (the runners collect the next batch
    with the previous weights while the learner updates; the policy lag stays <=
    max_policy_lag updates). ray_address: join this cluster (null: an embedded local Ray)."""

    num_workers: int = 1
    placement_strategy: Literal["pack", "spread", "strict_spread"] = "pack"
    num_learners: int = 1
    cpus_per_worker: float | None = None
    learner_cpus: float = 1.0
    sampling: Literal["sync", "async"] = "sync"
    max_policy_lag: int = 1
    ray_address: str | None = None

    def __post_init__(self) -> None:
        at_least(self, 0, "num_workers", note="0 = in-process")
        positive(self, "num_learners", "learner_cpus", "max_policy_lag")
        positive(self, "cpus_per_worker", null="")
        if self.num_workers == 0 and self.sampling == "async":
            raise ConfigError("async sampling overlaps env-runner processes with the learner; with num_workers: 0 "
                              "there are none. Set distributed.num_workers >= 1 or sampling: sync", "sampling")
        if self.num_workers == 0 and self.num_learners > 1:
            raise ConfigError("several learner ranks run as Ray processes; with num_workers: 0 everything runs "
                              "in-process. Set distributed.num_workers >= 1 or num_learners: 1", "num_learners")


@dataclass
class PPOSection:
    """rollout_steps: steps per env copy per iteration (batch = workers x num_envs x
    rollout_steps). minibatch_size: samples per optimizer step (over all learner ranks).
    epochs: passes over each batch. lr_schedule: constant or linear decay to 0 over
    trainer.total_env_steps. clip_value: value clip range (null: off). vf_coef weights a
    value loss that carries a 1/2 (vf_coef 1.0 here = Stable-Baselines3's 0.5).
    target_kl: stop an update's epochs once the approximate KL exceeds it (null: never).
    max_grad_norm: clip the gradient's norm to it (null: off). clip_ratio is in (0, 1)."""

    rollout_steps: int = 128
    minibatch_size: int = 64
    epochs: int = 10
    lr: float = 3e-4
    lr_schedule: Literal["constant", "linear"] = "constant"
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_ratio: float = 0.2
    clip_value: float | None = None
    ent_coef: float = 0.0
    vf_coef: float = 1.0
    max_grad_norm: float | None = 0.5
    normalize_advantages: bool = True
    target_kl: float | None = None

    def __post_init__(self) -> None:
        positive(self, "rollout_steps", "minibatch_size", "epochs", "lr")
        positive(self, "clip_value", "max_grad_norm", "target_kl", null="off")  # <= 0 would fail or invert the update
        at_least(self, 0, "vf_coef")
        in_unit(self, "gamma", "gae_lambda")
        if not 0.0 < self.clip_ratio < 1.0:  # as the LM loss's clip_ratio_low: 1 - clip_ratio stays positive
            raise ConfigError(f"must be in (0, 1) (the ratio is clipped to [1 - clip_ratio, 1 + clip_ratio]), "
                              f"got {self.clip_ratio}", "clip_ratio")


@dataclass
class SACSection:
    """buffer_size: replay capacity (transitions, over all learner ranks). batch_size:
    samples per gradient step (over all learner ranks). learning_starts: environment steps
    of uniform random actions before the first update. train_freq: steps per env copy
    between updates; gradient_steps: updates per train_freq steps of each env copy, so the
    update-to-data ratio gradient_steps / train_freq holds whatever distributed.num_workers
    and env.num_envs are (8 runners: 8 x the transitions and 8 x the updates per iteration;
    -1: one update per environment step). autotune: learn the temperature towards
    target_entropy (null: -action_dim), starting at init_alpha; otherwise alpha stays
    init_alpha."""

    buffer_size: int = 1_000_000
    batch_size: int = 256
    learning_starts: int = 100
    lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    train_freq: int = 1
    gradient_steps: int = 1
    autotune: bool = True
    init_alpha: float = 1.0
    target_entropy: float | None = None

    def __post_init__(self) -> None:
        positive(self, "buffer_size", "batch_size", "lr", "train_freq", "init_alpha")
        in_unit(self, "gamma")
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"must be in (0, 1], got {self.tau}", "tau")
        at_least(self, 0, "learning_starts")
        if self.gradient_steps == 0 or self.gradient_steps < -1:
            raise ConfigError(f"must be >= 1, or -1 for one per environment step, got {self.gradient_steps}",
                              "gradient_steps")


@dataclass
class EnvTrainerSection(LoopSection):
    """LoopSection's keys (run directory, console, checkpoints, loggers) and
    total_env_steps: environment steps of the whole run (train() without steps runs to
    it; with linear lr decay it is the horizon). log_freq: a metrics record at the end of
    every iteration that crosses a multiple of this many environment steps (save_freq:
    the same for checkpoints). return_window: episodes in the rolling mean return
    (episode/return_mean_window). target_return: stop once that mean reaches it (null:
    never). save_on_signal: the current iteration is finished and checkpointed."""

    total_env_steps: int = 100_000
    log_freq: int = 1000
    return_window: int = 20
    target_return: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        positive(self, "total_env_steps", "log_freq", "return_window")


@dataclass
class EnvRunConfig:
    name: str | None = None
    seed: int = 0
    algorithm: str = "ppo"
    env: EnvSection = field(default_factory=EnvSection)
    policy: PolicySection = field(default_factory=PolicySection)
    distributed: DistributedSection = field(default_factory=DistributedSection)
    ppo: PPOSection = field(default_factory=PPOSection)
    sac: SACSection = field(default_factory=SACSection)
    trainer: EnvTrainerSection = field(default_factory=EnvTrainerSection)

    def __post_init__(self) -> None:
        if self.name is not None:
            check_run_name(self.name)  # as a language-model run's: it becomes the run directory's name
        self.algorithm = ENV_ALGORITHMS.folded(self.algorithm)  # "PPO" names the registered "ppo"
        ENV_ALGORITHMS.check(self.algorithm)  # ConfigError keyed `algorithm`, naming the registered ones


# ----------------------------------------------------------------------------- user input


def normalize_tree(tree: dict[str, Any]) -> dict[str, Any]:
    """A user's dict as the nested tree the loader reads: dotted keys nested, `env: <name>`
    (or an environment class) as `env: {id: ...}`."""
    if not isinstance(tree, dict):
        raise ConfigError(f"an environment config is a mapping, got {type(tree).__name__}")
    # The flat form `env: <name>` (or a class) is the section `env: {id: <name>}`.
    nested = nest_dotted({key: ({"id": value} if key == "env" and (isinstance(value, str) or callable(value))
                                else value) for key, value in tree.items()})
    env = nested.get("env")
    if isinstance(env, dict) and callable(env.get("id")):
        from hybridflow.envs.registry import register_env

        env["id"] = register_env(env["id"]).__name__  # a class given directly: registered under its name
    return nested


# Settings of language-model runs that environment tasks do not have, and what to use.
LM_ONLY_KEYS = {
    "resources": "environment tasks place their workers with distributed.num_workers, "
                 "distributed.placement_strategy (pack, spread, strict_spread: spread over nodes) and "
                 "distributed.ray_address (the cluster)",
}


def env_config_from_dict(tree: dict[str, Any]) -> EnvRunConfig:
    """Build and resolve an `EnvRunConfig` from a user's dict (module docstring); a setting of
    language-model runs (LM_ONLY_KEYS) is a ConfigError saying what to use instead."""
    nested = normalize_tree(tree)
    for key, why in LM_ONLY_KEYS.items():
        section, _, name = key.rpartition(".")
        holder = nested.get(section) if section else nested
        if isinstance(holder, dict) and name in holder:
            raise ConfigError(f"is a setting of language-model runs; {why}", key)
    return resolve_env_config(_build(EnvRunConfig, nested))


def load_env_config(path: str | Path | None = None, overrides: list[str] = ()) -> EnvRunConfig:
    """Build and resolve an `EnvRunConfig` from a YAML file and dotted overrides."""
    return env_config_from_dict(user_tree(path, list(overrides)))


# ----------------------------------------------------------------------------- resolution

def resolve_env_config(cfg: EnvRunConfig) -> EnvRunConfig:
    """`cfg` with its row's `policy` defaults and the run name filled in, checked by the row's `check`."""
    spec = env_algorithm_spec(cfg.algorithm)
    unset = {key: value for key, value in dataclasses.asdict(spec.policy).items() if getattr(cfg.policy, key) is None}
    name = cfg.name or re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{cfg.env.id}-{cfg.algorithm}").strip("-")
    cfg = dataclasses.replace(cfg, name=name, policy=dataclasses.replace(cfg.policy, **unset))
    if spec.check is not None:
        spec.check(cfg)
    return cfg

