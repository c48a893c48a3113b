"""`dtype: auto` of a run, resolved once at its start and written into its config.yaml.

Every role's `dtype` (actor, rollout, critic, reward_model, cost_model; of the roles the run
builds) that says "auto" becomes "bf16" or "fp32" (engines/precision.py): bf16 with `resources.use_gpu`, otherwise
the faster of the two in a short matmul probe at the policy model's layer sizes (its
config.json, the pretrained model's, or the built-in model's section) on the run's
`resources.threads_per_rank`, cached per machine. The resolved value is what the run
saves, prints at its start (`auto_note`), and what `hybridflow eval` and `hybridflow
monitor` show (`dtype_summary`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridflow.engines.precision import AutoChoice, ProbeShape, auto_dtype

if TYPE_CHECKING:
    from hybridflow.config.schema import RunConfig

DTYPE_SECTIONS = ("actor", "rollout", "critic", "reward_model", "cost_model")


def probe_shape(cfg: RunConfig) -> ProbeShape:
    """The policy model's (hidden, intermediate) sizes, or ProbeShape()'s when unreadable."""
    if cfg.model.path is not None:
        try:
            hf = json.loads((Path(cfg.model.path) / "config.json").read_text())
            text = hf.get("text_config", hf)  # multimodal configs nest the language model's
            return ProbeShape(int(text["hidden_size"]), int(text.get("intermediate_size", 4 * text["hidden_size"])))
        except (OSError, ValueError, KeyError, TypeError):
            return ProbeShape()  # preflight reports an unreadable model; the probe needs some shape
    if cfg.model.pretrained is not None:
        from hybridflow.engines.pretrained import PRETRAINED_MODELS

        return ProbeShape(*PRETRAINED_MODELS[cfg.model.pretrained].layer_sizes)
    return ProbeShape(cfg.model.builtin.hidden_size, cfg.model.builtin.intermediate_size)


def auto_sections(cfg: RunConfig) -> list[str]:
    """The sections of roles this run builds whose dtype is "auto". A role it does not build
    keeps "auto" (a changed value in an unused section reads as set, and validation refuses
    settings the algorithm does not read)."""
    used = {"actor": True, "rollout": True, "critic": cfg.use_critic,
            "reward_model": cfg.reward_model.path is not None, "cost_model": cfg.cost_model.path is not None}
    return [name for name in DTYPE_SECTIONS if used[name] and getattr(cfg, name).dtype == "auto"]


def auto_choice(cfg: RunConfig, threads: int | None = None) -> AutoChoice:
    """What "auto" becomes on `threads` per rank (None: resources.threads_per_rank), cached per machine and shape."""
    device = "cuda" if cfg.resources.use_gpu else "cpu"
    return auto_dtype(device, probe_shape(cfg), threads or cfg.resources.threads_per_rank)


def resolved_dtypes(cfg: RunConfig) -> RunConfig:
    """`cfg` with every "auto" dtype replaced by `auto_choice` (cfg's resources resolved first)."""
    autos = auto_sections(cfg)
    if not autos:
        return cfg
    chosen = auto_choice(cfg).dtype
    return dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), dtype=chosen)
                                       for name in autos})


def resolved_rm_dtype(cfg: RunConfig, threads: int) -> tuple[RunConfig, str]:
    """A reward-model run (`hybridflow rm`) with rm.engine.dtype "auto" resolved as a training
    run's roles are (on its `threads` per rank), and the line it prints at its start."""
    engine = cfg.rm.engine
    if engine.dtype != "auto":
        return cfg, f"dtype: reward model {engine.dtype}"
    choice = auto_choice(cfg, threads)
    rm = dataclasses.replace(cfg.rm, engine=dataclasses.replace(engine, dtype=choice.dtype))
    return dataclasses.replace(cfg, rm=rm), f"dtype: reward model {choice.dtype} (engine: {choice.reason})"


def keep_dtypes(cfg: RunConfig, saved: RunConfig) -> RunConfig:
    """`cfg` with its "auto" dtypes set to what the run `saved` resolved them to: a resumed
    run keeps its precision even where a new measurement would pick the other one."""
    autos = auto_sections(cfg)
    return dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), dtype=getattr(saved, name).dtype)
                                       for name in autos}) if autos else cfg


def auto_note(cfg: RunConfig, autos: list[str]) -> str:
    """The line a run prints at its start: each role's dtype, and why where it was "auto"."""
    tree = dataclasses.asdict(cfg)  # the shape of config.yaml's tree, which shown_roles reads
    measured = [name for name in autos if name in shown_roles(tree)]
    line = f"dtype: {dtype_summary(tree)}"
    return f"{line} ({', '.join(measured)}: {auto_choice(cfg).reason})" if measured else line


def shown_roles(tree: dict[str, Any]) -> list[str]:
    """The roles a summary names: actor, rollout, critic, and the reward and cost models
    when they have a model (`path`); sections absent from `tree`, or still "auto" (a role
    the run does not build, `auto_sections`), left out."""
    def shown(name: str) -> bool:
        section = tree.get(name)
        return isinstance(section, dict) and section.get("dtype", "auto") != "auto" and (
            name not in ("reward_model", "cost_model") or section.get("path") is not None)

    return [name for name in DTYPE_SECTIONS if shown(name)]


def dtype_summary(tree: dict[str, Any]) -> str:
    """"actor fp32, rollout fp32, critic fp32" from a run's config as a dict (config.yaml's tree)."""
    return ", ".join(f"{name} {tree[name]['dtype']}" for name in shown_roles(tree))
