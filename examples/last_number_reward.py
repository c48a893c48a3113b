"""Reward of the learning recipe (docs/learning.md): 1.0 when the last number of the
response equals the ground truth, else 0.0, for every data source.

The exact-answer reward only: no partial credit for writing a number (an earlier trial
with 0.3 for any bare integer taught the format and collapsed the answers onto a few
numbers). The answer is read by the built-in GSM8K checker in its "flexible" mode
(hybridflow/rewards/gsm8k.py: thousands separators, "$", "18.0" == "18");
benchmarks/rl/eval_plain.py --answer last-number reads it independently.

    hybridflow train --config examples/grpo_words_smollm2.yaml        # sets reward.custom_fn_path
    hybridflow eval MODEL --data F reward.custom_fn_path=examples/last_number_reward.py
"""

from __future__ import annotations

from typing import Any

from hybridflow.rewards import gsm8k


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    return gsm8k.compute_score(solution_str, ground_truth, method="flexible")
