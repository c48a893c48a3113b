"""Process group and (dp, tp) or (pp, dp, tp) device mesh for the training engine.

Workers usually initialise torch.distributed themselves (one process per rank, gloo on
CPU, nccl on GPU); `init_distributed` does it from the torchrun-style environment
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) when nobody has. The engine never learns
how the processes were started (Ray, torchrun, multiprocessing).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

PP, DP, TP = "pp", "dp", "tp"


def device_type() -> str:
    """"cuda" when a GPU is visible to this process, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def current_device() -> torch.device:
    """The device this rank computes on (its own GPU, or the CPU)."""
    if device_type() == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_distributed() -> None:
    """Initialise the default process group from the environment if not done yet.

    On GPU machines the group gets both backends (nccl for CUDA tensors, gloo for CPU
    tensors such as offloaded state), on CPU machines gloo only.
    """
    if dist.is_initialized():
        return
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(
            f"torch.distributed is not initialised and the environment lacks {missing}; "
            "initialise the process group before building an engine, or set these variables "
            "(a single process may use RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=<free port>)"
        )
    if device_type() == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="cpu:gloo,cuda:nccl")
    else:
        dist.init_process_group(backend="gloo")


def build_device_mesh(tp_size: int, pp_size: int = 1) -> DeviceMesh:
    """A 2-D mesh ("dp", "tp") over all ranks, or ("pp", "dp", "tp") with pipeline stages;
    tp is the inner (fastest varying) axis, pp the outer one.

    Tensor-parallel groups are consecutive ranks because TP communicates in every layer
    and consecutive ranks usually share a node (NVLink); FSDP's per-layer all-gathers
    tolerate the slower links between nodes, and a pipeline sends one activation per
    micro-batch between neighbouring stages, the least traffic of the three.
    """
    world = dist.get_world_size()
    if tp_size < 1 or pp_size < 1 or world % (tp_size * pp_size) != 0:
        raise ValueError(
            f"tp_size={tp_size} x pp_size={pp_size} must divide the world size {world}; "
            f"choose tp_size x pp_size from {[d for d in range(1, world + 1) if world % d == 0]}"
        )
    if pp_size == 1:
        return init_device_mesh(device_type(), (world // tp_size, tp_size), mesh_dim_names=(DP, TP))
    shape = (pp_size, world // (tp_size * pp_size), tp_size)
    return init_device_mesh(device_type(), shape, mesh_dim_names=(PP, DP, TP))


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a parameter or gradient: gathered from its shards when it is a
    DTensor (collective), itself when the engine left it plain (a lone fp32 replica)."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t
