"""verl's configs read as hybridflow's (config/compat): verl's own key list and example
command lines translate key by key, nothing is dropped without a word, wrong keys and
clashing values are refused by name. No process starts here (test_verl_files.py runs them).

    .venv/bin/python -m pytest -q tests/config/test_compat_verl.py
"""

from __future__ import annotations

import yaml
import pytest
from compat_helpers import EXAMPLES, VERL, verl_overrides

from hybridflow.config import ConfigError
from hybridflow.config.compat import translate_foreign, translate_tree
from hybridflow.config.compat.engine import leaves
from hybridflow.config.compat.interpolate import resolve_references
from hybridflow.config.loader import with_overrides
from hybridflow.config.schema import run_config_from_tree
from hybridflow.config.tasks import read_task_config


def verl_tree(*overrides: str) -> dict:
    return with_overrides({}, list(overrides))


def native_of(*overrides: str) -> dict:
    """The native keys (dotted) a verl command line becomes."""
    tree, reports = translate_tree(verl_tree(*overrides))
    assert [r.dialect for r in reports] == ["verl"]
    return dict(leaves(tree))


def test_every_key_of_verls_trainer_config_has_a_row():
    """verl's ppo_trainer.yaml, every one of its keys as written: each is translated or named
    in the notice (with its value), none is dropped or unknown."""
    tree = yaml.safe_load((VERL / "ppo_trainer_generated.yaml").read_text())
    written = {k for k, _ in leaves(resolve_references(tree))}
    _, [report] = translate_tree(tree)
    accounted = {k for k, *_ in report.mapped} | {k for k, *_ in report.unused}
    assert written == accounted
    assert len(written) > 400 and len(report.mapped) > 80


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_command_lines_translate_and_validate(name, tmp_path):
    """Each of verl's example scripts, as written: every key it sets is accounted for in the
    notice, and the translated config passes hybridflow's validation (as `--print-config`)."""
    overrides = verl_overrides(name)
    said = []
    tree = translate_foreign(verl_tree(*overrides), say=said.append)
    [notice] = said
    for item in overrides:
        assert f"{item.split('=')[0].lstrip('+')}=" in notice, item
    cfg = run_config_from_tree(tree)
    assert cfg.sft.steps == 0 and "verl" in cfg.trainer.metric_names


def test_units_and_names_of_a_grpo_command():
    native = native_of(*verl_overrides("grpo_gsm8k"))
    assert native["actor.micro_batch.mini_batch_size"] == 256 * 5  # 256 prompts, each sampled rollout.n=5 times
    assert native["actor.micro_batch.micro_batch_size_per_device"] == 40
    assert native["algorithm.name"] == "grpo" and native["rollout.response_length"] == 1024
    assert native["trainer.total_epochs"] == 15 and native["trainer.total_steps"] is None
    assert native["resources.ranks_per_node"] == 8 and native["resources.nodes"] == 1
    assert native["name"] == "qwen2_7b_function_rm" and native["trainer.wandb_project"] == "verl_grpo_example_gsm8k"
    assert native["trainer.loggers"] == ["console", "jsonl", "wandb"]


def test_the_critic_takes_the_actors_batch_settings_as_in_verl():
    native = native_of("algorithm.adv_estimator=gae", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                       "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_epochs=2")
    assert native["algorithm.name"] == "ppo"
    assert native["critic.micro_batch.mini_batch_size"] == 32 and native["critic.micro_batch.epochs"] == 2
    own = native_of("algorithm.adv_estimator=gae", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                    "critic.ppo_mini_batch_size=4")
    assert own["critic.micro_batch.mini_batch_size"] == 4 and own["rollout.n"] == 1  # verl's n, pinned and said


