"""The dict / YAML API of environment tasks: the documented quick-start dict, flat and dotted
keys, case-insensitive choices, errors that name the closest key, size checks, and the
`steps` argument of train()."""

from __future__ import annotations

import pytest

from hybridflow.config import ConfigError
from hybridflow.config.env_schema import env_config_from_dict, load_env_config
from hybridflow.config.loader import user_tree
from hybridflow.config.tasks import read_task_config, task_kind_of
from hybridflow.trainer.entry import as_steps
from hybridflow.trainer.env.groups import runner_node_counts

QUICK_START = {
    "algorithm": "PPO",
    "env": "CustomEnv",
    "policy": {"hidden_size": [1024, 512], "activation": "gelu"},
    "distributed": {"num_workers": 8, "placement_strategy": "spread"},
}


def test_the_documented_dict_builds_and_fills_the_algorithm_defaults():
    cfg = env_config_from_dict(QUICK_START)
    assert (cfg.algorithm.name, cfg.env.id, cfg.name) == ("ppo", "CustomEnv", "CustomEnv-ppo")
    assert cfg.policy.hidden_size == [1024, 512] and cfg.policy.activation == "gelu" and cfg.policy.ortho_init
    assert cfg.distributed.num_workers == 8 and cfg.distributed.placement_strategy == "spread"
    sac = env_config_from_dict({"algorithm": "Sac", "env": {"id": "Pendulum-v1"}})
    assert sac.policy.hidden_size == [256, 256] and sac.policy.activation == "relu" and not sac.policy.ortho_init


def test_dotted_keys_merge_with_sections_and_choices_fold_case():
    cfg = env_config_from_dict({"env": "CartPole-v1", "env.num_envs": 4, "ppo.lr": 1e-3,
                                "ppo": {"epochs": 3}, "distributed": {"placement_strategy": "STRICT_SPREAD",
                                                                      "sampling": "Async"}})
    assert cfg.env.num_envs == 4 and cfg.ppo.lr == 1e-3 and cfg.ppo.epochs == 3
    assert cfg.distributed.placement_strategy == "strict_spread" and cfg.distributed.sampling == "async"


@pytest.mark.parametrize(("tree", "match"), [
    ({"algorithm": "dqn", "env": "x"}, r"algorithm.name: 'dqn' is not a registered algorithm\. Registered: .*sac"),
    ({"env": "x", "polcy": {}}, r"polcy: unknown config key; did you mean 'policy'"),
    ({"env": "x", "policy": {"hidden_sizes": [8]}}, r"policy.hidden_size"),
    ({"env": "x", "distributed": {"num_worker": 2}}, r"did you mean 'num_workers'"),
    ({"env": "x", "policy": {"activation": "swish"}}, r"policy.activation"),
    ({"env": "x", "ppo": {"gamma": 1.5}}, r"ppo.gamma: must be in \[0, 1\]"),
    ({"env": "x", "ppo": {"minibatch_size": 100}}, r"ppo.minibatch_size: 100 does not divide the batch of 128"),
    ({"env": "x", "distributed": {"num_workers": 0, "sampling": "async"}}, r"distributed.sampling"),
    ({"env": "x", "distributed": {"num_workers": -1}}, r"distributed.num_workers: must be >= 0"),
    # PPO settings that would fail in the first update (clip_value 0), or train silently wrong:
    # a negative max_grad_norm flips the gradient, a negative target_kl ends every update after one epoch.
    ({"env": "x", "ppo": {"clip_value": 0}}, r"ppo.clip_value: must be > 0 or null \(off\), got 0"),
    ({"env": "x", "ppo": {"max_grad_norm": -1}}, r"ppo.max_grad_norm: must be > 0 or null \(off\)"),
    ({"env": "x", "ppo": {"target_kl": -0.1}}, r"ppo.target_kl: must be > 0 or null \(off\)"),
    ({"env": "x", "ppo": {"vf_coef": -0.5}}, r"ppo.vf_coef: must be >= 0"),
    ({"env": "x", "ppo": {"clip_ratio": 1.5}}, r"ppo.clip_ratio: must be in \(0, 1\)"),
    # The checkpoint and logger keys are the LM trainer's own (config/sections/trainer.py LoopSection),
    # checked the same way: an unknown or repeated logger, no checkpoints kept.
    ({"env": "x", "trainer": {"loggers": ["jsonl", "csv"]}}, r"trainer.loggers: must be distinct names from"),
    ({"env": "x", "trainer": {"loggers": ["jsonl", "jsonl"]}}, r"trainer.loggers: must be distinct names from"),
    ({"env": "x", "trainer": {"keep_last_checkpoints": 0}}, r"trainer.keep_last_checkpoints: must be >= 1"),
    # The run name becomes the run directory's name, as in language-model runs.
    ({"env": "x", "name": "a/b"}, r"^name: must be a non-empty directory-safe word, got 'a/b'"),
    ({"env": "x", "name": ""}, r"^name: must be a non-empty directory-safe word"),
    ({"env": "x", "env.kwargs": 3}, r"^env.kwargs: expected a mapping, got 3"),
])
def test_bad_dicts_name_the_key_and_the_fix(tree, match):
    with pytest.raises(ConfigError, match=match):
        env_config_from_dict(tree)


