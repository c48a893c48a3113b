"""The asynchronous modes' controller-free data path (trainer/modes/stream_step.py, docs/async.md):
each algorithm's own program runs beside the data.

Each algorithm path runs here in one_step_off and, where the reproduction test in
test_async_modes.py does not already run it in async mode (2 steps, max_staleness=0, equal
to sync), in async mode with partial rollouts and staleness 1 too (DAPO, ReMax).

Every run checks that the controller fetched no tensor of the batch: each step's
`controller/fetched_tensor_bytes` (the controller's own count of what `gather` brought back,
controller/futures.py) is 0. test_async_modes.py checks it too, beside sync runs that fetch
the batch, and that max_staleness=0 reproduces sync mode's metrics for grpo (adaptive KL in
the reward), dapo, safe_rlhf (cost function + cost model) and ppo (reward model + rule).

- DAPO's dynamic sampling on the stream: groups whose rule-based scores are all equal are
  discarded as they arrive and their place goes to new prompts, so every step trains on a
  full batch of informative groups.
- Safe-RLHF: costs scored on the rollout pool beside the rewards, the cost critic trained
  on the training side, and the Lagrange multiplier updated in the step program's task
  from each batch's cost, its state carried back to the controller's algorithm state.
- ReMax: each prompt's greedy response is generated and scored on the rollout pool beside
  its group (partial rollouts included) and travels with it to the program's
  greedy-baseline phase.
- Multi-turn agent rollouts: the rollout pool runs the agent loop (guess_number) for whole
  calls; the environment's turns and rewards reach the trainer with the groups.
- A non-native rollout backend (hf): whole calls, weights loaded between them.
"""

from __future__ import annotations

import math

import pytest

from hybridflow import RLTrainer
from test_agent_e2e import _guess_number_config
from test_algorithms_e2e import HALF_UNIFORM_REWARD, STEPPED_COST, VARIED_REWARD
from test_async_modes import ONE_EACH, _run
from trainer_helpers import assert_finite, rl_records

pytestmark = pytest.mark.slow  # each run starts two pools of tiny-model processes


@pytest.mark.parametrize("mode", ["one_step_off", pytest.param("async", marks=pytest.mark.extended)])
def test_dapo_dynamic_sampling_on_the_stream(tiny_config, ray_local, tmp_path, mode):
    reward = tmp_path / "half_uniform.py"
    reward.write_text(HALF_UNIFORM_REWARD, encoding="utf-8")
    extra = ("async_rl.chunk_prompts=2", "async_rl.steps_per_call=4", "async_rl.max_staleness=1") \
        if mode == "async" else ()
    cfg = tiny_config(*ONE_EACH, f"trainer.mode={mode}", "algorithm.name=dapo", "rollout.n=4",
                      f"reward.custom_fn_path={reward}", *extra)
    records = _run(cfg)
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert_finite(r)
        assert r["dapo/cap_hit"] == 0 and r["dapo/trained_groups"] == cfg.data.train_batch_size
        assert r["controller/fetched_tensor_bytes"] == 0
        assert "dapo/overlong_penalty_mean" in r and r["dapo/overlong_penalty_mean"] <= 0
        # every trained group is informative: the group-relative advantages are not all 0
        assert r["adv/max"] > 0 and r["staleness/max"] <= 1
    # half the prompts score uniformly: they were generated, discarded, and replaced
    assert records[-1]["dapo/filtered_groups_total"] > 0
    assert sum(r["dapo/generated_groups"] for r in records) > sum(r["dapo/kept_groups"] for r in records)


