"""GRPO and PPO, unchanged, on a multi-turn task: 2 steps each on 2 Ray ranks.

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


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_multi_turn_training_runs_two_steps(algorithm, tiny_config, turn_model_dir, ray_local):
    cfg = tiny_config(
        f"algorithm.name={algorithm}", f"model.path={turn_model_dir}", "rollout.response_length=40",
        "rollout.agent.enable=true", "rollout.agent.default_env=guess_number", "rollout.agent.max_turns=4",
        "rollout.agent.env_kwargs={low: 0, high: 200}", "rollout.temperature=0.5",
    )
    with RLTrainer(cfg) as trainer:
        result = trainer.train(steps=2)
    records = rl_records(result.run_dir)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert_finite(record)
        assert record["agent/num_turns_mean"] > 1.0  # the environment answered and the model went on
    assert any(k.startswith("agent/stop_") for k in records[0])
