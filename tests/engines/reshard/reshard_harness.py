"""Run a function on N gloo ranks for the reshard tests (hybridflow.engines.local_ranks
with the training, rollout and reshard engines preloaded in the forkserver)."""

from __future__ import annotations

from typing import Any

from hybridflow.engines.local_ranks import run_ranks as _run_ranks

_PRELOAD = (
    "torch", "torch.distributed", "transformers",
    "hybridflow.engines.train", "hybridflow.engines.rollout", "hybridflow.engines.reshard",
)


def run_ranks(fn, world: int, *args: Any, timeout: float = 300.0) -> list[Any]:
    """fn(rank, world, *args) on `world` gloo ranks, with the engines preloaded."""
    return _run_ranks(fn, world, *args, timeout=timeout, preload=_PRELOAD)
