"""Rule-based scorers: arithmetic, GSM8K (real rows), format, math equivalence, registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridflow.rewards import (
    SCORERS,
    DispatchScore,
    arithmetic,
    default_compute_score,
    gsm8k,
    math_answer,
)
from hybridflow.rewards.format import format_score

GSM8K_TEST = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl"


def test_arithmetic_exact_answer():
    assert arithmetic.compute_score("357", "357") == 1.0
    assert arithmetic.compute_score(" 357\n", "357") == 1.0
    assert arithmetic.compute_score("356", "357") == 0.0
    assert arithmetic.compute_score("356", "357", format_score=0.1) == 0.1
    assert arithmetic.compute_score("357 apples", "357", format_score=0.1) == 0.0
    assert arithmetic.compute_score("-4", "-4") == 1.0
    with pytest.raises(ValueError, match="integer string"):
        arithmetic.compute_score("1", "one")


@pytest.mark.skipif(not GSM8K_TEST.is_file(), reason="shared GSM8K data not found")
def test_gsm8k_on_real_rows():
    with GSM8K_TEST.open() as handle:
        rows = [json.loads(next(handle)) for _ in range(30)]
    truths = [row["answer"].rsplit("####", 1)[1].strip().replace(",", "") for row in rows]
    # Janet's ducks: (16 - 3 - 4) * $2 = $18; the robe: 2 + 1 = 3 bolts
    assert truths[:2] == ["18", "3"]
    for row, truth in zip(rows, truths):
        assert gsm8k.compute_score(row["answer"], truth, method="strict") == 1.0
        assert gsm8k.compute_score(row["answer"], truth, method="flexible") == 1.0
        assert gsm8k.compute_score(row["answer"], str(int(truth) + 1)) == 0.0
        # without the marker, strict finds nothing while flexible reads the last number
        unmarked = row["answer"].replace("####", "so the answer is")
        assert gsm8k.compute_score(unmarked, truth, method="strict") == 0.0
        assert gsm8k.compute_score(unmarked, truth, method="flexible") == 1.0


@pytest.mark.parametrize(
    "response, truth, method, expected",
    [
        ("She pays $1,200 in total.\n#### $1,200", "1200", "strict", 1.0),
        ("#### 1,200.", "1200", "strict", 1.0),
        ("#### 18.0", "18", "strict", 1.0),
        ("#### -7", "-7", "strict", 1.0),
        ("#### 5 ... actually #### 6", "6", "strict", 1.0),  # the last marker counts
        ("The total is 1,234.50 dollars.", "1234.5", "flexible", 1.0),
        ("I think 12 or 13", "12", "flexible", 0.0),  # the last number counts
        ("no number at all", "3", "flexible", 0.0),
    ],
)
def test_gsm8k_number_formats(response, truth, method, expected):
    assert gsm8k.compute_score(response, truth, method=method) == expected


def test_gsm8k_format_score_and_errors():
    assert gsm8k.compute_score("#### 4", "5", format_score=0.1) == 0.1
    assert gsm8k.compute_score("nothing", "5", format_score=0.1) == 0.0
    with pytest.raises(ValueError, match="strict' or 'flexible"):
        gsm8k.compute_score("#### 4", "4", method="loose")
    with pytest.raises(ValueError, match="must be a number"):
        gsm8k.compute_score("#### 4", "four")


@pytest.mark.parametrize(
    "response, pattern, expected",
    [
        ("step 1... \n#### 42", "gsm8k", 1.0),
        ("the answer is 42", "gsm8k", 0.0),
        ("<think>add</think> <answer>3</answer>", "think_answer", 1.0),
        ("<answer>3</answer>", "think_answer", 0.0),
        ("so $\\boxed{7}$.", "boxed", 1.0),
        ("357", "integer", 1.0),
        ("357!", "integer", 0.0),
        ("abc", r"a.c", 1.0),
    ],
)
def test_format_reward(response, pattern, expected):
    assert format_score(response, pattern) == expected


def test_format_reward_bad_pattern():
    with pytest.raises(ValueError, match="neither a named format"):
        format_score("x", "(unclosed")


EQUIVALENT = [
    ("The answer is $\\boxed{\\frac{1}{2}}$.", "0.5"),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}"),
    ("so $x = 3$, hence \\boxed{3}", "3"),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt2}{2}"),
    ("\\boxed{(x+1)^2}", "x^2+2x+1"),
    ("\\boxed{10\\%}", "10"),
    ("\\boxed{2\\sqrt{3}}", "\\sqrt{12}"),  # simplified radicals
    ("\\boxed{\\{1,2\\}}", "\\{2,1\\}"),  # sets: order does not matter
    ("the interval is \\boxed{(0,1]}", "(0,1]"),
    ("\\boxed{1.5}", "\\frac{3}{2}"),
]
NOT_EQUIVALENT = [
    ("\\boxed{11}", "10"),
    ("\\boxed{\\pi}", "3.14"),
    ("\\boxed{\\frac{1}{3}}", "0.3"),
    ("no answer here", "2"),
    ("\\boxed{(0,1)}", "(0,1]"),  # open vs half-open interval
    ("\\boxed{-\\frac{1}{2}}", "\\frac{1}{2}"),  # the sign counts
]


@pytest.mark.skipif(not math_answer.HAVE_MATH_VERIFY, reason="math-verify not installed")
@pytest.mark.parametrize("response, truth", EQUIVALENT)
def test_math_verify_equivalent(response, truth):
    assert math_answer.compute_score(response, truth) == 1.0


@pytest.mark.skipif(not math_answer.HAVE_MATH_VERIFY, reason="math-verify not installed")
@pytest.mark.parametrize("response, truth", NOT_EQUIVALENT)
def test_math_verify_not_equivalent(response, truth):
    assert math_answer.compute_score(response, truth) == 0.0


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{1/2}", "\\frac12", 1.0),
        ("\\boxed{x = 3}", "3", 1.0),
        ("\\boxed{\\text{(B)}}", "(B)", 1.0),
        ("\\boxed{90^\\circ}", "90", 1.0),
        ("the total is 1,000", "1000", 1.0),
        ("\\boxed{11}", "10", 0.0),
        ("\\boxed{\\frac{1}{3}}", "0.3", 0.0),
        ("nothing", "1", 0.0),
    ],
)
def test_fallback_equivalence(response, truth, expected):
    assert math_answer.compute_score(response, truth, use_math_verify=False) == expected


def test_last_boxed_matches_braces():
    assert math_answer.last_boxed("a \\boxed{1} b \\boxed{\\frac{2}{3}} c") == "\\frac{2}{3}"
    assert math_answer.last_boxed("no box") is None


def test_registry_dispatch():
    assert default_compute_score("arithmetic", "46", "46") == 1.0
    assert default_compute_score("openai/gsm8k", "so\n#### 72", "72") == 1.0
    assert default_compute_score("lighteval/MATH", "\\boxed{4}", "4") == 1.0
    assert DispatchScore()(data_source="gsm8k", solution_str="#### 1", ground_truth="2") == 0.0
    with pytest.raises(KeyError, match="no built-in scorer for data_source 'mystery'"):
        default_compute_score("mystery", "1", "1")
    assert "arithmetic" in SCORERS
