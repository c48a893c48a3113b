"""Environment tasks on Ray: the documented quick-start dict with the user-defined CustomEnv of
examples/env_quick_start.py on 2 env-runner actors (spread placement, async sampling with
bounded lag), and runs on Ray that equal the in-process run (one env runner, two
data-parallel learner ranks)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

from hybridflow import RLTrainer
from hybridflow.trainer.env.part import EnvironmentPart, EnvTrainResult
from hybridflow.trainer.run.run_dir import read_metrics


def _load_example() -> ModuleType:
    """examples/env_quick_start.py as a module: importing it registers its CustomEnv (30-step
    episodes), the user-defined class of the documented quick start."""
    path = Path(__file__).resolve().parents[3] / "examples" / "env_quick_start.py"
    if "env_quick_start" not in sys.modules:
        spec = importlib.util.spec_from_file_location("env_quick_start", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["env_quick_start"] = module
        spec.loader.exec_module(module)
    return sys.modules["env_quick_start"]


_load_example()


def test_quick_start_summary_of_a_run_shorter_than_the_return_window(tmp_path):
    # A run with no finished episode has no window mean, and printing it once failed after
    # the whole run had trained; set-up and training are timed apart.
    summary = _load_example().summary
    short = EnvTrainResult(tmp_path, 150, 19, 12.3, None, None, {}, setup_s=9.6)
    assert summary("Pendulum-v1", "SAC", short) == (
        f"Pendulum-v1 SAC: 150 environment steps in 12 s (set-up 10 s), mean return of the last 20 episodes: no "
        f"episode finished yet; run directory {tmp_path}")
    done = EnvTrainResult(tmp_path, 20480, 80, 707.0, 409.25, None, {})
    assert "mean return of the last 20 episodes: 409.2;" in summary("CartPole-v1", "PPO", done)


def test_quick_start_dict_with_a_custom_env_on_two_spread_actors(ray_local, tmp_path):
    config = {
        "algorithm": "PPO",
        "env": "CustomEnv",
        "policy": {"hidden_size": [1024, 512], "activation": "gelu"},
        "distributed": {"num_workers": 2, "placement_strategy": "spread", "sampling": "async"},
        "ppo": {"rollout_steps": 60, "minibatch_size": 60, "epochs": 2},
        "trainer": {"output_dir": str(tmp_path), "console": "none", "log_freq": 120},
    }
    trainer = RLTrainer(config)
    assert isinstance(trainer, RLTrainer) and isinstance(trainer.task.part, EnvironmentPart)
    with trainer:
        result = trainer.train(steps=6e2)
        runners = trainer.roles.runners
        info = runners.worker_info
        assert runners.world_size == 2 and len({w["pid"] for w in info}) == 2
        assert trainer.roles.runners.resource_pool.process_on_nodes == [2]  # one node: spread is a preference
    records = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["phase"] == "rl"]
    assert result.env_steps == 600 and sum(r["perf/iterations"] for r in records) == 5
    assert records[0]["policy/lag_max"] == 0 and max(r["policy/lag_max"] for r in records) == 1  # async, lag <= 1
    assert sum(r["episode/count"] for r in records) == 600 // 30
    assert all(r["episode/length_mean"] == 30 for r in records if r["episode/count"])


def _common(tmp_path, algorithm: str) -> dict:
    return {"env": "CartPole-v1" if algorithm == "ppo" else "Pendulum-v1", "algorithm": algorithm,
            "env.num_envs": 4, "env.normalize_obs": True, "policy.hidden_size": [16, 16],
            "ppo": {"rollout_steps": 16, "minibatch_size": 64, "epochs": 1},
            "sac": {"batch_size": 32, "learning_starts": 16, "train_freq": 4, "gradient_steps": 2},
            "trainer": {"output_dir": str(tmp_path), "console": "none", "loggers": ["jsonl"]}}


def test_ppo_on_a_ray_runner_and_two_learner_ranks_equals_the_in_process_run(ray_local, tmp_path):
    # One full-batch minibatch per update: two data-parallel ranks then compute the same step
    # as one (gradients, advantage and observation statistics are averaged over the ranks),
    # and runner rank 0 draws what the in-process collector draws.
    digests = []
    for distributed in ({"num_workers": 0}, {"num_workers": 1, "num_learners": 2}):
        with RLTrainer({**_common(tmp_path, "ppo"), "distributed": distributed}) as trainer:
            trainer.train(steps=192)
            digests.append(trainer.roles.learner.parameters_digest())
    (local,), (rank0, rank1) = digests
    for name in local:
        assert np.array_equal(rank0[name], rank1[name]), name  # the replicas stay identical
        assert np.allclose(local[name], rank0[name], rtol=1e-4, atol=1e-6), name


def test_sac_learner_ranks_stay_identical_replicas(ray_local, tmp_path):
    # Each SAC rank samples its own replay shard, so the run differs from one rank's; the
    # averaged gradients must still keep both replicas equal.
    config = {**_common(tmp_path, "sac"), "distributed": {"num_workers": 1, "num_learners": 2}, "trainer.log_freq": 16}
    with RLTrainer(config) as trainer:
        result = trainer.train(steps=96)
        rank0, rank1 = trainer.roles.learner.parameters_digest()
    assert all(np.array_equal(rank0[name], rank1[name]) for name in rank0)
    records = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["phase"] == "rl"]
    assert records[-1]["sac/buffer_size"] == 96 / 2  # each rank holds half of the transitions


def test_sac_on_a_ray_runner_equals_the_in_process_run(ray_local, tmp_path):
    # New weights travel with the next collection call (programs/env_phases.py: EnvRun.take_weights):
    # the runner must act with exactly the weights the in-process collector acts with, at
    # every iteration, or the transitions and so the learnt weights would differ.
    digests = []
    for distributed in ({"num_workers": 0}, {"num_workers": 1}):
        with RLTrainer({**_common(tmp_path, "sac"), "distributed": distributed}) as trainer:
            trainer.train(steps=160)
            digests.append(trainer.roles.learner.parameters_digest()[0])
    local, ray_run = digests
    for name in local:
        assert np.allclose(local[name], ray_run[name], rtol=1e-4, atol=1e-6), name
