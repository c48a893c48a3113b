"""Fixtures of the planner tests: a tiny reward model directory (for the dataflow cases
that score with a reward model), and a calibration cache of each test's own."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_reward_dir(tmp_path_factory):
    from hybridflow.engines.models import save_tiny_reward_model

    return save_tiny_reward_model(tmp_path_factory.mktemp("planner_rm") / "rm")


@pytest.fixture(autouse=True)
def own_calibration_cache(tmp_path, monkeypatch):
    """No planner test reads or writes the user's calibration (~/.cache/hybridflow/planner)."""
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
