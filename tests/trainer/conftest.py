"""Fixtures for trainer tests: tiny run configs (trainer_helpers.TINY: 2 ranks, CPU, tiny model)."""

from __future__ import annotations

import pytest
from trainer_helpers import tiny_run_config

from hybridflow.config.schema import RunConfig


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
