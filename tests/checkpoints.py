"""A run checkpoint written with the real writers, small enough to build in a test: the
actor's DCP checkpoint (a linear model and its AdamW state: tensor and non-tensor
entries), its engine state and RNG files, and a saved batch (what an asynchronous run keeps),
committed as RLTrainer commits a checkpoint."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp

from hybridflow.protocol import DataProto
from hybridflow.trainer.run.checkpointing import STATE_VERSION, begin_checkpoint, commit_checkpoint

SHARD = "actor/__0_0.distcp"


def actor_state() -> dict:
    """A model and optimizer state as an engine saves it (one optimizer step taken)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 8)).sum().backward()
    optim.step()
    return {"model": model.state_dict(), "optim": optim.state_dict()}


def write_run_checkpoint(run_dir: Path, step: int = 1, state: dict | None = None) -> Path:
    """`<run_dir>/checkpoints/global_step_<step>` with the files listed in the module docstring."""
    tmp = begin_checkpoint(run_dir, step)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.save(state or actor_state(), checkpoint_id=tmp / "actor", no_dist=True)
    torch.save({"global_step": step, "lr_scheduler": {"last_epoch": step}}, tmp / "actor" / "engine_state.pt")
    torch.save({"torch": torch.get_rng_state(), "shuffle": torch.Generator().get_state()}, tmp / "actor" / "rng_rank0.pt")
    torch.save({"generation_seed": 3}, tmp / "actor" / "extra_rank0.pt")
    DataProto.from_dict(tensors={"input_ids": torch.arange(6).reshape(2, 3)},
                        non_tensors={"uid": np.array(["a", "b"], dtype=object)}).save(tmp / "prompts.dataproto")
    return commit_checkpoint(tmp, {"version": STATE_VERSION, "global_step": step}, None)
