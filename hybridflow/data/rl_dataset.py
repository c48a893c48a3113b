"""RL prompt data set: verl-format parquet/jsonl rows -> tokenized, left-padded DataProto.

    ds = RLPromptDataset(["train.parquet"], tokenizer, PromptDataConfig(max_prompt_length=256))
    batch = ds.collate([ds[i] for i in range(8)])
    batch.batch["input_ids"]           # [8, P] left-padded prompts
    batch.non_tensor_batch["ground_truth"]
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from hybridflow.data.records import Messages, PromptRecord, from_row, rows_from
from hybridflow.data.configs import PromptDataConfig
from hybridflow.errors import ConfigError
from hybridflow.protocol import DataProto

logger = logging.getLogger(__name__)


def render_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Messages | str, apply_chat_template: bool | str,
                  where: str = "a prompt", section: str = "data.prompt") -> str:
    """The prompt text the model sees: chat template with a generation prompt, or the raw
    string (apply_chat_template "conversational": the template for chat messages only). A
    prompt that cannot be rendered is a ConfigError naming `where` (the row) and the
    `section.apply_chat_template` setting."""
    key = f"{section}.apply_chat_template"
    if not apply_chat_template or (apply_chat_template == "conversational" and isinstance(prompt, str)):
        if not isinstance(prompt, str):
            raise ConfigError(f"{where} is a list of chat messages but apply_chat_template is false; enable it, or "
                              "give plain string prompts", key)
        return prompt
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError(f"tokenizer {type(tokenizer).__name__} has no chat template; set {key}=false and use "
                          "string prompts, or use a tokenizer that has one", key)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as err:  # noqa: BLE001 - the template's own refusal (jinja2: an unknown role) or its bug
        raise ConfigError(f"{where}: the tokenizer's chat template cannot render it ({type(err).__name__}: {err}); fix "
                          f"the messages (roles the template knows), or set {key}=false for plain prompts", key) from None


def pad_token_id_of(tokenizer: PreTrainedTokenizerBase) -> int:
    """The pad id, falling back to eos (many causal-LM tokenizers have no pad token)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token")
    return int(pad)


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to `length`: (ids [B, length] int64, attention_mask [B, length] int64)."""
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq) > length:
            raise ValueError(f"sequence {row} has {len(seq)} tokens, more than the pad length {length}")
        if seq:
            ids[row, length - len(seq):] = torch.as_tensor(seq, dtype=torch.long)
            mask[row, length - len(seq):] = 1
    return ids, mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only (0 at the first real token; 0 on padding)."""
    return (attention_mask.cumsum(dim=-1) - 1).clamp(min=0) * attention_mask


class RLPromptDataset:
    """Tokenized RL prompts; `ds[i]` is a dict and `ds.collate(samples)` a DataProto.

    `ds[i]["index"]` is the row's position in the source rows (files concatenated, counted
    before filtering), so it is unique and stable; `extra_info` is passed through as is.
    """

    def __init__(
        self,
        files: str | Path | Sequence[str | Path] | None,
        tokenizer: PreTrainedTokenizerBase,
        config: PromptDataConfig,
        rows: Sequence[dict] | None = None,
        section: str = "data.prompt",
    ) -> None:
        """Read `files` (or take `rows` already in memory, e.g. the built-in task's records).
        `section`: where `config` sits in the run config, for the keys errors name."""
        self.tokenizer = tokenizer
        self.config = config
        self.section = section
        self.pad_id = pad_token_id_of(tokenizer)
        raw_rows = rows_from(files, rows, config.max_samples)
        records = [from_row(r, i, config.prompt_key, config.default_data_source) for i, r in enumerate(raw_rows)]
        self.records: list[PromptRecord] = []
        self.input_ids: list[list[int]] = []
        self.stats: dict[str, int] = {"rows": len(records), "filtered_overlong": 0, "truncated": 0}
        self._tokenize(records)
        if not self.records:
            raise ConfigError(
                f"no prompts left: all {len(records)} rows were longer than {config.max_prompt_length} tokens "
                f"(or the files are empty); raise it", f"{section}.max_prompt_length")
        self.stats["kept"] = len(self.records)
        logger.info("prompt data set: %s", self.stats)

    def _tokenize(self, records: list[PromptRecord]) -> None:
        texts = [render_prompt(self.tokenizer, r.prompt, self.config.apply_chat_template, f"row {r.index}",
                               self.section) for r in records]
        all_ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        limit = self.config.max_prompt_length
        for record, ids in zip(records, all_ids):
            if len(ids) > limit:
                if self.config.filter_overlong_prompts:
                    self.stats["filtered_overlong"] += 1
                    continue
                ids = self._truncate(ids, record)
            self.records.append(record)
            self.input_ids.append(list(ids))

    def _truncate(self, ids: list[int], record: PromptRecord) -> list[int]:
        limit = self.config.max_prompt_length
        if self.config.truncation == "error":
            raise ConfigError(
                f"row {record.index}: prompt has {len(ids)} tokens > {limit}; raise it, set "
                f"{self.section}.filter_overlong_prompts=true, or {self.section}.truncation=left|right",
                f"{self.section}.max_prompt_length")
        self.stats["truncated"] += 1
        return ids[-limit:] if self.config.truncation == "left" else ids[:limit]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        record = self.records[i]
        return {
            "input_ids": self.input_ids[i],
            "raw_prompt": record.prompt,
            "data_source": record.data_source,
            "ground_truth": record.ground_truth,
            "extra_info": record.extra_info,
            "index": record.index,
            "columns": record.columns,
        }

    def collate(self, samples: Sequence[dict[str, Any]]) -> DataProto:
        """Samples -> DataProto with left-padded prompts and the per-sample non-tensor fields."""
        length = self.config.max_prompt_length if self.config.pad_to == "max_length" else None
        return collate_prompts(samples, self.pad_id, length)


def collate_prompts(samples: Sequence[dict[str, Any]], pad_id: int, pad_length: int | None = None) -> DataProto:
    """Left-pad `input_ids` to `pad_length` (or the longest sample) and build the DataProto.

    Tensors: input_ids, attention_mask, position_ids. Non-tensors: raw_prompt,
    data_source, ground_truth, extra_info, index, and columns (the row's other columns, what
    a batched reward function reads) where the samples have them.
    """
    if not samples:
        raise ValueError("collate_prompts got an empty list of samples")
    sequences = [s["input_ids"] for s in samples]
    length = pad_length if pad_length is not None else max(len(s) for s in sequences)
    input_ids, attention_mask = left_pad(sequences, pad_id, length)
    keys = ("raw_prompt", "data_source", "ground_truth", "extra_info", "index", "columns")
    non_tensors = {key: [s[key] for s in samples] for key in keys if all(key in s for s in samples)}
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
        },
        non_tensors=non_tensors,
    )
