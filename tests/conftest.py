"""Shared pytest fixtures: tiny Hugging Face models made locally (no downloads)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict:
    """One tiny saved model per supported family: {family: Path}."""
    from hybridflow.engines.models import SUPPORTED_FAMILIES, save_tiny_model

    root = tmp_path_factory.mktemp("tiny_models")
    return {fam: save_tiny_model(root / fam, fam, seed=0) for fam in SUPPORTED_FAMILIES}


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_dirs):
    return tiny_model_dirs["llama"]