def test_dapo_keys_run_the_dapo_program():
    native = native_of(*verl_overrides("dapo_gsm8k"))
    assert native["algorithm.name"] == "dapo" and native["algorithm.adv_estimator"] == "grpo"
    assert native["algorithm.dapo.filter_groups.metric"] == "shaped_score"  # seq_reward: with the overlong penalty
    assert native["algorithm.dapo.filter_groups.max_extra_rounds"] == 9  # 10 generation batches in all
    assert native["algorithm.dapo.overlong_buffer.len"] == 128
    assert native["trainer.total_steps"] == 1 and native["trainer.resume"] == "never"


def test_a_typo_in_a_verl_key_is_suggested_among_verls_keys():
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.ppo_mini_bach_size: unknown config key: not a "
                                          r"verl key; did you mean actor_rollout_ref\.actor\.ppo_mini_batch_size or"):
        translate_tree(verl_tree("actor_rollout_ref.actor.ppo_mini_bach_size=8"))
    with pytest.raises(ConfigError, match=r"trainer\.total_epoch: .*did you mean trainer\.total_epochs"):
        translate_tree(verl_tree("actor_rollout_ref.rollout.n=2", "trainer.total_epoch=3"))


def test_verl_and_hybridflow_keys_mix_and_a_clash_is_refused_by_name():
    native = native_of("actor_rollout_ref.rollout.n=4", "actor.optim.lr=3.0e-6", "rollout.temperature=0.7")
    assert native["rollout.n"] == 4 and native["actor.optim.lr"] == 3e-6 and native["rollout.temperature"] == 0.7
    assert native_of("actor_rollout_ref.actor.optim.lr=1e-6", "actor.optim.lr=1.0e-6")  # one number, two spellings
    assert native_of("actor_rollout_ref.rollout.n=4", "rollout.n=4")["rollout.n"] == 4  # the same value twice
    with pytest.raises(ConfigError, match=r"^rollout\.n: actor_rollout_ref\.rollout\.n sets rollout\.n=4, and the "
                                          r"config also sets rollout\.n=8 itself: keep one of the two"):
        translate_tree(verl_tree("actor_rollout_ref.rollout.n=4", "rollout.n=8"))
    with pytest.raises(ConfigError, match=r"trainer\.max_actor_ckpt_to_keep=2 and trainer\.max_critic_ckpt_to_keep=3 "
                                          r"both set trainer\.keep_last_checkpoints"):
        translate_tree(verl_tree("trainer.max_actor_ckpt_to_keep=2", "trainer.max_critic_ckpt_to_keep=3"))


def test_verls_own_fallbacks_settle_two_keys_for_one_setting():
    """rollout.response_length is data.max_response_length unless given (verl's interpolation)."""
    assert native_of("data.max_response_length=64")["rollout.response_length"] == 64
    assert native_of("data.max_response_length=64",
                     "actor_rollout_ref.rollout.response_length=32")["rollout.response_length"] == 32


