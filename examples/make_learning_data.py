"""Prompt files for the learning recipe (docs/learning.md): GSM8K subsets and seeded
arithmetic word problems, in the verl columns `hybridflow train` / `hybridflow eval` read.

    # GSM8K problems whose solution has exactly 1 (or 2) calculator annotations <<...>>:
    python examples/make_learning_data.py gsm8k --input ../shared/data/gsm8k/test.jsonl --calc 1 \
        --out data/learn/gsm8k_calc1_test.jsonl
    # word problems: the first 200 distinct ones of seed 0 are held out, the next 4000 train:
    python examples/make_learning_data.py words --seed 0 --steps 1 --heldout 200 --train 4000 \
        --out-dir data/learn --name words1

Selection and split rules (stated so a result can be checked):
- gsm8k: a row is kept when its reference solution has exactly `--calc` calculator
  annotations (`<<expr=value>>`; 1 or 2 means one- or two-step problems, the easiest GSM8K
  has). Held-out rows come from GSM8K's test split, training rows from its train split. The
  ground truth is the number after '####'.
- words: problems are drawn from templates (below) with a `random.Random(seed)` stream; the
  first `--heldout` distinct question texts are the held-out set, the next `--train`
  distinct texts not among them the training set, so no held-out question is trained on.
  `--steps 1`: one operation (+, -, x or /, small whole numbers); `--steps 2`: two
  operations; `--steps 12`: half of each.

Prompt formats (`--format`): `direct` asks for the number alone; `steps` for short
reasoning ending in "The answer is N."; `gsm8k` the instruction `hybridflow preprocess
gsm8k` writes. Every answer is read as the last number of the response
(examples/last_number_reward.py; benchmarks/rl/eval_plain.py --answer last-number).
"""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Callable
from pathlib import Path

from hybridflow.data.preprocess import GSM8K_INSTRUCTION, gsm8k_ground_truth
from hybridflow.data.records import read_records, write_records

FORMATS = {
    "direct": "Reply with the final number only.",
    "steps": "Think step by step in one or two short sentences, then finish with 'The answer is N.'",
    "gsm8k": GSM8K_INSTRUCTION,
}
_CALC = re.compile(r"<<[^>]*>>")

NAMES = [("Anna", "she"), ("Ben", "he"), ("Carla", "she"), ("David", "he"), ("Emma", "she"), ("Felix", "he"),
         ("Grace", "she"), ("Hugo", "he"), ("Ines", "she"), ("Jack", "he"), ("Kira", "she"), ("Leo", "he"),
         ("Maya", "she"), ("Noah", "he"), ("Olivia", "she"), ("Paul", "he"), ("Rosa", "she"), ("Sam", "he"),
         ("Tara", "she"), ("Omar", "he")]
ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "cookies", "stamps", "shells", "cards", "balloons",
         "oranges", "toy cars", "coins", "flowers", "eggs", "buttons"]


def calc_steps(answer: str) -> int:
    """How many calculator annotations a GSM8K reference solution has."""
    return len(_CALC.findall(answer))


def record(question: str, answer: int | str, fmt: str, source: str, split: str, index: int) -> dict:
    """One verl-format row: the question with the format's instruction as the user message."""
    return {"data_source": source, "prompt": [{"role": "user", "content": f"{question} {FORMATS[fmt]}"}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(answer)},
            "extra_info": {"split": split, "index": index, "question": question}}


def gsm8k_rows(path: Path, calc: int, fmt: str, limit: int | None) -> list[dict]:
    """GSM8K rows with exactly `calc` calculator annotations (the first `limit`)."""
    rows = []
    for i, row in enumerate(read_records(path)):
        if calc_steps(row["answer"]) == calc:
            rows.append(record(row["question"].strip(), gsm8k_ground_truth(row["answer"]), fmt,
                               f"gsm8k_calc{calc}", path.stem, i))
    return rows[:limit]


# ----------------------------------------------------------------------------- word problems
# Each template draws its numbers and returns (question, answer); answers are whole and >= 0.

Problem = tuple[str, int]


def _add(r: random.Random, name: str, he: str, item: str) -> Problem:
    a, b = r.randint(3, 40), r.randint(2, 30)
    return f"{name} has {a} {item}. {he.capitalize()} gets {b} more. How many {item} does {name} have now?", a + b


def _sub(r: random.Random, name: str, he: str, item: str) -> Problem:
    a = r.randint(10, 60)
    b = r.randint(2, a - 1)
    return f"{name} had {a} {item} and gave {b} of them away. How many {item} does {name} have left?", a - b


def _mul(r: random.Random, name: str, he: str, item: str) -> Problem:
    a, b = r.randint(2, 9), r.randint(2, 10)
    return f"{name} buys {a} bags with {b} {item} in each bag. How many {item} does {name} buy?", a * b


