"""Where a run starts from, decided in one place for every entry point."""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridflow.config import ConfigError, config_to_dict
from hybridflow.config.dtypes import keep_dtypes
from hybridflow.config.loader import _build, with_overrides
from hybridflow.config.schema import RunConfig, load_run_config, resolve_run_config, run_config_from_tree
from hybridflow.config.sections.model import BuiltinModelSection
from hybridflow.config.tasks import TaskKind
from hybridflow.data import make_builtin_model_dir
from hybridflow.engines.pretrained import pretrained_model_dir
from hybridflow.trainer.run.checkpointing import (
    CHECKPOINTS_DIR,
    STEP_PREFIX,
    TRAINER_STATE_FILE,
    CheckpointNotFoundError,
    SavedRun,
    complete_checkpoints,
    find_checkpoint,
    read_trainer_state,
    run_dir_of,
    saved_run,
)
from hybridflow.trainer.run.preflight import manifest_difference, model_manifest

BUILTIN_MODEL_DIR = "model"  # <run>/model: the built-in tiny model (model.path and model.pretrained null)
SFT_MODEL_DIR = "sft_model"  # <run>/sft_model: the policy after the SFT warm start (sft.steps > 0)


# ----------------------------------------------------------------------------- the starting model


def write_builtin_model(builtin: BuiltinModelSection, out_dir: Path, seed: int) -> Path:
    """The built-in tiny model of `builtin`'s sizes, initialised from `seed`, written to `out_dir`."""
    return make_builtin_model_dir(out_dir, seed=seed, **dataclasses.asdict(builtin))  # family and sizes


def base_model_path(cfg: RunConfig, run_dir: Path, *, write_builtin: bool) -> str:
    """The model the config names, before any fine-tuning: model.path; model.pretrained's
    directory in the cache (converted on first use, engines/pretrained.py); or the
    built-in tiny model in <run>/model. That one is written there when `write_builtin`
    and missing (a run starting), and must exist otherwise (a finished run being read)."""
    if cfg.model.path is not None:
        return cfg.model.path
    if cfg.model.pretrained is not None:
        return str(pretrained_model_dir(cfg.model.pretrained))
    path = run_dir / BUILTIN_MODEL_DIR
    if (path / "config.json").is_file():  # a resumed run keeps the model it started with
        return str(path)
    if not write_builtin:
        raise _missing_model(path)
    return str(write_builtin_model(cfg.model.builtin, path, cfg.seed))


def policy_start_path(cfg: RunConfig, run_dir: Path) -> str:
    """The model the RL policy is built from, before its first step or before a
    checkpoint's weights replace its own: <run>/sft_model when the run warm-starts with
    SFT (sft.steps > 0; SFT writes it first), else `base_model_path`. Raises
    FileNotFoundError when the run directory lacks the model it should hold."""
    if cfg.sft.steps == 0:
        return base_model_path(cfg, run_dir, write_builtin=False)
    path = run_dir / SFT_MODEL_DIR
    if not (path / "config.json").is_file():
        raise _missing_model(path)
    return str(path)


def _missing_model(path: Path) -> FileNotFoundError:
    return FileNotFoundError(
        f"the run's starting model {str(path)!r} is missing (the actor is built from it before a "
        "checkpoint's weights are loaded); restore the directory, or pass model.path=DIR")


# ----------------------------------------------------------------------------- resuming

# Keys a resumed run may change: how long and how often (trainer.*), where it runs
# (resources.*), how rewards are run (not what they score), and which held-out prompts it
# reports on, and how the native engine's decode loop runs (the same tokens; "auto" is
# resolved anew, so a run may resume on a GPU). Anything else (model, data, algorithm,
# optimizer, sampling, seeds) would make the saved weights, optimizer moments, data position
# or algorithm state mean something else.
RESUMABLE_CHANGES = (
    "name", "trainer.", "resources.", "data.val_files", "data.max_val_samples",
    "rollout.decode_loop", "rollout.readback_every", "rollout.compile_decode", "rollout.cuda_graphs",
    "reward.manager.num_workers", "reward.manager.timeout_s", "reward.manager.kill_grace_s",
    "reward.manager.mp_context", "reward.manager.memory_limit_mb", "reward.manager.max_failed_share",
    "reward.manager.max_failed_steps", "reward.manager.cpu_time_s", "reward.manager.file_size_limit_mb",
    "reward.manager.sandbox", "reward.manager.readable_paths",
)


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues: the checkpoint, its step, and the run's config."""

    checkpoint: Path
    step: int
    cfg: RunConfig  # resolved; differs from the saved one only in RESUMABLE_CHANGES
    saved: SavedRun  # the checkpoint with its run's config.yaml as read (once)


