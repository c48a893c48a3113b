"""The config tree of a reward-model training run (`hybridflow rm`, trainer/jobs/rm.py).

    cfg = load_rm_config("examples/rm_hh_rlhf.yaml", ["engine.optim.lr=2e-5"])
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path
from typing import Any

from hybridflow.config.loader import _build, _set_path, nest_dotted, user_tree
from hybridflow.config.schema import RunConfig
from hybridflow.errors import ConfigError
from hybridflow.workers.config import RewardModelWorkerConfig

RM_NAME = "reward-model"
# The built-in tiny model's positions for preference pairs (prompt + reply per side).
RM_PRESETS = (("model.builtin.max_position_embeddings", 512),)
# Keys of the earlier reward-model tree -> where they are now (a prefix moves what is under it).
MOVED_KEYS = (("data", "rm.data"), ("engine", "rm.engine"), ("trainer.epochs", "rm.epochs"),
              ("trainer.total_steps", "rm.total_steps"), ("trainer.eval_freq", "rm.eval_freq"),
              ("trainer.save_model", "rm.save_model"))


def moved_keys(tree: dict[str, Any]) -> dict[str, Any]:
    """`tree` (nested) with the keys of the earlier reward-model tree at their `rm.*` paths,
    each move said in one line on stderr."""
    tree = copy.deepcopy(tree)
    for old, new in MOVED_KEYS:
        *parents, last = old.split(".")
        holder = tree
        for part in parents:
            holder = holder.get(part) if isinstance(holder, dict) else None
        if not isinstance(holder, dict) or last not in holder:
            continue
        value = holder.pop(last)
        if isinstance(holder, dict) and not holder and parents:
            tree.pop(parents[0])
        _set_path(tree, new.split("."), value)
        print(f"hybridflow: {old} is now {new} (reward-model runs); the old key still works", file=sys.stderr)
    return tree


def rm_config_from_tree(tree: dict[str, Any]) -> RunConfig:
    """Build and validate a reward-model run's config from a user's tree (module docstring)."""
    from hybridflow.config.tasks import TASK_KINDS, check_own_keys  # tasks.py names this module's builders

    kind = TASK_KINDS["reward_model"]
    nested = moved_keys(nest_dotted(tree))
    nested.setdefault("rm", {})
    nested.setdefault("name", RM_NAME)
    for key, value in RM_PRESETS:
        node: Any = nested
        for part in key.split(".")[:-1]:
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.setdefault(key.rsplit(".", 1)[1], value)
    check_own_keys(kind, nested)
    cfg = _build(RunConfig, nested)
    cfg = dataclasses.replace(cfg, **{key: None for key in kind.foreign_keys() if "." not in key})
    validate_rm_config(cfg)
    return cfg


def rm_runs_config(tree: dict[str, Any]) -> RunConfig:
    """The name and trainer.* of a reward-model tree, unchecked: where its runs are (`hybridflow
    rm --resume` without PATH nor --config, whose config is then the run's own)."""
    nested = moved_keys(nest_dotted(tree))
    nested.setdefault("name", RM_NAME)
    return _build(RunConfig, nested)


def load_rm_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Load a reward-model run config (YAML file + dotted overrides) and validate it."""
    return rm_config_from_tree(user_tree(path, list(overrides)))


def resolve_rm_config(cfg: RunConfig) -> RunConfig:
    """The config as the run saves it: rm.engine.dtype auto and resources.omp_wait_policy
    auto resolved (config/dtypes.py, controller/omp.py)."""
    from hybridflow.config.dtypes import resolved_rm_dtype
    from hybridflow.controller import omp  # imports Ray and torch: only when a run resolves

    world = cfg.resources.resolved_world_size()
    cfg, _ = resolved_rm_dtype(cfg, cfg.resources.resolved_threads_per_rank(world))
    return dataclasses.replace(cfg, resources=dataclasses.replace(
        cfg.resources, omp_wait_policy=omp.resolve(cfg.resources.omp_wait_policy)))


def rm_worker_config(cfg: RunConfig, model_path: str) -> RewardModelWorkerConfig:
    """The worker config of the trained reward model."""
    return RewardModelWorkerConfig(engine=cfg.rm.engine.engine_config(model_path, cfg.seed,
                                                                             cfg.model.trust_remote_code))


def validate_rm_config(cfg: RunConfig) -> int:
    """Cross-section checks (ConfigError naming the keys to change); returns the world size."""
    rm = cfg.rm
    if not rm.data.train_files:
        raise ConfigError("is empty; give preference-pair files (prompt, chosen, rejected), e.g. from "
                          "`hybridflow preprocess hh-rlhf --input FILE --output pairs.parquet`", "rm.data.train_files")
    if cfg.model.uses_builtin and rm.data.pairs.max_length > cfg.model.builtin.max_position_embeddings:
        raise ConfigError(
            f"{rm.data.pairs.max_length} exceeds the built-in model's model.builtin.max_position_embeddings="
            f"{cfg.model.builtin.max_position_embeddings}; lower the one or raise the other", "rm.data.pairs.max_length",
        )
    world = cfg.resources.resolved_world_size()
    mb = rm.engine.micro_batch
    if rm.data.batch_size % mb.mini_batch_size != 0:
        raise ConfigError(
            f"{rm.data.batch_size} pairs per step is not a multiple of rm.engine.micro_batch.mini_batch_size="
            f"{mb.mini_batch_size} (pairs per optimizer step)", "rm.data.batch_size",
        )
    try:
        rm_worker_config(cfg, cfg.model.path or "<built-in>")  # the role's rules
    except ConfigError as err:
        raise err.within("rm") from None
    try:
        rm.engine.check_parallel(world, cfg.resources.use_gpu, trainable=True)
    except ConfigError as err:
        raise err.within("rm.engine") from None
    return world
