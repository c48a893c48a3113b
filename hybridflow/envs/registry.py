"""Environments by name: a registry for user classes, import paths, and Gymnasium ids.

    from hybridflow.envs import register_env

    @register_env                       # registered as "CustomEnv" (or @register_env("my-env"))
    class CustomEnv(gymnasium.Env): ...
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, overload

from hybridflow.errors import ConfigError
from hybridflow.registry import Registry, import_object, split_import_path

EnvFactory = Callable[..., Any]
_REGISTRY: Registry[EnvFactory] = Registry("environment")


@overload
def register_env(name: EnvFactory, *, override: bool = False) -> EnvFactory: ...
@overload
def register_env(name: str | None = None, factory: None = None, *,
                 override: bool = False) -> Callable[[EnvFactory], EnvFactory]: ...
@overload
def register_env(name: str, factory: EnvFactory, *, override: bool = False) -> EnvFactory: ...


def register_env(name: Any = None, factory: EnvFactory | None = None, *, override: bool = False) -> Any:
    """Register an environment class or factory: ``@register_env``, ``@register_env("name")``
    or ``register_env("name", factory)``. The default name is the class's (function's) name.
    Registering another object under a taken name needs override=True; the same object
    again is fine."""
    if callable(name) and factory is None:
        return _REGISTRY.add(name.__name__, name, override=override)
    if factory is not None:
        return _REGISTRY.add(name, factory, override=override)

    def decorate(obj: EnvFactory) -> EnvFactory:
        return _REGISTRY.add(name if name is not None else obj.__name__, obj, override=override)

    return decorate


def registered_envs() -> list[str]:
    return _REGISTRY.names()


@dataclass(frozen=True)
class EnvSource:
    """How to build one environment: a factory (class or function), or a Gymnasium id."""

    name: str
    factory: EnvFactory | None = None
    gym_id: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    max_episode_steps: int | None = None

    def make(self) -> Any:
        """A fresh environment instance (seeded later, by its first reset)."""
        try:
            if self.gym_id is not None:
                return _make_gym(self.gym_id, self.kwargs, self.max_episode_steps)
            env = self.factory(**self.kwargs)
        except TypeError as err:
            if not self.kwargs:
                raise
            raise ConfigError(f"{self.kwargs} did not fit environment {self.name!r}: {err}; pass only the arguments "
                              "its constructor takes", "env.kwargs") from err
        for attr in ("reset", "step", "observation_space", "action_space"):
            if not hasattr(env, attr):
                where = "" if self.name == _where(self.factory) else f" ({_where(self.factory)})"
                raise TypeError(f"environment {self.name!r}{where} has no {attr!r}; an environment "
                                "follows the Gymnasium API (reset, step, observation_space, action_space)")
        if self.max_episode_steps is not None:
            from gymnasium.wrappers import TimeLimit

            env = TimeLimit(env, max_episode_steps=self.max_episode_steps)
        return env


def _where(factory: Callable[..., Any]) -> str:
    """Where a factory is defined, "module:name", for errors about what it made."""
    return f"{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', repr(factory))}"


def _make_gym(gym_id: str, kwargs: dict[str, Any], max_episode_steps: int | None) -> Any:
    import gymnasium as gym
    from gymnasium.error import DependencyNotInstalled

    try:
        return gym.make(gym_id, max_episode_steps=max_episode_steps, **kwargs)
    except DependencyNotInstalled as err:
        raise ConfigError(f"Gymnasium environment {gym_id!r} needs a package that is not installed: {err}. "
                          "Install it (MuJoCo tasks: `pip install mujoco`)", "env.id") from err


def resolve_env(name: str, kwargs: dict[str, Any] | None = None, max_episode_steps: int | None = None) -> EnvSource:
    """The `EnvSource` of `name` (module docstring for the lookup order); ConfigError
    keyed `env.id` naming the closest known names when nothing matches."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"must name an environment (a registered name, 'module:Class' or a Gymnasium id), "
                          f"got {name!r}", "env.id")
    common = {"kwargs": dict(kwargs or {}), "max_episode_steps": max_episode_steps}
    if name in _REGISTRY:
        return EnvSource(name, factory=_REGISTRY[name], **common)
    imported = _import_path(name)
    if imported is not None:
        return EnvSource(name, factory=imported, **common)
    gym_ids = _gym_ids()
    if name in gym_ids:
        return EnvSource(name, gym_id=name, **common)
    candidates = registered_envs() + gym_ids
    folded = [c for c in candidates if c.lower() == name.lower()]
    if len(folded) == 1:  # names are case-insensitive when that is unambiguous
        return resolve_env(folded[0], kwargs, max_episode_steps)
    raise _REGISTRY.unknown(name, "env.id", "give a Gymnasium id (e.g. 'CartPole-v1'), a class registered with "
                            "@hybridflow.envs.register_env, or an import path 'package.module:ClassName'",
                            candidates=folded or candidates)


def _import_path(name: str) -> EnvFactory | None:
    """The object at 'module:attr' or 'module.attr' (registry.import_object), or None when
    `name` is not such a path (a dotted name whose module does not import may still be a
    Gymnasium id)."""
    parts = split_import_path(name)
    if parts is None or (":" not in name and "-v" in name):  # Gymnasium ids look like "Name-v1"
        return None
    if ":" not in name and importlib.util.find_spec(parts[0].split(".")[0]) is None:
        return None
    obj = import_object(name, "env.id", "environment class or factory")
    if not callable(obj):
        raise ConfigError(f"module {parts[0]!r} has no environment class or factory {parts[1]!r}", "env.id")
    return obj


def _gym_ids() -> list[str]:
    import gymnasium as gym

    return sorted(gym.envs.registry)