def resume_point(resume: str | Path | bool | SavedRun, config: RunConfig | str | Path | None = None,
                 overrides: Sequence[str] = ()) -> ResumePoint:
    """The checkpoint to resume and the config to resume it with.

    `resume`: a run directory (its newest complete checkpoint), a checkpoint directory, a
    SavedRun (one whose config.yaml was read already: `hybridflow train --resume`), or
    True for the newest checkpoint among the config's runs (trainer.run_dir if set, else
    the runs named `name` under trainer.output_dir). The run's config.yaml is read once.
    `config`: a RunConfig; or a YAML file, or None for the run's saved config.yaml, with
    the dotted `overrides` applied. It may differ from the saved config only in
    RESUMABLE_CHANGES (ConfigError naming every other key), and trainer.mode not between
    sync and the asynchronous modes (only their checkpoints hold the rollout pool's state).
    """
    if isinstance(config, RunConfig) and overrides:
        raise ValueError("overrides apply to a YAML config or to the run's saved one; with a RunConfig, "
                         "apply them when building it (load_run_config(path, overrides))")
    if resume is False or resume is None:
        raise ValueError(f"resume={resume!r} is not a checkpoint to resume; for a fresh run pass resume=None "
                         "to RLTrainer (or leave out --resume)")
    wanted = config if config is None or isinstance(config, RunConfig) else load_run_config(config, list(overrides))
    if resume is True:  # the runs are found by name: the config's, or the defaults' with the overrides
        resume = checkpoint_of_runs(wanted if wanted is not None else load_run_config(None, list(overrides)))
    run = saved_run(resume)  # the run's config.yaml, read once
    if wanted is None and overrides:  # overrides on the saved config
        wanted = run_config_from_tree(with_overrides(run.tree, list(overrides)))
    cfg = resume_config(run, wanted)  # wanted None: the saved config as it is
    check_model_unchanged(run.checkpoint, cfg)
    state = read_trainer_state(run.checkpoint)
    if ("async" in state) != (cfg.trainer.mode != "sync"):  # the rollout pool's state (modes/async_trainer.py)
        saved, fix = ("one_step_off / async", "one_step_off or async") if "async" in state else ("sync", "sync")
        raise ConfigError(f"{cfg.trainer.mode} cannot resume checkpoint {str(run.checkpoint)!r} of trainer.mode="
                          f"{saved}: only the asynchronous modes' checkpoints hold a rollout pool's state (policy "
                          f"version, prompts sent but not trained); resume with trainer.mode={fix}", "trainer.mode")
    return ResumePoint(run.checkpoint, int(state["global_step"]), cfg, run)


def job_resume_point(kind: TaskKind, checkpoint_kind: str, resume: str | Path | bool | SavedRun, config: Any,
                     resumable: tuple[str, ...]) -> ResumePoint:
    """Where a run of `kind` whose checkpoints are `checkpoint_kind`'s continues (environment
    runs, the `hybridflow sft` and `hybridflow rm` jobs; language-model RL runs check more:
    `resume_point`). `resume` as in `resume_point`; `config` None: the run's saved config, else
    that config, which may differ from the saved one only in the `resumable` key prefixes."""
    if resume is True:  # `--resume` without PATH: the newest checkpoint of the config's runs
        resume = checkpoint_of_runs(kind.resolve(config))
    run = saved_run(resume)  # the run's config.yaml, read once
    state = read_trainer_state(run.checkpoint)
    if state.get("kind") != checkpoint_kind:
        raise ConfigError(f"{str(run.checkpoint)!r} is a checkpoint of a {state.get('kind') or 'language-model RL'!r} "
                          f"run, not of a {checkpoint_kind!r} one; resume it with the command that wrote it")
    saved = kind.resolve(kind.build(copy.deepcopy(run.tree)))
    cfg = saved if config is None else unchanged_but(run.checkpoint, saved, kind.resolve(config), resumable,
                                                     f"drop these overrides (a resumed run may change "
                                                     f"{', '.join(k + '*' if k.endswith('.') else k for k in resumable)})")
    return ResumePoint(run.checkpoint, int(state["global_step"]), cfg, run)


MODEL_KEY = "model"  # trainer_state.json: the model section and the manifest of the model it trained


def model_record(cfg: RunConfig, model_path: str) -> dict[str, Any]:
    """What a checkpoint records of the model it was trained from (checked on resume)."""
    return {"section": config_to_dict(cfg.model), "manifest": model_manifest(model_path)}


def check_model_unchanged(checkpoint: Path, cfg: RunConfig) -> None:
    """Refuse to resume when the model differs from the one the checkpoint trained: the
    config's model section (config.yaml edited) or the model directory's config.json and
    weight files (model.path replaced). Checkpoints without a record pass."""
    record = read_trainer_state(checkpoint).get(MODEL_KEY)
    if record is None:
        return
    changed = changed_keys(record["section"], config_to_dict(cfg.model))
    if changed:
        detail = ", ".join(f"model.{k}: {before!r} -> {after!r}" for k, (before, after) in list(changed.items())[:4])
        raise ConfigError(f"the config's model differs from the one checkpoint {str(checkpoint)!r} trained "
                          f"({detail}); resume with the model the run started from (restore its config.yaml)",
                          "model")
    path = base_model_path(cfg, run_dir_of(checkpoint), write_builtin=False)
    difference = manifest_difference(record["manifest"], model_manifest(path))
    if difference is not None:
        raise ConfigError(f"the model directory {path!r} changed since checkpoint {str(checkpoint)!r} was "
                          f"written: {difference}. Resume with the model the run started from", "model.path")


