"""Warm-start data of the built-in arithmetic task: answers from an imperfect teacher."""

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
