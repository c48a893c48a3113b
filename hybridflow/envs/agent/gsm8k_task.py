"""GSM8K rows for a tool-calling agent: the calculator in the model's own chat template (docs/agents.md).

    python -m hybridflow.envs.agent.gsm8k_task --input ../shared/data/gsm8k/train.jsonl \
        --out data/gsm8k_agent --limit 256 --model-dir MODEL_DIR      # train.jsonl + sft.jsonl
    hybridflow train --config examples/agent_gsm8k_smollm2.yaml
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from hybridflow.data.preprocess import check_output, gsm8k_record, write_atomically
from hybridflow.data.records import read_records
from hybridflow.envs.agent.render import ChatRenderer
from hybridflow.envs.agent.tools import CALCULATOR

ENV = {"env": "tools", "env_kwargs": {"tools": ["calculator"], "tool_format": "hermes"}}
MAX_CALLS = 4  # the tools env's default max_calls_per_turn
_ANNOTATION = re.compile(r"<<([^=<>]+)=([^<>]*)>>")


def agent_row(question: str, answer: str, split: str, index: int) -> dict:
    row = gsm8k_record(question, answer, split, index)
    row["extra_info"] = {**row["extra_info"], **ENV}
    return row


def tool_call(expression: str) -> str:
    return "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": expression}}) + "</tool_call>"


def teacher_messages(answer: str) -> list[dict]:
    """The teacher's turns for one GSM8K solution: calls, tool answers, final answer."""
    expressions = [m.group(1).strip() for m in _ANNOTATION.finditer(answer)][:MAX_CALLS]
    final = _ANNOTATION.sub("", answer).strip()
    if not expressions:
        return [{"role": "assistant", "content": final}]
    calls = [{"role": "assistant", "content": "".join(tool_call(e) for e in expressions)}]
    answers = [{"role": "tool", "content": CALCULATOR.call({"expression": e})} for e in expressions]
    return calls + answers + [{"role": "assistant", "content": final}]


def sft_row(renderer: ChatRenderer, question: str, answer: str) -> dict:
    """(prompt messages, response text): the response is what the template renders after the
    prompt's generation prompt, up to (not including) the final end-of-turn token, which
    the SFT data set appends as eos."""
    tools = [CALCULATOR.schema]
    prompt = renderer.with_tools(gsm8k_record(question, answer, "train", 0)["prompt"], tools)
    head = renderer.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = renderer.tokenizer.apply_chat_template(prompt + teacher_messages(answer), tokenize=False)
    if not full.startswith(head):
        raise ValueError("the chat template does not render the prompt as a prefix of the conversation")
    response = full[len(head):].rstrip()
    eos = renderer.tokenizer.eos_token
    if not response.endswith(eos):
        raise ValueError(f"the conversation does not end with the tokenizer's eos {eos!r}")
    return {"prompt": prompt, "response": response[: -len(eos)]}


def write_task(in_jsonl: str | Path, out_dir: str | Path, limit: int | None = None, model_dir: str | None = None,
               overwrite: bool = False) -> dict:
    """train.jsonl (agent rows) and, with `model_dir`'s tokenizer, sft.jsonl in `out_dir`."""
    rows = read_records(in_jsonl, limit)
    for i, r in enumerate(rows):
        if "question" not in r or "answer" not in r:
            raise ValueError(f"{in_jsonl}: row {i} lacks 'question'/'answer' (columns {sorted(r)}); is this GSM8K?")
    if not rows:
        raise ValueError(f"{in_jsonl}: no rows to convert")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"train": check_output(out / "train.jsonl", overwrite)}
    write_atomically([agent_row(r["question"], r["answer"], "train", i) for i, r in enumerate(rows)], paths["train"])
    if model_dir is not None:
        from transformers import AutoTokenizer

        renderer = ChatRenderer(AutoTokenizer.from_pretrained(model_dir, local_files_only=True, trust_remote_code=False))
        paths["sft"] = check_output(out / "sft.jsonl", overwrite)
        write_atomically([sft_row(renderer, r["question"], r["answer"]) for r in rows], paths["sft"])
    return {name: str(path) for name, path in paths.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description="write GSM8K rows for the calculator agent (RL rows, SFT warm start)")
    ap.add_argument("--input", required=True, help="GSM8K jsonl with question/answer")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--model-dir", default=None, help="the model's directory (its tokenizer renders sft.jsonl)")
    ap.add_argument("--force", action="store_true", help="replace existing outputs")
    args = ap.parse_args()
    print(write_task(args.input, args.out, args.limit, args.model_dir, args.force))


if __name__ == "__main__":
    main()
