"""Shared pytest fixtures: tiny Hugging Face models made locally (no downloads), and one
embedded Ray instance for the whole test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def state_signing_key(tmp_path_factory):
    """Environment-run checkpoints sign their pickled environments with a per-user key
    (trainer/env/state.py); tests use their own instead of the user's ~/.config one."""
    import os

    from hybridflow.trainer.env.state import KEY_ENV

    previous = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = str(tmp_path_factory.mktemp("signing") / "state.key")
    yield
    if previous is None:
        os.environ.pop(KEY_ENV, None)
    else:
        os.environ[KEY_ENV] = previous


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict:
    """One tiny saved model per supported family: {family: Path}."""
    from hybridflow.engines.models import SUPPORTED_FAMILIES, save_tiny_model

    root = tmp_path_factory.mktemp("tiny_models")
    return {fam: save_tiny_model(root / fam, fam, seed=0) for fam in SUPPORTED_FAMILIES}


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_dirs):
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="session")
def turn_model_dir(tmp_path_factory):
    """A tiny built-in character model whose turns end after a few tokens (envs/agent/demo.py)."""
    from hybridflow.envs.agent.demo import make_turn_model_dir

    return make_turn_model_dir(tmp_path_factory.mktemp("turn_model") / "m")


# Logical CPUs of the session's Ray: more than this machine's cores on purpose, so that a
# few worker groups (one CPU per rank) can be alive at once; they are mostly idle.
RAY_TEST_CPUS = 16


@pytest.fixture(scope="session")
def ray_local():
    """The session's embedded Ray (127.0.0.1, no dashboard), started once and shut down at
    the end. Starting Ray costs seconds and each actor that imports torch costs more, so
    tests share it; a Ray already running in this process is reused and left running."""
    import ray

    from hybridflow.controller import init_ray

    started_here = not ray.is_initialized()
    runtime = init_ray(num_cpus=RAY_TEST_CPUS)  # describes the running one when reused
    yield runtime
    if started_here:
        ray.shutdown()
