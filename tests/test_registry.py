"""The one registry mechanism (hybridflow/registry.py) and every registry on it: capability
metadata, override=, did-you-mean (prefixes too), one import-path resolver, and each
`register_*` of the project taking override=."""

from __future__ import annotations

import pytest

from hybridflow.config import ConfigError
from hybridflow.registry import Registry, import_object, split_import_path, suggest


def _one(x: int) -> int:
    return 1


def _two(x: int) -> int:
    return 2


class _ProgramOne:
    pass


class _ProgramTwo:
    pass


def test_capabilities_override_and_lookup():
    reg: Registry = Registry("backend", "rollout.name")
    reg.add("a", _one, tensor_parallel=True)
    reg.add("b", _two, tensor_parallel=False)
    assert reg.capabilities("a") == {"tensor_parallel": True} and reg.having(tensor_parallel=False) == ["b"]
    with pytest.raises(ValueError, match="'a' is already registered with .*_one; choose another name"):
        reg.add("a", _two)
    reg.add("a", _two, override=True)
    assert reg["a"] is _two and reg.capabilities("a") == {}
    assert dict(reg) == {"a": _two, "b": _two} and len(reg) == 2 and list(reg) == ["a", "b"]
    assert reg.pop("b") is _two and "b" not in reg
    twin = reg.copy()
    twin.add("c", _one)
    assert "c" in twin and "c" not in reg  # a copy for a test's registrations
    with pytest.raises(ConfigError, match="rollout.name: unknown backend 'aa'; did you mean 'a'"):
        reg.get("aa")


def test_rows_are_registered_by_an_identity_of_their_own():
    reg: Registry = Registry("algorithm", rows=True, identity=lambda row: f"program {row['program']}")
    reg.add("x", {"program": "p:q"})
    reg.add("x", {"program": "p:q"})  # the same definition again: fine
    with pytest.raises(ValueError, match="already registered with program p:q; choose another name for program r:s"):
        reg.add("x", {"program": "r:s"})


def test_did_you_mean_also_finds_prefixes():
    assert suggest("enviroment", ["env", "trainer", "seed"]) == ["env"]
    assert suggest("trainr", ["env", "trainer"]) == ["trainer"]
    assert suggest("zzz", ["env", "trainer"]) == []


def test_one_import_path_resolver():
    assert split_import_path("pkg.mod:attr") == ("pkg.mod", "attr")
    assert split_import_path("pkg.mod.attr") == ("pkg.mod", "attr") and split_import_path("plain") is None
    assert import_object("hybridflow.registry:Registry") is Registry
    assert import_object("hybridflow.registry.suggest") is suggest
    with pytest.raises(ConfigError, match="env.id: cannot import environment 'no_such_mod:X'"):
        import_object("no_such_mod:X", "env.id", "environment")
    with pytest.raises(ConfigError, match="module 'hybridflow.registry' has no thing 'Nope'"):
        import_object("hybridflow.registry:Nope", None, "thing")


def test_every_register_function_takes_override(monkeypatch):
    from hybridflow.config import algorithm as algorithm_registry
    from hybridflow.config.algorithm import AlgorithmSpec, register_algorithm
    from hybridflow.config.env_algorithms import EnvAlgorithm, PolicyDefaults
    from hybridflow.envs import register_env
    from hybridflow.envs.registry import _REGISTRY as ENVS
    from hybridflow.envs.agent.base import _REGISTRY as AGENT_ENVS
    from hybridflow.envs.agent.base import register_agent_env
    from hybridflow.envs.agent.tools import TOOLS, register_tool
    from hybridflow.rewards.registry import SCORERS, register_scorer
    from hybridflow.rewards.templates import _TEMPLATES, register_reward_template

    monkeypatch.setattr(algorithm_registry, "ALGORITHMS", algorithm_registry.ALGORITHMS.copy())
    register_algorithm(AlgorithmSpec("probe_override", ("grpo",), min_samples=2))(_one)
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm(AlgorithmSpec("probe_override", ("grpo",), min_samples=2))(_two)
    register_algorithm(AlgorithmSpec("probe_override", ("grpo",), min_samples=2), override=True)(_two)
    assert algorithm_registry.algorithm_spec("probe_override").program is _two

    # An environment-only row: the decorated object is the program of its `environment` part.
    env_row = AlgorithmSpec("probe_env_override", environment=EnvAlgorithm("ppo", "rollout", PolicyDefaults((4,), "tanh", True)))
    register_algorithm(env_row)(_ProgramOne())
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm(env_row)(_ProgramTwo())
    register_algorithm(env_row, override=True)(_ProgramTwo())
    assert isinstance(algorithm_registry.algorithm_spec("probe_env_override").environment.program, _ProgramTwo)

    for register, registry in ((lambda f, **o: register_env("probe_override", f, **o), ENVS),
                               (lambda f, **o: register_agent_env("probe_override", **o)(f), AGENT_ENVS),
                               (lambda f, **o: register_tool(f, name="probe_override", **o), TOOLS),
                               (lambda f, **o: register_scorer("probe_override", f, **o), SCORERS),
                               (lambda f, **o: register_reward_template("probe_override", **o)(f), _TEMPLATES)):
        register(_one)
        with pytest.raises(ValueError, match="already registered"):
            register(_two)
        register(_two, override=True)
        assert registry["probe_override"] is _two
        registry.pop("probe_override")
