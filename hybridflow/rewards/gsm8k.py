"""GSM8K final-answer check.

Two ways to read the model's answer:

- strict: the number after the last '####' marker (what the GSM8K prompt asks for);
- flexible: the last number anywhere in the response.

Numbers may carry thousands separators, a currency sign or a trailing period
("$1,234.50." -> 1234.5); they are compared as exact decimals, so "18.0" equals "18".
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Literal

# A number: optional sign and $, digits with optional comma groups, optional decimals.
_NUMBER = r"-?\$?\s?-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\$?\s?-?\.\d+"
_STRICT = re.compile(r"####\s*(" + _NUMBER + r")")
_ANY_NUMBER = re.compile(_NUMBER)


def to_decimal(text: str) -> Decimal | None:
    """'$1,234.50' -> Decimal('1234.50'); None when it is not a number."""
    cleaned = text.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    if cleaned.startswith("--"):
        cleaned = cleaned[2:]
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def extract_answer(solution_str: str, method: Literal["strict", "flexible"] = "strict") -> str | None:
    """The answer text the model gave, or None when it gave none in this mode."""
    if method == "strict":
        matches = _STRICT.findall(solution_str)
    elif method == "flexible":
        matches = _ANY_NUMBER.findall(solution_str)
    else:
        raise ValueError(f"GSM8K method must be 'strict' or 'flexible', got {method!r}")
    return matches[-1].strip() if matches else None


def compute_score(
    solution_str: str,
    ground_truth: str | int | float,
    method: Literal["strict", "flexible"] = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """`score` if the extracted answer equals the ground truth, `format_score` if an answer
    was found but is wrong, 0.0 if none was found."""
    expected = to_decimal(str(ground_truth))
    if expected is None:
        raise ValueError(f"GSM8K ground truth must be a number, got {ground_truth!r}")
    answer = extract_answer(solution_str, method)
    if answer is None:
        return 0.0
    value = to_decimal(answer)
    return score if value is not None and value == expected else format_score
