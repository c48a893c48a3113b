"""Held-out prompts from two data sources and a reward function that scores them, for the
validation / eval tests: "arithmetic" rows are scored by the built-in arithmetic scorer,
"always_right" rows get 1.0 whatever the response, so their accuracy is known exactly."""

from __future__ import annotations

from pathlib import Path

from hybridflow.data import write_records
from hybridflow.data.arithmetic import ArithmeticConfig, rl_records

REWARD = '''
from hybridflow.rewards.registry import default_compute_score

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source == "always_right":
        return 1.0
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
'''

# 3 + 2 prompts: an odd count, so the 2 generation groups need a padding prompt.
SOURCES = {"arithmetic": 3, "always_right": 2}


def write_two_source_data(root: Path) -> tuple[Path, Path, Path]:
    """(train.jsonl, val.jsonl, reward.py) under root."""
    task = ArithmeticConfig()
    train = write_records(rl_records(task, "train", 16), root / "train.jsonl")
    rows = rl_records(task, "test", sum(SOURCES.values()))
    for row in rows[SOURCES["arithmetic"]:]:
        row["data_source"] = "always_right"
    val = write_records(rows, root / "val.jsonl")
    reward = root / "reward.py"
    reward.write_text(REWARD)
    return train, val, reward


def two_source_overrides(root: Path) -> list[str]:
    train, val, reward = write_two_source_data(root)
    return [f"data.train_files=[{train}]", f"data.val_files=[{val}]", f"reward.custom_fn_path={reward}"]
