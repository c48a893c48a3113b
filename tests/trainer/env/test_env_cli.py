"""`hybridflow train` on environment tasks, in-process through the CLI's main():
`--config examples/ppo_cartpole.yaml` with overrides writes the run directory (config,
metrics.jsonl, TensorBoard events, plots, checkpoints), `--resume <run dir>` trains on to
a larger trainer.total_env_steps (`--resume` without PATH: the newest run of the config's
name), and a bad key is a config error (exit code 2)."""

from __future__ import annotations

from pathlib import Path

from trainer_helpers import profile_in_background

from hybridflow.cli import main
from hybridflow.trainer.observe.live_status import read_timeline
from hybridflow.trainer.observe.monitor import attach
from hybridflow.trainer.run.run_dir import read_metrics

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _run_dir(output: Path) -> Path:
    (run_dir,) = [p for p in output.iterdir() if p.is_dir()]
    return run_dir


def test_train_and_resume_from_the_command_line(tmp_path, capsys):
    common = [f"trainer.output_dir={tmp_path}", "trainer.console=plain", "trainer.target_return=null",
              "trainer.log_freq=256", "trainer.save_freq=256", "trainer.loggers=[jsonl,tensorboard]",
              "ppo.epochs=2"]
    assert main(["train", "--config", str(EXAMPLES / "ppo_cartpole.yaml"), "trainer.total_env_steps=512",
                 *common]) == 0
    # Without the "console" logger nothing is printed, as in LM runs (LoopSection.display_mode).
    assert capsys.readouterr().out == ""
    run_dir = _run_dir(tmp_path)
    assert run_dir.name.startswith("CartPole-v1-ppo-")
    assert (run_dir / "config.yaml").is_file() and (run_dir / "plots" / "episode_return.png").is_file()
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["global_step_1", "global_step_2"]

    assert main(["train", "--resume", str(run_dir), "trainer.total_env_steps=1024",
                 "trainer.loggers=[console,jsonl,tensorboard]"]) == 0
    steps = [r["env/steps"] for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "rl"]
    assert steps == [256, 512, 768, 1024]  # the resumed run appends to the same metrics
    out = capsys.readouterr().out
    # As LM runs: the run directory first, then where it resumes from, and at the end where it is.
    assert out.startswith(f"run directory: {run_dir}\nresuming from {run_dir / 'checkpoints' / 'global_step_2'} "
                          "(iteration 2)\n") and f"run saved to {run_dir}" in out
    # `--resume` without PATH: the newest checkpoint of the config's runs, as for LM runs
    # (it was "give the run directory to resume").
    assert main(["train", "--config", str(EXAMPLES / "ppo_cartpole.yaml"), "--resume", *common,
                 "trainer.total_env_steps=1280"]) == 0
    assert _run_dir(tmp_path) == run_dir
    assert [r["env/steps"] for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "rl"][-2:] == [1024, 1280]


def test_a_misspelt_key_is_a_config_error(tmp_path, capsys):
    code = main(["train", "--config", str(EXAMPLES / "sac_pendulum.yaml"), "sac.batch_sise=64",
                 f"trainer.output_dir={tmp_path}"])
    assert code == 2 and "did you mean 'batch_size'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing was created


def test_the_commands_given_an_environment_run_read_it_as_one(tmp_path, capsys):
    runs = tmp_path / "runs"
    profile = profile_in_background(lambda: _run_dir(runs) if runs.is_dir() and any(runs.iterdir()) else None,
                                    tmp_path / "profile")
    assert main(["train", "--config", str(EXAMPLES / "ppo_cartpole.yaml"), f"trainer.output_dir={runs}",
                 "trainer.console=none", "trainer.total_env_steps=256", "trainer.save_freq=256"]) == 0
    run_dir = _run_dir(runs)
    # `hybridflow monitor` watches its workers (in process here) and names its phases.
    phases = {e["phase"] for e in read_timeline(run_dir)}
    assert set(profile()["phases"]) <= phases and {"collect", "update"} <= phases
    assert {w.role for w in attach(run_dir)} == {"runners", "learner"}
    # A language-model config cannot continue it: its saved config was read as a language-model
    # one ("algorithm: expected a section (mapping), got 'ppo'").
    assert main(["train", "--config", str(EXAMPLES / "grpo_arithmetic.yaml"), "--resume", str(run_dir)]) == 2
    assert "is a run of task kind 'environment', the config of kind 'language_model'" in capsys.readouterr().err
    # `hybridflow plot` draws its plots (was "has no RL step metrics to plot").
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "episode_return.png").is_file()
    # eval and export say they take language-model runs (was "env: unknown config key; valid keys: [...]").
    for command in (["eval", str(run_dir)], ["export", str(run_dir), "--out", str(tmp_path / "model")]):
        capsys.readouterr()
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "is a run of task kind 'environment'; eval and export take language-model runs" in err
