"""One source of truth for config: every engine and advantage setting reaches the YAML,
the run's defaults are the workers' and the engine's, and every rule raises one error type
(ConfigError) naming the dotted key. No Ray, no models: config objects only."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import pytest

from hybridflow.algorithms import AdvantageConfig
from hybridflow.config import ConfigError, load_config
from hybridflow.config.rm_schema import load_rm_config
from hybridflow.config.schema import BUILTIN_MODEL_PRESETS, DEMO_PRESETS, RunConfig, load_run_config
from hybridflow.engines.train.config import (
    ActorLossConfig,
    CriticLossConfig,
    EngineSettings,
    TrainEngineConfig,
    TrainEngineSettings,
)
from hybridflow.workers.config import RolloutWorkerConfig

# A cosine schedule and a warmup ratio need optim.total_steps; set it for every engine case.
_ENGINE_BASE = ("optim.total_steps=10",)


def _leaves(cls: type, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, type hint, default) of every leaf setting of the dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        if dataclasses.is_dataclass(hints[f.name]):
            out += _leaves(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", hints[f.name], default))
    return out


def _other_value(hint: Any, default: Any) -> Any:
    """A valid value of type `hint` that differs from `default`, as YAML would give it."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return _other_value(args[0], default) if default is None else None
    if typing.get_origin(hint) is typing.Literal:
        return next(a for a in args if a != default)
    if hint is bool:
        return not default
    if hint is int:
        return (default or 0) + 1
    if hint is float:
        return 0.5 if default in (None, 0.0, 1.0) else default / 2
    if hint is str:
        return "eager"  # the one free-form engine string is attn_implementation
    if typing.get_origin(hint) is tuple:
        return [0.5, 0.75] if args[0] is float else ["q_proj"]
    raise AssertionError(f"no test value for {hint}")


ENGINE_LEAVES = [leaf for leaf in _leaves(TrainEngineConfig) if leaf[0] not in ("model_path", "seed")]


def test_the_engine_leaves_are_all_found():
    keys = {key for key, _, _ in ENGINE_LEAVES}
    assert {"dtype", "tp_size", "optim.lr", "optim.betas", "lora.target_modules", "micro_batch.epochs"} <= keys
    assert {key for key, _, _ in _leaves(TrainEngineSettings)} == keys  # the config adds only path and seed


@pytest.mark.parametrize("role", ["actor", "critic"])
@pytest.mark.parametrize("key, hint, default", ENGINE_LEAVES, ids=[leaf[0] for leaf in ENGINE_LEAVES])
def test_every_engine_setting_is_a_yaml_key_of_the_trained_roles(role, key, hint, default):
    value = _other_value(hint, default)
    if key == "optim.total_steps":
        value = 11
    extra = ["optim.warmup_steps=0"] if key == "optim.warmup_ratio" else []
    overrides = [f"{role}.{k}" for k in (*_ENGINE_BASE, *extra)] + [f"{role}.{key}={value}"]
    if key == "lora.rank":
        overrides = [f"{role}.lora.rank=4"]
    cfg = load_config(RunConfig, None, overrides)
    engine = getattr(cfg, role).engine_config("/model", seed=3)
    got = engine
    for part in key.split("."):
        got = getattr(got, part)
    assert got == (tuple(value) if isinstance(value, list) else (4 if key == "lora.rank" else value))
    assert (engine.model_path, engine.seed) == ("/model", 3)


FROZEN_LEAVES = _leaves(EngineSettings)


@pytest.mark.parametrize("key, hint, default", FROZEN_LEAVES, ids=[k for k, _, _ in FROZEN_LEAVES])
def test_every_frozen_engine_setting_is_a_yaml_key_of_the_scorers(key, hint, default):
    value = _other_value(hint, default)
    for role in ("reward_model", "cost_model"):
        cfg = load_config(RunConfig, None, [f"{role}.{key}={value}"])
        got = getattr(cfg, role).engine_config("/rm", seed=0)
        for part in key.split("."):
            got = getattr(got, part)
        assert got == value


@pytest.mark.parametrize("key", ["optim.lr", "lora.rank", "gradient_checkpointing", "optimizer_offload",
                                 "micro_batch.mini_batch_size", "micro_batch.micro_batch_size_per_device",
                                 "micro_batch.max_tokens_per_device", "micro_batch.epochs", "micro_batch.shuffle"])
