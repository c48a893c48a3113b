"""Reading and writing row files (parquet, jsonl, jsonl.gz) and verl's prompt columns.

verl's RL data sets are parquet files with the columns
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".json")


def _suffix(path: Path) -> str:
    name = path.name.lower()
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return suffix
    raise ValueError(f"{str(path)!r}: unsupported file type; use one of {list(SUFFIXES)}")


def read_records(path: str | Path, limit: int | None = None) -> list[dict]:
    """Rows of a parquet / jsonl / jsonl.gz file as dicts (the first `limit` rows if given)."""
    path = Path(path)
    suffix = _suffix(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        if limit is not None:
            table = table.slice(0, limit)
        return table.to_pylist()
    opener = gzip.open if suffix == ".jsonl.gz" else open
    rows: list[dict] = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if limit is not None and len(rows) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_number}: not valid JSON ({err}); one JSON object per line") from err
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_number}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def read_many(paths: str | Path | Sequence[str | Path], limit: int | None = None) -> list[dict]:
    """Rows of one file or of several files, concatenated in the order given."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise ValueError("no data files given; pass at least one parquet or jsonl path")
    rows: list[dict] = []
    for path in paths:
        rows.extend(read_records(path, None if limit is None else limit - len(rows)))
        if limit is not None and len(rows) >= limit:
            break
    return rows


def rows_from(
    files: str | Path | Sequence[str | Path] | None, rows: Sequence[dict] | None, limit: int | None = None
) -> list[dict]:
    """A data set's source rows: read from `files`, or taken from `rows` already in memory."""
    if (files is None) == (rows is None):
        raise ValueError("give exactly one of `files` (parquet/jsonl paths) or `rows` (records in memory)")
    return read_many(files, limit) if rows is None else list(rows)[:limit]


def write_records(rows: Iterable[dict], path: str | Path) -> Path:
    """Write rows to parquet or jsonl (by the suffix of `path`); returns `path`."""
    path = Path(path)
    suffix = _suffix(path)
    rows = list(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
        return path
    opener = gzip.open if suffix == ".jsonl.gz" else open
    with opener(path, "wt", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


Messages = list[dict[str, str]]


@dataclasses.dataclass
class PromptRecord:
    """One RL prompt: the chat messages (or a plain string), where its answer is checked."""

    prompt: Messages | str
    data_source: str
    ground_truth: Any
    extra_info: dict
    index: int
    columns: dict = dataclasses.field(default_factory=dict)  # the row's other columns (a batched reward function's)


def _check_messages(messages: Any, where: str) -> Messages:
    if not messages:
        raise ValueError(f"{where}: prompt is an empty list; give at least one {{role, content}} message")
    out: Messages = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(
                f"{where}: prompt[{i}] is {message!r}; each chat message must be a dict with "
                "'role' and 'content' (verl format)"
            )
        out.append({"role": str(message["role"]), "content": str(message["content"])})
    return out


def from_row(
    row: dict,
    index: int,
    prompt_key: str = "prompt",
    default_data_source: str | None = None,
    section: str = "data.prompt",
) -> PromptRecord:
    """A `PromptRecord` from a verl-format row or a plain row with a string prompt.
    `section`: the dotted config section of prompt_key / default_data_source (for messages)."""
    where = f"row {index}"
    if prompt_key not in row:
        columns = sorted(map(str, row))
        shown = columns if len(columns) <= 20 else [*columns[:20], f"... {len(columns) - 20} more"]
        raise ValueError(f"{where} has no {prompt_key!r} column (columns: {shown}); set {section}.prompt_key to "
                         "the column that holds the prompts")
    raw = row[prompt_key]
    if isinstance(raw, str):
        prompt: Messages | str = raw
    elif isinstance(raw, (list, tuple)):
        prompt = _check_messages(raw, where)
    else:
        # numpy arrays appear when rows come from pandas; accept anything list-like.
        if hasattr(raw, "tolist"):
            prompt = _check_messages(raw.tolist(), where)
        else:
            raise ValueError(
                f"{where}: {prompt_key!r} must be a string or a list of chat messages, got {type(raw).__name__}"
            )
    data_source = row.get("data_source") or default_data_source
    if data_source is None:
        raise ValueError(
            f"{where} has no 'data_source' column; add one (it selects the reward function) or set "
            f"{section}.default_data_source"
        )
    reward_model = row.get("reward_model") or {}
    if not isinstance(reward_model, dict):
        raise ValueError(f"{where}: reward_model must be a dict like {{'style': 'rule', 'ground_truth': ...}}")
    ground_truth = reward_model.get("ground_truth", row.get("ground_truth"))
    extra_info = row.get("extra_info") or {}
    if not isinstance(extra_info, dict):
        raise ValueError(f"{where}: extra_info must be a dict, got {type(extra_info).__name__}")
    columns = {k: v for k, v in row.items() if k != prompt_key}
    return PromptRecord(prompt, str(data_source), ground_truth, dict(extra_info), index, columns)
