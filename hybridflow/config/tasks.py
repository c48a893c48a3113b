"""Task kinds: what kind of run a config describes, decided once, from a declared row.

    kind = task_kind_of(tree)            # the "environment" row when the tree names an `env`
    check_top_level_keys(tree)           # a misspelt top-level key: ConfigError with did-you-mean
    cfg = kind.build(tree)               # its typed, validated config (RunConfig, EnvRunConfig)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hybridflow.config.algorithm import AlgorithmSection
from hybridflow.config.env_schema import env_config_from_dict, resolve_env_config
from hybridflow.config.rm_schema import resolve_rm_config, rm_config_from_tree
from hybridflow.config.schema import RunConfig, resolve_run_config, run_config_from_tree
from hybridflow.errors import ConfigError, UserInputError
from hybridflow.registry import Registry, suggest


@dataclass(frozen=True)
class TaskKind:
    """name: the kind ("language_model", "environment", "reward_model"). marker: the section
    only its configs set (None: the kind of a config that sets no other kind's marker). keys:
    the top-level sections and dotted keys it reads beyond every kind's. build(tree) -> its
    validated RunConfig; resolve(config) -> the config as a run saves it. checkpoint_kind:
    trainer_state.json's "kind" of its checkpoints (None: checkpoints without one). advice:
    what to use instead of another kind's key (key -> text). language_model: its runs train a
    language-model policy (what `hybridflow sft`, `eval` and `export` take). offline: where
    a run of a kind that is not one finds what eval and export give (their refusal says it).
    command: the `hybridflow` command that runs its configs."""

    name: str
    marker: str | None
    keys: tuple[str, ...]
    build: Callable[[dict[str, Any]], RunConfig]
    resolve: Callable[[RunConfig], RunConfig]
    checkpoint_kind: str | None = None
    advice: Mapping[str, str] = field(default_factory=dict)
    language_model: bool = False
    offline: str = ""
    command: str = "train"

    def foreign_keys(self) -> dict[str, TaskKind]:
        """The keys other kinds read and this one does not (what its configs leave out and
        refuse), each with the first kind that reads it."""
        out: dict[str, TaskKind] = {}
        for kind in TASK_KINDS.entries.values():
            for key in kind.keys:
                if key not in self.keys:
                    out.setdefault(key, kind)
        return out


_LM_ALGORITHM_KEYS = tuple(f"algorithm.{f.name}" for f in dataclasses.fields(AlgorithmSection)
                           if f.name not in ("name", "module"))
_LM_RESOURCE_KEYS = ("resources.placement", "resources.critic_ranks")
_ELASTIC_KEYS = ("resources.min_world_size", "resources.max_world_size")  # restart on fewer nodes (run/elastic.py)
TASK_KINDS: Registry[TaskKind] = Registry("task kind", rows=True, identity=lambda kind: kind.name)
TASK_KINDS.add("language_model", TaskKind(
    "language_model", None,
    ("resources", "model", "data", "algorithm", "actor", "rollout", "critic", "reward", "reward_model", "cost_model",
     "sft", "async_rl", *_LM_RESOURCE_KEYS, *_ELASTIC_KEYS, "trainer.total_steps", "trainer.test_freq",
     "trainer.save_final_model", "trainer.val_before_train",
     "trainer.validation", "trainer.balance_batch", "trainer.concurrent_phases", "trainer.mode",
     "trainer.max_no_signal_steps", *_LM_ALGORITHM_KEYS),
    run_config_from_tree, resolve_run_config, language_model=True))
TASK_KINDS.add("environment", TaskKind(
    "environment", "env",
    ("env", "algorithm", "policy", "distributed", "ppo", "sac", "trainer.total_env_steps", "trainer.log_freq",
     "trainer.return_window", "trainer.target_return"),
    env_config_from_dict, resolve_env_config, checkpoint_kind="env",
    offline="its episode returns are in its metrics.jsonl: hybridflow plot RUN_DIR",
    advice={"resources": "environment tasks place their workers with distributed.num_workers, "
                         "distributed.placement_strategy (pack, spread, strict_spread: spread over nodes) and "
                         "distributed.ray_address (the cluster)"}))
TASK_KINDS.add("reward_model", TaskKind(
    "reward_model", "rm", ("rm", "model", "resources", *_ELASTIC_KEYS), rm_config_from_tree, resolve_rm_config,
    checkpoint_kind="rm",
    offline="its held-out pairwise accuracy is in its metrics.jsonl (hybridflow plot RUN_DIR) and its model in "
            "RUN_DIR/reward_model, a Hugging Face directory already (reward_model.path of a PPO run)", command="rm"))


def task_kind_of(tree: dict[str, Any]) -> TaskKind:
    """The kind whose marker is a top-level key of `tree` (dotted keys count by their first
    part), else the kind without a marker."""
    top = {key.split(".")[0] for key in tree if isinstance(key, str)}
    marked = [kind for kind in TASK_KINDS.entries.values() if kind.marker is not None and kind.marker in top]
    if len(marked) > 1:
        raise ConfigError(f"the config names {', '.join(k.marker for k in marked)}: keys of different task kinds "
                          f"({', '.join(k.name for k in marked)}); keep those of one")
    if marked:
        return marked[0]
    return next(kind for kind in TASK_KINDS.entries.values() if kind.marker is None)


def task_kind_of_config(config: Any) -> TaskKind | None:
    """The kind of a typed config: the kind whose marker section it sets, else the
    marker-less one (None: not a RunConfig)."""
    if not isinstance(config, RunConfig):
        return None
    return task_kind_of({f.name: 1 for f in dataclasses.fields(config) if getattr(config, f.name) is not None})


def task_kind_of_checkpoint(state: dict[str, Any]) -> TaskKind:
    """The kind that wrote a checkpoint, from its trainer_state.json."""
    recorded = state.get("kind")
    found = next((kind for kind in TASK_KINDS.entries.values() if kind.checkpoint_kind == recorded), None)
    if found is None:
        if isinstance(recorded, str) and recorded:  # a job's checkpoint (sft, ...): its own command continues it
            raise ConfigError(f"the checkpoint is one of a {recorded!r} job, which `hybridflow train` does not "
                              f"continue: resume it with `hybridflow {recorded} --resume RUN_DIR`, or train from "
                              "its model")
        raise UserInputError(f"trainer_state.json names a checkpoint kind {recorded!r} that no task kind writes "
                             f"(known: {sorted(str(k.checkpoint_kind) for k in TASK_KINDS.entries.values())}): the "
                             "checkpoint is damaged or from another program")
    return found


def check_top_level_keys(tree: dict[str, Any]) -> None:
    """A ConfigError for a top-level key that no task kind knows, naming the closest known
    one ("enviroment: unknown key; did you mean env?"), before any kind is decided: a
    misspelt marker would otherwise make a run of the wrong kind."""
    if not isinstance(tree, dict):
        raise ConfigError(f"a config is a mapping of keys to values, got {type(tree).__name__}")
    known = sorted({f.name for f in dataclasses.fields(RunConfig)})
    for key in tree:
        if not isinstance(key, str):
            raise ConfigError(f"config keys are strings, got {key!r}")
        top = key.split(".")[0]
        if top not in known:
            close = suggest(top, known)
            hint = f"did you mean {' or '.join(close)}?" if close else f"known keys: {', '.join(known)}"
            raise ConfigError(f"unknown key; {hint}", top)


def read_task_config(tree: dict[str, Any]) -> tuple[TaskKind, RunConfig]:
    """Translate verl / TRL keys (config/compat), check the top-level keys, decide the kind
    (once) and build its config."""
    from hybridflow.config.compat import translate_foreign

    tree = translate_foreign(tree) if isinstance(tree, dict) else tree
    check_top_level_keys(tree)
    kind = task_kind_of(tree)
    return kind, kind.build(tree)


def check_own_keys(kind: TaskKind, nested: dict[str, Any]) -> None:
    """A ConfigError when the nested tree sets a key that only other kinds read (else "sac:
    unknown config key; did you mean 'actor'?" for an environment task's key in a config
    without env)."""
    for key, other in kind.foreign_keys().items():
        node: Any = nested
        for part in key.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        if node is _ABSENT:
            continue
        why = f"it names {kind.marker!r}" if kind.marker else f"it names no {other.marker!r}"
        fix = f"set {other.marker} or drop {key}" if other.marker else f"drop {key}"
        advice = kind.advice.get(key)
        raise ConfigError(f"is a key of {other.name!r} configs, and this config is of kind {kind.name!r} ({why}): "
                          f"{fix}" + (f"; {advice}" if advice else ""), key)


_ABSENT = object()
