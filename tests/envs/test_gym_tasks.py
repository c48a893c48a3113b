"""The Gymnasium tasks the issue names run end to end in-process (a few hundred steps):
Acrobot-v1 (discrete), MountainCarContinuous-v0 with PPO and SAC (bounded Box actions),
and MuJoCo tasks when `mujoco` is installed (otherwise a clear ConfigError)."""

from __future__ import annotations

import importlib.util

import pytest

from hybridflow.config import ConfigError
from hybridflow.envs import resolve_env
from hybridflow import RLTrainer
from hybridflow.trainer.run.run_dir import read_metrics


def _short_run(tmp_path, env: str, algorithm: str, steps: int) -> list[dict]:
    config = {"env": env, "algorithm": algorithm, "distributed": {"num_workers": 0}, "policy.hidden_size": [16, 16],
              "env.num_envs": 2, "ppo": {"rollout_steps": 32, "minibatch_size": 32, "epochs": 1},
              "sac": {"batch_size": 16, "learning_starts": 32},
              "trainer": {"output_dir": str(tmp_path), "console": "none", "loggers": ["jsonl"], "log_freq": 64}}
    with RLTrainer(config) as trainer:
        result = trainer.train(steps=steps)
    assert result.env_steps == steps
    return [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["phase"] == "rl"]


@pytest.mark.parametrize(("env", "algorithm"), [("Acrobot-v1", "ppo"), ("MountainCarContinuous-v0", "ppo"),
                                                ("MountainCarContinuous-v0", "sac")])
def test_named_gymnasium_tasks_train(tmp_path, env, algorithm):
    records = _short_run(tmp_path, env, algorithm, 128)
    assert records[-1]["env/steps"] == 128
    key = "ppo/loss" if algorithm == "ppo" else "sac/critic_loss"
    assert any(key in r for r in records), sorted(records[-1])


@pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="mujoco is not installed")
def test_mujoco_task_trains(tmp_path):
    _short_run(tmp_path, "HalfCheetah-v5", "ppo", 64)


@pytest.mark.skipif(importlib.util.find_spec("mujoco") is not None, reason="mujoco is installed")
def test_mujoco_task_without_mujoco_says_what_to_install():
    source = resolve_env("HalfCheetah-v5")  # Gymnasium lists it either way
    with pytest.raises(ConfigError, match="pip install mujoco"):
        source.make()
