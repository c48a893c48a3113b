"""The actor's parameters as generation sees them: plain HF names, LoRA merged in."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from hybridflow.engines.train import TrainEngine

NamedTensors = Callable[[], Iterator[tuple[str, torch.Tensor]]]

_ADAPTER = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.(?P<adapter>[^.]+)\.weight$")


def generation_named_parameters(engine: TrainEngine) -> NamedTensors:
    """A function listing the engine's parameters under HF names, LoRA merged (if any)."""
    lora = engine.config.lora
    if not lora.enabled:
        return engine.named_sharded_parameters
    scale = lora.alpha / lora.rank
    return lambda: _merged(engine, scale)


def _merged(engine: TrainEngine, scale: float) -> Iterator[tuple[str, torch.Tensor]]:
    params = dict(engine.named_sharded_parameters())
    adapters = _adapters_by_module(params)
    for name, param in params.items():
        if ".lora_" in name:
            continue
        pair = adapters.pop(name.removesuffix(".weight"), None) if name.endswith(".weight") else None
        yield name, param.detach() if pair is None else _merge(param, pair["A"], pair["B"], scale)
    if adapters:
        raise RuntimeError(f"LoRA adapters without a base weight: {sorted(adapters)}")


def _adapters_by_module(params: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    found: dict[str, dict[str, torch.Tensor]] = {}
    adapter_names = set()
    for name, param in params.items():
        if ".lora_" not in name:
            continue
        match = _ADAPTER.match(name)
        if match is None:
            raise ValueError(f"unsupported LoRA tensor {name!r}: only lora_A / lora_B weights of Linear layers merge")
        adapter_names.add(match["adapter"])
        found.setdefault(match["module"], {})[match["ab"]] = param
    if len(adapter_names) > 1:
        raise ValueError(f"the actor carries several LoRA adapters {sorted(adapter_names)}; exactly one is supported")
    return found


def _merge(weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float) -> torch.Tensor:
    """W + scale * B A, laid out like W (collective: gathers A and B)."""
    a, b = _full(lora_a), _full(lora_b)
    delta = (b.float() @ a.float()).mul_(scale).to(weight.dtype)
    base = weight.detach()
    if isinstance(base, DTensor):
        delta = distribute_tensor(delta, base.device_mesh, base.placements, src_data_rank=None)
    return base + delta


def _full(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return t.full_tensor() if isinstance(t, DTensor) else t