def checkpoint_of_runs(cfg: RunConfig) -> Path:
    """The newest complete checkpoint of the config's runs: trainer.run_dir if set, else the
    newest (most recently written) among the runs named `<name>-<timestamp>` under
    trainer.output_dir (what `--resume` without PATH continues)."""
    if cfg.trainer.run_dir is not None:
        return find_checkpoint(cfg.trainer.run_dir)
    root, name = Path(cfg.trainer.output_dir), cfg.name
    pattern = re.compile(rf"^{re.escape(name)}-\d{{8}}-\d{{6}}(-\d+)?$")
    runs = [p for p in root.iterdir() if p.is_dir() and pattern.match(p.name)] if root.is_dir() else []
    found = [ckpt for run in runs for ckpt in complete_checkpoints(run / CHECKPOINTS_DIR)]
    if not found:
        raise CheckpointNotFoundError(
            f"--resume found no checkpoint: no run {name}-<timestamp> under {str(root)!r} has a complete "
            f"{CHECKPOINTS_DIR}/{STEP_PREFIX}<N> ({len(runs)} run(s) of that name). Pass the run directory "
            "explicitly (--resume PATH), or set name / trainer.output_dir to the run's")
    newest = max(found, key=lambda p: (p / TRAINER_STATE_FILE).stat().st_mtime_ns)
    return find_checkpoint(newest.parent.parent)  # that run's newest intact checkpoint


def configured_resume(cfg: RunConfig) -> Path | None:
    """The checkpoint trainer.resume names: "auto" the newest of the config's runs (None when
    there is none yet: the run starts fresh), a path that run or checkpoint, "never" None."""
    resume = cfg.trainer.resume
    if resume == "never":
        return None
    if resume != "auto":
        return find_checkpoint(resume)
    try:
        return checkpoint_of_runs(cfg)
    except CheckpointNotFoundError:
        return None


def resume_config(resume: str | Path | SavedRun, cfg: RunConfig | None) -> RunConfig:
    """The config of the resumed run (`resume`: a run or checkpoint directory, or a
    SavedRun): the run's saved config.yaml, or `cfg` when it only changes keys in
    RESUMABLE_CHANGES (see `unchanged_but`)."""
    run = saved_run(resume)
    saved = resolve_run_config(_build(RunConfig, copy.deepcopy(run.tree)))
    if cfg is None:
        return saved
    cfg = resolve_run_config(keep_dtypes(cfg, saved))  # dtype: auto stays what the run measured
    return unchanged_but(run.checkpoint, saved, cfg, RESUMABLE_CHANGES, "drop these overrides (a resumed run may "
                         "change trainer.*, resources.*, the reward workers, the held-out data and the decode loop), or "
                         "start a new run from an exported model (model.path)")


def unchanged_but(checkpoint: Path, saved: Any, cfg: Any, resumable: tuple[str, ...], fix: str) -> Any:
    """`cfg` (any task kind's config) to continue `checkpoint`'s run, whose config is
    `saved`: the run keeps its directory whatever trainer.run_dir and trainer.output_dir
    say. Raises ConfigError naming every changed key outside the `resumable` prefixes."""
    # Keep the saved values so that the config only differs where the user changed something.
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(
        cfg.trainer, run_dir=saved.trainer.run_dir, output_dir=saved.trainer.output_dir))
    changed = {key: values for key, values in changed_keys(config_to_dict(saved), config_to_dict(cfg)).items()
               if not key.startswith(resumable)}
    if changed:
        detail = ", ".join(f"{k}: saved {before!r}, now {after!r}" for k, (before, after) in changed.items())
        raise ConfigError(f"cannot resume {str(checkpoint)!r} with a different {detail}. A checkpoint's weights, "
                          f"optimizer state and counters only mean something with the config that wrote them; {fix}")
    return cfg


def changed_keys(before: dict[str, Any], after: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (value before, value after) of every value that differs between two
    config trees (a key one of them lacks counts with None), sorted by key."""
    old, new = _flat(before), _flat(after)
    return {key: (old.get(key), new.get(key)) for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key)}


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_steps_left(done: int, total: int, key: str = "trainer.total_steps", unit: str = "step") -> int:
    """Steps from `done` to `total` (the setting `key`); a ConfigError when there are none
    (a resumed run must never silently train zero steps)."""
    if done >= total:
        raise ConfigError(f"nothing to train: the run is at {unit} {done} and {key}={total}; raise {key} (e.g. "
                          f"{key}={done + total}) to train further, or pass steps", key)
    return total - done
