"""The rollout backend registry: names, `module:name` imports, and the run config's check."""

from __future__ import annotations

import textwrap

import pytest

from hybridflow.engines.rollout import (
    HFRolloutEngine,
    NativeRolloutEngine,
    RolloutConfig,
    build_rollout_engine,
    check_rollout_backend,
    register_rollout_backend,
    rollout_backend,
    rollout_backends,
)
from hybridflow.engines.models import load_hf_config
from hybridflow.errors import ConfigError
from hybridflow.workers.config import RolloutWorkerConfig

EXTERNAL = '''
from hybridflow.engines.rollout import HFRolloutEngine, register_rollout_backend


@register_rollout_backend("external_hf")
class ExternalHF(HFRolloutEngine):
    """Registered from outside hybridflow."""
'''


def test_builtin_names_resolve_to_their_classes():
    assert {"native", "hf"} <= set(rollout_backends())
    assert rollout_backend("native") is NativeRolloutEngine and rollout_backend("hf") is HFRolloutEngine


def test_unknown_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown rollout backend 'natve'; did you mean 'native'.*known: hf, native"):
        rollout_backend("natve")
    with pytest.raises(ConfigError, match=r"name: unknown rollout backend 'vlm'.*known: hf, native, sglang, vllm"):
        RolloutWorkerConfig(name="vlm")


def test_registration_rules(isolated_backend_registry):
    @register_rollout_backend("mine")
    class Mine(HFRolloutEngine):
        pass

    assert rollout_backend("mine") is Mine and "mine" in rollout_backends()
    with pytest.raises(ValueError, match="already registered"):
        register_rollout_backend("mine")(type("Other", (HFRolloutEngine,), {}))
    replacement = register_rollout_backend("mine", override=True)(type("Other", (HFRolloutEngine,), {}))
    assert rollout_backend("mine") is replacement
    with pytest.raises(TypeError, match="RolloutEngine subclass"):
        register_rollout_backend("not_an_engine")(object)
    with pytest.raises(ValueError, match="must not contain ':'"):
        register_rollout_backend("a:b")


def test_tensor_parallel_is_refused_where_unsupported():
    check_rollout_backend("native", 4)  # no error: the native engine runs tensor parallel
    check_rollout_backend("hf", 1)
    with pytest.raises(ValueError, match="tensor_model_parallel_size=2.*rollout.name=native"):
        check_rollout_backend("hf", 2)
    with pytest.raises(ConfigError, match="tensor_model_parallel_size=2"):
        RolloutWorkerConfig(name="hf", tensor_model_parallel_size=2)
    assert RolloutWorkerConfig(name="hf").name == "hf"


def test_module_colon_name_imports_the_module(tmp_path, monkeypatch, isolated_backend_registry, tiny_llama_dir):
    (tmp_path / "my_rollout_backends.py").write_text(textwrap.dedent(EXTERNAL))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert RolloutWorkerConfig(name="my_rollout_backends:external_hf").name == "my_rollout_backends:external_hf"
    engine = build_rollout_engine("my_rollout_backends:external_hf", load_hf_config(tiny_llama_dir), RolloutConfig(),
                                  process_group=None, tokenizer=None, model_path=str(tiny_llama_dir))
    assert type(engine).__name__ == "ExternalHF" and engine.weight_storage_bytes() > 0
    with pytest.raises(ValueError, match="rollout.name: cannot import rollout backend 'no_such_module:x'.*PYTHONPATH"):
        rollout_backend("no_such_module:x")
    with pytest.raises(ValueError, match="unknown rollout backend 'missing'"):
        rollout_backend("my_rollout_backends:missing")
    with pytest.raises(ValueError, match="package.module:name"):
        rollout_backend(":external_hf")
