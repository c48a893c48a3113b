"""Fixtures of the rollout tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def isolated_backend_registry(monkeypatch):
    """Backends a test registers disappear when it ends (the built-ins stay)."""
    from hybridflow.engines.rollout import registry

    for name in registry.BUILTIN_TENSOR_PARALLEL:  # import the built-ins first: they must stay registered
        registry.rollout_backend(name)
    monkeypatch.setattr(registry._BACKENDS, "_items", registry._BACKENDS.loaded())
