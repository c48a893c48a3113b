"""What every worker role shares: dispatch meshes read off an engine, metrics that agree
on every rank, phase timers, CPU offload around engine calls, and batch-key checks.

Why metrics are reduced here: the controller concatenates the DataProto parts of the
collecting ranks, and `DataProto.concat` refuses parts whose meta_info values differ. A
rank-local number (a timer, an MFU measured on this rank's CPU) would differ, so every
number a worker puts into meta_info is first all-reduced over the whole world: all ranks
then hold bit-identical values (a ring all-reduce hands every rank the same sums).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping

import torch
import torch.distributed as dist

from hybridflow.controller import Worker
from hybridflow.engines.train import TrainEngine
from hybridflow.engines.train.distributed import TP
from hybridflow.protocol import DataProto

Tensor = torch.Tensor


def register_engine_mesh(worker: Worker, name: str, engine: TrainEngine) -> None:
    """Dispatch mesh `name` = the engine's data-parallel layout; tp rank 0 of pipeline stage 0
    returns the result (every stage holds the last stage's outputs, broadcast by the pipeline)."""
    tp_rank = engine.device_mesh[TP].get_local_rank()
    worker.register_dispatch_mesh(name, dp_rank=engine.dp_rank, dp_size=engine.dp_size,
                                  is_collect=tp_rank == 0 and engine.pp_rank == 0)


def mean_over_world(values: Mapping[str, float]) -> dict[str, float]:
    """Every value averaged over all ranks (collective; every rank must pass the same keys)."""
    return _all_reduce(values, dist.ReduceOp.SUM, divide=True)


def max_over_world(values: Mapping[str, float]) -> dict[str, float]:
    """Every value's maximum over all ranks, e.g. the wall time of the slowest rank (collective)."""
    return _all_reduce(values, dist.ReduceOp.MAX, divide=False)


def _all_reduce(values: Mapping[str, float], op: dist.ReduceOp, *, divide: bool) -> dict[str, float]:
    names = sorted(values)  # one order on every rank: the keys come from the configuration
    if not names:
        return {}
    local = torch.tensor([float(values[n]) for n in names], dtype=torch.float64)
    dist.all_reduce(local, op=op)
    if divide:
        local /= dist.get_world_size()
    return dict(zip(names, local.tolist()))


@contextlib.contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """Add the seconds spent in the block to ``timings[name]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


def uses_offload(engine: TrainEngine) -> bool:
    return engine.config.param_offload or engine.config.optimizer_offload


@contextlib.contextmanager
def engine_on_device(engine: TrainEngine) -> Iterator[TrainEngine]:
    """Bring offloaded state onto the device for the block, and back to the CPU after it
    (GPU only: offloading frees device memory for the other roles sharing it)."""
    engine.onload()
    try:
        yield engine
    finally:
        if uses_offload(engine):
            engine.offload()


def batch_tensors(data: DataProto, keys: Iterable[str], op: str) -> dict[str, Tensor]:
    """The named tensors of ``data.batch``; a missing one raises, naming what is there."""
    keys = tuple(keys)
    missing = [k for k in keys if k not in data.batch]
    if missing:
        raise KeyError(f"{op} needs batch tensors {missing}; the DataProto has {sorted(data.batch)}")
    return {k: data.batch[k] for k in keys}


def require(value: object, what: str) -> None:
    """Raise a clear error when a method runs before init_model built ``what``."""
    if value is None:
        raise RuntimeError(f"{what} is not built yet; call init_model() on the worker group first")
