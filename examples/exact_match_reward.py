"""Reward of the cold-start recipe (docs/learning.md, "Cold start"): 1.0 when the whole
response, stripped of surrounding white space, is the ground truth, else 0.0.

The strictest reading there is: a right answer inside a sentence scores 0, so a model that
answers in prose starts near 0 % and must learn the answer format as well as the answers.
benchmarks/rl/eval_plain.py --answer exact reads the same way, independently.

    hybridflow train --config examples/grpo_coldstart_smollm2.yaml     # sets reward.custom_fn_path
    hybridflow eval MODEL --data F reward.custom_fn_path=examples/exact_match_reward.py
"""

from __future__ import annotations

from typing import Any


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    return 1.0 if solution_str.strip() == str(ground_truth).strip() else 0.0
