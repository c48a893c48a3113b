"""`Collector`: steps a `VecEnv` with the current policy and returns what it saw as a DataProto.

    collector = Collector(CollectorSpec(source, num_envs=8, seed=0, network=spec, acting_model=ActorCritic))
    collector.set_weights(weights, version=3)          # export_acting(learner model)
    segment = collector.rollout(128)                   # PPO: rows = env copies, 128 steps each
    transitions = collector.transitions(1, random=False)   # SAC: one row per transition
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hybridflow.engines.policy.actor_critic import ActorCritic, NetworkSpec
from hybridflow.engines.policy.sac_model import SACModel
from hybridflow.engines.policy.weights import Weights, import_acting
from hybridflow.envs.registry import EnvSource
from hybridflow.envs.vector import RewardScaler, VecEnv
from hybridflow.protocol import DataProto

Tensor = torch.Tensor


@dataclass(frozen=True)
class CollectorSpec:
    source: EnvSource
    num_envs: int
    seed: int
    network: NetworkSpec
    acting_model: type[ActorCritic] | type[SACModel]  # the network the runner acts with (the program's)
    normalize_reward: bool = False
    reward_gamma: float = 0.99
    clip_reward: float = 10.0


class Collector:
    def __init__(self, spec: CollectorSpec) -> None:
        self.spec = spec
        self.venv = VecEnv(spec.source, spec.num_envs, spec.seed)
        if self.venv.action_spec != spec.network.action or self.venv.obs_dim != spec.network.obs_dim:
            raise ValueError(f"environment {spec.source.name!r} has observation size {self.venv.obs_dim} and actions "
                             f"{self.venv.action_spec}, but the policy was built for {spec.network.obs_dim} and "
                             f"{spec.network.action}; every copy of an environment must have the same spaces")
        self.model: ActorCritic | SACModel = spec.acting_model(spec.network)
        self.model.requires_grad_(False)
        self.scaler = RewardScaler(spec.num_envs, spec.reward_gamma, spec.clip_reward) if spec.normalize_reward else None
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.obs = self.venv.reset()
        self.version = 0

    def set_weights(self, weights: Weights, version: int) -> None:
        """Load the learner's acting weights (engines/policy/weights.py) of policy `version`."""
        import_acting(self.model, weights)
        self.version = int(version)

    def _scale(self, rewards: np.ndarray, dones: np.ndarray) -> np.ndarray:
        return rewards if self.scaler is None else self.scaler(rewards, dones)

    def rollout(self, steps: int) -> DataProto:
        """`steps` steps of every copy with the PPO policy (module docstring)."""
        assert isinstance(self.model, ActorCritic), "rollout() is the PPO collection; SAC uses transitions()"
        n, d = self.venv.num_envs, self.venv.obs_dim
        action_shape, action_dtype = (self.venv.action_spec.dim,), (
            torch.float32 if self.venv.action_spec.is_continuous else torch.int64)
        obs_buf = torch.empty(n, steps, d)
        actions = torch.empty(n, steps, *action_shape, dtype=action_dtype)
        log_probs, values, rewards = torch.empty(n, steps), torch.empty(n, steps), torch.empty(n, steps)
        terminated, truncated = torch.zeros(n, steps, dtype=torch.bool), torch.zeros(n, steps, dtype=torch.bool)
        final_obs: dict[tuple[int, int], np.ndarray] = {}
        obs = self.obs
        for t in range(steps):
            obs_t = torch.from_numpy(obs)
            action, log_prob, value = self.model.act(obs_t, self.generator)
            step = self.venv.step(self.model.head.to_env(action))
            obs_buf[:, t], actions[:, t], log_probs[:, t], values[:, t] = obs_t, action, log_prob, value
            rewards[:, t] = torch.from_numpy(self._scale(step.rewards, step.terminated | step.truncated))
            terminated[:, t], truncated[:, t] = torch.from_numpy(step.terminated), torch.from_numpy(step.truncated)
            for i in np.flatnonzero(step.truncated):
                final_obs[(i, t)] = step.final_obs[i]
            obs = step.obs
        self.obs = obs
        next_values = torch.empty(n, steps)
        next_values[:, :-1] = values[:, 1:]
        next_values[:, -1] = self.model.value(torch.from_numpy(obs))
        if final_obs:
            rows, cols = zip(*final_obs)
            next_values[list(rows), list(cols)] = self.model.value(torch.from_numpy(np.stack(list(final_obs.values()))))
        next_values[terminated] = 0.0
        tensors = {"observations": obs_buf, "actions": actions, "old_log_probs": log_probs, "values": values,
                   "next_values": next_values, "rewards": rewards, "terminated": terminated,
                   "dones": terminated | truncated,
                   "policy_version": torch.full((n, steps), self.version, dtype=torch.int64)}
        return DataProto.from_dict(tensors, meta_info=self._meta(n * steps))

    def transitions(self, steps: int, random: bool) -> DataProto:
        """`steps` steps of every copy with the SAC actor, or uniform actions when `random`."""
        assert isinstance(self.model, SACModel), "transitions() is the SAC collection; PPO uses rollout()"
        n, d, a = self.venv.num_envs, self.venv.obs_dim, self.venv.action_spec.dim
        obs_buf, next_buf = torch.empty(steps, n, d), torch.empty(steps, n, d)
        actions, rewards = torch.empty(steps, n, a), torch.empty(steps, n)
        terminated = torch.zeros(steps, n, dtype=torch.bool)
        obs = self.obs
        for t in range(steps):
            obs_t = torch.from_numpy(obs)
            if random:
                action = torch.rand(n, a, generator=self.generator) * 2.0 - 1.0
            else:
                action = self.model.act(obs_t, self.generator)
            step = self.venv.step(self.model.to_env(action))
            dones = step.terminated | step.truncated
            next_obs = np.where(dones[:, None], step.final_obs, step.obs)
            obs_buf[t], next_buf[t], actions[t] = obs_t, torch.from_numpy(next_obs), action
            rewards[t] = torch.from_numpy(self._scale(step.rewards, dones))
            terminated[t] = torch.from_numpy(step.terminated)
            obs = step.obs
        self.obs = obs
        rows = steps * n
        tensors = {"observations": obs_buf.reshape(rows, d), "actions": actions.reshape(rows, a),
                   "rewards": rewards.reshape(rows), "next_observations": next_buf.reshape(rows, d),
                   "terminated": terminated.reshape(rows),
                   "policy_version": torch.full((rows,), self.version, dtype=torch.int64)}
        return DataProto.from_dict(tensors, meta_info=self._meta(rows))

    def _meta(self, env_steps: int) -> dict[str, Any]:
        returns, lengths = self.venv.pop_episodes()
        return {"episode_returns": returns, "episode_lengths": lengths, "env_steps": env_steps}

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything but the weights (the learner's): the environments (pickled when they
        allow it, else None), the current observations, the RNG, reward-scaling statistics.
        All but the environments are arrays and plain data (trainer/env/state.py stores them
        without pickle and signs the environments)."""
        try:
            import cloudpickle

            envs = cloudpickle.dumps(self.venv.envs)
        except Exception:  # noqa: BLE001 - e.g. MuJoCo handles: resume then restarts the episodes
            envs = None
        return {"envs": envs, "obs": self.obs.copy(), "generator": self.generator.get_state(),
                "scaler": None if self.scaler is None else self.scaler.state_dict(),
                "episodes": (self.venv.episode_return.copy(), self.venv.episode_length.copy()),
                "version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore `state_dict`; False when the environments could not be saved and were
        reset instead (their episodes in progress start over)."""
        self.generator.set_state(state["generator"])
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.version = int(state["version"])
        if state["envs"] is None:
            self.obs = self.venv.reset()
            return False
        self.venv.close()
        self.venv.envs = pickle.loads(state["envs"])
        self.obs = state["obs"].copy()
        self.venv.episode_return[:], self.venv.episode_length[:] = state["episodes"]
        return True
