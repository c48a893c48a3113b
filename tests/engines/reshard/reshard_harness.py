"""Run a function on N gloo ranks (CPU processes) and collect what each rank returns.

Processes come from a forkserver that imported torch, transformers and the engines
once: each rank then starts in well under a second instead of re-importing for ~8 s of
CPU (this machine has 2 cores shared by up to 8 ranks). A rank that raises sends its
traceback back, and the parent raises it instead of hanging.
"""

from __future__ import annotations

import os
import queue
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

_PRELOAD = [
    "torch", "torch.distributed", "transformers",
    "hybridflow.engines.train", "hybridflow.engines.rollout", "hybridflow.engines.reshard",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_entry(fn: Callable, rank: int, world: int, port: int, args: tuple, out: Any) -> None:
    import torch
    import torch.distributed as dist

    # One thread per rank: several ranks share two cores, oversubscription only slows down.
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        result = fn(rank, world, *args)
        dist.barrier()
        dist.destroy_process_group()
        out.put((rank, None, result))
    except BaseException:
        out.put((rank, traceback.format_exc(), None))


def run_ranks(fn: Callable, world: int, *args: Any, timeout: float = 300.0) -> list[Any]:
    """fn(rank, world, *args) on `world` gloo ranks; returns the results in rank order."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_entry, args=(fn, r, world, port, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        while len(results) < world:
            try:
                rank, error, value = out.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"ranks {sorted(set(range(world)) - set(results))} gave no result") from None
            if error is not None:
                raise RuntimeError(f"rank {rank} failed:\n{error}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    return [results[r] for r in range(world)]
