"""Preference pairs for reward-model training: (prompt, chosen, rejected) -> token ids.

Rows are what `preprocess_hh_rlhf` writes (or any parquet/jsonl with the same columns):

    prompt    list[{role, content}] (or a string)   the conversation up to the reply
    chosen    str                                   the preferred reply
    rejected  str                                   the other reply
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from hybridflow.data.records import _check_messages, rows_from
from hybridflow.data.rl_dataset import left_pad, pad_token_id_of, position_ids_from_mask, render_prompt
from hybridflow.data.configs import PairwiseDataConfig
from hybridflow.protocol import DataProto

logger = logging.getLogger(__name__)

SIDES = ("chosen", "rejected")


class PairwiseDataset:
    """Tokenized preference pairs; `ds[i]` is {chosen_ids, rejected_ids, index}, `ds.collate` a DataProto.

    `index` is the pair's row position in the source rows (files concatenated, counted
    before filtering).
    """

    def __init__(
        self,
        files: str | Path | Sequence[str | Path] | None,
        tokenizer: PreTrainedTokenizerBase,
        config: PairwiseDataConfig,
        rows: Sequence[dict] | None = None,
    ) -> None:
        """Read `files` (or take `rows` already in memory)."""
        self.config = config
        self.pad_id = pad_token_id_of(tokenizer)
        if config.append_eos and tokenizer.eos_token_id is None:
            raise ValueError("append_eos is set but the tokenizer has no eos token; set append_eos=false")
        raw_rows = rows_from(files, rows, config.max_samples)
        self.chosen_ids: list[list[int]] = []
        self.rejected_ids: list[list[int]] = []
        self.indices: list[int] = []
        self.stats: dict[str, int] = {"rows": len(raw_rows), "filtered_overlong": 0, "truncated": 0}
        self._tokenize(tokenizer, raw_rows)
        if not self.indices:
            raise ValueError(
                f"no pairs left out of {len(raw_rows)} rows: every pair had a side longer than max_length="
                f"{config.max_length} tokens (or the files are empty); raise max_length or set overlong=truncate"
            )
        self.stats["kept"] = len(self.indices)
        logger.info("pairwise data set: %s", self.stats)

    def _texts(self, tokenizer: PreTrainedTokenizerBase, row: dict, i: int) -> tuple[str, str, str]:
        cfg = self.config
        for key in (cfg.prompt_key, cfg.chosen_key, cfg.rejected_key):
            if key not in row:
                raise ValueError(
                    f"pair row {i} has no {key!r} column (columns: {sorted(row)}); give prompt/chosen/rejected "
                    "rows (`hybridflow preprocess hh-rlhf` writes them) or set rm.data.pairs.prompt_key / "
                    "rm.data.pairs.chosen_key / rm.data.pairs.rejected_key"
                )
        prompt = row[cfg.prompt_key]
        prompt = prompt.tolist() if isinstance(prompt, np.ndarray) else prompt
        if not isinstance(prompt, str):
            prompt = _check_messages(prompt, f"pair row {i}")
        replies = []
        for key in (cfg.chosen_key, cfg.rejected_key):
            if not isinstance(row[key], str):
                raise ValueError(f"pair row {i}: {key!r} must be a string reply, got {type(row[key]).__name__}")
            replies.append(row[key])
        text = render_prompt(tokenizer, prompt, cfg.apply_chat_template, f"pair row {i}", "rm.data.pairs")
        return text, replies[0], replies[1]

    def _tokenize(self, tokenizer: PreTrainedTokenizerBase, rows: list[dict]) -> None:
        texts = [self._texts(tokenizer, r, i) for i, r in enumerate(rows)]
        if not texts:
            return

        def ids(strings: list[str]) -> list[list[int]]:
            # verbose=False: lengths over the tokenizer's model_max_length are handled below, by config.
            return tokenizer(strings, add_special_tokens=False, verbose=False)["input_ids"]

        prompts, chosen, rejected = ids([t[0] for t in texts]), ids([t[1] for t in texts]), ids([t[2] for t in texts])
        eos = [tokenizer.eos_token_id] if self.config.append_eos else []
        for i, (p, c, r) in enumerate(zip(prompts, chosen, rejected)):
            sides = [list(p) + list(c) + eos, list(p) + list(r) + eos]
            limited = self._limit(sides, i)
            if limited is None:
                continue
            self.chosen_ids.append(limited[0])
            self.rejected_ids.append(limited[1])
            self.indices.append(i)

    def _limit(self, sides: list[list[int]], i: int) -> list[list[int]] | None:
        """Both sides within max_length, or None when the pair is filtered."""
        limit = self.config.max_length
        longest = max(len(s) for s in sides)
        if longest <= limit:
            return sides
        if self.config.overlong == "filter":
            self.stats["filtered_overlong"] += 1
            return None
        if self.config.overlong == "error":
            raise ValueError(
                f"pair row {i}: a side has {longest} tokens > max_length={limit}; raise max_length, or set "
                "overlong=filter (drop such pairs) or overlong=truncate (keep the last max_length tokens)"
            )
        self.stats["truncated"] += 1
        return [s[-limit:] for s in sides]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"chosen_ids": self.chosen_ids[i], "rejected_ids": self.rejected_ids[i], "index": self.indices[i]}

    def select(self, positions: Sequence[int]) -> PairwiseDataset:
        """A data set of the pairs at `positions` (e.g. a held-out split); stats stay the source's."""
        out = copy.copy(self)
        out.chosen_ids = [self.chosen_ids[p] for p in positions]
        out.rejected_ids = [self.rejected_ids[p] for p in positions]
        out.indices = [self.indices[p] for p in positions]
        return out

    def collate(self, samples: Sequence[dict[str, Any]]) -> DataProto:
        return collate_pairs(samples, self.pad_id)


def collate_pairs(samples: Sequence[dict[str, Any]], pad_id: int) -> DataProto:
    """Left-pad both sides of every pair to one length S (the longest side in the batch).

    Tensors: {chosen,rejected}_{input_ids,attention_mask,position_ids} [B, S]. Non-tensor:
    index. This is the pair layout of `RewardModelEngine` (engines/train/reward.py).
    """
    if not samples:
        raise ValueError("collate_pairs got an empty list of samples")
    length = max(max(len(s["chosen_ids"]), len(s["rejected_ids"])) for s in samples)
    tensors = {}
    for side in SIDES:
        ids, mask = left_pad([s[f"{side}_ids"] for s in samples], pad_id, length)
        tensors.update({f"{side}_input_ids": ids, f"{side}_attention_mask": mask,
                        f"{side}_position_ids": position_ids_from_mask(mask)})
    return DataProto.from_dict(tensors=tensors, non_tensors={"index": [s["index"] for s in samples]})


def split_held_out(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train positions, held-out positions): a seeded random `fraction` of range(n) is held out.

    At least one pair goes to each side; the positions of each side are in ascending order.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"the held-out fraction must be in (0, 1), got {fraction}")
    if n < 2:
        raise ValueError(f"cannot hold out a share of {n} pair(s); give at least 2 pairs or a separate val file")
    n_val = min(n - 1, max(1, round(n * fraction)))
    order = np.random.default_rng([seed, 0x4D]).permutation(n)
    return sorted(order[n_val:].tolist()), sorted(order[:n_val].tolist())
