"""verl's example scripts and a TRL GRPO setup run here: one RL step each, in this process
(RLTrainer, one Ray for all), with only what differs between their machines and this one
swapped (compat_helpers.for_this_machine: the model path, the data files, the device counts)
and the sizes of one small step appended as verl keys (compat_helpers.one_small_step).

Six of verl's scripts (GRPO on GSM8K and MATH, PPO with a critic, the DAPO recipe's run,
REINFORCE++, RLOO, ReMax); DAPO's dynamic sampling gets a reward file with partial credit
(tests/config/data/verl_reward: verl's reward-function shape, dispatching on data_source, its
scorers imported from the files beside it) so a random tiny model's groups differ.

    .venv/bin/python -m pytest -q tests/config/test_verl_files.py     # slow: 4.3 min at load 11-15 on 2 cores
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from compat_helpers import PARTIAL_CREDIT, for_this_machine, one_small_step, tiny_model, verl_data, verl_overrides

from hybridflow import RLTrainer
from hybridflow.config.loader import with_overrides
from hybridflow.data.records import write_records
from hybridflow.rewards import load_reward_fn
from hybridflow.trainer.run.run_dir import read_metrics

pytestmark = pytest.mark.slow

# example -> (algorithm.name it runs, whether it trains a critic)
RUNS = {"grpo_gsm8k_math": ("grpo", False), "ppo_gsm8k": ("ppo", True), "dapo_gsm8k": ("dapo", False),
        "reinforce_plus_plus_gsm8k_math": ("reinforce_plus_plus", False), "rloo_gsm8k": ("rloo", False),
        "remax_gsm8k": ("remax", False)}


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    root = tmp_path_factory.mktemp("verl")
    return {"model": tiny_model(root / "model"), "data": verl_data(root / "data"), "root": root}


# make test runs one example as written (every example's translation: test_compat_verl.py); the rest: extended
@pytest.mark.parametrize("name", [n if n == "grpo_gsm8k_math"
                                  else pytest.param(n, marks=pytest.mark.extended) for n in RUNS])
def test_a_verl_example_runs_one_step_as_written(name, machine, ray_local, monkeypatch, capfd):
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the scripts log to W&B: offline, nothing sent
    run_dir = machine["root"] / f"run-{name}"
    overrides = for_this_machine(verl_overrides(name), machine["model"], machine["data"])
    overrides += one_small_step(overrides, run_dir) + (PARTIAL_CREDIT if name.startswith("dapo") else [])
    with RLTrainer(with_overrides({}, overrides)) as trainer:
        result = trainer.train()
    assert result.steps == 1
    notice = capfd.readouterr().err
    assert "verl config:" in notice and "-> actor.micro_batch.mini_batch_size=" in notice
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())  # the native keys it ran with
    given = dict(item.lstrip("+").split("=", 1) for item in overrides)
    algorithm, critic = RUNS[name]
    assert saved["algorithm"]["name"] == algorithm and saved["trainer"]["total_steps"] == 1
    assert saved["actor"]["micro_batch"]["mini_batch_size"] == \
        int(given["actor_rollout_ref.actor.ppo_mini_batch_size"]) * int(given.get("actor_rollout_ref.rollout.n", 1))
    records = read_metrics(run_dir / "metrics.jsonl")
    [step] = [r for r in records if r["phase"] == "rl"]
    assert step["critic/score/mean"] == step["score/mean"] and step["training/global_step"] == 1  # verl's names too
    assert ("critic/vf_loss" in step) == critic
    evals = [r for r in records if r["phase"] == "eval"]
    assert evals and all(any(k.startswith("val-core/") and k.endswith("/reward/mean@1") for k in r) for r in evals)
    if name.startswith("dapo"):
        assert step["dapo/trained_groups"] == int(given["data.train_batch_size"]) and step["score/max"] > 0


def test_a_trl_grpo_setup_runs_one_step(machine, ray_local, tmp_path, capfd):
    """GRPOConfig's names, TRL reward functions (passed as the functions) and a TRL data set
    (chat-message prompts, a `solution` column, no data_source)."""
    rewards = machine["root"].parent / "trl_rewards"
    rewards.mkdir(exist_ok=True)
    source = (Path(__file__).parent / "data" / "trl" / "rewards.py").read_text()
    (rewards / "rewards.py").write_text(source)
    funcs = [load_reward_fn(rewards / "rewards.py", n).resolve() for n in ("accuracy_reward", "format_reward")]
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {a}?"}], "solution": str(2 * a)} for a in range(16)]
    data = write_records(rows, tmp_path / "train.jsonl")
    trl = {"model": str(machine["model"]), "train_dataset": str(data), "reward_funcs": funcs,
           "reward_weights": [1.0, 0.5],
           "num_generations": 4, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2,
           "max_completion_length": 32, "max_prompt_length": 64, "beta": 0.04, "learning_rate": 1e-6,
           "loss_type": "dr_grpo", "scale_rewards": False, "epsilon": 0.2, "num_iterations": 1, "max_steps": 1,
           "output_dir": str(tmp_path / "out")}
    with RLTrainer({"trl": trl}) as trainer:
        result = trainer.train()
    assert result.steps == 1 and "TRL config:" in capfd.readouterr().err
    saved = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert saved["data"]["train_batch_size"] == 4 and saved["rollout"]["n"] == 4  # 8 x 1 rank x 2 / 4
    assert saved["actor"]["micro_batch"]["mini_batch_size"] == 16 and saved["actor"]["loss"]["kl_loss_type"] == "k3"
    assert saved["reward"]["custom_fn_name"] == ["accuracy_reward", "format_reward"]
    [step] = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()
              if json.loads(line)["phase"] == "rl"]
    assert step["reward/errors"] == 0 and "reward_fn/format_reward" in step
    parts = step["reward_fn/accuracy_reward"] + 0.5 * step["reward_fn/format_reward"]
    assert step["score/mean"] == pytest.approx(parts)
