"""Fixtures for the training-engine tests: a one-process gloo group, small saved models."""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from train_harness import free_port


@pytest.fixture(scope="module")
def single_process_group():
    """A world-size-1 gloo group in the test process, for engine tests that need no peers."""
    if dist.is_initialized():
        pytest.fail("a torch.distributed group is already initialised in the test process")
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def tiny_reward_dir(tmp_path_factory):
    """A tiny one-label Llama sequence classifier saved in HF format."""
    from hybridflow.engines.models import save_tiny_reward_model

    return save_tiny_reward_model(tmp_path_factory.mktemp("tiny_rm") / "llama_rm", "llama", seed=3)
