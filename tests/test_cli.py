"""The `hybridflow` command: subcommands, help, and config errors reported before any
worker starts (exit status 2, the message on stderr)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hybridflow.cli import build_parser, main, parse_args


def test_help_lists_the_subcommands():
    out = subprocess.run([sys.executable, "-m", "hybridflow.cli", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for command in ("train", "sft", "rm", "preprocess", "eval", "export", "plot", "selfcheck"):
        assert command in out


def test_train_and_sft_take_a_config_file_and_overrides():
    args = build_parser().parse_args(["train", "--config", "run.yaml", "rollout.n=4", "actor.optim.lr=1e-5"])
    assert args.config == "run.yaml" and args.overrides == ["rollout.n=4", "actor.optim.lr=1e-5"]
    args = build_parser().parse_args(["sft", "sft.steps=10"])
    assert args.config is None and args.overrides == ["sft.steps=10"]


def test_overrides_may_follow_the_options_and_other_leftovers_are_refused(capsys):
    args = parse_args(["eval", "runs/r", "resources.world_size=1", "--data", "a.parquet", "rollout.n=2"])
    assert args.path == "runs/r" and args.data == ["a.parquet"]
    assert args.overrides == ["resources.world_size=1", "rollout.n=2"]
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["eval", "runs/r", "--data", "a.parquet", "--bogus"])
    assert exit_info.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["train", "actor.optim.lrr=1e-5"], "did you mean 'lr'"),
    (["train", "data.train_batch_size=3", "resources.world_size=2"], "cannot be shared by the 2 generation groups"),
    (["sft", "seed=x"], "seed: expected int"),
    (["sft", "sft.steps=0"], "set sft.steps"),
    # An environment task's config given to a language-model-only command (was "env: unknown config key; valid keys")
    (["sft", "env.id=CartPole-v1"], "it is a task of kind 'environment', which `hybridflow train` runs"),
    (["plan", "env.id=CartPole-v1"], "`hybridflow plan` takes language-model configs"),
    (["sft", "rm.data.train_files=[p.parquet]"], "it is a task of kind 'reward_model', which `hybridflow rm` runs"),
])
def test_config_errors_exit_2_with_the_reason(argv, message, capsys, tmp_path):
    assert main([*argv, f"trainer.output_dir={tmp_path}"]) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before a run directory was made


def test_missing_config_file_is_a_config_error(capsys, tmp_path):
    assert main(["train", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_print_config_shows_the_resolved_tree_without_running(capsys, tmp_path):
    import yaml

    assert main(["train", "--print-config", "rollout.n=16", f"trainer.output_dir={tmp_path}"]) == 0
    tree = yaml.safe_load(capsys.readouterr().out)
    assert tree["rollout"]["n"] == 16 and tree["algorithm"]["adv_estimator"] == "grpo"
    assert isinstance(tree["resources"]["world_size"], int)
    assert not any(tmp_path.iterdir())


def test_yaml_syntax_errors_are_reported_before_torch_is_imported(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  total_steps: 3\n bad: [1\n")
    probe = ("import sys; from hybridflow.cli import main; "
             f"rc = main(['train', '--config', {str(bad)!r}]); print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False"], out.stderr
    assert "not valid YAML" in out.stderr and "line 3" in out.stderr
