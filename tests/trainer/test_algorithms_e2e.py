"""Every trainer algorithm end to end: tiny model, real Ray, CPU, 2 ranks, 2 steps each.

- the critic-free family (rloo, reinforce_plus_plus, reinforce_plus_plus_baseline, drgrpo,
  remax), with GSPO and CISPO as the policy loss of two of them;
- DAPO dynamic sampling: a reward function that makes half the groups uniform, so the
  step must generate more prompts until the batch holds data.train_batch_size groups;
- Safe-RLHF: a cost function that makes step 1 cost more than the limit and step 2 less,
  so the Lagrange multiplier goes up, then down (and is in the algorithm state);
- PPO with a learned reward model (a random `LlamaForSequenceClassification`) as the reward,
  and ReMax with the model's score added to the rule-based reward.
(grpo and ppo themselves: test_rl_e2e.py.)
"""

from __future__ import annotations

import math

import pytest

from hybridflow import RLTrainer
from trainer_helpers import assert_finite, rl_records

# A score that depends on the response text, so groups differ and advantages are not all 0.
VARIED_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(sum(map(ord, solution_str)) % 7) / 6.0
'''

# Even prompts: every sample scores 0 (a uniform group, dropped by dynamic sampling);
# odd prompts: a score that depends on the response.
HALF_UNIFORM_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if extra_info["index"] % 2 == 0:
        return 0.0
    return float(sum(map(ord, solution_str)) % 7) / 6.0
'''

