"""Fixtures for the worker tests: a tiny saved reward model next to the session's tiny Llama."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def reward_model_dir(tmp_path_factory):
    """A tiny one-label Llama sequence classifier saved in HF format."""
    from hybridflow.engines.models import save_tiny_reward_model

    return save_tiny_reward_model(tmp_path_factory.mktemp("workers_rm") / "llama_rm", "llama", seed=5)
