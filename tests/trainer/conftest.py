"""Helpers for trainer tests: a tiny run config (2 ranks, CPU, tiny model) and metrics checks."""

from __future__ import annotations

import pytest

from hybridflow.config.schema import RunConfig, load_run_config

# A 2-layer, 32-wide model and a handful of prompts: seconds per step on 2 CPU ranks.
TINY = [
    "trainer.console=none", "trainer.total_steps=2", "trainer.test_freq=0", "trainer.save_final_model=false",
    "resources.world_size=2", "sft.steps=0",
    "model.builtin.hidden_size=32", "model.builtin.intermediate_size=64", "model.builtin.num_hidden_layers=2",
    "data.train_batch_size=4", "rollout.n=2", "data.builtin.num_train=64", "data.builtin.num_val=8",
    "actor.micro_batch.mini_batch_size=4", "actor.micro_batch.micro_batch_size_per_device=2",
    "critic.micro_batch.mini_batch_size=4", "critic.micro_batch.micro_batch_size_per_device=2",
    "reward.manager.num_workers=1",
]


def tiny_run_config(output_dir, *overrides: str) -> RunConfig:
    """TINY plus `overrides`, with runs going under `output_dir`."""
    return load_run_config(None, [f"trainer.output_dir={output_dir}", *TINY, *overrides])


@pytest.fixture
def tiny_config(tmp_path):
    def make(*overrides: str) -> RunConfig:
        return tiny_run_config(tmp_path / "runs", *overrides)

    return make


@pytest.fixture(scope="module")
def module_tiny_config(tmp_path_factory):
    """`tiny_config` for module-scoped fixtures (a run shared by a module's tests)."""
    root = tmp_path_factory.mktemp("runs")

    def make(*overrides: str) -> RunConfig:
        return tiny_run_config(root, *overrides)

    return make
