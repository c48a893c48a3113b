"""Critic engine: values of response positions and the clipped value-loss update."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hybridflow.algorithms import AggregationScale, value_loss
from hybridflow.engines.train import batching
from hybridflow.engines.train.config import CriticLossConfig, TrainEngineConfig
from hybridflow.engines.train.engine import TrainEngine
from hybridflow.engines.train.forward import critic_values
from hybridflow.engines.train.update import Update, accumulate

Tensor = torch.Tensor

FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")
UPDATE_KEYS = FORWARD_KEYS + ("response_mask", "values", "returns")


class CriticEngine(TrainEngine):
    """Backbone + value head (from a causal-LM or a saved critic checkpoint) over a (dp, tp)
    or (pp, dp, tp) mesh."""

    def __init__(self, config: TrainEngineConfig, loss: CriticLossConfig | None = None) -> None:
        super().__init__(config, kind="critic", trainable=True)
        self.loss_config = loss if loss is not None else CriticLossConfig()

    def compute_values(self, batch: Mapping[str, Tensor]) -> Tensor:
        """Values [B, R] (fp32) at the positions before each response token."""
        batching.require_keys(batch, FORWARD_KEYS, "compute_values")
        if self.pipeline is not None:
            return self.pipeline_forward(batch, temperature=1.0, with_entropy=False)[0]
        pack = self.config.pack_sequences
        out = self.forward_in_micro_batches(batch, lambda mb: {"values": critic_values(self.model, mb, pack_sequences=pack)})
        return out["values"]

    def update_critic(self, batch: Mapping[str, Tensor]) -> dict[str, float]:
        """One trainer step of value regression on this rank's batch; metrics under "critic/"."""
        batching.require_keys(batch, UPDATE_KEYS, "update_critic")
        update = Update(self, batch, prefix="critic", loss_scale_factor=self.loss_config.loss_scale_factor)
        for micro, agg in update.mini_batches():
            if self.pipeline is None:
                update.record(*accumulate(micro, lambda mb: self._micro_step(mb, agg)))
            else:
                update.record(*self._pipeline_mini_step(micro, agg))
        return update.finish()

    def _micro_step(
        self, mb: dict[str, Tensor], agg: AggregationScale
    ) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
        return self._loss(critic_values(self.model, mb, pack_sequences=self.config.pack_sequences), mb, agg)

    def _pipeline_mini_step(
        self, micro: list[dict[str, Tensor]], agg: AggregationScale
    ) -> tuple[dict[str, float], dict[str, float]]:
        """One mini-batch through the pipeline: the same `_loss` on the last stage's values."""
        return self.pipeline.train_mini_batch(
            micro, ["response_mask", "values", "returns"], lambda vpreds, _, mb: self._loss(vpreds, mb, agg),
            temperature=1.0, chunk_size=self.config.logits_chunk_size, with_entropy=False,
        )

    def _loss(
        self, vpreds: Tensor, mb: Mapping[str, Tensor], agg: AggregationScale
    ) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
        loss, metrics = value_loss(
            vpreds,
            mb["values"],
            mb["returns"],
            mb["response_mask"],
            cliprange_value=self.loss_config.cliprange_value,
            loss_agg_mode=self.loss_config.loss_agg_mode,
            agg=agg,
        )
        return loss, {"vf_loss": loss.detach()}, metrics
