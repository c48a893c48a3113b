"""Rollout backends by name: `rollout.name` picks the `RolloutEngine` class that generates.

    @register_rollout_backend("mine")
    class MyRolloutEngine(RolloutEngine): ...

    engine = build_rollout_engine("mine", hf_config, RolloutConfig(dtype="auto"),
                                  process_group=None, tokenizer=None, model_path=None)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hybridflow.engines.rollout.external import EXTERNAL_ENGINES, is_installed, missing_package_message
from hybridflow.registry import Registry, import_path_module

if TYPE_CHECKING:  # torch: this module is read by config validation, before torch is imported
    import torch.distributed as dist

    from hybridflow.engines.rollout.config import RolloutConfig
    from hybridflow.engines.rollout.interface import RolloutEngine

_BUILTINS = {"native": "hybridflow.engines.rollout.engine", "hf": "hybridflow.engines.rollout.hf_backend",
             **{name: engine.module for name, engine in EXTERNAL_ENGINES.items()}}
# The built-ins' `supports_tensor_parallel`, for checks that must not import them
# (tests/engines/rollout/test_registry.py compares it with the classes).
BUILTIN_TENSOR_PARALLEL = {"native": True, "hf": False,
                           **{name: engine.tensor_parallel for name, engine in EXTERNAL_ENGINES.items()}}
# The built-ins that run multi-turn rollouts (a `turn_engine`), for the same reason.
BUILTIN_MULTI_TURN = {"native": True, "hf": True, "vllm": False, "sglang": False}
_BACKENDS: Registry[type[RolloutEngine]] = Registry("rollout backend", "rollout.name", _BUILTINS)


def register_rollout_backend(name: str, *, override: bool = False) -> Callable[[type], type]:
    """Class decorator: make a `RolloutEngine` subclass selectable as `rollout.name=<name>`.

    The class is built as `cls(hf_config, rollout_config, process_group=..., tokenizer=...,
    model_path=...)`; re-registering a taken name needs `override=True`.
    """
    if isinstance(name, str) and ":" in name:
        raise ValueError(f"rollout backend name {name!r} must not contain ':' (it separates module and name)")
    register = _BACKENDS.register(name, override=override)

    def decorator(cls: type) -> type:
        from hybridflow.engines.rollout.interface import RolloutEngine  # torch: only when a backend registers

        if not (isinstance(cls, type) and issubclass(cls, RolloutEngine)):
            raise TypeError(f"@register_rollout_backend({name!r}) must decorate a RolloutEngine subclass, got {cls!r}")
        return register(cls)

    return decorator


def rollout_backends() -> list[str]:
    """Names of the registered backends, sorted."""
    return _BACKENDS.names()


def rollout_backend(name: str) -> type[RolloutEngine]:
    """The class registered as `name`, or as `short` after importing `module` for "module:short"."""
    return _BACKENDS.get(_import_external(name))


def _import_external(name: str) -> str:
    """The registry name of `name`: "module:short" imports `module` (which registers
    `short`) and gives `short`; a plain name is itself."""
    if not (isinstance(name, str) and ":" in name):
        return name
    return import_path_module(name, "rollout.name", "rollout backend")[1]


def unsupported_tp_message(name: str, tp_size: int) -> str:
    """Why backend `name` cannot run tensor_model_parallel_size=tp_size, and what to do instead."""
    return (f"rollout backend {name!r} generates on one rank only, not with tensor_model_parallel_size="
            f"{tp_size}; set rollout.tensor_model_parallel_size=1, or use rollout.name=native")


def multi_turn_backends() -> list[str]:
    """Backends with a turn engine (RolloutEngine.turn_engine) for the agent loop: the
    built-ins from BUILTIN_MULTI_TURN (not imported), the others from their class."""
    from_classes = {name for name in _BACKENDS.loaded() if _runs_turns(_BACKENDS.get(name))}
    return sorted(from_classes | {name for name, turns in BUILTIN_MULTI_TURN.items()
                                  if turns and name not in _BACKENDS.loaded()})


def _runs_turns(cls: type) -> bool:
    from hybridflow.engines.rollout.interface import RolloutEngine  # loaded with the class already

    return cls.turn_engine is not RolloutEngine.turn_engine


def check_rollout_backend(name: str, tp_size: int) -> None:
    """ValueError if `name` is unknown, needs a package that is not installed (vllm,
    sglang), or cannot run `tp_size`-way TP. A built-in's module is not imported for this
    (the config check stays torch-free); an external "module:name" is (its registration
    is how its name becomes known)."""
    short = _import_external(name)
    _BACKENDS.check(short)
    if short in EXTERNAL_ENGINES and not is_installed(EXTERNAL_ENGINES[short].package):
        raise ValueError(missing_package_message(short))
    if short in _BACKENDS.loaded():
        tensor_parallel = _BACKENDS.get(short).supports_tensor_parallel
    else:
        tensor_parallel = BUILTIN_TENSOR_PARALLEL[short]
    if tp_size > 1 and not tensor_parallel:
        raise ValueError(unsupported_tp_message(name, tp_size))


def build_rollout_engine(name: str, hf_config, config: RolloutConfig, *, process_group: dist.ProcessGroup | None,
                         tokenizer, model_path: str | None) -> RolloutEngine:
    """Build backend `name` on `process_group` (its tensor-parallel group; None: one rank).

    The engine holds no weights yet: the caller loads them with `load_weights` (the
    HybridEngine streams them from training; `RolloutEngine.from_pretrained` reads a model
    directory). `model_path` is the model directory, for backends that read files of their
    own (tokenizer, generation config); the built-in ones do not need it.
    """
    import torch.distributed as dist

    tp_size = 1 if process_group is None else dist.get_world_size(process_group)
    check_rollout_backend(name, tp_size)
    cls = rollout_backend(name)
    return cls(hf_config, config, process_group=process_group, tokenizer=tokenizer, model_path=model_path)
