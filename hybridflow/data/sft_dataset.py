"""SFT data set: (prompt, response) pairs -> token ids with a loss mask on the response.

The prompt is rendered exactly as the RL data set renders it (chat template with a
generation prompt), and the response is followed by eos so the model learns to stop;
a supervised warm start therefore trains the same token layout RL later samples from.

A batch uses the RL layout (ARCHITECTURE.md): `input_ids` = left-padded prompt +
right-padded response, so the actor's response log-prob code computes the SFT loss too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from hybridflow.data.conversation import conversation_row
from hybridflow.data.records import rows_from
from hybridflow.data.rl_dataset import left_pad, pad_token_id_of, position_ids_from_mask, render_prompt
from hybridflow.data.configs import SFTDataConfig
from hybridflow.protocol import DataProto

logger = logging.getLogger(__name__)


class SFTDataset:
    """Tokenized SFT pairs; `ds[i]` is {prompt_ids, response_ids}, `ds.collate` a DataProto."""

    def __init__(
        self,
        files: str | Path | Sequence[str | Path] | None,
        tokenizer: PreTrainedTokenizerBase,
        config: SFTDataConfig,
        rows: Sequence[dict] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.pad_id = pad_token_id_of(tokenizer)
        raw_rows = rows_from(files, rows)
        self.prompt_ids: list[list[int]] = []
        self.response_ids: list[list[int]] = []
        self.loss_masks: list[list[int] | None] = []  # per response token for conversations, None: all
        self.stats = {"rows": len(raw_rows), "filtered_overlong": 0, "truncated": 0}
        self._tokenize(raw_rows)
        if not self.prompt_ids:
            raise ValueError(f"no SFT pairs left out of {len(raw_rows)}; raise max_length or check the files")
        self.stats["kept"] = len(self.prompt_ids)
        logger.info("SFT data set: %s", self.stats)

    def _pair(self, row: dict, i: int) -> tuple[str, str]:
        for key in (self.config.prompt_key, self.config.response_key):
            if key not in row:
                raise ValueError(
                    f"SFT row {i} has no {key!r} column (columns: {sorted(row)}); set sft.data.prompt_key / "
                    "sft.data.response_key to the columns that hold them"
                )
        response = row[self.config.response_key]
        if not isinstance(response, str):
            raise ValueError(f"SFT row {i}: response must be a string, got {type(response).__name__}")
        prompt = row[self.config.prompt_key]
        prompt = prompt.tolist() if hasattr(prompt, "tolist") else prompt
        return render_prompt(self.tokenizer, prompt, self.config.apply_chat_template, f"SFT row {i}",
                             "sft.data"), response

    def _is_conversation(self, row: dict) -> bool:
        return self.config.messages_key in row and self.config.prompt_key not in row

    def _conversation(self, row: dict, i: int) -> dict[str, list[int]]:
        messages = row[self.config.messages_key]
        messages = messages.tolist() if hasattr(messages, "tolist") else messages
        try:
            return conversation_row(self.tokenizer, messages)
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"SFT row {i} ({self.config.messages_key!r}): {err}") from None

    def _tokenize(self, rows: list[dict]) -> None:
        conversations = {i: self._conversation(r, i) for i, r in enumerate(rows) if self._is_conversation(r)}
        pairs = {i: self._pair(r, i) for i, r in enumerate(rows) if i not in conversations}
        eos = [self.tokenizer.eos_token_id] if self.config.append_eos else []
        if pairs and self.config.append_eos and self.tokenizer.eos_token_id is None:
            raise ValueError("append_eos is set but the tokenizer has no eos token")
        tokenized: dict[int, tuple[list[int], list[int], list[int] | None]] = {
            i: (row["prompt_ids"], row["response_ids"], row["response_loss_mask"]) for i, row in conversations.items()}
        if pairs:
            prompts = self.tokenizer([p for p, _ in pairs.values()], add_special_tokens=False)["input_ids"]
            responses = self.tokenizer([r for _, r in pairs.values()], add_special_tokens=False)["input_ids"]
            tokenized.update({i: (p, list(r) + eos, None) for i, p, r in zip(pairs, prompts, responses)})
        for i in range(len(rows)):
            p, r, mask = tokenized[i]
            if len(p) + len(r) > self.config.max_length:
                if self.config.overlong == "filter":
                    self.stats["filtered_overlong"] += 1
                    continue
                room = self.config.max_length - len(p)
                if self.config.overlong == "error" or room < 1:
                    raise ValueError(
                        f"SFT row {i}: prompt {len(p)} + response {len(r)} tokens > max_length="
                        f"{self.config.max_length}; raise max_length or set overlong=filter"
                    )
                r, mask = r[:room], mask[:room] if mask is not None else None
                self.stats["truncated"] += 1
            self.prompt_ids.append(list(p))
            self.response_ids.append(r)
            self.loss_masks.append(mask)

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = {"prompt_ids": self.prompt_ids[i], "response_ids": self.response_ids[i]}
        if self.loss_masks[i] is not None:
            item["response_loss_mask"] = self.loss_masks[i]
        return item

    def collate(self, samples: Sequence[dict[str, Any]]) -> DataProto:
        return collate_sft(samples, self.pad_id)


def collate_sft(samples: Sequence[dict[str, Any]], pad_id: int) -> DataProto:
    """Left-pad prompts, right-pad responses, and mark the trained response tokens (all, or
    a sample's `response_loss_mask`) in loss_mask and response_mask."""
    if not samples:
        raise ValueError("collate_sft got an empty list of samples")
    p_len = max(len(s["prompt_ids"]) for s in samples)
    r_len = max(len(s["response_ids"]) for s in samples)
    prompts, prompt_mask = left_pad([s["prompt_ids"] for s in samples], pad_id, p_len)
    responses = torch.full((len(samples), r_len), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(samples), r_len), dtype=torch.long)
    response_attention = torch.zeros((len(samples), r_len), dtype=torch.long)
    for row, s in enumerate(samples):
        n = len(s["response_ids"])
        responses[row, :n] = torch.as_tensor(s["response_ids"], dtype=torch.long)
        response_attention[row, :n] = 1
        response_mask[row, :n] = torch.as_tensor(s["response_loss_mask"], dtype=torch.long) \
            if "response_loss_mask" in s else 1
    attention_mask = torch.cat([prompt_mask, response_attention], dim=1)
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
            "loss_mask": torch.cat([torch.zeros_like(prompt_mask), response_mask], dim=1),
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
        }
    )
