"""An environment run survives a killed env runner and a killed learner by automatic restart
from its newest checkpoint (trainer/task.py, the lifecycle every task kind shares; failures
injected with HYBRIDFLOW_FAULT, controller/faults.py), and ends where the uninterrupted run
ends: the same learner weights, the same episodes."""

from __future__ import annotations

import numpy as np
import pytest

from hybridflow import RLTrainer
from hybridflow.trainer.observe.live_status import read_status
from hybridflow.trainer.run.run_dir import read_metrics

pytestmark = pytest.mark.slow  # three runs on Ray, two of them restarted (~60 s on 2 cores)


def _config(tmp_path, name: str) -> dict:
    # 2 copies x 16 steps = 32 environment steps an iteration; a checkpoint every 2 iterations.
    return {"algorithm": "ppo", "env": {"id": "CartPole-v1", "num_envs": 2}, "seed": 3,
            "distributed": {"num_workers": 1}, "ppo": {"rollout_steps": 16, "minibatch_size": 32, "epochs": 1},
            "trainer": {"output_dir": str(tmp_path / name), "console": "none", "loggers": ["jsonl"],
                        "log_freq": 32, "save_freq": 64}}


def _run(config: dict) -> tuple[dict, list[dict]]:
    with RLTrainer(config) as trainer:
        result = trainer.train(steps=192)
        weights = trainer.roles.learner.parameters_digest()[0]
    assert result.env_steps == 192
    return weights, read_metrics(result.run_dir / "metrics.jsonl")


@pytest.fixture(scope="module")
def uninterrupted(ray_local, tmp_path_factory):
    return _run(_config(tmp_path_factory.mktemp("reference"), "reference"))


@pytest.mark.parametrize("target, role", [("runners.rollout", "runners"),
                                          pytest.param("learner.ppo_update", "learner", marks=pytest.mark.extended)])
def test_a_killed_runner_or_learner_restarts_from_the_newest_checkpoint(uninterrupted, tmp_path, monkeypatch,
                                                                        target, role):
    # Killed in iteration 5 (its 5th call), after the checkpoint of iteration 4.
    monkeypatch.setenv("HYBRIDFLOW_FAULT", f"kill:{target}:0:5:{tmp_path / 'fired'}")
    weights, records = _run(_config(tmp_path, "run"))
    restart = [r for r in records if r["phase"] == "restart"]
    assert len(restart) == 1
    assert (restart[0]["restart/role"], restart[0]["restart/cause"]) == (role, "died")
    assert (restart[0]["restart/failed_step"], restart[0]["restart/resumed_step"]) == (5, 4)
    status = read_status(next((tmp_path / "run").iterdir()))
    assert status["restarts"] == 1 and status["state"] == "finished"
    want_weights, want = uninterrupted
    assert weights.keys() == want_weights.keys()
    assert all(np.array_equal(weights[k], want_weights[k]) for k in weights)
    rl = [r for r in records if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [r["step"] for r in want if r["phase"] == "rl"]
    for key in ("episode/total", "episode/return_mean_window", "ppo/loss"):
        assert [r.get(key) for r in rl] == [r.get(key) for r in want if r["phase"] == "rl"]
