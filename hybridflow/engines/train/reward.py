"""Reward-model engine: one scalar score per sequence, read at its last valid token."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hybridflow.engines.train import batching
from hybridflow.engines.train.config import TrainEngineConfig
from hybridflow.engines.train.engine import TrainEngine
from hybridflow.engines.train.forward import reward_scores

Tensor = torch.Tensor


class RewardModelEngine(TrainEngine):
    """A `*ForSequenceClassification` (one label) over a (dp, tp) mesh, used for scoring only."""

    def __init__(self, config: TrainEngineConfig) -> None:
        super().__init__(config, kind="reward", trainable=False)

    def compute_scores(self, batch: Mapping[str, Tensor]) -> Tensor:
        """Scores [B] (fp32) of full sequences (prompt + response)."""
        batching.require_keys(batch, ("input_ids", "attention_mask", "position_ids"), "compute_scores")
        pack = self.config.pack_sequences
        out = self.forward_in_micro_batches(batch, lambda mb: {"scores": reward_scores(self.model, mb, pack_sequences=pack)})
        return out["scores"]
