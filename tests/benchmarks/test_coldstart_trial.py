"""The cold-start recipe and its trial (docs/learning.md, "Cold start") without a model: the
three tasks' files are seeded and share no question, number words are right, the exact
reward reads as eval_plain's exact mode, the recipe keeps its features when only the data
and reward change, and the trial script's plan and summary table (the runs themselves are
the lead's, on a quiet machine: `--quick` rehearses them in minutes)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from hybridflow.config.schema import load_run_config
from hybridflow.rewards.registry import load_reward_fn

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "grpo_coldstart_smollm2.yaml"


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


data = _module(ROOT / "examples" / "make_coldstart_data.py", "make_coldstart_data")
sys.path.insert(0, str(ROOT))  # the scripts import benchmarks.*
trial = _module(ROOT / "benchmarks" / "rl" / "coldstart_trial.py", "coldstart_trial")
eval_plain = _module(ROOT / "benchmarks" / "rl" / "eval_plain.py", "eval_plain_for_coldstart")


@pytest.mark.parametrize("task", sorted(data.TASKS))
def test_the_files_are_seeded_and_share_no_question(task):
    parts = data.split(task, 0, 200, 32, 4000)
    questions = {part: [r["extra_info"]["question"] for r in rows] for part, rows in parts.items()}
    assert len(questions["heldout"]) == 200 and len(questions["demos"]) == 32 and len(questions["train"]) > 200
    assert sum(map(len, questions.values())) == len(set(sum(questions.values(), [])))  # no question twice
    assert data.split(task, 0, 200, 0, 0)["heldout"] == parts["heldout"]  # held-out fixed by the seed alone
    assert data.split(task, 1, 200, 0, 0)["heldout"] != parts["heldout"]
    assert all(d["response"] == d["reward_model"]["ground_truth"] for d in parts["demos"])
    assert {r["difficulty"] for rows in parts.values() for r in rows} == {1, 2, 3}


def test_numbers_in_words_and_answers_that_are_right():
    assert [data.number_words(n) for n in (7, 15, 40, 59, 100, 305, 347, 990, 999)] == [
        "seven", "fifteen", "forty", "fifty-nine", "one hundred", "three hundred five", "three hundred forty-seven",
        "nine hundred ninety", "nine hundred ninety-nine"]
    for row in data.split("arith", 0, 50, 0, 0)["heldout"]:
        a, op, b = row["extra_info"]["question"].removeprefix("What is ").removesuffix("?").split()
        assert int(row["reward_model"]["ground_truth"]) == {"+": int(a) + int(b), "-": int(a) - int(b),
                                                             "x": int(a) * int(b)}[op] >= 0


def test_the_reward_is_eval_plains_exact_mode():
    score = load_reward_fn(str(ROOT / "examples" / "exact_match_reward.py"), "compute_score")
    for response, truth in (("85", "85"), (" 85\n", "85"), ("The answer is 85.", "85"), ("85.", "85"),
                            ("Forty-seven", "forty-seven"), ("forty-seven", "forty-seven")):
        want = eval_plain.is_correct(eval_plain.extracted(response, "exact"), truth, "exact")
        assert score(data_source="coldstart_arith", solution_str=response, ground_truth=truth) == float(want)


def test_a_user_who_changes_only_data_and_reward_keeps_the_cold_start_features(tmp_path):
    cfg = load_run_config(RECIPE, [f"data.train_files=[{tmp_path / 'mine.jsonl'}]",
                                   f"data.val_files=[{tmp_path / 'mine_heldout.jsonl'}]",
                                   f"sft.files=[{tmp_path / 'my_demos.jsonl'}]",
                                   f"reward.custom_fn_path={tmp_path / 'my_reward.py'}"])
    assert cfg.sft.steps > 0 and cfg.algorithm.exploration.enabled and cfg.actor.loss.skip_no_signal_updates
    assert cfg.data.train_batch_size * cfg.rollout.n == cfg.actor.micro_batch.mini_batch_size  # one step per RL step



@pytest.mark.parametrize("variant", sorted(trial.VARIANTS))
def test_every_variant_loads_and_turns_off_what_it_says(tmp_path, variant):
    overrides, features = trial.VARIANTS[variant]
    files = [f"data.train_files=[{tmp_path / 't.jsonl'}]", f"data.val_files=[{tmp_path / 'h.jsonl'}]",
             f"sft.files=[{tmp_path / 'd.jsonl'}]", "seed=1", "rollout.seed=1"]
    cfg = load_run_config(RECIPE, [*files, *overrides])
    assert {"warm_start": cfg.sft.steps > 0, "exploration": cfg.algorithm.exploration.enabled,
            "skip_no_signal": cfg.actor.loss.skip_no_signal_updates} == features

def _run_json(out: Path, task: str, seed: int, variant: str, before: float, after: float) -> None:
    steps = [{"step": 1, "adv/silent_groups": 4.0, "adv/groups": 4.0, "explore/extra_groups": 8.0,
              "actor/skipped_no_signal": 1.0},
             {"step": 2, "adv/silent_groups": 1.0, "adv/groups": 4.0, "explore/extra_groups": 2.0,
              "actor/skipped_no_signal": 0.0}]
    record = {"name": f"{task}_s{seed}_{variant}", "task": task, "seed": seed, "variant": variant,
              "before": {"accuracy": before, "distinct_answers": 190},
              "after": {"exit_code": 0, "accuracy": after, "distinct_answers": 120, "top_share": 0.03},
              "train": {"exit_code": 0, "wall_s": 1800.0, "steps": steps, "evals": [{"step": 2, "val/accuracy": after}],
                        "sft_evals": [{"step": 0, "val/accuracy": 0.0}, {"step": 12, "val/accuracy": 0.2}],
                        "load_during": {"mean": 2.1, "max": 2.6}}}
    (out / f"{task}_s{seed}_{variant}.json").write_text(json.dumps(record))


def test_the_plan_and_the_summary_table(tmp_path):
    args = type("Args", (), {"tasks": ["arith", "units"], "seeds": [0, 1], "variants": ["full", *trial.ABLATIONS]})
    runs = trial.plan(args)
    assert runs[:5] == [("arith", 0, "full"), ("arith", 1, "full"), ("arith", 0, "no_warm_start"),
                        ("arith", 0, "no_exploration"), ("arith", 0, "no_skip")] and len(runs) == 10
    _run_json(tmp_path, "arith", 0, "full", 0.0, 0.315)
    _run_json(tmp_path, "arith", 0, "no_warm_start", 0.0, 0.01)
    (tmp_path / "arith_s0_full_plain.json").write_text(json.dumps({"all": {}}))  # eval_plain's report: not a run
    rows = trial.summarise(tmp_path)
    assert [(r["variant"], r["gain_points"], r["steps"], r["silent_steps"], r["skipped_steps"], r["extra_groups"])
            for r in rows] == [("full", 31.5, 2, 1, 1.0, 10.0), ("no_warm_start", 1.0, 2, 1, 1.0, 10.0)]
    table = (tmp_path / "summary.md").read_text()
    assert "| arith | 0 | full | 0.0 % | 31.5 % | +31.5 | 31.5 % | 20.0 % | 190 -> 120 (3.0 %) | 2 (1 / 1) | 10 |" in table
    assert json.loads((tmp_path / "summary.json").read_text()) == rows
