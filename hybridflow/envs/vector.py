"""`VecEnv`: several copies of one environment stepped together, with episode statistics.

    venv = VecEnv(resolve_env("CartPole-v1"), num_envs=8, seed=0)
    obs = venv.reset()                                    # [8, obs_dim] float32
    step = venv.step(actions)                             # one action per copy
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hybridflow.engines.policy.spaces import ActionSpec
from hybridflow.envs.registry import EnvSource
from hybridflow.envs.spaces import action_spec, obs_dim, obs_encoder


@dataclass
class VecStep:
    obs: np.ndarray  # [N, D] next observations (a new episode's first where one ended)
    rewards: np.ndarray  # [N] float64, raw
    terminated: np.ndarray  # [N] bool
    truncated: np.ndarray  # [N] bool
    final_obs: np.ndarray  # [N, D]: the last observation where terminated | truncated, else undefined


class VecEnv:
    def __init__(self, source: EnvSource, num_envs: int, seed: int) -> None:
        if num_envs < 1:
            raise ValueError(f"VecEnv needs num_envs >= 1, got {num_envs}")
        self.source = source
        self.envs = [source.make() for _ in range(num_envs)]
        first = self.envs[0]
        self.action_spec: ActionSpec = action_spec(first.action_space)
        self.obs_dim = obs_dim(first.observation_space)
        self._encode = obs_encoder(first.observation_space)
        self.seed = seed
        self.episode_return = np.zeros(num_envs)
        self.episode_length = np.zeros(num_envs, dtype=np.int64)
        self.finished_returns: list[float] = []  # episodes ended since the last `pop_episodes`
        self.finished_lengths: list[int] = []

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def reset(self) -> np.ndarray:
        """Reset every copy with its seed; the first observations [N, D]."""
        obs = np.empty((self.num_envs, self.obs_dim), dtype=np.float32)
        for i, env in enumerate(self.envs):
            first, _ = env.reset(seed=self.seed + i)
            env.action_space.seed(self.seed + i)
            obs[i] = self._encode(first)
        self.episode_return[:] = 0.0
        self.episode_length[:] = 0
        return obs

    def step(self, actions: np.ndarray) -> VecStep:
        n = self.num_envs
        out = VecStep(obs=np.empty((n, self.obs_dim), dtype=np.float32), rewards=np.empty(n),
                      terminated=np.zeros(n, dtype=bool), truncated=np.zeros(n, dtype=bool),
                      final_obs=np.zeros((n, self.obs_dim), dtype=np.float32))
        for i, env in enumerate(self.envs):
            result = env.step(actions[i])
            if len(result) != 5:
                raise TypeError(f"environment {self.source.name!r}: step() returned {len(result)} values; the "
                                "Gymnasium API returns (obs, reward, terminated, truncated, info)")
            obs, reward, terminated, truncated, _ = result
            out.rewards[i] = reward
            self.episode_return[i] += reward
            self.episode_length[i] += 1
            if terminated or truncated:
                out.terminated[i], out.truncated[i] = bool(terminated), bool(truncated) and not terminated
                out.final_obs[i] = self._encode(obs)
                self.finished_returns.append(float(self.episode_return[i]))
                self.finished_lengths.append(int(self.episode_length[i]))
                self.episode_return[i], self.episode_length[i] = 0.0, 0
                obs, _ = env.reset()
            out.obs[i] = self._encode(obs)
        return out

    def pop_episodes(self) -> tuple[list[float], list[int]]:
        """Returns and lengths of the episodes finished since the last call."""
        returns, lengths = self.finished_returns, self.finished_lengths
        self.finished_returns, self.finished_lengths = [], []
        return returns, lengths

    def close(self) -> None:
        for env in self.envs:
            close = getattr(env, "close", None)
            if close is not None:
                close()


class RunningMeanStd:
    """Running mean and variance of a stream of arrays (Chan et al.'s parallel formula)."""

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.mean = np.zeros(shape)
        self.var = np.ones(shape)
        self.count = 1e-4  # a tiny prior count keeps the first update well defined

    def update(self, x: np.ndarray) -> None:
        batch_mean, batch_var, n = x.mean(axis=0), x.var(axis=0), x.shape[0]
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.count = total


class RewardScaler:
    """r / sqrt(Var[discounted return] + eps), clipped to +-clip; one return per env copy."""

    def __init__(self, num_envs: int, gamma: float, clip: float, eps: float = 1e-8) -> None:
        self.gamma, self.clip, self.eps = gamma, clip, eps
        self.returns = np.zeros(num_envs)
        self.stats = RunningMeanStd()

    def state_dict(self) -> dict[str, Any]:
        """Arrays and numbers only (checkpoints store them without pickle)."""
        return {"returns": self.returns.copy(), "mean": self.stats.mean, "var": self.stats.var,
                "count": self.stats.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.returns = np.array(state["returns"])
        self.stats.mean, self.stats.var, self.stats.count = state["mean"], state["var"], state["count"]

    def __call__(self, rewards: np.ndarray, dones: np.ndarray) -> np.ndarray:
        self.returns = self.returns * self.gamma + rewards
        self.stats.update(self.returns)
        self.returns[dones] = 0.0
        return np.clip(rewards / np.sqrt(self.stats.var + self.eps), -self.clip, self.clip)
