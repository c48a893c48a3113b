"""benchmarks/rl/learning_trial.py and learning_curves.py, the tools of the learning proof
(issue 25, docs/learning.md), end to end on the built-in tiny model: a trial trains,
evaluates mid-run and after, runs `hybridflow eval --output` and the independent
evaluator on the final model (token for token equal in fp32), and the summary and the
PNG are drawn from its JSON; `--eval-only` evaluates a model directory without training
(slow: two short runs and four evaluations, real Ray)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.data import write_records
from hybridflow.data.arithmetic import ArithmeticConfig, rl_records

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
CONFIG = """
trainer: {{total_steps: 2, test_freq: 1, save_freq: 0}}
sft: {{steps: 0}}
data: {{train_files: [{train}], val_files: [{held}], train_batch_size: 8, max_val_samples: 8}}
rollout: {{n: 2, response_length: 5}}
actor: {{micro_batch: {{mini_batch_size: 16, micro_batch_size_per_device: 8, forward_micro_batch_size_per_device: 8}}}}
"""


def _script(name: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "rl" / name), *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
@pytest.mark.extended  # a benchmark script; learning itself: tests/trainer/test_learning.py
def test_a_trial_is_measured_both_ways_and_summarised(tmp_path):
    train = write_records(rl_records(ArithmeticConfig(), "train", 64), tmp_path / "train.jsonl")
    held = write_records(rl_records(ArithmeticConfig(), "test", 8), tmp_path / "held.jsonl")
    config = tmp_path / "recipe.yaml"
    config.write_text(CONFIG.format(train=train, held=held))
    common = ["--config", str(config), "--heldout", str(held), "--max-new-tokens", "5", "--dtype", "fp32",
              "--runs", str(tmp_path / "runs")]
    _script("learning_trial.py", "--name", "t", *common, "--out", str(tmp_path / "t.json"))
    trial = json.loads((tmp_path / "t.json").read_text())
    assert trial["train"]["exit_code"] == 0
    assert [e["step"] for e in trial["train"]["evals"]] == [0, 2]  # before and after training
    assert [s["step"] for s in trial["train"]["steps"] if "val/accuracy" in s] == [1]  # test_freq, the last apart
    after = trial["hybridflow_eval"]["metrics"]["val/accuracy"]
    assert after == trial["train"]["evals"][-1]["val/accuracy"]  # the CLI on final_model = the run's last evaluation
    compared = trial["eval_plain"]["compare"]
    assert compared["rows"] == 8 and compared["same_response"] == 8  # fp32: the same greedy tokens
    with pytest.raises(AssertionError, match="nothing is overwritten"):
        _script("learning_trial.py", "--name", "t2", *common, "--out", str(tmp_path / "t.json"))

    _script("learning_trial.py", "--name", "base", *common, "--eval-only", str(tmp_path / "runs" / "t" / "final_model"),
            "--out", str(tmp_path / "base.json"), "--", "rollout.response_length=5")
    base = json.loads((tmp_path / "base.json").read_text())
    assert "train" not in base and base["hybridflow_eval"]["metrics"]["val/accuracy"] == after
    assert base["eval_plain"]["compare"]["same_response"] == 8

    png, summary = tmp_path / "curves.png", tmp_path / "summary.json"
    table = _script("learning_curves.py", str(tmp_path / "t.json"), "--out", str(png), "--summary", str(summary))
    row = json.loads(summary.read_text())["rows"][0]
    assert png.stat().st_size > 0 and "| t |" in table
    assert [p[0] for p in row["held_out"]] == [0, 1, 2] and row["steps"] == 2
    wall = row["wall_s"]
    assert 0 < wall["update"] < wall["rl_steps"] < wall["train_total"] and wall["held_out_evals"] > 0
