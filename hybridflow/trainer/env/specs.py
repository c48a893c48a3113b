"""From an environment config to what the workers are built with.

    program = env_program(cfg)                  # the algorithm's EnvProgram (its registry row)
    network = network_spec(cfg)                 # probes one environment for its spaces
    collector_spec(cfg, network, program)       # each env runner's Collector
    learner_spec(cfg, network, program)         # each learner rank's learner
"""

from __future__ import annotations

from hybridflow.config.algorithm import ALGORITHMS, env_algorithm
from hybridflow.config.env_algorithms import hyper_parameters
from hybridflow.config.schema import RunConfig
from hybridflow.engines.policy.actor_critic import NetworkSpec
from hybridflow.envs.collector import CollectorSpec
from hybridflow.envs.registry import EnvSource, resolve_env
from hybridflow.envs.spaces import action_spec, obs_dim
from hybridflow.errors import ConfigError
from hybridflow.registry import import_object
from hybridflow.trainer.programs.algorithms import EnvProgram
from hybridflow.workers.learner import LearnerSpec


def env_program(cfg: RunConfig) -> EnvProgram:
    """The EnvProgram on the row of cfg.algorithm (imported when the row names its path)."""
    program = env_algorithm(cfg).program
    if isinstance(program, str):
        program = import_object(program, "algorithm", "environment algorithm program")
    if not isinstance(program, EnvProgram):
        raise ConfigError(f"the program of environment algorithm {cfg.algorithm.name!r} is {program!r}, not an "
                          "EnvProgram (hybridflow/trainer/programs/algorithms.py)", "algorithm")
    return program


def env_source(cfg: RunConfig) -> EnvSource:
    return resolve_env(cfg.env.id, cfg.env.kwargs, cfg.env.max_episode_steps)


def network_spec(cfg: RunConfig) -> NetworkSpec:
    """The policy network's shape: the environment's spaces and the `policy` section."""
    source = env_source(cfg)
    env = source.make()
    try:
        action, observations = action_spec(env.action_space), obs_dim(env.observation_space)
    except ValueError as err:
        raise ConfigError(f"environment {cfg.env.id!r}: {err}", "env.id") from err
    finally:
        if callable(getattr(env, "close", None)):
            env.close()
    if env_algorithm(cfg).continuous_actions and not action.is_continuous:
        others = [name for name, spec in ALGORITHMS.entries.items()
                  if spec.environment is not None and not spec.environment.continuous_actions]
        raise ConfigError(f"{cfg.algorithm.name.upper()} needs continuous (Box) actions; {cfg.env.id!r} has {action.kind} "
                          f"actions. Use algorithm: {' or '.join(others) or 'one for discrete actions'}", "algorithm")
    policy = cfg.policy
    return NetworkSpec(
        obs_dim=observations, action=action, hidden_size=tuple(policy.hidden_size), activation=policy.activation,
        shared=policy.shared_network,
        value_hidden_size=None if policy.value_hidden_size is None else tuple(policy.value_hidden_size),
        ortho_init=bool(policy.ortho_init), log_std_init=policy.log_std_init,
        normalize_obs=cfg.env.normalize_obs, clip_obs=cfg.env.clip_obs)


def collector_spec(cfg: RunConfig, network: NetworkSpec, program: EnvProgram) -> CollectorSpec:
    return CollectorSpec(source=env_source(cfg), num_envs=cfg.env.num_envs, seed=cfg.seed, network=network,
                         acting_model=program.acting_model, normalize_reward=cfg.env.normalize_reward,
                         reward_gamma=hyper_parameters(cfg).gamma, clip_reward=cfg.env.clip_reward)


def learner_spec(cfg: RunConfig, network: NetworkSpec, program: EnvProgram) -> LearnerSpec:
    ranks = cfg.distributed.num_learners
    return LearnerSpec(build=program.build_learner, network=network, seed=cfg.seed,
                       update=program.update_config(hyper_parameters(cfg), ranks))
