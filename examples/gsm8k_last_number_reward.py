"""GSM8K reward for small models: the last number of the response is the answer.

The built-in GSM8K scorer is strict (the number after '####', as the prompt asks). A
135M-parameter model almost never writes the marker, so every strict reward is 0 and GRPO
has nothing to learn from. This file keeps the built-in checker but reads the answer in
its "flexible" mode (the last number anywhere); other data sources score as built in.

    hybridflow train --config examples/grpo_gsm8k_smollm2.yaml      # sets reward.custom_fn_path
"""

from __future__ import annotations

from typing import Any

from hybridflow.rewards import gsm8k
from hybridflow.rewards.registry import default_compute_score

GSM8K_SOURCES = ("openai/gsm8k", "gsm8k")


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
                  ) -> float | dict[str, Any]:
    if data_source in GSM8K_SOURCES:
        return gsm8k.compute_score(solution_str, ground_truth, method="flexible")
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
