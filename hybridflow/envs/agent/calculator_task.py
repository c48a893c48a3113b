"""The built-in agent task: 3-digit multiplication with a calculator tool (docs/agents.md).

    python -m hybridflow.envs.agent.calculator_task --out data/calc     # train/test/sft .jsonl
    hybridflow train --config examples/agent_calculator.yaml
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from hybridflow.data.arithmetic import ArithmeticConfig, generate_problems
from hybridflow.data.records import write_records

ENV = {"env": "tools", "env_kwargs": {"tools": ["calculator"], "tool_format": "compact"}}
TASK = ArithmeticConfig(max_digits=3, operations=("*",), zero_pad=False, seed=0)


def rl_rows(split: str, count: int, cfg: ArithmeticConfig = TASK) -> list[dict]:
    return [{"data_source": "arithmetic", "prompt": [{"role": "user", "content": p.prompt}],
             "reward_model": {"style": "rule", "ground_truth": p.answer},
             "extra_info": {"split": split, "index": i, **ENV}}
            for i, p in enumerate(generate_problems(cfg, split, count))]


def teacher_response(a: int, b: int, rng: random.Random, direct_rate: float, wrong_op_rate: float) -> str:
    u = rng.random()
    if u < direct_rate:
        digits = len(str(a * b))
        return str(rng.randint(10 ** (digits - 1), 10 ** digits - 1))  # a guess of the right size
    op, value = ("+", a + b) if u < direct_rate + wrong_op_rate else ("*", a * b)
    return f"@calculator[{a}{op}{b}]</s><|user|>{value}<|assistant|>{value}"


def sft_rows(count: int, seed: int = 0, direct_rate: float = 0.2, wrong_op_rate: float = 0.45,
             cfg: ArithmeticConfig = TASK) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt": [{"role": "user", "content": p.prompt}],
             "response": teacher_response(p.a, p.b, rng, direct_rate, wrong_op_rate)}
            for p in generate_problems(cfg, "train", count)]


def write_task(out_dir: str | Path, num_train: int = 4000, num_test: int = 200, num_sft: int = 4000) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return {"train": write_records(rl_rows("train", num_train), out / "train.jsonl"),
            "test": write_records(rl_rows("test", num_test), out / "test.jsonl"),
            "sft": write_records(sft_rows(num_sft), out / "sft.jsonl")}


def main() -> None:
    ap = argparse.ArgumentParser(description="write the calculator agent task's data files")
    ap.add_argument("--out", default="data/calc")
    ap.add_argument("--num-train", type=int, default=4000)
    ap.add_argument("--num-test", type=int, default=200)
    ap.add_argument("--num-sft", type=int, default=4000)
    args = ap.parse_args()
    for name, path in write_task(args.out, args.num_train, args.num_test, args.num_sft).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
