"""GRPO and PPO end to end on a tiny model: Ray, 2 ranks, CPU, 2 steps each.

Checks what a run must deliver whatever the model learns: every metric finite, the
metrics file and resolved config in the run directory, both placements, and a reward
function that raises or hangs contained (counted, scored 0, the run goes on)."""

from __future__ import annotations

import dataclasses

import pytest

from hybridflow import RLTrainer
from hybridflow.config import load_config
from hybridflow.config.schema import RunConfig
from hybridflow.trainer.run.checkpointing import find_checkpoint, read_trainer_state
from hybridflow.trainer.run.run_dir import read_metrics
from trainer_helpers import assert_finite, rl_records

# Misbehaves on the first two training prompts only (data.shuffle=false puts them in step 1).
FLAKY_REWARD = '''
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if extra_info["split"] == "train" and extra_info["index"] == 0:
        raise RuntimeError("this reward function is broken")
    if extra_info["split"] == "train" and extra_info["index"] == 1:
        time.sleep(600)
    return 1.0 if solution_str.strip() == ground_truth else 0.0
'''

STEP_KEYS = ("score/mean", "adv/mean", "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl", "response_length/mean",
             "response_length/max", "response_length/clip_ratio", "timing_s/gen", "timing_s/update_actor",
             "timing_s/step", "perf/tokens_per_s", "perf/mfu")


def test_grpo_two_steps_with_kl_loss_and_a_reward_function_that_raises_and_hangs(ray_local, tiny_config, tmp_path):
    reward_file = tmp_path / "flaky_reward.py"
    reward_file.write_text(FLAKY_REWARD)
    cfg = tiny_config(
        "data.shuffle=false", "actor.loss.use_kl_loss=true", f"reward.custom_fn_path={reward_file}",
        "reward.manager.timeout_s=1.0", "reward.manager.kill_grace_s=0.5", "trainer.save_freq=2",
    )
    with RLTrainer(cfg) as trainer:
        result = trainer.train(steps=2)
        pids = {info["pid"] for info in trainer.groups["actor"].worker_info}
    assert result.steps == 2 and len(pids) == 2
    steps = rl_records(result.run_dir)
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:
        assert_finite(record)
        assert set(STEP_KEYS) <= set(record)
        assert "actor/ref_kl" in record and "actor/kl_loss" in record
    # Prompt 0 raised and prompt 1 hung, rollout.n=2 samples each: contained and counted.
    assert steps[0]["reward/errors"] == 2 and steps[0]["reward/timeouts"] == 2
    assert steps[1]["reward/errors"] == 0 and steps[1]["reward/timeouts"] == 0
    saved = load_config(RunConfig, result.run_dir / "config.yaml")
    assert saved == trainer.config and saved.resources.world_size == 2 and saved.algorithm.adv_estimator == "grpo"
    # rollout.decode_loop "auto" is a run's own choice, saved resolved ("host" on CPUs).
    assert saved.actor == cfg.actor and saved.rollout == dataclasses.replace(cfg.rollout, decode_loop="host")
    checkpoint = find_checkpoint(result.run_dir)
    assert checkpoint == result.run_dir / "checkpoints" / "global_step_2"
    assert read_trainer_state(checkpoint)["global_step"] == 2 and (checkpoint / "actor" / ".metadata").is_file()
    evals = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["phase"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2] and 0.0 <= evals[-1]["val/accuracy"] <= 1.0


@pytest.mark.parametrize("placement", ["colocated", pytest.param("split", marks=pytest.mark.extended)])
def test_ppo_two_steps_with_kl_in_reward(ray_local, tiny_config, placement):
    extra = ["resources.world_size=3", "resources.placement=split", "resources.critic_ranks=1"] \
        if placement == "split" else []
    # Peaks per role, as if the critic ranks ran on slower devices: perf/mfu divides by the
    # peaks of the processes that ran the step (a colocated process counts once).
    peaks = ["actor.peak_flops_per_device=4e9", "critic.peak_flops_per_device=1e9"]
    cfg = tiny_config("algorithm.name=ppo", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
                      "trainer.save_final_model=true", *peaks, *extra)
    with RLTrainer(cfg) as trainer:
        result = trainer.train(steps=2)
        actor_pids = {info["pid"] for info in trainer.groups["actor"].worker_info}
        critic_pids = {info["pid"] for info in trainer.groups["critic"].worker_info}
    if placement == "split":
        assert len(actor_pids) == 2 and len(critic_pids) == 1 and not actor_pids & critic_pids
    else:
        assert actor_pids == critic_pids and len(actor_pids) == 2
    peak = 2 * 4e9 + (1e9 if placement == "split" else 0.0)
    for record in rl_records(result.run_dir):
        assert_finite(record)
        assert record["perf/mfu"] == pytest.approx(record["perf/step_flops"] / record["timing_s/step"] / peak)
        assert set(STEP_KEYS) <= set(record)
        for key in ("values/mean", "returns/mean", "critic/vf_loss", "critic/vf_clipfrac", "kl/penalty", "kl/coef",
                    "timing_s/values", "timing_s/update_critic"):
            assert key in record, key
    assert (result.run_dir / "final_model" / "config.json").is_file()
