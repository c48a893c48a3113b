"""An independent evaluator: plain transformers, no hybridflow code.

Scores a Hugging Face model directory on a held-out prompt file with greedy decoding, so a
claim "the policy got better" measured by `hybridflow eval` can be checked by code that
shares nothing with hybridflow's engines, data loader or scorers: the prompt file is read
here, rendered with the tokenizer's own chat template, generated with transformers'
`generate` (batched, left-padded, greedy) and the answer is read and compared here.

    python benchmarks/rl/eval_plain.py smollm2-135m-instruct --data data/learn/heldout.jsonl \
        --max-new-tokens 64 --out benchmarks/rl/results/eval_plain_base.json
    python benchmarks/rl/eval_plain.py runs/<run> --data F ...                 # the run's final_model/
    python benchmarks/rl/eval_plain.py exported_dir --data F ...               # `hybridflow export` output
    python benchmarks/rl/eval_plain.py MODEL --data F --compare report.json    # agreement with `hybridflow eval --output`
    python benchmarks/rl/eval_plain.py MODEL --data F --dtype bf16             # as rollout.dtype bf16 (fp32 by default)

MODEL is a Hugging Face directory (config.json, safetensors, tokenizer), a run directory
(its final_model/), or the name `smollm2-135m-instruct` (the directory hybridflow's
`model.pretrained` conversion cached: $HYBRIDFLOW_CACHE/models, else
$XDG_CACHE_HOME/hybridflow/models, else ~/.cache/hybridflow/models). A checkpoint
directory is refused with the command that exports it.

The data file is what `hybridflow eval --data` reads: parquet / jsonl / jsonl.gz rows with
`prompt` (a list of {role, content} messages or a string), `data_source` and
`reward_model.ground_truth` (or a top-level `ground_truth`). Prompts longer than
--max-prompt-length tokens are dropped (counted), then the first --limit rows are scored,
as `hybridflow eval` does with its defaults (data.prompt.filter_overlong_prompts).

Answers (--answer): `last-number` (default: the last number in the response, thousands
separators and a leading $ allowed, compared as a decimal: "18.0" equals "18"), `strict`
(the number after the last '####'), `exact` (the whole response, stripped, equals the
ground truth). The JSON has, overall and per data source: exact accuracy, the number of
distinct answers and the share of the most frequent one (collapse onto a few numbers shows
there), the share without an answer, the share cut by the length limit, 5 sample responses,
and every response; plus the machine (benchmarks/common/plain_machine.py) and wall times.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402
from benchmarks.common.plain_machine import load_average, machine  # noqa: E402

PRETRAINED_NAMES = ("smollm2-135m-instruct",)
NO_ANSWER = "<none>"
# A number: optional minus and dollar sign, digits (with comma groups of three), optional decimals.
_NUMBER = re.compile(r"-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_STRICT = re.compile(r"####\s*(-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)")


# ----------------------------------------------------------------------------- model and data


def cache_roots() -> list[Path]:
    """Where hybridflow's converted pretrained models may be (its documented cache rule)."""
    if os.environ.get("HYBRIDFLOW_CACHE"):
        return [Path(os.environ["HYBRIDFLOW_CACHE"]).expanduser() / "models"]
    xdg = os.environ.get("XDG_CACHE_HOME")
    return [(Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "hybridflow" / "models"]


def resolve_model(spec: str) -> Path:
    """The Hugging Face directory MODEL names (module docstring), or SystemExit with the fix."""
    if spec in PRETRAINED_NAMES:
        found = sorted(p for root in cache_roots() for p in root.glob(f"{spec}-*") if (p / "config.json").is_file())
        if not found:
            raise SystemExit(f"eval_plain: {spec} is not converted yet under {cache_roots()}; run "
                             f"`python -m hybridflow.engines.pretrained {spec}` once")
        return found[-1]
    path = Path(spec)
    if (path / "config.json").is_file():
        return path
    if (path / "final_model" / "config.json").is_file():
        return path / "final_model"
    if path.is_dir():
        raise SystemExit(f"eval_plain: {spec} is neither a Hugging Face model directory nor a run with final_model/; "
                         f"for a checkpoint run `hybridflow export {spec} --out DIR` and pass DIR")
    raise SystemExit(f"eval_plain: {spec} does not exist")


def read_rows(path: Path) -> list[dict]:
    """The rows of a parquet / jsonl / jsonl.gz file."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if not name.endswith((".jsonl", ".jsonl.gz", ".json")):
        raise SystemExit(f"eval_plain: {path}: use a .parquet, .jsonl or .jsonl.gz file")
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@dataclass
class Item:
    """One prompt to score."""

    file: str
    row: int
    data_source: str
    prompt: Any  # as in the file
    ground_truth: str
    input_ids: list[int]


def items_of(files: list[Path], tokenizer: Any, max_prompt_length: int, limit: int | None) -> tuple[list[Item], int]:
    """(the prompts to score, how many were dropped as too long): rendered with the chat
    template (generation prompt on), too-long ones dropped, then the first `limit`."""
    items, dropped = [], 0
    for path in files:
        for i, row in enumerate(read_rows(path)):
            prompt = row["prompt"]
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) > max_prompt_length:
                dropped += 1
                continue
            truth = (row.get("reward_model") or {}).get("ground_truth", row.get("ground_truth"))
            items.append(Item(str(path), i, str(row.get("data_source", "")), prompt, str(truth), ids))
    return (items if limit is None else items[:limit]), dropped


# ----------------------------------------------------------------------------- answers


def as_decimal(text: str) -> Decimal | None:
    try:
        value = Decimal(text.replace(",", "").replace("$", "").strip())
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def extracted(response: str, mode: str) -> str | None:
    """The answer the response gives in `mode` (numbers normalised: "1,200.0" -> "1200"; the
    stripped response itself in exact mode), or None when it gives none."""
    if mode == "exact":
        return response.strip()
    found = _STRICT.findall(response) if mode == "strict" else _NUMBER.findall(response)
    if not found:
        return None
    value = as_decimal(found[-1])
    if value is None:
        return None
    return format(value.normalize(), "f")  # normalize() alone writes 1200 as 1.2E+3


def is_correct(answer: str | None, ground_truth: str, mode: str) -> bool:
    if mode == "exact":
        return answer == ground_truth.strip()
    if answer is None:
        return False
    expected, got = as_decimal(ground_truth), as_decimal(answer)
    return expected is not None and got is not None and expected == got


# ----------------------------------------------------------------------------- generation


def generate(model: Any, tokenizer: Any, items: list[Item], max_new_tokens: int, batch_size: int) -> list[dict]:
    """Greedy responses of every item, in item order: {response (special tokens kept, up to
    the end token), text (special tokens removed, what is scored), length, finish_reason}."""
    import torch

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    # A file's prompts batch together (one prompt format per batch), similar lengths next to each other.
    order = sorted(range(len(items)), key=lambda k: (items[k].file, -len(items[k].input_ids)))
    out: list[dict] = [{} for _ in items]
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        width = max(len(items[k].input_ids) for k in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for r, k in enumerate(chunk):  # left padding: every prompt ends where generation starts
            n = len(items[k].input_ids)
            ids[r, width - n:] = torch.tensor(items[k].input_ids)
            mask[r, width - n:] = 1
        with torch.inference_mode():
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=eos, pad_token_id=pad)
        for r, k in enumerate(chunk):
            tokens = gen[r, width:].tolist()
            stop = tokens.index(eos) if eos in tokens else None
            kept = tokens if stop is None else tokens[: stop + 1]
            out[k] = {"response": tokenizer.decode(kept, skip_special_tokens=False),
                      "text": tokenizer.decode(kept, skip_special_tokens=True), "length": len(kept),
                      "finish_reason": "length" if stop is None else "stop"}
    return out


# ----------------------------------------------------------------------------- report


def summary(records: list[dict], show: int) -> dict[str, Any]:
    """Accuracy, distinct answers, the most frequent answer's share, no-answer and cut
    shares, mean length and `show` sample responses of `records`."""
    n = len(records)
    answers = collections.Counter(r["answer"] if r["answer"] is not None else NO_ANSWER for r in records)
    top, top_count = answers.most_common(1)[0] if answers else (None, 0)
    return {
        "samples": n, "accuracy": sum(r["correct"] for r in records) / n if n else 0.0,
        "correct": sum(r["correct"] for r in records),
        "distinct_answers": len(answers), "top_answer": top, "top_share": top_count / n if n else 0.0,
        "no_answer_share": answers.get(NO_ANSWER, 0) / n if n else 0.0,
        "clip_share": sum(r["finish_reason"] == "length" for r in records) / n if n else 0.0,
        "mean_length": sum(r["length"] for r in records) / n if n else 0.0,
        "sample_responses": [{k: r[k] for k in ("prompt_text", "response", "answer", "ground_truth", "correct")}
                             for r in records[:show]],
    }


def last_message(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else str(prompt[-1]["content"])


def compare(records: list[dict], report_path: Path) -> dict[str, Any]:
    """Row-by-row agreement with a `hybridflow eval --output` report of the same prompts."""
    theirs = json.loads(report_path.read_text())["responses"]
    if len(theirs) != len(records):
        return {"report": str(report_path), "error": f"{len(theirs)} responses there, {len(records)} here"}
    same_prompt = sum(last_message(a["prompt"]) == last_message(b["prompt"]) for a, b in zip(records, theirs))
    same_correct = sum(a["correct"] == bool(b["correct"]) for a, b in zip(records, theirs))
    same_response = sum(a["response"].strip() == str(b["response"]).strip() for a, b in zip(records, theirs))
    differ = [{"row": i, "here": a["response"], "there": b["response"], "here_correct": a["correct"],
               "there_correct": bool(b["correct"])}
              for i, (a, b) in enumerate(zip(records, theirs)) if a["correct"] != bool(b["correct"])]
    return {"report": str(report_path), "rows": len(records), "same_prompt": same_prompt,
            "same_correct": same_correct, "same_response": same_response,
            "accuracy_here": sum(r["correct"] for r in records) / len(records),
            "accuracy_there": sum(bool(b["correct"]) for b in theirs) / len(theirs),
            "metrics_there": json.loads(report_path.read_text()).get("metrics", {}), "correct_differs": differ[:10]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="HF model directory, run directory (final_model/) or smollm2-135m-instruct")
    parser.add_argument("--data", action="append", required=True, metavar="FILE", help="prompt file; repeatable")
    parser.add_argument("--limit", type=int, default=None, help="score the first N prompts (hybridflow eval --max-samples)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="as rollout.response_length (default 128)")
    parser.add_argument("--max-prompt-length", type=int, default=512, help="as data.prompt.max_prompt_length")
    parser.add_argument("--answer", choices=("last-number", "strict", "exact"), default="last-number")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="weights and compute (as rollout.dtype; compare like with like)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--show", type=int, default=5, help="sample responses in the JSON and on the console")
    parser.add_argument("--compare", type=Path, default=None, metavar="REPORT.json",
                        help="a `hybridflow eval --output` report of the same prompts: row-by-row agreement")
    parser.add_argument("--label", default="", help="free text stored in the JSON (what this measurement is)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here (a new file)")
    args = parser.parse_args()
    if args.out is not None and args.out.exists():
        raise SystemExit(f"eval_plain: --out {args.out} exists; nothing is overwritten")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    load_before = load_average()
    t0 = time.perf_counter()
    model_dir = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, trust_remote_code=False).eval()
    items, dropped = items_of([Path(f) for f in args.data], tokenizer, args.max_prompt_length, args.limit)
    if not items:
        raise SystemExit("eval_plain: no prompts left to score")
    t1 = time.perf_counter()
    outputs = generate(model, tokenizer, items, args.max_new_tokens, args.batch_size)
    t2 = time.perf_counter()

    records = []
    for item, out in zip(items, outputs):
        answer = extracted(out["text"], args.answer)
        records.append({"file": item.file, "row": item.row, "data_source": item.data_source, "prompt": item.prompt,
                        "prompt_text": last_message(item.prompt), "response": out["response"], "answer": answer,
                        "ground_truth": item.ground_truth, "correct": is_correct(answer, item.ground_truth, args.answer),
                        "length": out["length"], "finish_reason": out["finish_reason"]})
    sources = sorted({r["data_source"] for r in records})
    result = {
        "label": args.label, "model": str(args.model), "model_dir": str(model_dir), "data": args.data,
        "settings": {"decoding": "greedy", "max_new_tokens": args.max_new_tokens,
                     "max_prompt_length": args.max_prompt_length, "limit": args.limit, "answer": args.answer,
                     "batch_size": args.batch_size, "dtype": args.dtype, "chat_template": True},
        "prompts_dropped_as_too_long": dropped,
        "all": summary(records, args.show),
        "per_source": {s: summary([r for r in records if r["data_source"] == s], args.show) for s in sources},
        "wall_s": {"load": round(t1 - t0, 1), "generate": round(t2 - t1, 1)},
        "load_avg_before": load_before, "machine": machine(),
    }
    if args.compare is not None:
        result["compare"] = compare(records, args.compare)
    result["responses"] = records
    print(f"{model_dir}: {len(records)} prompts ({dropped} dropped as too long), generate {t2 - t1:.0f} s, "
          f"load average {load_before} -> {result['machine']['load_avg_1_5_15']}")
    for name, s in [("all", result["all"]), *result["per_source"].items()]:
        print(f"  {name:24s} accuracy {s['accuracy']:.3f} ({s['correct']}/{s['samples']})  distinct {s['distinct_answers']}"
              f"  top {s['top_answer']!r} {s['top_share']:.3f}  no answer {s['no_answer_share']:.3f}"
              f"  cut {s['clip_share']:.3f}  length {s['mean_length']:.1f}")
    for r in result["all"]["sample_responses"]:
        print(f"  - {r['prompt_text'][-70:]!r} -> {r['response'][:120]!r} (answer {r['answer']}, truth {r['ground_truth']})")
    if "compare" in result:
        c = result["compare"]
        print(f"  vs {args.compare}: " + (c["error"] if "error" in c else
              f"same correct {c['same_correct']}/{c['rows']}, same response {c['same_response']}/{c['rows']}, "
              f"accuracy here {c['accuracy_here']:.3f} there {c['accuracy_there']:.3f}"))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "x", encoding="utf-8") as f:
            json.dump(stamp(result), f, indent=1)
            f.write("\n")
        print(f"written {args.out}")


if __name__ == "__main__":
    main()
