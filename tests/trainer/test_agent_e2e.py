"""GRPO, PPO and DAPO, unchanged, on a multi-turn task: 2 steps each on 2 Ray ranks (GRPO also
on the hf rollout backend and with generation tensor parallelism t_g = 2); and the learned
reward model as a weighted reward template.

The task is the built-in `guess_number` environment (target: the arithmetic row's answer,
answers "higher"/"lower"), played by a tiny character model whose turns end after a few
tokens (`turn_model_dir`), with the async agent loop behind `generate_sequences` and
3D-HybridEngine resharding every step. The run must record multi-turn metrics and
finite losses; PPO's critic and GAE see the interleaved response_mask.
"""

from __future__ import annotations

import pytest

from hybridflow import RLTrainer
from trainer_helpers import assert_finite, rl_records


def _guess_number_config(tiny_config, turn_model_dir, *extra: str):
    return tiny_config(
        f"model.path={turn_model_dir}", "rollout.response_length=40", "rollout.agent.enable=true",
        "rollout.agent.default_env=guess_number", "rollout.agent.env_kwargs={low: 0, high: 200}", *extra)


def _train_two_steps(cfg) -> tuple[list[dict], set[str]]:
    """Two steps: the metrics records (finite, multi-turn) and the roles that ran."""
    with RLTrainer(cfg) as trainer:
        result = trainer.train(steps=2)
        roles = set(trainer.groups)
    records = rl_records(result.run_dir)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert_finite(record)
        assert record["agent/num_turns_mean"] > 1.0  # the environment answered and the model went on
        assert record["agent_loop/loop_s"] > 0.0  # the loop's own timings reach the logs (slowest rank)
    return records, roles


@pytest.mark.parametrize("algorithm, backend", [("grpo", "native"), pytest.param("ppo", "native", marks=pytest.mark.extended),
                                                pytest.param("grpo", "hf", marks=pytest.mark.extended)])
def test_multi_turn_training_runs_two_steps(algorithm, backend, tiny_config, turn_model_dir, ray_local):
    """hf: transformers' generate, each turn regenerated from the prefix (regen_turns.py)."""
    cfg = _guess_number_config(tiny_config, turn_model_dir, f"algorithm.name={algorithm}", f"rollout.name={backend}",
                               "rollout.agent.max_turns=4", "rollout.temperature=0.5")
    records, _ = _train_two_steps(cfg)
    assert any(k.startswith("agent/stop_") for k in records[0])


def test_grpo_multi_turn_with_tensor_parallel_generation(tiny_config, tmp_path, ray_local):
    """t_g = 2 on the 2 ranks: one generation group runs the agent loop in lockstep
    (envs/agent/lockstep.py), environments on its rank 0; weights reach the TP layout
    through the 3D-HybridEngine resharding every step."""
    from hybridflow.envs.agent.demo import TINY_SIZES, make_turn_model_dir

    model = make_turn_model_dir(tmp_path / "tp_turn_model", **{**TINY_SIZES, "num_key_value_heads": 2})
    cfg = _guess_number_config(tiny_config, model, "algorithm.name=grpo", "rollout.tensor_model_parallel_size=2",
                               "rollout.agent.max_turns=4", "rollout.temperature=0.5")
    records, _ = _train_two_steps(cfg)
    assert any(k.startswith("agent/stop_") for k in records[0])


@pytest.fixture
def turn_reward_model_dir(turn_model_dir, tmp_path):
    """A random one-label sequence classifier on the turn model's config (same vocabulary)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(turn_model_dir, num_labels=1)
    config.pad_token_id = 0
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "rm")
    return tmp_path / "rm"


def test_reward_model_is_a_weighted_template_beside_rule_templates(tiny_config, turn_model_dir,
                                                                   turn_reward_model_dir, ray_local):
    """reward.templates names reward_model (weight 0.5) and numeric_match (weight 2): the
    step's score is 0.5 x the model's score + 2 x the match, plus the env's turn rewards."""
    cfg = _guess_number_config(
        tiny_config, turn_model_dir, f"reward_model.path={turn_reward_model_dir}", "rollout.agent.max_turns=3",
        "reward.templates=[{name: reward_model, weight: 0.5}, {name: numeric_match, weight: 2.0}]")
    records, roles = _train_two_steps(cfg)
    assert roles == {"actor", "reward_model"}
    for record in records:
        assert record["template/reward_model"] == pytest.approx(0.5 * record["reward/model_score_mean"], abs=1e-6)
        assert record["reward/model_score_mean"] != 0.0
        want = record["template/reward_model"] + record["template/numeric_match"] + record["reward/env_mean"]
        assert record["score/mean"] == pytest.approx(want, abs=1e-5)


# Even rows: every sample scores 0 (a uniform group, which dynamic sampling drops).
HALF_UNIFORM_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if extra_info["index"] % 2 == 0:
        return 0.0
    return float(sum(map(ord, solution_str)) % 7) / 6.0
'''


@pytest.mark.extended  # dynamic sampling: test_algorithms_e2e.py; multi-turn: test_multi_turn_training_runs_two_steps
def test_dapo_dynamic_sampling_on_a_multi_turn_task(tiny_config, turn_model_dir, ray_local, tmp_path):
    """DAPO generates more prompts (more agent-loop rounds) until the batch holds
    train_batch_size informative groups, on the multi-turn guess_number task."""
    reward = tmp_path / "reward.py"
    reward.write_text(HALF_UNIFORM_REWARD)
    cfg = _guess_number_config(tiny_config, turn_model_dir, "algorithm.name=dapo", "rollout.n=4",
                               f"reward.custom_fn_path={reward}", "rollout.agent.max_turns=3", "rollout.temperature=0.8")
    records, _ = _train_two_steps(cfg)
    for record in records:
        # Half of each round's prompts are uniform: at least 2 rounds to keep train_batch_size groups.
        assert record["dapo/rounds"] > 1 and record["dapo/cap_hit"] == 0
        assert record["dapo/trained_groups"] == cfg.data.train_batch_size
