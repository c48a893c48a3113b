"""The `actor` and `critic` sections: the training engine's settings of each trained role plus its loss."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybridflow.engines.train.config import ActorLossConfig, CriticLossConfig, TrainEngineSettings


@dataclass
class ActorSection(TrainEngineSettings):
    """The policy: the training engine's settings (TrainEngineSettings, one definition with
    the engine) plus the loss (policy loss, KL loss, entropy bonus). The model path and
    seed come from `model` and `seed`.

    old_log_probs: "auto" skips the separate old-log-prob pass when the update makes one
        optimizer step over the step's batch (micro_batch.epochs 1, mini_batch_size = all
        sequences of the step) and nothing reads them before it (no reference policy): the
        update then takes them from its own forward pass, detached (the same weights, so the
        same values up to float summation order; ActorEngine.update_policy). "recompute"
        always runs the pass.
    """

    loss: ActorLossConfig = field(default_factory=ActorLossConfig)
    old_log_probs: Literal["auto", "recompute"] = "auto"


@dataclass
class CriticSection(TrainEngineSettings):
    """The value model (algorithm.name=ppo): engine settings as the actor's, plus the value
    loss. model_path null starts it from the policy model. LoRA does not apply to it."""

    model_path: str | None = None
    loss: CriticLossConfig = field(default_factory=CriticLossConfig)