def _div(r: random.Random, name: str, he: str, item: str) -> Problem:
    a, b = r.randint(2, 9), r.randint(2, 10)
    return (f"{name} shares {a * b} {item} equally among {a} friends. How many {item} does each friend get?", b)


def _add_sub(r: random.Random, name: str, he: str, item: str) -> Problem:
    a, b = r.randint(5, 40), r.randint(2, 30)
    c = r.randint(1, a + b - 1)
    return (f"{name} has {a} {item}. {he.capitalize()} gets {b} more and then gives {c} away. "
            f"How many {item} does {name} have now?", a + b - c)


def _mul_add(r: random.Random, name: str, he: str, item: str) -> Problem:
    a, b, c = r.randint(2, 9), r.randint(2, 10), r.randint(1, 20)
    return (f"{name} buys {a} bags with {b} {item} in each bag and finds {c} more {item}. "
            f"How many {item} does {name} have?", a * b + c)


def _change(r: random.Random, name: str, he: str, item: str) -> Problem:
    price, count = r.randint(2, 9), r.randint(2, 6)
    paid = next(bill for bill in (10, 20, 50, 100) if bill >= price * count)
    singular = item[:-1] if item.endswith("s") else item
    return (f"One {singular} costs {price} dollars. {name} buys {count} {item} and pays with a {paid}-dollar bill. "
            f"How many dollars of change does {name} get?", paid - price * count)


def _sub_sub(r: random.Random, name: str, he: str, item: str) -> Problem:
    a = r.randint(20, 80)
    b = r.randint(2, a // 2)
    c = r.randint(1, a - b - 1)
    return (f"{name} had {a} {item}. {he.capitalize()} lost {b} of them and gave {c} to a friend. "
            f"How many {item} does {name} have left?", a - b - c)


TEMPLATES: dict[str, list[Callable[[random.Random, str, str, str], Problem]]] = {
    "1": [_add, _sub, _mul, _div],
    "2": [_add_sub, _mul_add, _change, _sub_sub],
}


def word_problems(seed: int, steps: str, count: int) -> list[Problem]:
    """`count` distinct problems of the seeded stream (`steps`: "1", "2" or "12" alternating)."""
    r = random.Random(seed)
    kinds = [TEMPLATES[s] for s in steps]
    seen: set[str] = set()
    out: list[Problem] = []
    while len(out) < count:
        name, he = r.choice(NAMES)
        question, answer = r.choice(kinds[len(out) % len(kinds)])(r, name, he, r.choice(ITEMS))
        if question not in seen:
            seen.add(question)
            out.append((question, answer))
    return out


def word_rows(seed: int, steps: str, heldout: int, train: int, fmt: str) -> tuple[list[dict], list[dict]]:
    """(held-out rows, training rows): the first `heldout` distinct problems, then `train` more."""
    problems = word_problems(seed, steps, heldout + train)
    source = f"words{steps}_{fmt}"
    held = [record(q, a, fmt, source, "heldout", i) for i, (q, a) in enumerate(problems[:heldout])]
    rest = [record(q, a, fmt, source, "train", i) for i, (q, a) in enumerate(problems[heldout:])]
    return held, rest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    g = sub.add_parser("gsm8k", help="GSM8K rows with a given number of calculator annotations")
    g.add_argument("--input", type=Path, required=True)
    g.add_argument("--calc", type=int, required=True)
    g.add_argument("--format", choices=sorted(FORMATS), default="steps")
    g.add_argument("--limit", type=int, default=None)
    g.add_argument("--out", type=Path, required=True)
    w = sub.add_parser("words", help="seeded arithmetic word problems: held-out and training files")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--steps", choices=("1", "2", "12"), default="1")
    w.add_argument("--heldout", type=int, default=200)
    w.add_argument("--train", type=int, default=4000)
    w.add_argument("--format", choices=sorted(FORMATS), default="direct")
    w.add_argument("--out-dir", type=Path, required=True)
    w.add_argument("--name", default=None, help="file name stem (default words<steps>_<format>)")
    args = parser.parse_args()
    if args.kind == "gsm8k":
        rows = gsm8k_rows(args.input, args.calc, args.format, args.limit)
        print(f"{write_records(rows, args.out)}: {len(rows)} rows")
        return
    held, train = word_rows(args.seed, args.steps, args.heldout, args.train, args.format)
    stem = args.name or f"words{args.steps}_{args.format}"
    for rows, part in ((held, "heldout"), (train, "train")):
        if rows:
            print(f"{write_records(rows, args.out_dir / f'{stem}_{part}.jsonl')}: {len(rows)} rows")


if __name__ == "__main__":
    main()
