"""Warm-start data of the built-in arithmetic task: answers from an imperfect teacher.

The built-in demo shows what RL with a checkable reward adds to imitation. Its warm start
imitates a teacher who knows the answer format and digit-wise addition but often forgets
to carry: in `carry_drop_rate` of its answers to addition problems it writes the sum
without carries (17+25 -> "032" instead of "042"). Fine-tuned on these pairs, the policy
puts most of its probability on the carry-less answer wherever a carry occurs, so greedy
decoding is right mainly on carry-free problems (about 30% of 2-digit additions), while
the right answer keeps the rest of the probability mass. GRPO, rewarded by the exact
checker, then has a consistent signal to learn from and raises held-out greedy accuracy
far above the teacher. With carry_drop_rate 0 the pairs are the task's exact answers.
"""

from __future__ import annotations

import numpy as np

from hybridflow.data.arithmetic import ArithmeticConfig, Problem, generate_problems


def carryless_sum(a: int, b: int) -> int:
    """Digit-wise sum mod 10 in every position: addition that forgets every carry."""
    total, place = 0, 1
    while a or b:
        total += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return total


def teacher_answer(problem: Problem, forget_carry: bool) -> str:
    """The teacher's answer, written in the task's format (same width as the exact answer)."""
    exact = problem.answer
    if not forget_carry or problem.op != "+":
        return exact
    value = carryless_sum(problem.a, problem.b)
    return f"{value:0{len(exact)}d}" if problem.pad_digits else str(value)


def teacher_sft_records(task: ArithmeticConfig, count: int, carry_drop_rate: float, seed: int) -> list[dict]:
    """`count` prompt/response pairs of the train split, answered by the imperfect teacher
    (`carry_drop_rate` in [0, 1]: SFTSection checks sft.builtin_carry_drop_rate)."""
    rng = np.random.default_rng([seed, 0x5F7])
    records = []
    for problem in generate_problems(task, "train", count):
        forget = bool(rng.random() < carry_drop_rate)
        records.append({"prompt": [{"role": "user", "content": problem.prompt}],
                        "response": teacher_answer(problem, forget)})
    return records
