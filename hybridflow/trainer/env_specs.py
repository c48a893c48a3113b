"""From an environment config to what the workers are built with.

    network = network_spec(cfg)                 # probes one environment for its spaces
    collector_spec(cfg, network)                # each env runner's Collector
    learner_spec(cfg, network)                  # each learner rank's PPO/SAC learner

Per-rank sizes are the config's totals divided by distributed.num_learners (the schema
checked that they divide): each learner rank trains on its slice of every minibatch and
keeps its share of the replay buffer.
"""

from __future__ import annotations

from hybridflow.algorithms.ppo_env import PPOLossConfig
from hybridflow.config.env_schema import EnvRunConfig
from hybridflow.engines.policy.actor_critic import NetworkSpec
from hybridflow.engines.policy.ppo_learner import PPOUpdateConfig
from hybridflow.engines.policy.sac_learner import SACUpdateConfig
from hybridflow.envs.collector import CollectorSpec
from hybridflow.envs.registry import EnvSource, resolve_env
from hybridflow.envs.spaces import action_spec, obs_dim
from hybridflow.errors import ConfigError
from hybridflow.workers.learner import LearnerSpec


def env_source(cfg: EnvRunConfig) -> EnvSource:
    return resolve_env(cfg.env.id, cfg.env.kwargs, cfg.env.max_episode_steps)


def network_spec(cfg: EnvRunConfig) -> NetworkSpec:
    """The policy network's shape: the environment's spaces and the `policy` section."""
    source = env_source(cfg)
    env = source.make()
    try:
        try:
            action, observations = action_spec(env.action_space), obs_dim(env.observation_space)
        except ValueError as err:
            raise ConfigError(f"environment {cfg.env.id!r}: {err}", "env.id") from err
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()
    if cfg.algorithm == "sac" and not action.is_continuous:
        raise ConfigError(f"SAC needs continuous (Box) actions; {cfg.env.id!r} has {action.kind} actions. "
                          "Use algorithm: ppo", "algorithm")
    policy = cfg.policy
    return NetworkSpec(
        obs_dim=observations, action=action, hidden_size=tuple(policy.hidden_size), activation=policy.activation,
        shared=policy.shared_network,
        value_hidden_size=None if policy.value_hidden_size is None else tuple(policy.value_hidden_size),
        ortho_init=bool(policy.ortho_init), log_std_init=policy.log_std_init,
        normalize_obs=cfg.env.normalize_obs, clip_obs=cfg.env.clip_obs)


def collector_spec(cfg: EnvRunConfig, network: NetworkSpec) -> CollectorSpec:
    gamma = cfg.ppo.gamma if cfg.algorithm == "ppo" else cfg.sac.gamma
    return CollectorSpec(source=env_source(cfg), num_envs=cfg.env.num_envs, seed=cfg.seed, network=network,
                         algorithm=cfg.algorithm, normalize_reward=cfg.env.normalize_reward, reward_gamma=gamma,
                         clip_reward=cfg.env.clip_reward)


def learner_spec(cfg: EnvRunConfig, network: NetworkSpec) -> LearnerSpec:
    ranks = cfg.distributed.num_learners
    p, s = cfg.ppo, cfg.sac
    ppo = PPOUpdateConfig(lr=p.lr, epochs=p.epochs, minibatch_size=p.minibatch_size // ranks,
                          max_grad_norm=p.max_grad_norm, target_kl=p.target_kl,
                          loss=PPOLossConfig(clip_ratio=p.clip_ratio, clip_value=p.clip_value, vf_coef=p.vf_coef,
                                             ent_coef=p.ent_coef, normalize_advantages=p.normalize_advantages))
    sac = SACUpdateConfig(lr=s.lr, batch_size=s.batch_size // ranks, gamma=s.gamma, tau=s.tau, autotune=s.autotune,
                          alpha=s.init_alpha, target_entropy=s.target_entropy)
    return LearnerSpec(algorithm=cfg.algorithm, network=network, seed=cfg.seed, ppo=ppo, sac=sac,
                       init_alpha=s.init_alpha, buffer_capacity=max(1, s.buffer_size // ranks))