@pytest.mark.parametrize("item, message", [
    ("+actor_rollout_ref.model.override_config.attention_dropout=0.1",
     "asks for changing the model's config.json at load"),
    ("algorithm.use_pf_ppo=true", "asks for preference-feedback PPO's reweighting"),
    ("actor_rollout_ref.actor.strategy=megatron", "hybridflow has only an FSDP2 training engine"),
    ("trainer.logger=[console,mlflow]", r"\['mlflow'\]: hybridflow logs to"),
    ("data.truncation=middle", "hybridflow truncates prompts with error, left or right"),
    ("trainer.resume_mode=resume_path", "resume_path needs trainer.resume_from_path"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size=16", "counts sequences over all GPUs"),
])
def test_values_hybridflow_cannot_honour_are_refused(item, message):
    with pytest.raises(ConfigError, match=message):
        translate_tree(verl_tree("actor_rollout_ref.rollout.n=2", item))


def test_values_that_switch_nothing_on_are_named_not_refused():
    _, [report] = translate_tree(verl_tree("algorithm.use_pf_ppo=false", "actor_rollout_ref.rollout.enforce_eager=true",
                                           "actor_rollout_ref.actor.strategy=fsdp2"))
    assert {k for k, *_ in report.unused} == {"algorithm.use_pf_ppo", "actor_rollout_ref.rollout.enforce_eager",
                                              "actor_rollout_ref.actor.strategy"}
    assert report.mapped == []


def test_units_that_differ_are_converted():
    native = native_of("trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.total_training_steps=2")
    assert (native["trainer.save_freq"], native["trainer.test_freq"]) == (0, 0)
    native = native_of("actor_rollout_ref.actor.ppo_micro_batch_size=32", "trainer.n_gpus_per_node=4",
                       "trainer.nnodes=2")
    assert native["actor.micro_batch.micro_batch_size_per_device"] == 4  # 32 over 8 GPUs
    assert native_of("trainer.resume_mode=resume_path", "trainer.resume_from_path=/ckpt/run")["trainer.resume"] == \
        "/ckpt/run"
    assert native_of("trainer.device=cpu")["resources.use_gpu"] is False
    assert native_of("trainer.logger=console")["trainer.loggers"] == ["console", "jsonl"]


def test_a_hybridflow_config_is_left_as_it_is():
    tree = {"algorithm": {"name": "grpo"}, "trainer": {"save_freq": 2}, "data": {"train_batch_size": 4}}
    assert translate_tree(tree) == (tree, [])


def test_the_cli_path_reads_hydra_style_overrides():
    """`+key=value` (Hydra's add) and verl keys through read_task_config, as `hybridflow train` reads them."""
    kind, cfg = read_task_config(with_overrides({}, ["+actor_rollout_ref.rollout.n=3", "algorithm.adv_estimator=rloo",
                                                     "trainer.total_training_steps=7",
                                                     "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                                                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"]))
    assert kind.name == "language_model"
    assert (cfg.rollout.n, cfg.algorithm.name, cfg.trainer.total_steps) == (3, "rloo", 7)
    assert cfg.actor.micro_batch.mini_batch_size == 48


def test_references_resolve_as_omegaconf_reads_them():
    tree = {"a": {"b": 3, "c": "${.b}", "d": "${oc.select:x.y,7}", "e": "${oc.select:a.b,1}"},
            "f": "${a.b}", "g": "dir/${a.b}/${a.d}", "h": "${a}", "i": "${oc.select:a.missing,null}"}
    assert resolve_references(tree) == {"a": {"b": 3, "c": 3, "d": 7, "e": 3}, "f": 3, "g": "dir/3/7",
                                        "h": {"b": 3, "c": 3, "d": 7, "e": 3}, "i": None}
    with pytest.raises(ConfigError, match="refers to 'nowhere'"):
        resolve_references({"a": "${nowhere}"})


def test_the_cli_prints_what_it_mapped_and_refuses_in_one_line(tmp_path, capsys):
    """`hybridflow train --config verl.yaml`: the notice on stderr, the native keys in the
    printed config; a value that cannot be honoured is one line and exit status 2."""
    from hybridflow.cli import main

    config = tmp_path / "verl.yaml"
    config.write_text(yaml.safe_dump({"algorithm": {"adv_estimator": "rloo"}, "data": {"train_batch_size": 8},
                                      "actor_rollout_ref": {"rollout": {"n": 4},
                                                            "actor": {"ppo_mini_batch_size": "${data.train_batch_size}",
                                                                      "ppo_micro_batch_size_per_gpu": 8}},
                                      "trainer": {"total_training_steps": 3}}))
    assert main(["train", "--config", str(config), "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=8 -> actor.micro_batch.mini_batch_size=32" in err
    printed = yaml.safe_load(out)
    assert printed["algorithm"]["name"] == "rloo" and printed["actor"]["micro_batch"]["mini_batch_size"] == 32
    assert main(["train", "--config", str(config), "algorithm.use_pf_ppo=true", "--print-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("hybridflow train: config error: algorithm.use_pf_ppo: true: it asks for")
