"""Environment lookup (registry, import path, Gymnasium id, errors), the vectorised
environment (seeding, same-step reset, final observations, episode statistics), reward
scaling and the collector's segments."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from hybridflow.config import ConfigError
from hybridflow.engines.policy.actor_critic import ActorCritic, NetworkSpec
from hybridflow.envs import register_env, resolve_env
from hybridflow.envs.collector import Collector, CollectorSpec
from hybridflow.envs.vector import RewardScaler, VecEnv


class Corridor(gym.Env):
    """Walk right from 0 to `length`: reward 1 per step right, the episode ends at the goal."""

    def __init__(self, length: int = 3) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, float(length), shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.pos = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.array([0.0], dtype=np.float32), {}

    def step(self, action):
        self.pos += 1 if action == 1 else 0
        done = self.pos >= self.length
        return np.array([float(self.pos)], dtype=np.float32), float(action == 1), done, False, {}


register_env("Corridor-test", Corridor)


def test_lookup_order_and_errors():
    assert resolve_env("Corridor-test").factory is Corridor
    assert resolve_env("corridor-TEST").factory is Corridor  # case-insensitive when unambiguous
    assert resolve_env(f"{__name__}:Corridor").factory is Corridor
    assert resolve_env("CartPole-v1").gym_id == "CartPole-v1"
    with pytest.raises(ConfigError, match="did you mean 'CartPole-v1'"):
        resolve_env("CartPole-v9")
    with pytest.raises(ConfigError, match="no environment class or factory 'Nope'"):
        resolve_env(f"{__name__}:Nope")
    with pytest.raises(ValueError, match="already registered"):
        register_env("Corridor-test", dict)


def test_arguments_the_environment_does_not_take_are_a_config_error_on_env_kwargs():
    # Was the constructor's TypeError (Gymnasium's wording, or a bare one for a registered class).
    with pytest.raises(ConfigError, match=r"^env.kwargs: \{'foo': 1\} did not fit environment 'CartPole-v1': .*"
                                          r"unexpected keyword argument 'foo'"):
        resolve_env("CartPole-v1", {"foo": 1}).make()
    with pytest.raises(ConfigError, match=r"^env.kwargs: \{'width': 2\} did not fit environment 'Corridor-test'"):
        resolve_env("Corridor-test", {"width": 2}).make()
    assert resolve_env("Corridor-test", {"length": 5}).make().length == 5


class NoStep:
    """Has everything of a Gymnasium environment but step."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return 0, {}


def test_an_environment_without_the_gymnasium_api_is_named_with_where_it_is_defined():
    with pytest.raises(TypeError, match=rf"environment '{__name__}:NoStep' has no 'step'; an environment follows"):
        resolve_env(f"{__name__}:NoStep").make()
    register_env("NoStep-test", NoStep)
    with pytest.raises(TypeError, match=rf"environment 'NoStep-test' \({__name__}:NoStep\) has no 'step'"):
        resolve_env("NoStep-test").make()


def test_decorator_registers_under_the_class_name():
    @register_env
    class DecoratedCorridor(Corridor):
        pass

    assert resolve_env("DecoratedCorridor").make().length == 3


def test_same_step_reset_final_observation_and_episode_statistics():
    venv = VecEnv(resolve_env("Corridor-test", kwargs={"length": 2}, max_episode_steps=3), num_envs=2, seed=0)
    venv.reset()
    first = venv.step(np.array([1, 0]))
    second = venv.step(np.array([1, 0]))  # env 0 reaches the goal
    assert second.terminated.tolist() == [True, False] and second.final_obs[0].tolist() == [2.0]
    assert second.obs[0].tolist() == [0.0]  # already the next episode's first observation
    third = venv.step(np.array([0, 0]))  # env 1 hits the 3-step time limit
    assert third.truncated.tolist() == [False, True] and third.final_obs[1].tolist() == [0.0]
    assert first.rewards.tolist() == [1.0, 0.0]
    assert venv.pop_episodes() == ([2.0, 0.0], [2, 3]) and venv.pop_episodes() == ([], [])


def test_copies_are_seeded_reproducibly():
    a, b = (VecEnv(resolve_env("CartPole-v1"), num_envs=3, seed=7) for _ in range(2))
    obs_a, obs_b = a.reset(), b.reset()
    assert np.array_equal(obs_a, obs_b) and not np.array_equal(obs_a[0], obs_a[1])


def test_reward_scaler_divides_by_the_return_std():
    scaler = RewardScaler(num_envs=1, gamma=0.0, clip=10.0)  # gamma 0: the "return" is the reward
    for r in [1.0, 3.0] * 200:
        out = scaler(np.array([r]), np.array([False]))
    assert out[0] == pytest.approx(3.0 / np.sqrt(scaler.stats.var[()]), rel=1e-6)
    assert scaler.stats.var == pytest.approx(1.0, rel=0.01)  # rewards 1 and 3: variance 1


def test_collector_segments_bootstrap_truncations_and_count_episodes():
    source = resolve_env("Corridor-test", kwargs={"length": 50}, max_episode_steps=4)
    venv = VecEnv(source, 1, 0)
    spec = NetworkSpec(obs_dim=venv.obs_dim, action=venv.action_spec, hidden_size=(8,))
    collector = Collector(CollectorSpec(source, num_envs=2, seed=0, network=spec, acting_model=ActorCritic))
    segment = collector.rollout(6)
    b = segment.batch
    assert b["observations"].shape == (2, 6, 1) and b["actions"].shape == (2, 6, 1)
    assert b["dones"][:, 3].all() and not b["terminated"].any()  # the 4-step limit truncates
    with torch.no_grad():  # truncated: V(final observation), not V(next episode's first)
        final = b["observations"][:, 3] + b["rewards"][:, 3:4]
        assert torch.allclose(b["next_values"][:, 3], collector.model.value(final))
        assert torch.allclose(b["next_values"][:, :3], b["values"][:, 1:4])
    assert segment.meta_info["env_steps"] == 12 and len(segment.meta_info["episode_returns"]) == 2