def test_safe_rlhf_costs_cost_critic_and_multiplier_in_one_step_off(tiny_config, ray_local, tmp_path):
    """(async mode: test_async_modes.py's reproduction test, with a cost model too)"""
    (tmp_path / "reward.py").write_text(VARIED_REWARD, encoding="utf-8")
    (tmp_path / "cost.py").write_text(STEPPED_COST, encoding="utf-8")  # prompts 0-3 cost 1, the others 0
    cfg = tiny_config(*ONE_EACH, "trainer.mode=one_step_off", "algorithm.name=safe_rlhf", "data.shuffle=false",
                      f"reward.custom_fn_path={tmp_path / 'reward.py'}", f"cost_model.custom_fn_path={tmp_path / 'cost.py'}",
                      "algorithm.safe_rlhf.cost_limit=0.5", "algorithm.safe_rlhf.lambda_init=1.0",
                      "algorithm.safe_rlhf.lambda_lr=0.5")
    with RLTrainer(cfg) as trainer:
        result = trainer.train(steps=2)
        state = trainer.state.state_dict()
    records = rl_records(result.run_dir)
    log_lambda = 0.0
    for r in records:
        assert_finite(r)
        # ln lambda += lr * lambda * (the batch's mean episode cost - limit), each step on its own batch
        log_lambda += 0.5 * math.exp(log_lambda) * (r["cost/mean"] - 0.5)
        assert r["safe_rlhf/lambda"] == pytest.approx(math.exp(log_lambda))
        for key in ("critic/vf_loss", "cost_critic/vf_loss", "cost/errors", "reward/errors", "values/mean"):
            assert key in r, key
        assert r["controller/fetched_tensor_bytes"] == 0
    assert state["lagrange"]["log_value"] == pytest.approx(log_lambda)  # the controller's multiplier followed
    assert [r["cost/mean"] for r in records] == [1.0, 0.0]  # whole loader batches in order: prompts 0-3, then 4-7


@pytest.mark.parametrize("mode", [pytest.param("one_step_off", marks=pytest.mark.extended), "async"])
def test_remax_greedy_baselines_from_the_rollout_pool(tiny_config, ray_local, tmp_path, mode):
    (tmp_path / "reward.py").write_text(VARIED_REWARD, encoding="utf-8")
    extra = ("async_rl.chunk_prompts=2", "async_rl.steps_per_call=3", "async_rl.max_staleness=1") \
        if mode == "async" else ()
    records = _run(tiny_config(*ONE_EACH, f"trainer.mode={mode}", "algorithm.name=remax",
                               f"reward.custom_fn_path={tmp_path / 'reward.py'}", *extra))
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert_finite(r)
        assert "remax/baseline_mean" in r and r["staleness/max"] <= 1
        assert r["controller/fetched_tensor_bytes"] == 0
    # the varied reward gives greedy responses non-zero scores: a baseline that was really scored
    assert any(r["remax/baseline_mean"] != 0 for r in records)


def test_multi_turn_agent_rollouts_on_the_rollout_pool_in_one_step_off(tiny_config, turn_model_dir, ray_local):
    """(async mode: the reproduction test's agent and remax_agent cases)"""
    cfg = _guess_number_config(tiny_config, turn_model_dir, *ONE_EACH, "trainer.mode=one_step_off",
                               "rollout.agent.max_turns=4", "rollout.temperature=0.5")
    records = _run(cfg)
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert_finite(r)
        assert r["agent/num_turns_mean"] > 1.0  # the environment answered and the model went on
        assert r["staleness/max"] <= 1 and r["controller/fetched_tensor_bytes"] == 0
    assert any(k.startswith("agent/stop_") for k in records[0])


def test_hf_rollout_backend_generates_whole_calls_in_one_step_off(tiny_config, ray_local):
    """(async mode: the reproduction test's hf case)"""
    records = _run(tiny_config(*ONE_EACH, "trainer.mode=one_step_off", "rollout.name=hf"), steps=3)
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert_finite(r)
        assert r["staleness/max"] <= 1 and r["controller/fetched_tensor_bytes"] == 0
        assert r["weight_sync/in_flight"] == 0  # whole calls: nothing is in flight when weights load
    # the trained weights reached the hf engine: a generation call loaded version 1
    assert max(r["weight_sync/receive/version"] for r in records) >= 1
    assert [r["staleness/max"] for r in records] == [0.0, 1.0, 1.0]
