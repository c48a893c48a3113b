"""Reward-model engine: one scalar score per sequence, read at its last valid token, and
(when built trainable) Bradley-Terry training on preference pairs.

A pair batch holds the two sequences of each pair side by side, each [B, S] (any padding,
position ids counted over valid tokens; `PairwiseDataset.collate` makes them):

    chosen_input_ids, chosen_attention_mask, chosen_position_ids
    rejected_input_ids, rejected_attention_mask, rejected_position_ids
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hybridflow.algorithms import AggregationScale, bradley_terry_loss
from hybridflow.engines.train import batching
from hybridflow.engines.train.config import TrainEngineConfig
from hybridflow.engines.train.engine import TrainEngine
from hybridflow.engines.train.forward import reward_scores
from hybridflow.engines.train.update import Update, accumulate

Tensor = torch.Tensor

SCORE_KEYS = ("input_ids", "attention_mask", "position_ids")
SIDES = ("chosen", "rejected")
PAIR_KEYS = tuple(f"{side}_{key}" for side in SIDES for key in SCORE_KEYS)


def with_pair_masks(batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The pair tensors plus the derived `attention_mask` and `response_mask` (module docstring)."""
    batching.require_keys(batch, PAIR_KEYS, "pair batch")
    chosen, rejected = batch["chosen_input_ids"], batch["rejected_input_ids"]
    if chosen.shape != rejected.shape:
        raise ValueError(
            f"chosen and rejected sequences must be padded to one shape [B, S], got {tuple(chosen.shape)} "
            f"and {tuple(rejected.shape)}"
        )
    out = {k: batch[k] for k in PAIR_KEYS}
    out["attention_mask"] = torch.cat([batch["chosen_attention_mask"], batch["rejected_attention_mask"]], dim=1)
    out["response_mask"] = torch.ones(chosen.shape[0], 1, dtype=torch.long, device=chosen.device)
    return out


def stack_pairs(batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The 2B sequences of a pair batch as one scoring batch: chosen rows first, then rejected."""
    return {key: torch.cat([batch[f"{side}_{key}"] for side in SIDES], dim=0) for key in SCORE_KEYS}


class RewardModelEngine(TrainEngine):
    """A `*ForSequenceClassification` (one label) over a (dp, tp) mesh.

    trainable=False (scoring in PPO) keeps it in the compute dtype without an optimizer;
    trainable=True keeps fp32 master weights and an optimizer for `update_reward_model`.
    """

    def __init__(self, config: TrainEngineConfig, *, trainable: bool = False) -> None:
        super().__init__(config, kind="reward", trainable=trainable)

    def compute_scores(self, batch: Mapping[str, Tensor]) -> Tensor:
        """Scores [B] (fp32) of full sequences (prompt + response)."""
        batching.require_keys(batch, SCORE_KEYS, "compute_scores")
        pack = self.config.pack_sequences
        out = self.forward_in_micro_batches(batch, lambda mb: {"scores": reward_scores(self.model, mb, pack_sequences=pack)})
        return out["scores"]

    def compute_pair_scores(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        """(chosen scores [B], rejected scores [B]) of a pair batch, fp32, no gradients."""
        out = self.forward_in_micro_batches(with_pair_masks(batch), self._pair_scores_dict)
        return out["chosen"], out["rejected"]

    def update_reward_model(self, batch: Mapping[str, Tensor]) -> dict[str, float]:
        """One trainer step of Bradley-Terry training on this rank's pairs; metrics under "rm/"."""
        update = Update(self, with_pair_masks(batch), prefix="rm", loss_scale_factor=None)
        for micro, agg in update.mini_batches():
            update.record(*accumulate(micro, lambda mb: self._micro_step(mb, agg)))
        return update.finish()

    def _pair_scores(self, mb: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        # One forward over both halves: FSDP gathers each layer's weights once per micro-batch.
        scores = reward_scores(self.model, stack_pairs(mb), pack_sequences=self.config.pack_sequences)
        n = mb["chosen_input_ids"].shape[0]
        return scores[:n], scores[n:]

    def _pair_scores_dict(self, mb: dict[str, Tensor]) -> dict[str, Tensor]:
        chosen, rejected = self._pair_scores(mb)
        return {"chosen": chosen, "rejected": rejected}

    def _micro_step(
        self, mb: dict[str, Tensor], agg: AggregationScale
    ) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
        chosen, rejected = self._pair_scores(mb)
        loss, metrics = bradley_terry_loss(chosen, rejected, agg)
        # Every value is normalised by the mini-batch's global pair count, so they add up
        # over micro-batches (the "summed" slot) to exact mini-batch means.
        return loss, {"loss": loss.detach(), **metrics}, {}
