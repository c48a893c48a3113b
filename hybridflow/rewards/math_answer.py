"""Math answer equivalence (MATH-style data sets with LaTeX answers).

With the `math-verify` package installed (the `rewards` extra), answers are parsed into
SymPy and compared symbolically: "\\frac{1}{2}" equals "0.5", "(x+1)^2" equals
"x^2+2x+1". Without it, a small fallback compares normalised strings and plain numbers
(integers, decimals, fractions "a/b" and "\\frac{a}{b}"); it knows no algebra.
"""

from __future__ import annotations

import re
import signal
import threading
from fractions import Fraction

try:  # optional dependency: the `rewards` extra installs it
    import math_verify

    HAVE_MATH_VERIFY = True
except ImportError:  # pragma: no cover - exercised only where the extra is missing
    math_verify = None
    HAVE_MATH_VERIFY = False


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces matched; None if absent."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        # "\boxed 5" form: the answer runs to the next space or '$'.
        rest = text[start:].split(None, 1)
        return rest[1].split("$")[0].strip() if len(rest) > 1 else None
    depth = 0
    for i in range(brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[brace + 1 : i]
    return None


def _signal_timeouts_usable() -> bool:
    # math-verify guards parsing with SIGALRM. That works only in the main thread, and it
    # would cancel an alarm already armed by our RewardManager (which enforces its own
    # per-sample timeout), so use math-verify's timeouts only when neither applies.
    return threading.current_thread() is threading.main_thread() and signal.getitimer(signal.ITIMER_REAL)[0] == 0


def _verify_with_math_verify(solution_str: str, ground_truth: str) -> bool:
    timeout = 5 if _signal_timeouts_usable() else None
    gold_text = ground_truth if ("$" in ground_truth or "\\boxed" in ground_truth) else f"\\boxed{{{ground_truth}}}"
    gold = math_verify.parse(gold_text, parsing_timeout=timeout)
    boxed = last_boxed(solution_str)
    pred = math_verify.parse(f"\\boxed{{{boxed}}}" if boxed is not None else solution_str, parsing_timeout=timeout)
    if not gold or not pred:
        return False
    return bool(math_verify.verify(gold, pred, timeout_seconds=timeout))


_REMOVE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "^\\circ", "^{\\circ}", "\\%", "%", "$")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_FRAC = re.compile(r"\\frac\{([^{}]+)\}\{([^{}]+)\}|\\frac(\d)(\d)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def normalize_answer(text: str) -> str:
    """Canonical string form: no spacing macros, units-free text, 'dfrac' -> 'frac', ..."""
    text = text.strip()
    for token in _REMOVE:
        text = text.replace(token, "")
    text = _TEXT.sub(r"\1", text).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = re.sub(r"^[a-zA-Z]\s*=\s*", "", text)  # "x = 3" -> "3"
    text = text.replace(" ", "").rstrip(".")
    return text


def _as_number(text: str) -> Fraction | None:
    frac = _FRAC.fullmatch(text)
    if frac:
        num, den = (frac.group(1), frac.group(2)) if frac.group(1) else (frac.group(3), frac.group(4))
        text = f"{num}/{den}"
    parts = text.replace(",", "").split("/")
    try:
        values = [Fraction(p) for p in parts]
    except (ValueError, ZeroDivisionError):
        return None
    if len(values) == 1:
        return values[0]
    if len(values) == 2 and values[1] != 0:
        return values[0] / values[1]
    return None


def fallback_equal(prediction: str, ground_truth: str) -> bool:
    """Equal after normalisation, or both plain numbers with the same value."""
    a, b = normalize_answer(prediction), normalize_answer(ground_truth)
    if a == b:
        return bool(a)
    x, y = _as_number(a), _as_number(b)
    return x is not None and y is not None and x == y


def _verify_fallback(solution_str: str, ground_truth: str) -> bool:
    answer = last_boxed(solution_str)
    if answer is None:
        numbers = _NUMBER.findall(solution_str)
        if not numbers:
            return False
        answer = numbers[-1]
    return fallback_equal(answer, last_boxed(ground_truth) or ground_truth)


def is_equivalent(solution_str: str, ground_truth: str, use_math_verify: bool = True) -> bool:
    """Whether the response's final answer equals the ground truth (see module docstring)."""
    if use_math_verify and HAVE_MATH_VERIFY:
        return _verify_with_math_verify(solution_str, str(ground_truth))
    return _verify_fallback(solution_str, str(ground_truth))


def compute_score(solution_str: str, ground_truth: str, use_math_verify: bool = True) -> float:
    """1.0 when the final answer is equivalent to the ground truth, else 0.0."""
    return 1.0 if is_equivalent(solution_str, ground_truth, use_math_verify) else 0.0
