"""The config tree of an environment task (PPO or SAC on Gymnasium-style environments).

    cfg = load_env_config("examples/ppo_cartpole.yaml", ["ppo.lr=1e-3"])
    cfg = env_config_from_dict({"algorithm": "PPO", "env": "CartPole-v1",
                                "policy": {"hidden_size": [64, 64], "activation": "tanh"},
                                "distributed": {"num_workers": 2, "placement_strategy": "spread"}})
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from hybridflow.config.algorithm import env_algorithm
from hybridflow.config.loader import _build, nest_dotted, user_tree
from hybridflow.config.schema import RunConfig
from hybridflow.errors import ConfigError

# The sections an environment task reads (a section left out gets its defaults).
ENV_SECTIONS = ("env", "policy", "distributed", "ppo", "sac")
DEFAULT_ALGORITHM = "ppo"


# ----------------------------------------------------------------------------- user input


def normalize_tree(tree: dict[str, Any]) -> dict[str, Any]:
    """A user's dict as the nested tree the loader reads: dotted keys nested, `env: <name>`
    (or an environment class) as `env: {id: ...}`."""
    if not isinstance(tree, dict):
        raise ConfigError(f"an environment config is a mapping, got {type(tree).__name__}")
    # The flat form `env: <name>` (or a class) is the section `env: {id: <name>}`.
    nested = nest_dotted({key: ({"id": value} if key == "env" and (isinstance(value, str) or callable(value))
                                else value) for key, value in tree.items()})
    env = nested.get("env")
    if isinstance(env, dict) and callable(env.get("id")):
        from hybridflow.envs.registry import register_env

        env["id"] = register_env(env["id"]).__name__  # a class given directly: registered under its name
    return nested


def env_config_from_dict(tree: dict[str, Any]) -> RunConfig:
    """Build and resolve an environment task's config from a user's dict (module docstring); a
    key of language-model runs is a ConfigError saying so (config/tasks.py)."""
    from hybridflow.config.tasks import TASK_KINDS, check_own_keys  # tasks.py names this module's builders

    kind = TASK_KINDS["environment"]
    nested = normalize_tree(tree)
    check_own_keys(kind, nested)
    if isinstance(nested.get("algorithm", DEFAULT_ALGORITHM), str):  # the flat form `algorithm: ppo`
        nested["algorithm"] = {"name": nested.get("algorithm", DEFAULT_ALGORITHM)}
    nested.setdefault("name", None)  # null: <env>-<algorithm> (resolve_env_config)
    for section in ENV_SECTIONS:
        nested.setdefault(section, {})
    cfg = _build(RunConfig, nested)
    others = {key: None for key in kind.foreign_keys() if "." not in key}  # the sections of other kinds
    return resolve_env_config(dataclasses.replace(cfg, **others))


def load_env_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Build and resolve an environment task's config from a YAML file and dotted overrides."""
    return env_config_from_dict(user_tree(path, list(overrides)))


# ----------------------------------------------------------------------------- resolution

def resolve_env_config(cfg: RunConfig) -> RunConfig:
    """`cfg` with its algorithm's `policy` defaults and the run name filled in, checked by the
    algorithm's `check` (the `environment` part of its row)."""
    spec = env_algorithm(cfg)
    unset = {key: value for key, value in dataclasses.asdict(spec.policy).items() if getattr(cfg.policy, key) is None}
    name = cfg.name or re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{cfg.env.id}-{cfg.algorithm.name}").strip("-")
    cfg = dataclasses.replace(cfg, name=name, policy=dataclasses.replace(cfg.policy, **unset))
    if spec.check is not None:
        spec.check(cfg)
    return cfg
