"""benchmarks/rl/eval_plain.py, the independent evaluator (issue 25): it reads answers as
hybridflow's scorers do without sharing their code, and on a tiny model its greedy
responses and right/wrong verdicts equal `hybridflow eval`'s row by row."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.cli import main as cli_main
from hybridflow.config.schema import load_run_config
from hybridflow.config.model_presets import write_model_presets
from hybridflow.config.sections.model import BuiltinModelSection
from hybridflow.data import write_records
from hybridflow.data.arithmetic import ArithmeticConfig, rl_records
from hybridflow.rewards import gsm8k
from hybridflow.trainer.run.lifecycle import write_builtin_model

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = BENCHMARKS / "rl" / "eval_plain.py"
EXACT_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str.strip() == str(ground_truth).strip() else 0.0
'''


def _plain_module():
    if "eval_plain" not in sys.modules:  # registered before it runs: its dataclass looks itself up there
        spec = importlib.util.spec_from_file_location("eval_plain", SCRIPT)
        sys.modules["eval_plain"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["eval_plain"])
    return sys.modules["eval_plain"]


def test_the_script_imports_nothing_from_hybridflow():
    for path in (SCRIPT, BENCHMARKS / "common" / "plain_machine.py"):
        lines = path.read_text().splitlines()
        assert not [line for line in lines if line.lstrip().startswith(("import hybridflow", "from hybridflow"))]


@pytest.mark.parametrize("response, truth", [
    ("The answer is 72.", "72"), ("It costs $1,234.50 in all", "1234.5"), ("18.0", "18"), ("-5 degrees", "-5"),
    ("3 boxes of 4 make 12", "12"), ("no number here", "3"), ("12,5", "5"), ("about 7. Then 8", "7"),
    ("#### 9 or maybe 10", "10"), ("1,000,000 stars", "1000000"), ("0.5 and .25", "0.5"), ("3.", "3"),
])
def test_last_number_reading_agrees_with_the_builtin_flexible_gsm8k_scorer(response, truth):
    plain = _plain_module()
    theirs = gsm8k.compute_score(response, truth, method="flexible") == 1.0
    assert plain.is_correct(plain.extracted(response, "last-number"), truth, "last-number") == theirs
    strict = gsm8k.compute_score(response, truth, method="strict") == 1.0
    assert plain.is_correct(plain.extracted(response, "strict"), truth, "strict") == strict


def test_answers_are_normalised_so_equal_numbers_count_once():
    plain = _plain_module()
    assert plain.extracted("so 1,200.0 apples", "last-number") == "1200"
    assert plain.extracted("so $18.50", "last-number") == "18.5"
    assert plain.extracted("nothing", "last-number") is None


def _run_plain(*args: str) -> dict:
    out = Path(args[args.index("--out") + 1])
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_responses_and_verdicts_equal_hybridflow_eval_on_a_tiny_model(ray_local, tmp_path):
    model = write_builtin_model(BuiltinModelSection(hidden_size=32, intermediate_size=64, num_hidden_layers=2),
                                tmp_path / "model", seed=0)
    write_model_presets(model, load_run_config(None, []), "a test")  # fp32, 32-token prompts
    first = write_records(rl_records(ArithmeticConfig(), "test", 8), tmp_path / "first.jsonl")
    seen = _run_plain(str(model), "--data", str(first), "--answer", "exact", "--max-new-tokens", "5",
                      "--batch-size", "3", "--out", str(tmp_path / "seen.json"))
    # Ground truths that make every other response right: both tools must say which.
    rows = [json.loads(line) for line in first.read_text().splitlines()]
    for i, (row, said) in enumerate(zip(rows, seen["responses"])):
        row["reward_model"]["ground_truth"] = said["answer"] if i % 2 == 0 else "no such answer"
        row["data_source"] = "exact"
    data = write_records(rows, tmp_path / "data.jsonl")
    reward = tmp_path / "reward.py"
    reward.write_text(EXACT_REWARD)
    report = tmp_path / "report.json"
    assert cli_main(["eval", str(model), "--data", str(data), "--output", str(report), "resources.world_size=2",
                     "rollout.response_length=5", f"reward.custom_fn_path={reward}"]) == 0
    result = _run_plain(str(model), "--data", str(data), "--answer", "exact", "--max-new-tokens", "5",
                        "--compare", str(report), "--out", str(tmp_path / "plain.json"))
    compared = result["compare"]
    assert compared["rows"] == 8 and compared["same_prompt"] == 8
    assert compared["same_response"] == 8 and compared["same_correct"] == 8
    assert result["all"]["accuracy"] == compared["accuracy_there"] == 0.5
    assert result["all"]["samples"] == 8 and len(result["all"]["sample_responses"]) == 5
    assert result["machine"]["load_avg_1_5_15"] and result["settings"]["decoding"] == "greedy"
