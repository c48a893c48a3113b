"""The cold-start features together on the tiny model (real Ray, 2 ranks): a warm start from
24 demonstrations (sft.files), a curriculum by the policy's own pass rate (measured once,
saved in the run), and the exploration of silent groups, whose extra generation is counted
and whose batch keeps one group per prompt. The reward is right for a quarter of the
responses (by their text), so many groups of 2 score alike."""

from __future__ import annotations

import json

import pytest

from hybridflow import RLTrainer
from hybridflow.data import write_records
from hybridflow.data.arithmetic import ArithmeticConfig, rl_records
from hybridflow.trainer.lm.curriculum import PASS_RATES_FILE
from trainer_helpers import rl_records as logged_steps

QUARTER_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if sum(map(ord, solution_str)) % 4 == 0 else 0.0
'''


@pytest.mark.slow
def test_demonstrations_pass_rate_curriculum_and_exploration_run_together(ray_local, tiny_config, tmp_path):
    rows = rl_records(ArithmeticConfig(), "train", 88)
    train = write_records(rows[:64], tmp_path / "train.jsonl")
    demos = write_records([{"prompt": r["prompt"], "response": r["reward_model"]["ground_truth"]} for r in rows[64:]],
                          tmp_path / "demos.jsonl")
    reward = tmp_path / "reward.py"
    reward.write_text(QUARTER_REWARD)
    cfg = tiny_config(f"data.train_files=[{train}]", f"sft.files=[{demos}]", "sft.steps=3", "sft.batch_size=8",
                      "sft.micro_batch_size_per_device=4", f"reward.custom_fn_path={reward}",
                      "data.curriculum.by=pass_rate", "data.curriculum.pass_rate_prompts=16",
                      "data.curriculum.pass_rate_samples=2", "algorithm.exploration.max_extra_groups=6",
                      "algorithm.exploration.max_tries_per_prompt=2", "trainer.total_steps=3",
                      "actor.loss.skip_no_signal_updates=true")
    with RLTrainer(cfg) as trainer:
        result = trainer.train()
    run = result.run_dir
    assert [r["step"] for r in logged_steps(run)] == [1, 2, 3]
    sft = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in sft if r["phase"] == "sft"] == [1, 2, 3]  # 24 demonstrations, batches of 8
    saved = json.loads((run / PASS_RATES_FILE).read_text())
    assert len(saved["rows"]) == 16 and saved["samples"] == 2
    assert all(rate in (0.0, 0.5, 1.0) for rate in saved["pass_rates"])
    for r in logged_steps(run):
        assert r["adv/groups"] == 4.0  # one group per prompt whatever was explored
        assert r["explore/extra_groups"] <= 6 and r["explore/extra_groups"] % 2 == 0  # whole units of 2 ranks
        assert r["explore/extra_samples"] == 2 * r["explore/extra_groups"]
        assert r["explore/found"] == r["explore/silent_before"] - r["explore/silent_after"]
        assert r["adv/silent_groups"] == r["explore/silent_after"]
    assert sum(r["explore/extra_groups"] for r in logged_steps(run)) > 0
