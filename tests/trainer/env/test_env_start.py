"""The start of an environment run on Ray: the env runners' processes start while the
learner's do (trainer/env/groups.py), and when one side fails both are stopped and their
CPUs given back; as for language-model runs, a failed start leaves no run directory and a
worker failure names the run directory to resume."""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np
import pytest
import ray

from hybridflow import RLTrainer
from hybridflow.controller import WorkerError
from hybridflow.envs import register_env


CONTROLLER_PID = os.getpid()


@register_env
class BrokenAtStartEnv(gym.Env):
    """An environment whose construction fails in an env runner's process (the controller
    builds one too, to read its spaces)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        if os.getpid() != CONTROLLER_PID:
            raise RuntimeError("this environment cannot be built")

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        return np.zeros(1, np.float32), {}


def test_a_runner_that_fails_to_start_stops_the_learner_and_frees_the_cpus(ray_local, tmp_path):
    before = ray.available_resources().get("CPU", 0.0)
    config = {"algorithm": "ppo", "env": "BrokenAtStartEnv", "distributed": {"num_workers": 1},
              "trainer": {"output_dir": str(tmp_path), "console": "none", "loggers": ["jsonl"]}}
    with RLTrainer(config) as trainer, pytest.raises(WorkerError, match="this environment cannot be built"):
        trainer.train(steps=64)
    deadline = time.monotonic() + 30  # Ray returns a killed actor's CPUs asynchronously
    while ray.available_resources().get("CPU", 0.0) < before and time.monotonic() < deadline:
        time.sleep(0.2)
    # >=: an earlier test's actors may still have been returning their CPUs when `before`
    # was read (the session's Ray is shared); what this run held must all be back
    assert ray.available_resources().get("CPU", 0.0) >= before
    assert trainer.groups == {}



@register_env
class BrokenAfterTheProbeEnv(gym.Env):
    """The controller's first instance (read for the spaces) works; the collector's fail."""

    made = 0
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        type(self).made += 1
        if type(self).made > 1:
            raise RuntimeError("this environment cannot be built")


@register_env
class BrokenInTheRunnerStepEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        return np.zeros(1, np.float32), {}

    def step(self, action: int) -> tuple:
        raise RuntimeError("this environment cannot step")


def test_a_failed_start_leaves_no_run_dir_and_a_failed_run_names_its_run_dir(ray_local, tmp_path):
    # As language-model runs: a start that failed removes its empty run directory
    # (trainer/run/setup.py); a worker failure in the run says which directory to --resume.
    config = {"algorithm": "ppo", "env": "BrokenAfterTheProbeEnv", "distributed": {"num_workers": 0},
              "trainer": {"output_dir": str(tmp_path / "start"), "console": "none", "loggers": ["jsonl"]}}
    with pytest.raises(RuntimeError, match="cannot be built"), RLTrainer(config) as trainer:
        assert trainer.run_dir.is_dir()
        trainer.train(steps=64)
    assert list((tmp_path / "start").iterdir()) == []
    config = {**config, "env": "BrokenInTheRunnerStepEnv", "distributed": {"num_workers": 1},
              "trainer.output_dir": str(tmp_path / "run")}
    with pytest.raises(WorkerError, match="cannot step") as info, RLTrainer(config) as trainer:
        trainer.train(steps=64)
    assert f"hybridflow: the run directory: {trainer.run_dir}" in info.value.__notes__
    assert trainer.run_dir.is_dir()


@register_env
class CountsItsClosesEnv(gym.Env):
    """Writes its process id to `marker` when closed (a window, a file, a simulator process to end)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        return np.zeros(1, np.float32), {}

    def step(self, action: int) -> tuple:
        return np.zeros(1, np.float32), 1.0, True, False, {}

    def close(self) -> None:
        with open(self.marker, "a") as f:
            f.write(f"{os.getpid()}\n")


@pytest.mark.parametrize("num_workers", [0, 1])
def test_the_environments_are_closed_when_the_workers_go(ray_local, tmp_path, num_workers):
    # Killing a runner's process or dropping an in-process runner skipped env.close().
    marker = tmp_path / "closed"
    config = {"algorithm": "ppo", "env": {"id": "CountsItsClosesEnv", "num_envs": 2, "kwargs": {"marker": str(marker)}},
              "distributed": {"num_workers": num_workers}, "ppo": {"rollout_steps": 16, "minibatch_size": 32},
              "trainer": {"output_dir": str(tmp_path), "console": "none", "loggers": ["jsonl"]}}
    trainer = RLTrainer(config)
    assert marker.read_text().split() == [str(CONTROLLER_PID)]  # the one read for its spaces
    trainer.train(steps=32)  # outside `with`: the workers go when it returns
    closed = marker.read_text().split()[1:]
    assert len(closed) == 2 and (set(closed) == {str(CONTROLLER_PID)}) == (num_workers == 0)
    trainer.close()