def test_yaml_files_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm: SAC\nenv: Pendulum-v1\nsac:\n  batch_size: 64\n")
    cfg = load_env_config(path, ["sac.lr=0.001", "trainer.total_env_steps=5000"])
    assert (cfg.algorithm.name, cfg.env.id, cfg.sac.batch_size, cfg.sac.lr) == ("sac", "Pendulum-v1", 64, 1e-3)
    assert task_kind_of(user_tree(path)).name == "environment"
    assert task_kind_of({"trainer": {"total_steps": 3}}).name == "language_model"


def test_env_tasks_are_told_apart_from_language_model_configs():
    assert task_kind_of(QUICK_START).name == task_kind_of({"env.id": "CartPole-v1"}).name == "environment"
    assert task_kind_of({"algorithm": {"name": "grpo"}, "trainer": {"total_steps": 2}}).name == "language_model"


@pytest.mark.parametrize(("tree", "message"), [
    # An environment task's key without `env` was "sac: unknown config key; did you mean 'actor'?"
    ({"algorithm": "sac", "sac": {"tau": 0.1}},
     "sac: is a key of 'environment' configs, and this config is of kind 'language_model' (it names no 'env'): "
     "set env or drop sac"),
    ({"env": "x", "actor.optim.lr": 1e-5},
     "actor: is a key of 'language_model' configs, and this config is of kind 'environment' (it names 'env'): "
     "drop actor"),
])
def test_a_key_of_the_other_task_kind_says_which_kind_the_config_is(tree, message):
    with pytest.raises(ConfigError) as info:
        read_task_config(tree)
    assert str(info.value) == message


def test_train_steps_accept_ints_and_integral_floats_only():
    assert as_steps(1e6) == 1_000_000 and as_steps(300) == 300
    with pytest.raises(ValueError, match="whole number"):
        as_steps(1.5)
    with pytest.raises(ValueError, match=">= 1"):
        as_steps(0)
    with pytest.raises(TypeError, match="integral float"):
        as_steps("100")


def test_placement_strategies_map_onto_nodes():
    assert runner_node_counts(8, "pack", 3) == [8]
    assert runner_node_counts(8, "spread", 1) == [8]  # spreading is a preference
    assert runner_node_counts(8, "spread", 3) == [3, 3, 2]
    assert runner_node_counts(2, "strict_spread", 2) == [1, 1]
    with pytest.raises(ConfigError, match="strict_spread puts each of the 8 env runners on its own node"):
        runner_node_counts(8, "strict_spread", 1)


def test_rl_trainer_decides_the_task_kind_once_from_the_declared_rows(tmp_path):
    # The language-model side of a dict is the same tree builder as a YAML file's
    # (constructing that trainer is covered by the LM tests, which all go through
    # hybridflow.RLTrainer).
    import hybridflow
    from hybridflow.config.schema import RunConfig, run_config_from_tree
    from hybridflow.trainer.env.part import EnvironmentPart

    lm = {"trainer": {"output_dir": str(tmp_path / "lm"), "total_steps": 1}, "algorithm.name": "rloo"}
    assert task_kind_of(lm).name == "language_model"
    cfg = run_config_from_tree(lm)
    assert isinstance(cfg, RunConfig) and (cfg.trainer.total_steps, cfg.algorithm.name) == (1, "rloo")
    with hybridflow.RLTrainer({"env": "CartPole-v1", "trainer.output_dir": str(tmp_path / "env")}) as env:
        assert env.kind.name == "environment" and isinstance(env.task.part, EnvironmentPart)
        assert env.config.env.id == "CartPole-v1"  # the task's attributes read through
    # A misspelt top-level key is refused before any kind is decided (it would otherwise
    # silently make a language-model run out of an environment task).
    with pytest.raises(ConfigError, match="did you mean trainer") as info:
        hybridflow.RLTrainer({"trainr": {"total_steps": 1}})
    assert info.value.key == "trainr"
    with pytest.raises(ConfigError) as info:
        hybridflow.RLTrainer({"algorithm": "PPO", "enviroment": "CartPole-v1"})
    assert str(info.value) == "enviroment: unknown key; did you mean env?"
    # resume=False is a fresh run for every kind (an environment task raised "expected str, bytes or
    # os.PathLike object, not bool"; a language-model run "resume=False is not a checkpoint to resume").
    fresh = {"env": "CartPole-v1", "trainer.output_dir": str(tmp_path / "fresh")}
    with hybridflow.RLTrainer(fresh, resume=False) as env:
        assert env.resumed_from is None and env.run_dir.parent == tmp_path / "fresh"


def test_language_model_placement_keys_are_refused_for_environment_tasks():
    # Environment tasks have no resources section: the keys are refused with what to use
    # instead, not as an unknown key. (Restarts are every kind's: trainer.max_restarts.)
    with pytest.raises(ConfigError, match="is a key of 'language_model' configs") as info:
        env_config_from_dict({"algorithm": "ppo", "env": "CartPole-v1", "resources": {"nodes": 2}})
    assert info.value.key == "resources" and "distributed.placement_strategy" in str(info.value)
    assert env_config_from_dict({"env": "CartPole-v1", "trainer.max_restarts": 1}).trainer.max_restarts == 1
