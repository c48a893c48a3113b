"""Scorer of the built-in arithmetic task: the response must be exactly the answer.

"12+345=" -> "357" scores 1.0; a response that is an integer but the wrong one scores
`format_score` (0.0 by default: partial credit for emitting a number can help very early
RL, at the cost of a reward the model can collect without doing arithmetic).
"""

from __future__ import annotations

import re

_INTEGER = re.compile(r"-?\d+")


def compute_score(solution_str: str, ground_truth: str | int, format_score: float = 0.0) -> float:
    """1.0 for an exact answer (surrounding whitespace ignored), format_score for another integer, else 0.0."""
    answer = solution_str.strip()
    expected = str(ground_truth).strip()
    if not _INTEGER.fullmatch(expected):
        raise ValueError(f"arithmetic ground truth must be an integer string, got {ground_truth!r}")
    if answer == expected:
        return 1.0
    return format_score if _INTEGER.fullmatch(answer) else 0.0
