"""Critic engine: values of response positions and the clipped value-loss update."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hybridflow.algorithms import AggregationScale, value_loss
from hybridflow.engines.train import batching
from hybridflow.engines.train.config import CriticLossConfig, TrainEngineConfig
from hybridflow.engines.train.engine import TrainEngine
from hybridflow.engines.train.forward import critic_values
from hybridflow.engines.train.update import run_update

Tensor = torch.Tensor

FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")
UPDATE_KEYS = FORWARD_KEYS + ("response_mask", "values", "returns")


class CriticEngine(TrainEngine):
    """Backbone + value head (from a causal-LM or a saved critic checkpoint) over a (dp, tp) mesh."""

    def __init__(self, config: TrainEngineConfig, loss: CriticLossConfig | None = None) -> None:
        super().__init__(config, kind="critic", trainable=True)
        self.loss_config = loss if loss is not None else CriticLossConfig()

    def compute_values(self, batch: Mapping[str, Tensor]) -> Tensor:
        """Values [B, R] (fp32) at the positions before each response token."""
        batching.require_keys(batch, FORWARD_KEYS, "compute_values")
        pack = self.config.pack_sequences
        out = self.forward_in_micro_batches(batch, lambda mb: {"values": critic_values(self.model, mb, pack_sequences=pack)})
        return out["values"]

    def update_critic(self, batch: Mapping[str, Tensor]) -> dict[str, float]:
        """One trainer step of value regression on this rank's batch; metrics under "critic/"."""
        batching.require_keys(batch, UPDATE_KEYS, "update_critic")
        return run_update(
            self, batch, prefix="critic", micro_step=self._micro_step,
            loss_scale_factor=self.loss_config.loss_scale_factor,
        )

    def _micro_step(
        self, mb: dict[str, Tensor], agg: AggregationScale
    ) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
        vpreds = critic_values(self.model, mb, pack_sequences=self.config.pack_sequences)
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
