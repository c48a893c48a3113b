"""Fixtures of the rollout tests, and the `isolated` marker: such a test runs in a child
pytest process of its own (one external engine per process, test_backend_contract.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHILD_ENV = "HYBRIDFLOW_ISOLATED_CHILD"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run an `isolated` test as `python -m pytest <its node id>` in a fresh process (the
    child runs the body: CHILD_ENV is set there); a failure there fails it here with the
    child's output."""
    if pyfuncitem.get_closest_marker("isolated") is None or os.environ.get(CHILD_ENV) == "1":
        return None
    root = str(pyfuncitem.config.rootpath)
    env = {**os.environ, CHILD_ENV: "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           pyfuncitem.nodeid], cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"{pyfuncitem.nodeid} failed in its own process:\n{done.stdout[-6000:]}{done.stderr[-2000:]}",
                    pytrace=False)
    return True


@pytest.fixture
def isolated_backend_registry(monkeypatch):
    """Backends a test registers disappear when it ends (the built-ins stay)."""
    from hybridflow.engines.rollout import registry

    for name in registry.BUILTIN_TENSOR_PARALLEL:  # import the built-ins first: they must stay registered
        registry.rollout_backend(name)
    monkeypatch.setattr(registry._BACKENDS, "_items", registry._BACKENDS.loaded())
