"""Validation, loggers and plots of an RL run (issue 7).

One tiny GRPO run (Ray, 2 ranks, 2 steps) with held-out prompts from two data sources,
evaluated before training, every step and after, logged to console, metrics.jsonl and
TensorBoard; then the per-source numbers, the TensorBoard file (read back with
tensorboard's EventAccumulator), and the plots are checked. The logger and plot units
run without Ray."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from PIL import Image

from hybridflow import RLTrainer
from hybridflow.cli import main as cli_main
from hybridflow.config import ConfigError
from hybridflow.config.schema import load_run_config
from hybridflow.trainer.observe.loggers import TensorBoardLogger, scalar_tags
from hybridflow.trainer.observe.plots import PLOTS, plot_records
from hybridflow.trainer.run.run_dir import read_metrics
from trainer_helpers import rl_records
from validation_data import SOURCES, two_source_overrides

PLOT_FILES = {"reward.png", "kl.png", "entropy.png", "response_length.png", "val_accuracy.png"}


def _event_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _assert_png(path, size=(600, 400)) -> None:
    with Image.open(path) as image:
        image.verify()  # a truncated or corrupt file raises
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == size
        low, high = image.convert("L").getextrema()
        assert low < high, f"{path} is blank"


def _check_per_source(record: dict, n: int) -> None:
    """Per data source keys exist (n responses per prompt), add up to the overall numbers,
    and the always-right source scores exactly 1."""
    counts = {source: record[f"val/{source}/samples"] for source in SOURCES}
    assert counts == {source: float(n * count) for source, count in SOURCES.items()}
    assert record["val/samples"] == n * sum(SOURCES.values())
    assert record["val/always_right/accuracy"] == 1.0 and record["val/always_right/score"] == 1.0
    for name in ("accuracy", "score"):
        combined = sum(record[f"val/{s}/{name}"] * n for s, n in counts.items()) / record["val/samples"]
        assert math.isclose(record[f"val/{name}"], combined, rel_tol=1e-12), name


def test_validation_per_source_loggers_and_plots(ray_local, tiny_config, tmp_path, capsys):
    # Sampled validation, 2 responses per prompt (greedy, n=1 is the default: the eval
    # tests in test_cli_eval_export.py use it).
    cfg = tiny_config(*two_source_overrides(tmp_path), "trainer.test_freq=1", "trainer.console=plain",
                      "trainer.loggers=[console,jsonl,tensorboard]", "trainer.validation.do_sample=true",
                      "trainer.validation.n=2")
    assert cfg.trainer.val_before_train  # the default
    with RLTrainer(cfg) as trainer:
        result = trainer.train(steps=2)
    records = read_metrics(result.run_dir / "metrics.jsonl")

    # Before training (step 0), after step 1 (test_freq=1, merged into the step's record)
    # and after the last step.
    evals = [r for r in records if r["phase"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2]
    steps = rl_records(result.run_dir)
    assert "val/accuracy" in steps[0] and "val/accuracy" not in steps[1]
    for record in (evals[0], steps[0], evals[1]):
        _check_per_source(record, n=2)
    assert result.accuracy_before == evals[0]["val/accuracy"] and result.accuracy_after == evals[1]["val/accuracy"]
    printed = capsys.readouterr().out
    assert "step 0: held-out accuracy" in printed and "always_right 100.0%" in printed

    # TensorBoard: every RL-step metric at steps 1, 2; the evaluations at 0, 1, 2.
    scalars = _event_scalars(result.run_dir / "tensorboard")
    assert [s for s, _ in scalars["score/mean"]] == [1, 2]
    for (step, value), record in zip(scalars["score/mean"], steps):
        assert math.isclose(value, record["score/mean"], rel_tol=1e-6)
    assert [s for s, _ in scalars["val/always_right/accuracy"]] == [0, 1, 2]
    assert [v for _, v in scalars["val/accuracy"]] == pytest.approx(
        [evals[0]["val/accuracy"], steps[0]["val/accuracy"], evals[1]["val/accuracy"]])

    # Plots written at the end of training, and again by `hybridflow plot` elsewhere.
    plots = result.run_dir / "plots"
    assert {p.name for p in plots.iterdir()} == PLOT_FILES
    for path in plots.iterdir():
        _assert_png(path)
    assert cli_main(["plot", str(result.run_dir), "--out", str(tmp_path / "replot")]) == 0
    assert {p.name for p in (tmp_path / "replot").iterdir()} == PLOT_FILES


def test_tensorboard_logger_round_trip(tmp_path):
    logger = TensorBoardLogger(tmp_path / "tb")
    logger.write("rl", 1, {"score/mean": 0.25, "actor/entropy": 2.0, "bad": float("nan"), "note": "text"})
    logger.write("eval", 0, {"val/accuracy": 0.5})
    logger.write("sft", 3, {"sft/loss": 1.5, "timing_s/step": 0.1})
    logger.close()
    assert _event_scalars(tmp_path / "tb") == {
        "score/mean": [(1, 0.25)], "actor/entropy": [(1, 2.0)], "val/accuracy": [(0, 0.5)],
        "sft/loss": [(3, 1.5)], "sft/timing_s/step": [(3, pytest.approx(0.1))],
    }


def test_scalar_tags_keep_rl_keys_and_prefix_other_phases():
    assert scalar_tags("rl", {"a/b": 1, "flag": True, "inf": math.inf}) == {"a/b": 1.0}
    assert scalar_tags("sft_eval", {"val/accuracy": 0.5}) == {"sft_eval/val/accuracy": 0.5}


def test_plots_draw_only_logged_metrics(tmp_path):
    records = [{"phase": "rl", "step": s, "score/mean": 0.1 * s, "kl/penalty": None} for s in (1, 2, 3)]
    written = plot_records(records, tmp_path / "plots")
    assert [p.name for p in written] == ["reward.png"]  # kl/penalty only non-finite: no KL plot
    _assert_png(written[0])
    assert len(PLOTS) == len(PLOT_FILES) + 2  # + agent_tool_use, agent_turns: multi-turn runs only


def test_validation_is_greedy_and_runs_before_training_by_default():
    trainer = load_run_config(None, []).trainer
    assert trainer.val_before_train and trainer.loggers == ["console", "jsonl"]
    assert not trainer.validation.do_sample and trainer.validation.n == 1
    with pytest.raises(ConfigError, match="trainer.validation.n: must be >= 1"):
        load_run_config(None, ["trainer.validation.n=0"])


def test_unknown_logger_and_missing_wandb_are_config_errors(monkeypatch):
    with pytest.raises(ConfigError, match="trainer.loggers: must be distinct names from"):
        load_run_config(None, ["trainer.loggers=[console,tensorbord]"])
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed (import fails)
    with pytest.raises(ConfigError, match="pip install wandb"):
        load_run_config(None, ["trainer.loggers=[console,wandb]"])


def test_plot_command_explains_a_directory_without_metrics(tmp_path, capsys):
    assert cli_main(["plot", str(tmp_path)]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err


def test_wandb_logger_offline_writes_into_the_run_dir(tmp_path, monkeypatch):
    # wandb is in the [all] extra the suite installs: a plain import, so a missing package
    # fails here instead of skipping silently.
    from hybridflow.trainer.observe.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")  # never contacts a server
    monkeypatch.setenv("WANDB_SILENT", "true")
    # Keep W&B's own settings, cache and staging files out of the home directory.
    for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home" / var.lower()))
    (tmp_path / "run").mkdir()  # the trainer creates the run directory before its loggers
    logger = WandbLogger(load_run_config(None, ["trainer.loggers=[wandb]"]), tmp_path / "run")
    logger.write("rl", 1, {"score/mean": 0.25})
    logger.write("sft", 4, {"sft/loss": 1.5})
    summary = dict(logger._run.summary)
    logger.close()
    assert summary["score/mean"] == 0.25 and summary["sft/loss"] == 1.5
    assert summary["rl/step"] == 1 and summary["sft/step"] == 4
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_importing_hybridflow_does_not_import_wandb():
    # wandb takes seconds to import; only a run with the wandb logger should pay for it.
    probe = ("import sys, hybridflow, hybridflow.cli, hybridflow.trainer.observe.loggers; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'wandb'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
