"""Prompt files of the three cold-start tasks (docs/learning.md, "Cold start"): tasks whose
answer is a short exact string that SmolLM2-135M-Instruct does not give at first (it answers
in a sentence), so it starts at or under 2 % exact accuracy.

    python examples/make_coldstart_data.py --task numwords --seed 0 --out-dir data/coldstart
    # -> numwords_heldout.jsonl (200), numwords_demos.jsonl (32), numwords_train.jsonl (the rest)

Tasks (`--task`), each answered by the whole response, exactly (examples/exact_match_reward.py;
benchmarks/rl/eval_plain.py --answer exact):
- numwords: "Write the number 347 in words." -> "three hundred forty-seven" (1-999; lowercase,
  a hyphen between tens and units, no "and").
- arith: "What is 47 + 38?" -> "85" (two-digit +, -, and one- by two-digit x).
- units: "How many minutes are in 7 hours?" -> "420" (18 unit pairs, 2-30 of the bigger unit).

Split rules (stated so a result can be checked): problems come from a `random.Random(seed)`
stream; the first `--heldout` distinct questions are the held-out set, the next `--demos`
distinct ones the demonstrations (prompt/response pairs for sft.files), the next `--train`
the RL training prompts; no question is in two files (a test checks). Every row has a
`difficulty` column (1 easy .. 3 hard; what each task counts as hard is in its generator)
for `data.curriculum.by: column`.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path

from hybridflow.data.records import write_records

INSTRUCTION = {"numwords": "Reply with the number in lowercase words only.",
               "arith": "Reply with the number only.", "units": "Reply with the number only."}
_ONES = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]

Problem = tuple[str, str, int]  # question, answer, difficulty


def number_words(n: int) -> str:
    """1 <= n <= 999 in words: "three hundred forty-seven" (no "and")."""
    if not 1 <= n <= 999:
        raise ValueError(f"number_words covers 1..999, got {n}")
    hundreds, rest = divmod(n, 100)
    parts = [f"{_ONES[hundreds]} hundred"] if hundreds else []
    if rest >= 20:
        parts.append(_TENS[rest // 10] + (f"-{_ONES[rest % 10]}" if rest % 10 else ""))
    elif rest:
        parts.append(_ONES[rest])
    return " ".join(parts)


def _numwords(r: random.Random) -> Problem:
    # Hard: three digits; easy: up to twenty (a single word).
    n = r.choice((r.randint(1, 20), r.randint(21, 99), r.randint(100, 999), r.randint(100, 999)))
    return f"Write the number {n} in words.", number_words(n), 1 if n <= 20 else 2 if n < 100 else 3


def _arith(r: random.Random) -> Problem:
    op = r.choice("+-x")
    if op == "+":
        a, b = r.randint(10, 89), r.randint(10, 89)
        return f"What is {a} + {b}?", str(a + b), 1
    if op == "-":
        a = r.randint(20, 99)
        b = r.randint(10, a - 1)
        return f"What is {a} - {b}?", str(a - b), 2
    a, b = r.randint(2, 9), r.randint(11, 39)
    return f"What is {a} x {b}?", str(a * b), 3


# (bigger, smaller, how many smaller in one bigger)
_UNITS = [("hours", "minutes", 60), ("minutes", "seconds", 60), ("days", "hours", 24), ("weeks", "days", 7),
          ("meters", "centimeters", 100), ("kilograms", "grams", 1000), ("feet", "inches", 12), ("years", "months", 12),
          ("kilometers", "meters", 1000), ("liters", "milliliters", 1000), ("centimeters", "millimeters", 10),
          ("decades", "years", 10), ("centuries", "years", 100), ("dollars", "cents", 100), ("yards", "feet", 3),
          ("gallons", "quarts", 4), ("pounds", "ounces", 16), ("quarts", "pints", 2)]


def _units(r: random.Random) -> Problem:
    # Hard: a long answer (3 digits and more are hard to get right without writing the product).
    big, small, factor = r.choice(_UNITS)
    n = r.randint(2, 30)
    answer = str(n * factor)
    return f"How many {small} are in {n} {big}?", answer, min(3, max(1, len(answer) - 1))


TASKS: dict[str, Callable[[random.Random], Problem]] = {"numwords": _numwords, "arith": _arith, "units": _units}


def problems(task: str, seed: int, count: int) -> list[Problem]:
    """The first `count` distinct problems of the task's seeded stream (fewer when 10000 draws
    in a row find nothing new: the task has no more)."""
    r, seen, out, misses = random.Random(seed), set(), [], 0
    while len(out) < count and misses < 10000:
        problem = TASKS[task](r)
        misses = misses + 1 if problem[0] in seen else 0
        if problem[0] not in seen:
            seen.add(problem[0])
            out.append(problem)
    return out


def row(task: str, problem: Problem, split: str, index: int) -> dict:
    """One verl-format row (the question and the task's instruction as the user message)."""
    question, answer, difficulty = problem
    return {"data_source": f"coldstart_{task}", "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION[task]}"}],
            "ability": "exact", "reward_model": {"style": "rule", "ground_truth": answer}, "difficulty": difficulty,
            "extra_info": {"split": split, "index": index, "question": question}}


def demo(task: str, problem: Problem, index: int) -> dict:
    """One demonstration: the prompt as the RL rows have it and the exact answer as the response."""
    return {**row(task, problem, "demos", index), "response": problem[1]}


def split(task: str, seed: int, heldout: int, demos: int, train: int) -> dict[str, list[dict]]:
    """{"heldout", "demos", "train"} rows: consecutive distinct problems of the stream."""
    found = problems(task, seed, heldout + demos + train)
    held, shown, rest = found[:heldout], found[heldout:heldout + demos], found[heldout + demos:]
    return {"heldout": [row(task, p, "heldout", i) for i, p in enumerate(held)],
            "demos": [demo(task, p, i) for i, p in enumerate(shown)],
            "train": [row(task, p, "train", i) for i, p in enumerate(rest)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout", type=int, default=200)
    parser.add_argument("--demos", type=int, default=32)
    parser.add_argument("--train", type=int, default=4000, help="at most this many (numwords has 999 numbers)")
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args()
    for part, rows in split(args.task, args.seed, args.heldout, args.demos, args.train).items():
        print(f"{write_records(rows, args.out_dir / f'{args.task}_{part}.jsonl')}: {len(rows)} rows")


if __name__ == "__main__":
    main()