def test_the_frozen_scorers_have_no_training_keys(key):
    for role in ("reward_model", "cost_model"):
        with pytest.raises(ConfigError, match="unknown config key") as err:
            load_run_config(None, [f"{role}.{key}=1"])
        # the loader names the first key that does not exist (micro_batch exists, its update keys not)
        want = key if key.startswith("micro_batch.") else key.split(".")[0]
        assert err.value.key == f"{role}.{want}"


ADVANTAGE_LEAVES = _leaves(AdvantageConfig)


@pytest.mark.parametrize("key, hint, default", ADVANTAGE_LEAVES, ids=[k for k, _, _ in ADVANTAGE_LEAVES])
def test_every_advantage_setting_is_a_yaml_key(key, hint, default):
    value = _other_value(hint, default)
    cfg = load_config(RunConfig, None, [f"algorithm.{key}={value}"])
    assert getattr(cfg.algorithm.advantage_config(), key) == value


def test_the_run_defaults_are_the_workers_and_engines_defaults():
    bare = RunConfig()
    assert bare.rollout == RolloutWorkerConfig()
    assert bare.actor.engine_config("/m", 0) == TrainEngineConfig(model_path="/m")
    assert bare.critic.engine_config("/m", 0) == TrainEngineConfig(model_path="/m")
    assert bare.reward_model.engine_config("/m", 0) == TrainEngineConfig(model_path="/m")
    assert (bare.actor.loss, bare.critic.loss) == (ActorLossConfig(), CriticLossConfig())
    assert bare.algorithm.advantage_config() == AdvantageConfig()


def test_a_run_of_your_own_model_and_data_gets_the_class_defaults():
    cfg = load_run_config(None, ["model.path=/models/mine", "data.train_files=[train.parquet]", "sft.steps=0",
                                 "rollout.n=4"])
    assert cfg.rollout == RolloutWorkerConfig(n=4)
    assert cfg.actor.engine_config("/m", 0) == TrainEngineConfig(model_path="/m")


def test_the_demo_keeps_its_values_from_one_preset_table():
    demo = load_run_config()
    presets = dict(DEMO_PRESETS) | dict(BUILTIN_MODEL_PRESETS)
    assert (demo.rollout.n, demo.rollout.response_length) == (8, 6)
    assert (demo.actor.optim.lr, demo.critic.optim.lr) == (1e-4, 1e-3)
    for key, value in presets.items():
        got: Any = demo
        for part in key.split("."):
            got = getattr(got, part)
        assert got == value, key
    # What the preset does not set stays the class default.
    assert (dataclasses.replace(demo.rollout, n=8, response_length=6, dtype="fp32")
            == RolloutWorkerConfig(n=8, response_length=6, dtype="fp32"))


def test_the_builtin_model_computes_in_fp32_and_a_model_directory_keeps_auto(tmp_path):
    assert (load_run_config().actor.dtype, load_run_config().rollout.dtype) == ("fp32", "fp32")
    cfg = load_run_config(None, ["actor.dtype=bf16"])  # the user's choice wins over the preset
    assert cfg.actor.dtype == "bf16" and cfg.rollout.dtype == "fp32"
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    assert load_run_config(None, [f"model.path={model_dir}"]).actor.dtype == "auto"


def test_a_preset_yields_to_any_key_the_user_sets_in_a_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("actor:\n  optim: {lr: 0.002}\nalgorithm: {name: drgrpo}\n")
    cfg = load_run_config(path)
    assert cfg.actor.optim.lr == 0.002  # the file's value
    assert cfg.actor.optim.weight_decay == dict(DEMO_PRESETS)["actor.optim.weight_decay"]  # a sibling keeps its preset
    assert cfg.actor.loss.policy.loss_agg_mode == "seq-mean-token-sum-norm"  # the algorithm's preset still applies


