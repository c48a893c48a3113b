"""`CriticWorker`: the value model role.

    wg.init_model()
    batch.union(wg.compute_values(batch))            # values [B, R]
    metrics = wg.update_critic(batch).meta_info["metrics"]

Data methods split by the critic's data-parallel layout (mesh "critic", collected from
tensor-parallel rank 0).
"""

from __future__ import annotations

from hybridflow.controller import Dispatch, Worker, register
from hybridflow.engines.train import CriticEngine
from hybridflow.engines.train.checkpoint import load_checkpoint, save_checkpoint, write_checkpoint
from hybridflow.engines.train.critic import FORWARD_KEYS, UPDATE_KEYS
from hybridflow.engines.train.flops import FlopFacts, engine_flop_facts
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
from hybridflow.workers.config import CriticWorkerConfig

CRITIC_MESH = "critic"


class CriticWorker(Worker):
    """A `CriticEngine` on every rank."""

    def __init__(self, config: CriticWorkerConfig) -> None:
        if not isinstance(config, CriticWorkerConfig):
            raise TypeError(f"CriticWorker needs a CriticWorkerConfig, got {type(config).__name__}")
        self.config = config
        self.critic: CriticEngine | None = None

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the critic (collective) and declare its dispatch mesh."""
        self.init_process_group()
        self.critic = CriticEngine(self.config.engine, self.config.loss)
        if uses_offload(self.critic):
            self.critic.offload()
        register_engine_mesh(self, CRITIC_MESH, self.critic)

    @register(dispatch=Dispatch.MESH(CRITIC_MESH))
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` [B, R] (fp32): the value of the state before each response token."""
        require(self.critic, "the critic")
        batch = batch_tensors(data, FORWARD_KEYS, "compute_values")
        with engine_on_device(self.critic):
            values = self.critic.compute_values(batch)
        return DataProto.from_dict(tensors={"values": values})

    # pad=False: padding would train on duplicated samples.
    @register(dispatch=Dispatch.MESH(CRITIC_MESH, pad=False))
    def update_critic(self, data: DataProto) -> DataProto:
        """One value update; returns only ``meta_info["metrics"]`` (averaged over ranks)."""
        require(self.critic, "the critic")
        batch = batch_tensors(data, UPDATE_KEYS, "update_critic")
        timings: dict[str, float] = {}
        with engine_on_device(self.critic), timed(timings, "timing_s/update_critic"):
            metrics = self.critic.update_critic(batch)
        return DataProto(meta_info={"metrics": mean_over_world({**metrics, **timings})})

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, root: str, keep_last: int | None = None) -> str:
        """Save the critic under ``root/global_step_<n>``."""
        require(self.critic, "the critic")
        with engine_on_device(self.critic):
            return str(save_checkpoint(self.critic, root, keep_last=keep_last))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def write_checkpoint(self, path: str) -> str:
        """What `save_checkpoint` saves, written into exactly ``path`` (not atomic: for the
        trainer, which renames its whole step checkpoint into place when complete)."""
        require(self.critic, "the critic")
        with engine_on_device(self.critic):
            return str(write_checkpoint(self.critic, path))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> str:
        """Restore the critic from a checkpoint dir (or the latest under a root)."""
        require(self.critic, "the critic")
        with engine_on_device(self.critic):
            return str(load_checkpoint(self.critic, path))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def flop_facts(self) -> FlopFacts:
        """This rank's critic size and its device's peak FLOP/s, measured in this process
        (once) unless configured: the trainer adds them up for perf/mfu."""
        require(self.critic, "the critic")
        return engine_flop_facts(self.critic)
