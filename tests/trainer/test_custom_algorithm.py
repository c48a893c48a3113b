"""An algorithm registered outside the package, examples/custom_algorithm/ (the recipe of
docs/extending.md, "Add an algorithm"): its YAML validates as documented, and RLTrainer
trains it for two steps on real Ray workers with the tiny config; the metrics show that
the user's phase ran and shaped the scores that were trained on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow import RLTrainer
from hybridflow.config import load_config
from hybridflow.config.schema import RunConfig, load_run_config
from trainer_helpers import assert_finite, rl_records

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "custom_algorithm"


def test_the_example_config_finds_its_algorithm_from_the_repository_root(monkeypatch):
    monkeypatch.chdir(REPO)  # where the documented command runs; algorithm.module is relative to it
    cfg = load_run_config("examples/custom_algorithm/grpo_brevity.yaml")
    assert cfg.algorithm.name == "grpo_brevity" and cfg.algorithm.estimator == "grpo"
    assert cfg.actor.loss.policy.loss_agg_mode == "token-mean"  # the example's preset
    assert cfg.algorithm.spec.check is not None and not cfg.use_critic


def test_custom_algorithm_trains_two_steps(ray_local, tiny_config):
    cfg = tiny_config("algorithm.name=grpo_brevity", f"algorithm.module={EXAMPLE / 'grpo_brevity.py'}")
    with RLTrainer(cfg) as trainer:
        result = trainer.train(steps=2)
        roles = set(trainer.groups)
    assert roles == {"actor"}
    saved = load_config(RunConfig, result.run_dir / "config.yaml")  # imports algorithm.module again
    assert saved.algorithm.name == "grpo_brevity"
    records = rl_records(result.run_dir)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert_finite(record)
        assert {"timing_s/brevity", "actor/pg_loss", "adv/mean"} <= set(record)
        # The penalty is 0.1 x length / rollout.response_length, and the trained scores include it.
        assert record["brevity/penalty_mean"] == pytest.approx(
            -0.1 * record["response_length/mean"] / cfg.rollout.response_length)
        assert record["score/mean"] == pytest.approx(record["brevity/task_score_mean"] + record["brevity/penalty_mean"])