RUN_RULES = [
    # the engine's rules (EngineSettings / TrainEngineSettings), keyed under the role
    (["resources.world_size=2", "actor.tp_size=4"], "actor.tp_size"),
    (["resources.world_size=2", "algorithm.name=ppo", "critic.tp_size=4"], "critic.tp_size"),
    (["resources.world_size=2", "reward_model.path=/rm", "reward_model.tp_size=4"], "reward_model.tp_size"),
    (["actor.param_offload=true"], "actor.param_offload"),
    (["actor.optimizer_offload=true"], "actor.optimizer_offload"),
    (["algorithm.name=ppo", "critic.optimizer_offload=true"], "critic.optimizer_offload"),
    (["reward_model.path=/rm", "reward_model.param_offload=true"], "reward_model.param_offload"),
    (["resources.world_size=2", "actor.micro_batch.mini_batch_size=64",
      "actor.micro_batch.micro_batch_size_per_device=24"], "actor.micro_batch.micro_batch_size_per_device"),
    (["resources.world_size=4", "data.train_batch_size=4", "rollout.n=3", "algorithm.name=ppo",
      "actor.micro_batch.mini_batch_size=4", "actor.micro_batch.micro_batch_size_per_device=1",
      "critic.micro_batch.mini_batch_size=6", "critic.micro_batch.micro_batch_size_per_device=1"],
     "critic.micro_batch.mini_batch_size"),
    (["actor.micro_batch.epochs=0"], "actor.micro_batch.epochs"),
    (["actor.optim.lr=0"], "actor.optim.lr"),
    (["critic.optim.lr_schedule=cosine"], "critic.optim.total_steps"),
    (["actor.loss.use_kl_loss=true", "actor.loss.kl_loss_type=nope"], "actor.loss.kl_loss_type"),
    (["critic.loss.loss_agg_mode=nope"], "critic.loss.loss_agg_mode"),
    # the critic role's rule (check_role_engine)
    (["algorithm.name=ppo", "critic.lora.rank=4"], "critic.lora.rank"),
    # the rollout worker's rules
    (["rollout.seed=-1"], "rollout.seed"),
    (["rollout.matmul=fast"], "rollout.matmul"),
    (["resources.world_size=2", "rollout.tensor_model_parallel_size=4"], "rollout.tensor_model_parallel_size"),
    # cross-section rules
    (["actor.micro_batch.mini_batch_size=48"], "actor.micro_batch.mini_batch_size"),
    (["resources.world_size=2", "data.train_batch_size=3"], "data.train_batch_size"),
    (["resources.world_size=2", "sft.batch_size=51", "sft.micro_batch_size_per_device=1"], "sft.batch_size"),
    (["rollout.response_length=60"], "rollout.response_length"),
    # single sections of the run
    (["algorithm.lam=2"], "algorithm.lam"),
    (["algorithm.epsilon=0"], "algorithm.epsilon"),
    (["trainer.keep_last_checkpoints=0"], "trainer.keep_last_checkpoints"),
    (["trainer.validation.seed=-1"], "trainer.validation.seed"),
    (["resources.world_size=0"], "resources.world_size"),
    (["resources.critic_ranks=0"], "resources.critic_ranks"),
    (["data.builtin.num_val=0"], "data.builtin.num_val"),
    (["sft.builtin_carry_drop_rate=2"], "sft.builtin_carry_drop_rate"),
    (["model.pretrained=gpt-5"], "model.pretrained"),
    (["name=a/b"], "name"),
]


RM_RULES = [
    (["rm.engine.lora.rank=4"], "rm.engine.lora.rank"),  # the reward-model role's rule
    (["resources.world_size=2", "rm.engine.tp_size=4"], "rm.engine.tp_size"),
    (["rm.engine.param_offload=true"], "rm.engine.param_offload"),
    (["resources.world_size=2", "rm.engine.micro_batch.mini_batch_size=32",
      "rm.engine.micro_batch.micro_batch_size_per_device=32"], "rm.engine.micro_batch.micro_batch_size_per_device"),
    (["rm.data.batch_size=24"], "rm.data.batch_size"),
    (["rm.epochs=0"], "rm.epochs"),
    (["name=a/b"], "name"),
]


# `hybridflow rm` runs: its required data file and one rank, then the case's overrides.
RM_BASE = ["rm.data.train_files=[pairs.jsonl]", "resources.world_size=1"]
RULES = [(load_run_config, overrides, key) for overrides, key in RUN_RULES] + [
    (load_rm_config, RM_BASE + overrides, key) for overrides, key in RM_RULES]


@pytest.mark.parametrize("load, overrides, key", RULES,
                         ids=[f"{load.__name__}:{key}" for load, _, key in RULES])
def test_every_rule_raises_a_config_error_that_starts_with_its_key(load, overrides, key):
    with pytest.raises(ConfigError) as err:
        load(None, overrides)
    assert err.value.key == key, str(err.value)
    assert str(err.value).startswith(f"{key}: ")


def test_the_engine_and_worker_configs_raise_the_same_error_type():
    with pytest.raises(ConfigError) as err:
        TrainEngineConfig(model_path="")
    assert err.value.key == "model_path" and isinstance(err.value, ValueError)
    with pytest.raises(ConfigError) as err:
        RolloutWorkerConfig(max_num_seqs=0)
    assert err.value.key == "max_num_seqs"
