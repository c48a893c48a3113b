"""`RewardModelWorker`: scores whole sequences with a reward model, and trains one.

    wg.init_model()
    scores = wg.compute_rm_score(batch).batch["rm_scores"]          # [B]
    token_level = scores_at_last_response_token(scores, batch.batch["response_mask"])
"""

from __future__ import annotations

import torch

from hybridflow.controller import Dispatch, Worker, register
from hybridflow.engines.train import RewardModelEngine
from hybridflow.engines.train.checkpoint import load_checkpoint, write_checkpoint
from hybridflow.engines.train.export import export_hf
from hybridflow.engines.train.flops import FlopFacts, engine_flop_facts
from hybridflow.engines.train.reward import PAIR_KEYS
from hybridflow.protocol import DataProto
from hybridflow.workers.common import (
    batch_tensors,
    engine_on_device,
    mean_over_world,
    register_engine_mesh,
    require,
    timed,
    uses_offload,
)
from hybridflow.workers.config import RewardModelWorkerConfig

REWARD_MESH = "reward"
SCORE_KEYS = ("input_ids", "attention_mask", "position_ids")


class RewardModelWorker(Worker):
    """A `RewardModelEngine` on every rank (trainable only when asked: PPO scores with a frozen one)."""

    def __init__(self, config: RewardModelWorkerConfig, trainable: bool = False) -> None:
        if not isinstance(config, RewardModelWorkerConfig):
            raise TypeError(f"RewardModelWorker needs a RewardModelWorkerConfig, got {type(config).__name__}")
        self.config = config
        self.trainable = trainable
        self.rm: RewardModelEngine | None = None

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the reward model (collective) and declare its dispatch mesh."""
        self.init_process_group()
        self.rm = RewardModelEngine(self.config.engine, trainable=self.trainable)
        if uses_offload(self.rm):
            self.rm.offload()
        register_engine_mesh(self, REWARD_MESH, self.rm)

    @register(dispatch=Dispatch.MESH(REWARD_MESH))
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` [B] (fp32), one per prompt + response sequence."""
        require(self.rm, "the reward model")
        batch = batch_tensors(data, SCORE_KEYS, "compute_rm_score")
        with engine_on_device(self.rm):
            scores = self.rm.compute_scores(batch)
        return DataProto.from_dict(tensors={"rm_scores": scores})

    @register(dispatch=Dispatch.MESH(REWARD_MESH))
    def compute_pair_scores(self, data: DataProto) -> DataProto:
        """``chosen_scores`` and ``rejected_scores`` [B] (fp32) of a pair batch."""
        require(self.rm, "the reward model")
        batch = batch_tensors(data, PAIR_KEYS, "compute_pair_scores")
        with engine_on_device(self.rm):
            chosen, rejected = self.rm.compute_pair_scores(batch)
        return DataProto.from_dict(tensors={"chosen_scores": chosen, "rejected_scores": rejected})

    # pad=False: padding would train on duplicated pairs.
    @register(dispatch=Dispatch.MESH(REWARD_MESH, pad=False))
    def update_reward_model(self, data: DataProto) -> DataProto:
        """One Bradley-Terry update; returns only ``meta_info["metrics"]`` (averaged over ranks)."""
        require(self.rm, "the reward model")
        batch = batch_tensors(data, PAIR_KEYS, "update_reward_model")
        timings: dict[str, float] = {}
        with engine_on_device(self.rm), timed(timings, "timing_s/update_reward_model"):
            metrics = self.rm.update_reward_model(batch)
        return DataProto(meta_info={"metrics": mean_over_world({**metrics, **timings})})

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def write_checkpoint(self, path: str) -> str:
        """The trained reward model's checkpoint (model, optimizer, schedule, RNG) into
        exactly ``path`` (a step checkpoint of `hybridflow rm`, renamed into place whole)."""
        require(self.rm, "the reward model")
        with engine_on_device(self.rm):
            return str(write_checkpoint(self.rm, path))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> str:
        """Restore what `write_checkpoint` wrote (an automatic restart of `hybridflow rm`)."""
        require(self.rm, "the reward model")
        with engine_on_device(self.rm):
            return str(load_checkpoint(self.rm, path))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def export_hf(self, out_dir: str) -> str:
        """Write the reward model as a Hugging Face ``*ForSequenceClassification`` directory."""
        require(self.rm, "the reward model")
        with engine_on_device(self.rm):
            return str(export_hf(self.rm, out_dir))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def flop_facts(self) -> FlopFacts:
        """This rank's reward model size and its device's peak FLOP/s, measured in this process
        (once) unless configured: the trainer adds them up for perf/mfu."""
        require(self.rm, "the reward model")
        return engine_flop_facts(self.rm)


def scores_at_last_response_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B, R] float32: ``scores[i]`` at row i's last valid response token, 0 elsewhere.

    A row without any valid response token gets no score (all zeros).
    """
    if scores.dim() != 1 or response_mask.dim() != 2 or scores.shape[0] != response_mask.shape[0]:
        raise ValueError(f"scores must be [B] and response_mask [B, R] with the same B, got "
                         f"{tuple(scores.shape)} and {tuple(response_mask.shape)}")
    mask = response_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=-1).values
    out = torch.zeros(mask.shape, dtype=torch.float32, device=scores.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = scores[rows].float()
    return out
