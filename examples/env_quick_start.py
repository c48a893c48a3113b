"""The quick start of docs/envs.md exactly as written, with the environment, the algorithm
and the number of environment steps from the command line:

    python examples/env_quick_start.py CartPole-v1 PPO 2e4
    python examples/env_quick_start.py CustomEnv PPO 5e3      # the user-defined class below
    python examples/env_quick_start.py Pendulum-v1 SAC 2e3

8 env-runner workers (Ray actors) spread over the cluster's nodes (one node here), a
[1024, 512] GELU policy; the run directory is printed at the end.
"""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np

from hybridflow import RLTrainer
from hybridflow.envs import register_env
from hybridflow.trainer.env.part import EnvTrainResult


@register_env
class CustomEnv(gym.Env):
    """Steer a point on a line to 0: actions left / stay / right, reward -|x|, 30 steps."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-10.0, 10.0, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.x, self.t = 0.0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = float(self.np_random.uniform(-5, 5)), 0
        return np.array([self.x], dtype=np.float32), {}

    def step(self, action):
        self.x = float(np.clip(self.x + (int(action) - 1) * 0.5, -10, 10))
        self.t += 1
        return np.array([self.x], dtype=np.float32), -abs(self.x), False, self.t >= 30, {}


def main(env: str, algorithm: str, steps: float) -> None:
    config = {
        "algorithm": algorithm,
        "env": env,
        "policy": {"hidden_size": [1024, 512], "activation": "gelu"},
        "distributed": {"num_workers": 8, "placement_strategy": "spread"},
    }
    trainer = RLTrainer(config)
    result = trainer.train(steps=steps)
    trainer.close()
    print(summary(env, algorithm, result))


def summary(env: str, algorithm: str, result: EnvTrainResult) -> str:
    """One line about a finished run (set-up and training timed apart)."""
    window = result.return_mean_window  # the last trainer.return_window (20) episodes, fewer early on
    shown = "no episode finished yet" if window is None else f"{window:.1f}"
    return (f"{env} {algorithm}: {result.env_steps} environment steps in {result.wall_s:.0f} s (set-up "
            f"{result.setup_s:.0f} s), mean return of the last 20 episodes: {shown}; run directory {result.run_dir}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
