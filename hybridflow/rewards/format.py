"""Format rewards: does the response have the shape the prompt asked for?

A format reward is often added to a correctness reward (or used alone early in RL) so the
model learns where to put its answer before it learns to get it right. Patterns are
regular expressions matched against the whole response (surrounding whitespace ignored).
"""

from __future__ import annotations

import re

# Named patterns for the formats our data sets ask for.
FORMATS: dict[str, str] = {
    # GSM8K: reasoning, then the final number after '####' at the end.
    "gsm8k": r"(?s).*####\s*-?\$?-?[\d,]*\.?\d+\.?",
    # R1-style: <think>reasoning</think> then <answer>answer</answer>.
    "think_answer": r"(?s)<think>.*?</think>\s*<answer>.*?</answer>",
    # A LaTeX \boxed{...} answer somewhere in the response.
    "boxed": r"(?s).*\\boxed\{.+\}.*",
    # The built-in arithmetic task: only an integer.
    "integer": r"-?\d+",
}


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(FORMATS.get(pattern, pattern))
    except re.error as err:
        raise ValueError(
            f"format pattern {pattern!r} is neither a named format {sorted(FORMATS)} nor a valid regex: {err}"
        ) from err


def format_score(solution_str: str, pattern: str, score: float = 1.0) -> float:
    """`score` when the whole response (stripped) matches `pattern` (a regex or a name in FORMATS), else 0.0."""
    return score if _compile(pattern).fullmatch(solution_str.strip()) else 0.0
