"""Shared pytest fixtures: tiny Hugging Face models made locally (no downloads), and one
embedded Ray instance for the whole test session."""

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


@pytest.fixture(scope="session")
def turn_model_dir(tmp_path_factory):
    """The built-in character model (tiny sizes) whose eos row of lm_head is raised so that
    model turns end after a few tokens: a random model almost never ends a turn, and the
    multi-turn tests need turns that end."""
    import torch
    import transformers

    from hybridflow.data.tokenizer import make_builtin_model_dir

    path = make_builtin_model_dir(tmp_path_factory.mktemp("turn_model") / "m", hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        w = model.lm_head.weight
        w[2] = 5.0 * w[10:40].mean(0) * 30 ** 0.5
    model.save_pretrained(path)
    return path


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
