"""`resources.placement: auto`: the planner's best mapping as concrete run settings."""

from __future__ import annotations

import dataclasses

from hybridflow.config.schema import RunConfig
from hybridflow.config.validation import validate_run_config
from hybridflow.errors import ConfigError
from hybridflow.planner.problem import Capabilities, Cluster, problem_from_config
from hybridflow.planner.search import search
from hybridflow.planner.simulate import Mapping

# Enough fallbacks that one passes validation whenever any would.
_CANDIDATES = 64


def local_device(use_gpu: bool) -> str:
    """The device table entry of this machine's devices."""
    if not use_gpu:
        return "cpu"
    import torch

    name = torch.cuda.get_device_name().lower()
    for key, entry in (("h100", "h100"), ("h200", "h100"), ("a100", "a100-80gb")):
        if key in name:
            return entry
    raise ConfigError(f"placement=auto has no cost model for {name!r} (known: cpu, a100-80gb, h100); "
                      "choose placement colocated or split", "resources.placement")


def mapping_config(cfg: RunConfig, mapping: Mapping) -> RunConfig:
    """`cfg` with the mapping's placement and parallel sizes (Capabilities.here mappings)."""
    critics = set(cfg.algorithm.spec.critics)
    critic_pools = [p for p in mapping.pools if critics & set(p.roles)]
    split = len(mapping.pools) > 1
    resources = dataclasses.replace(
        cfg.resources, placement="split" if split else "colocated",
        world_size=sum(p.devices for p in mapping.pools),
        critic_ranks=critic_pools[0].devices if split else cfg.resources.critic_ranks)
    par = mapping.parallel
    out = dataclasses.replace(
        cfg, resources=resources,
        actor=dataclasses.replace(cfg.actor, tp_size=par["actor"].tp),
        rollout=dataclasses.replace(cfg.rollout, tensor_model_parallel_size=par["actor"].gen_tp))
    for role in ("critic", "reward_model", "cost_model"):
        if role in par:
            out = dataclasses.replace(out, **{role: dataclasses.replace(getattr(out, role), tp_size=par[role].tp)})
    return out


def resolve_auto_placement(cfg: RunConfig) -> tuple[RunConfig, Mapping]:
    """The config with the planner's mapping in place of placement=auto (module docstring)."""
    world = cfg.resources.resolved_world_size()
    cluster = Cluster.of(1, world, local_device(cfg.resources.use_gpu))
    result = search(problem_from_config(cfg, cluster, Capabilities.for_run(cfg)), top=_CANDIDATES)
    refused = []
    for mapping in result.mappings:
        candidate = mapping_config(cfg, mapping)
        try:
            validate_run_config(candidate)
        except ConfigError as err:
            refused.append(f"{mapping.placement()} {_label(mapping)}: {err}")
            continue
        return candidate, mapping
    reasons = "; ".join(refused[:3] + [f"{r} ({n}x)" for r, n in list(result.rejected.items())[:3]])
    raise ConfigError(f"auto found no mapping of the run on {world} ranks that fits and passes validation "
                      f"({reasons or 'no candidates'}); set placement colocated or split", "resources.placement")


def _label(mapping: Mapping) -> str:
    return ", ".join(f"{r} {p.label()}" for r, p in mapping.parallel.items())