# With data.shuffle=false step 1 sees prompts 0-3 (cost 1 > limit 0.5), step 2 prompts 4-7 (cost 0).
STEPPED_COST = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if extra_info["index"] < 4 else 0.0
'''


@pytest.fixture
def reward_model_dir(tiny_llama_dir, tmp_path):
    """A randomly initialised one-label LlamaForSequenceClassification (the format of
    `hybridflow rm`), from the tiny Llama's config; its vocabulary covers the built-in model's."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(tiny_llama_dir, num_labels=1)
    config.pad_token_id = 0
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "rm")
    return tmp_path / "rm"


@pytest.fixture
def reward_file(tmp_path):
    def write(text: str, name: str = "reward.py") -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


def _train(cfg) -> tuple[RLTrainer, list[dict], set[str]]:
    """Two steps; the trainer (closed), its metrics records and the roles it ran."""
    with RLTrainer(cfg) as trainer:
        result = trainer.train(steps=2)
        roles = set(trainer.groups)
    records = rl_records(result.run_dir)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert_finite(record)
    return trainer, records, roles


@pytest.mark.parametrize("name, extra", [
    ("rloo", ["actor.loss.policy.loss_mode=gspo", "actor.loss.policy.clip_ratio_low=0.0003",
              "actor.loss.policy.clip_ratio_high=0.0004", "actor.loss.policy.loss_agg_mode=seq-mean-token-mean"]),
    pytest.param("reinforce_plus_plus", ["actor.loss.policy.loss_mode=cispo"], marks=pytest.mark.extended),
    pytest.param("reinforce_plus_plus_baseline", [], marks=pytest.mark.extended),
    pytest.param("drgrpo", [], marks=pytest.mark.extended),
    ("remax", ["reward_model.add_rule_reward=true"]),  # and the reward model's score added to the rule's
])
def test_critic_free_algorithms_two_steps(ray_local, tiny_config, reward_file, reward_model_dir, name, extra):
    if name == "remax":
        extra = [*extra, f"reward_model.path={reward_model_dir}"]
    cfg = tiny_config(f"algorithm.name={name}", f"reward.custom_fn_path={reward_file(VARIED_REWARD)}", *extra)
    trainer, records, roles = _train(cfg)
    assert roles == ({"actor", "reward_model"} if name == "remax" else {"actor"})
    saved = trainer.config
    assert saved.algorithm.adv_estimator == ("grpo" if name == "drgrpo" else name)
    for record in records:
        assert {"adv/mean", "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "timing_s/update_actor"} <= set(record)
        assert "critic/vf_loss" not in record
    # The reward varies within groups, so the policy gradient is not zero.
    assert any(r["adv/max"] > 0 for r in records)
    if name == "drgrpo":  # the name's presets reach the actor and the estimator
        assert saved.actor.loss.policy.loss_agg_mode == "seq-mean-token-sum-norm"
        assert saved.algorithm.norm_adv_by_std_in_grpo is False
    if name == "remax":  # the greedy baseline, scored by the rule-based function plus the reward model
        for key in ("remax/baseline_mean", "timing_s/greedy_baseline", "reward/errors", "reward/model_score_mean"):
            assert all(key in r for r in records), key


def test_dapo_dynamic_sampling_fills_the_batch_with_informative_groups(ray_local, tiny_config, reward_file):
    cfg = tiny_config("algorithm.name=dapo", "rollout.n=4", f"reward.custom_fn_path={reward_file(HALF_UNIFORM_REWARD)}")
    trainer, records, _ = _train(cfg)
    assert trainer.config.actor.loss.policy.clip_ratio_high == 0.28  # clip-higher preset
    for record in records:
        # Half of each round's 4 prompts are uniform: at least 2 rounds to keep 4 groups.
        assert record["dapo/rounds"] > 1 and record["dapo/cap_hit"] == 0
        assert record["dapo/trained_groups"] == cfg.data.train_batch_size
        assert record["dapo/generated_groups"] == 4 * record["dapo/rounds"]
        assert record["dapo/kept_groups"] >= cfg.data.train_batch_size
        assert "dapo/overlong_penalty_mean" in record and record["dapo/overlong_penalty_mean"] <= 0


def test_safe_rlhf_multiplier_rises_above_the_cost_limit_and_falls_below(ray_local, tiny_config, reward_file):
    cfg = tiny_config(
        "algorithm.name=safe_rlhf", "data.shuffle=false", f"reward.custom_fn_path={reward_file(VARIED_REWARD)}",
        f"cost_model.custom_fn_path={reward_file(STEPPED_COST, 'cost.py')}",
        "algorithm.safe_rlhf.cost_limit=0.5", "algorithm.safe_rlhf.lambda_init=1.0", "algorithm.safe_rlhf.lambda_lr=0.5",
    )
    trainer, (first, second), roles = _train(cfg)
    assert roles == {"actor", "critic", "cost_critic"}
    assert first["cost/mean"] == 1.0 and second["cost/mean"] == 0.0
    # ln lambda += lr * lambda * (cost - limit): 1 -> e^0.25, then down by lr * lambda * 0.5.
    assert first["safe_rlhf/lambda"] == pytest.approx(math.exp(0.25))
    assert second["safe_rlhf/lambda"] == pytest.approx(math.exp(0.25 - 0.25 * math.exp(0.25)))
    assert trainer.state.state_dict()["lagrange"]["log_value"] == pytest.approx(math.log(second["safe_rlhf/lambda"]))
    for record in (first, second):
        for key in ("critic/vf_loss", "cost_critic/vf_loss", "timing_s/cost_values", "timing_s/update_cost_critic",
                    "perf/critic_update_tokens_per_s", "perf/cost_critic_update_tokens_per_s",
                    "timing_s/update_cost_critic_in_worker"):
            assert key in record, key
        assert not [key for key in record if "cost_cost" in key]


def test_ppo_with_a_reward_model_as_the_reward(ray_local, tiny_config, reward_model_dir):
    cfg = tiny_config("algorithm.name=ppo", f"reward_model.path={reward_model_dir}")
    _, records, roles = _train(cfg)
    assert roles == {"actor", "critic", "reward_model"}
    for record in records:
        # The reward is the model's score alone: the rule-based function was not called.
        assert record["score/mean"] == pytest.approx(record["reward/model_score_mean"], abs=1e-5)
        assert "reward/errors" not in record


@pytest.mark.extended  # Safe-RLHF's mechanism: test_safe_rlhf_multiplier_rises_above_the_cost_limit_and_falls_below
def test_safe_rlhf_with_a_reward_model_and_a_cost_model(ray_local, tiny_config, reward_model_dir, tmp_path):
    import shutil

    cost_model_dir = shutil.copytree(reward_model_dir, tmp_path / "cost_model")
    cfg = tiny_config(
        "algorithm.name=safe_rlhf", f"reward_model.path={reward_model_dir}", f"cost_model.path={cost_model_dir}",
        "algorithm.safe_rlhf.cost_limit=0.0", "algorithm.safe_rlhf.lambda_init=1.0", "algorithm.safe_rlhf.lambda_lr=0.5",
    )
    _, records, roles = _train(cfg)
    assert roles == {"actor", "critic", "cost_critic", "reward_model", "cost_model"}
    # The same model scores reward and cost, so the mean cost is the mean reward-model score,
    # and the multiplier follows ln lambda += lr * lambda * (mean cost - limit) from 1.
    log_lambda = 0.0
    for record in records:
        assert record["cost/mean"] == pytest.approx(record["reward/model_score_mean"], abs=1e-5)
        log_lambda += 0.5 * math.exp(log_lambda) * record["cost/mean"]
        assert record["safe_rlhf/lambda"] == pytest.approx(math.exp(log_lambda), rel=1e-5)
