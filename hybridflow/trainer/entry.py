"""`RLTrainer`: one entry point for language-model post-training and environment tasks.

    from hybridflow import RLTrainer

    trainer = RLTrainer({"algorithm": "PPO", "env": "CartPole-v1"})   # an environment task
    trainer.train(steps=1e5)                                           # environment steps

    trainer = RLTrainer("examples/grpo_arithmetic.yaml")               # language-model post-training
    trainer.train(steps=5)                                             # RL steps

`RLTrainer(config, resume=None)` reads what the config describes and returns the trainer
for it: a config that names an `env` (a dict, a YAML file, an EnvRunConfig) gives an
`EnvTrainer` (env_trainer.py); anything else (a RunConfig, an LM YAML file, a dict of run
config keys) gives the language-model trainer (rl_trainer.py), unchanged but for `train`
also taking an integral float. `resume=<run dir>` alone picks by the run's saved config.
Both kinds are instances of `RLTrainer` (isinstance works).
"""

from __future__ import annotations

import abc
import json
from pathlib import Path
from typing import Any

from hybridflow.config.env_schema import EnvRunConfig, is_env_tree
from hybridflow.config.loader import user_tree
from hybridflow.errors import ConfigError
from hybridflow.config.schema import reward_reference
from hybridflow.trainer.env_trainer import EnvTrainer, as_env_steps
from hybridflow.trainer.rl_trainer import RLTrainer as LMTrainer
from hybridflow.trainer.rl_trainer import TrainResult


class RLTrainer(abc.ABC):  # noqa: B024 - an entry point, not an interface to implement
    """Dispatches to `EnvTrainer` or the language-model trainer (module docstring)."""

    def __new__(cls, config: Any = None, resume: Any = None) -> Any:  # noqa: D102
        if describes_env_task(config, resume):
            return EnvTrainer(config, resume=resume)
        if isinstance(config, dict):
            from hybridflow.config.schema import load_run_config

            config = load_run_config(None, dict_overrides(config))
        return _LanguageModelTrainer(config, resume=resume)


class _LanguageModelTrainer(LMTrainer):
    """The language-model trainer; `train(steps)` also takes integral floats (1e3)."""

    def train(self, steps: int | float | None = None) -> TrainResult:
        return super().train(None if steps is None else as_env_steps(steps))


RLTrainer.register(LMTrainer)
RLTrainer.register(EnvTrainer)


def describes_env_task(config: Any, resume: Any = None) -> bool:
    """Does the config (or, with only `resume`, the resumed run's saved config) name an environment?"""
    if isinstance(config, EnvRunConfig):
        return True
    if isinstance(config, dict):
        return is_env_tree(config)
    if isinstance(config, (str, Path)):
        return is_env_tree(user_tree(config))
    if config is None and isinstance(resume, (str, Path)):  # not True / a language-model ResumePoint
        from hybridflow.trainer.checkpointing import find_checkpoint, run_config_path

        return is_env_tree(user_tree(run_config_path(find_checkpoint(resume))))
    return False


def dict_overrides(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """A nested dict of run-config keys as dotted `key=value` overrides (values as JSON, which
    the loader reads as YAML), so a dict goes through the same loader as a YAML file. A
    function given as `custom_fn_path` becomes its import path and `custom_fn_name`."""
    out: list[str] = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out += dict_overrides(value, f"{prefix}{key}.")
        elif callable(value) and key == "custom_fn_path":
            # A reward function given as a Python object: its import path and name.
            try:
                path, name = reward_reference(value, "compute_score")
            except ConfigError as err:
                raise err.within(prefix.rstrip(".")) from None
            out += [f"{prefix}{key}={json.dumps(path)}", f"{prefix}custom_fn_name={json.dumps(name)}"]
        else:
            out.append(f"{prefix}{key}={json.dumps(value)}")
    return out
