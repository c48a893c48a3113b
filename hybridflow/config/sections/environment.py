"""The sections of environment tasks (a config that names an `env`): which environment, the
policy network, where the env runners and the learner run, and the hyper-parameters of PPO and
SAC (each algorithm's row names the section it reads: config/env_algorithms.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybridflow.config.loader import at_least, in_unit, positive
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
