"""Turn public data sets into our (verl-compatible) parquet formats.

    preprocess_gsm8k("gsm8k/train.jsonl", "gsm8k_train.parquet", split="train")
    preprocess_hh_rlhf("hh-rlhf-harmless/test.jsonl.gz", "hh_test.parquet")
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from hybridflow.data.records import SUFFIXES, read_records, write_records

GSM8K_DATA_SOURCE = "openai/gsm8k"
HH_RLHF_DATA_SOURCE = "Anthropic/hh-rlhf"

GSM8K_INSTRUCTION = "Reason step by step, then give the final numeric answer on the last line after '####'."

_GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$")


def check_output(out: str | Path, overwrite: bool) -> Path:
    """`out` as a Path; FileExistsError if it exists and `overwrite` is off."""
    out = Path(out)
    if not out.name.lower().endswith(SUFFIXES):
        raise ValueError(f"output {str(out)!r}: unsupported file type; end the name with one of {list(SUFFIXES)}")
    if out.exists() and not overwrite:
        raise FileExistsError(
            f"output {str(out)!r} already exists; choose another path, or pass --force (overwrite=True) to replace it"
        )
    return out


def write_atomically(rows: list[dict], out: Path) -> None:
    """Write `rows` next to `out` and rename into place (the format follows out's suffix)."""
    tmp = out.with_name(f".tmp-{out.name}")
    try:
        write_records(rows, tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def gsm8k_ground_truth(answer: str) -> str:
    """The number after '####' in a GSM8K solution, without thousands separators."""
    match = _GSM8K_ANSWER.search(answer.strip())
    if match is None:
        raise ValueError(f"GSM8K answer has no '#### <number>' line: {answer[-80:]!r}")
    return match.group(1).replace(",", "").replace("$", "").strip()


def gsm8k_record(question: str, answer: str, split: str, index: int) -> dict:
    """One verl-format GSM8K row."""
    return {
        "data_source": GSM8K_DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question.strip()} {GSM8K_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gsm8k_ground_truth(answer)},
        "extra_info": {"split": split, "index": index, "question": question, "answer": answer},
    }


def preprocess_gsm8k(
    in_jsonl: str | Path, out_parquet: str | Path, split: str, limit: int | None = None, overwrite: bool = False
) -> dict:
    """GSM8K jsonl ({question, answer}) -> verl parquet; ground truth = number after '####'."""
    out_path = check_output(out_parquet, overwrite)
    rows = read_records(in_jsonl, limit)
    out = []
    for i, row in enumerate(rows):
        if "question" not in row or "answer" not in row:
            raise ValueError(f"{in_jsonl}: row {i} lacks 'question'/'answer' (columns {sorted(row)}); is this GSM8K?")
        out.append(gsm8k_record(row["question"], row["answer"], split, i))
    if not out:
        raise ValueError(f"{in_jsonl}: no rows to convert")
    write_atomically(out, out_path)
    return {"rows_read": len(rows), "rows_written": len(out), "rows_skipped": 0, "out": str(out_path)}


# hh-rlhf conversations are "\n\nHuman: ...\n\nAssistant: ..." repeated; the two texts of a
# pair share every turn but the last assistant one.
_TURN = re.compile(r"\n\n(Human|Assistant):[ ]?")
_ROLES = {"Human": "user", "Assistant": "assistant"}
_LAST_ASSISTANT = "\n\nAssistant:"


def parse_hh_turns(text: str) -> list[dict[str, str]]:
    """'\\n\\nHuman: a\\n\\nAssistant: b' -> [{role: user, content: a}, {role: assistant, content: b}]."""
    parts = _TURN.split(text)
    if parts[0].strip():
        raise ValueError(f"hh-rlhf text does not start with a Human/Assistant turn: {text[:60]!r}")
    return [{"role": _ROLES[role], "content": content.strip()} for role, content in zip(parts[1::2], parts[2::2])]


def split_hh_pair(chosen: str, rejected: str) -> tuple[list[dict[str, str]], str, str] | None:
    """(shared prompt messages, chosen reply, rejected reply), or None when the pair is unusable.

    Unusable: no final assistant turn, different prefixes, or identical replies (no
    preference signal).
    """
    cut_c, cut_r = chosen.rfind(_LAST_ASSISTANT), rejected.rfind(_LAST_ASSISTANT)
    if cut_c < 0 or cut_r < 0 or chosen[:cut_c] != rejected[:cut_r]:
        return None
    reply_c = chosen[cut_c + len(_LAST_ASSISTANT):].strip()
    reply_r = rejected[cut_r + len(_LAST_ASSISTANT):].strip()
    if reply_c == reply_r:
        return None
    try:
        prompt = parse_hh_turns(chosen[:cut_c])
    except ValueError:
        return None
    if not prompt or prompt[-1]["role"] != "user":
        return None
    return prompt, reply_c, reply_r


def preprocess_hh_rlhf(
    in_jsonl_gz: str | Path, out_parquet: str | Path, limit: int | None = None, overwrite: bool = False
) -> dict:
    """hh-rlhf ({chosen, rejected} full texts) -> reward-model pairs (prompt, chosen, rejected).

    `prompt` is the shared conversation as chat messages ending with the user's turn;
    `chosen` / `rejected` are the two final assistant replies. Unusable pairs are skipped
    and counted.
    """
    out_path = check_output(out_parquet, overwrite)
    rows = read_records(in_jsonl_gz, limit)
    out, skipped = [], 0
    for i, row in enumerate(rows):
        if "chosen" not in row or "rejected" not in row:
            raise ValueError(
                f"{in_jsonl_gz}: row {i} lacks 'chosen'/'rejected' (columns {sorted(row)}); is this hh-rlhf?"
            )
        pair = split_hh_pair(row["chosen"], row["rejected"])
        if pair is None:
            skipped += 1
            continue
        prompt, chosen, rejected = pair
        out.append({
            "data_source": HH_RLHF_DATA_SOURCE,
            "prompt": prompt,
            "chosen": chosen,
            "rejected": rejected,
            "extra_info": {"index": i},
        })
    if not out:
        raise ValueError(f"{in_jsonl_gz}: none of {len(rows)} rows is a usable chosen/rejected pair")
    write_atomically(out, out_path)
    return {"rows_read": len(rows), "rows_written": len(out), "rows_skipped": skipped, "out": str(out_path)}
