"""The built-in task learns: a shortened version of `hybridflow train` (the demo).

Warm start on the imperfect teacher's answers (trainer/jobs/builtin.py), then a few GRPO steps
on 2 CPU ranks. The greedy policy's reward on held-out prompts must rise clearly: the
teacher's carry-less answers give a greedy accuracy near 30%, GRPO flips the carries.
Seeded; the margin asked for is well below what this shortened run reaches."""

from __future__ import annotations

import pytest

from hybridflow import RLTrainer
from hybridflow.config.schema import load_run_config
from hybridflow.trainer.run.run_dir import read_metrics


@pytest.mark.slow
def test_builtin_task_reward_rises_under_grpo(ray_local, tmp_path):
    cfg = load_run_config(None, [
        f"trainer.output_dir={tmp_path}", "trainer.console=none", "trainer.save_final_model=false",
        "resources.world_size=2", "seed=0", "trainer.total_steps=10", "trainer.test_freq=0",
        "data.builtin.num_val=100",
    ])  # the demo's warm start (sft.steps=400) and GRPO settings, 10 RL steps instead of 30
    with RLTrainer(cfg) as trainer:
        result = trainer.train()
    records = read_metrics(result.run_dir / "metrics.jsonl")
    sft_losses = [r["sft/loss"] for r in records if r["phase"] == "sft"]
    assert len(sft_losses) == cfg.sft.steps and sft_losses[-1] < 0.5 * sft_losses[0]
    evals = [r for r in records if r["phase"] == "eval"]
    before, after = evals[0], evals[-1]
    assert (before["step"], after["step"]) == (0, 10)
    # Measured with this seed: about +45 points; the full demo gains +57 to +61 over 30 steps.
    assert after["val/score"] >= before["val/score"] + 0.25, (before, after)
    assert result.accuracy_after - result.accuracy_before >= 0.25
