"""GSM8K rows for a tool-calling agent: the calculator in the model's own chat template (docs/agents.md).

    python -m hybridflow.envs.agent.gsm8k_task --input ../shared/data/gsm8k/train.jsonl --out data/gsm8k_agent/train.jsonl
    hybridflow train --config examples/agent_gsm8k_smollm2.yaml

Each row is the verl GSM8K row (`hybridflow.data.preprocess.gsm8k_record`: data source
openai/gsm8k, ground truth after '####') with two changes:
- `extra_info` names the `tools` environment with the calculator in the Hermes form
  (`<tool_call>{"name": "calculator", "arguments": {"expression": "48/2"}}</tool_call>`);
  the renderer describes the tool in a system message when the chat template ignores
  `tools=` (SmolLM2's does).
- the prompt starts with one worked example as earlier chat turns (a question, the
  assistant's tool call, the tool's answer, the final answer): a 135M-parameter model
  does not call a tool from a description alone, but copies a demonstrated turn.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hybridflow.data.preprocess import check_output, gsm8k_record, write_atomically
from hybridflow.data.records import read_records

ENV = {"env": "tools", "env_kwargs": {"tools": ["calculator"], "tool_format": "hermes"}}


def _call(expression: str) -> str:
    return "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": expression}}) + "</tool_call>"


# One demonstrated episode, in chat messages the template renders like any other turns.
EXAMPLE = [
    {"role": "user", "content": "A box holds 12 pens. How many pens are in 7 boxes?"},
    {"role": "assistant", "content": _call("12*7")},
    {"role": "tool", "content": "84"},
    {"role": "assistant", "content": "7 boxes hold 12*7 = 84 pens.\n#### 84"},
]


def agent_row(question: str, answer: str, split: str, index: int) -> dict:
    row = gsm8k_record(question, answer, split, index)
    row["prompt"] = [dict(m) for m in EXAMPLE] + row["prompt"]
    row["extra_info"] = {**row["extra_info"], **ENV}
    return row


def write_agent_rows(in_jsonl: str | Path, out: str | Path, split: str, limit: int | None = None,
                     overwrite: bool = False) -> dict:
    """GSM8K jsonl ({question, answer}) -> agent rows (jsonl or parquet by `out`'s suffix)."""
    out_path = check_output(out, overwrite)
    rows = read_records(in_jsonl, limit)
    for i, r in enumerate(rows):
        if "question" not in r or "answer" not in r:
            raise ValueError(f"{in_jsonl}: row {i} lacks 'question'/'answer' (columns {sorted(r)}); is this GSM8K?")
    if not rows:
        raise ValueError(f"{in_jsonl}: no rows to convert")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically([agent_row(r["question"], r["answer"], split, i) for i, r in enumerate(rows)], out_path)
    return {"rows": len(rows), "out": str(out_path)}


def main() -> None:
    ap = argparse.ArgumentParser(description="write GSM8K rows for the calculator agent")
    ap.add_argument("--input", required=True, help="GSM8K jsonl with question/answer")
    ap.add_argument("--out", required=True, help="output .jsonl or .parquet")
    ap.add_argument("--split", default="train")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--force", action="store_true", help="replace an existing output")
    args = ap.parse_args()
    print(write_agent_rows(args.input, args.out, args.split, args.limit, args.force))


if __name__ == "__main__":
    main()
