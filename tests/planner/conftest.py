"""Fixtures of the planner tests: a tiny reward model directory (for the dataflow cases
that score with a reward model)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_reward_dir(tmp_path_factory):
    from hybridflow.engines.models import save_tiny_reward_model

    return save_tiny_reward_model(tmp_path_factory.mktemp("planner_rm") / "rm")
