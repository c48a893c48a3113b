"""TRL's GRPO settings read as hybridflow's (config/compat/trl.py): GRPOConfig's names under a
`trl:` section, with TRL's meaning and units (its batch arithmetic, optimizer steps, losses).

    .venv/bin/python -m pytest -q tests/config/test_compat_trl.py
"""

from __future__ import annotations

import pytest

from hybridflow.config import ConfigError
from hybridflow.config.compat import translate_tree
from hybridflow.config.compat.engine import leaves
from hybridflow.config.schema import run_config_from_tree


def accuracy_reward(completions, solution, **kwargs):
    """A TRL reward function (module level: recorded by its import path)."""
    return [float(c[0]["content"].strip() == s) for c, s in zip(completions, solution)]


def format_reward(completions, **kwargs):
    return [0.5 for _ in completions]


def native_of(trl: dict, **native) -> dict:
    tree, reports = translate_tree({"trl": trl, **native})
    assert [r.dialect for r in reports] == ["TRL"]
    return dict(leaves(tree))


def test_batch_sizes_follow_trls_arithmetic():
    """A generation batch of per_device x ranks x steps_per_generation completions is that /
    num_generations prompts; an optimizer step takes per_device x ranks x accumulation."""
    native = native_of({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_generations": 4},
                       resources={"world_size": 2})
    assert native["data.train_batch_size"] == 4 * 2 * 2 // 4 and native["rollout.n"] == 4
    assert native["actor.micro_batch.mini_batch_size"] == 4 * 2 * 2
    assert native["actor.micro_batch.micro_batch_size_per_device"] == 4
    longer = native_of({"per_device_train_batch_size": 4, "num_generations": 4, "steps_per_generation": 4})
    assert longer["data.train_batch_size"] == 4 and longer["actor.micro_batch.mini_batch_size"] == 4  # 4 updates
    assert longer["resources.world_size"] == 1  # per-device sizes count per rank: one CPU rank, said
    assert native_of({"per_device_train_batch_size": 2, "num_generations": 2, "generation_batch_size": 8}) \
        ["data.train_batch_size"] == 4


def test_trls_defaults_fill_the_batch_sizes_not_given():
    native = native_of({"learning_rate": 5e-6})
    sizes = ("data.train_batch_size", "rollout.n", "actor.micro_batch.mini_batch_size")
    assert tuple(native[k] for k in sizes) == (1, 8, 8)
    assert native["data.prompt.apply_chat_template"] == "conversational"
    assert native["data.prompt.default_data_source"] == "dataset"
    mine = native_of({"learning_rate": 5e-6}, data={"train_batch_size": 8}, rollout={"n": 4})
    assert mine["data.train_batch_size"] == 8 and mine["rollout.n"] == 4  # hybridflow's own sizes are kept


def test_optimizer_steps_become_generations():
    native = native_of({"max_steps": 10, "num_iterations": 2, "save_steps": 4, "num_generations": 2})
    assert native["trainer.total_steps"] == 5 and native["actor.micro_batch.epochs"] == 2
    assert native["trainer.save_freq"] == 2
    with pytest.raises(ConfigError, match=r"^trl\.max_steps: 9 optimizer steps are not whole generations"):
        native_of({"max_steps": 9, "num_iterations": 2})


@pytest.mark.parametrize("trl, expected", [
    ({"beta": 0.04}, {"actor.loss.use_kl_loss": True, "actor.loss.kl_loss_coef": 0.04,
                      "actor.loss.kl_loss_type": "k3"}),
    ({"beta": 0.0}, {"actor.loss.use_kl_loss": False}),
    ({"epsilon": 0.1}, {"actor.loss.policy.clip_ratio_low": 0.1, "actor.loss.policy.clip_ratio_high": 0.1}),
    ({"epsilon": 0.2, "epsilon_high": 0.28}, {"actor.loss.policy.clip_ratio_low": 0.2,
                                              "actor.loss.policy.clip_ratio_high": 0.28}),
    ({"loss_type": "grpo"}, {"actor.loss.policy.loss_agg_mode": "seq-mean-token-mean"}),
    ({"loss_type": "dapo"}, {"actor.loss.policy.loss_agg_mode": "token-mean"}),
    ({"loss_type": "bnpo"}, {"actor.loss.policy.loss_agg_mode": "token-mean"}),
    ({"loss_type": "dr_grpo", "max_completion_length": 256},
     {"actor.loss.policy.loss_agg_mode": "seq-mean-token-sum-norm", "actor.loss.loss_scale_factor": 256.0}),
    ({"scale_rewards": False}, {"algorithm.norm_adv_by_std_in_grpo": False}),
    ({"scale_rewards": "group"}, {"algorithm.norm_adv_by_std_in_grpo": True}),
    ({"importance_sampling_level": "sequence"}, {"actor.loss.policy.loss_mode": "gspo"}),
    ({"max_prompt_length": 64}, {"data.prompt.max_prompt_length": 64, "data.prompt.truncation": "left",
                                 "data.prompt.filter_overlong_prompts": False}),
    ({"max_completion_length": 32, "temperature": 0.9, "top_k": 0}, {"rollout.response_length": 32,
                                                                      "rollout.temperature": 0.9, "rollout.top_k": -1}),
    ({"learning_rate": 3e-6, "max_grad_norm": 0.5, "weight_decay": 0.0, "adam_beta2": 0.99},
     {"actor.optim.lr": 3e-6, "actor.optim.grad_clip": 0.5, "actor.optim.weight_decay": 0.0,
      "actor.optim.betas": [0.9, 0.99]}),
    ({"num_train_epochs": 2}, {"trainer.total_epochs": 2, "trainer.total_steps": None}),
    ({"report_to": "wandb"}, {"trainer.loggers": ["console", "jsonl", "wandb"]}),
])
def test_grpo_config_names_keep_their_meaning(trl, expected):
    native = native_of(trl)
    assert {k: native[k] for k in expected} == expected


def test_reward_functions_and_their_weights():
    native = native_of({"reward_funcs": [accuracy_reward, format_reward], "reward_weights": [1.0, 0.5]})
    assert native["reward.custom_fn_path"] == __name__
    assert native["reward.custom_fn_name"] == ["accuracy_reward", "format_reward"]
    assert native["reward.custom_fn_weights"] == [1.0, 0.5]
    one = native_of({"reward_funcs": "rewards.py:accuracy"})
    assert (one["reward.custom_fn_path"], one["reward.custom_fn_name"]) == ("rewards.py", "accuracy")


def test_a_trl_config_validates_and_unknown_names_get_a_trl_hint():
    cfg = run_config_from_tree(translate_tree({"trl": {"num_generations": 4, "per_device_train_batch_size": 4,
                                                       "beta": 0.04, "max_completion_length": 16},
                                               "model": {"path": "/some/model"},
                                               "data": {"train_files": ["d.jsonl"]}})[0])
    assert cfg.use_reference and cfg.rollout.n == 4 and cfg.data.train_batch_size == 1
    with pytest.raises(ConfigError, match=r"^trl\.num_generation: unknown config key: not a TRL key; did you mean "
                                          r"trl\.num_generations"):
        translate_tree({"trl": {"num_generation": 4}})
    with pytest.raises(ConfigError, match=r"^trl\.scale_rewards: 'batch'"):
        translate_tree({"trl": {"scale_rewards": "batch"}})


def test_trl_and_verl_keys_in_one_config():
    tree, reports = translate_tree({"trl": {"beta": 0.04}, "actor_rollout_ref": {"rollout": {"n": 4}}})
    assert [r.dialect for r in reports] == ["verl", "TRL"]
    native = dict(leaves(tree))
    assert native["rollout.n"] == 4 and native["actor.loss.kl_loss_coef"] == 0.04
