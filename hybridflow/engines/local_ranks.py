"""Run a function on N local gloo ranks (CPU processes) and collect what each returns.

Used by the engine tests and benchmarks, which need real torch.distributed groups but no
Ray. Processes come from a forkserver that imported the heavy modules once, so a rank
starts in well under a second instead of re-importing torch (~8 s of CPU per process on
a 2-core machine). A rank that raises sends its traceback back and the parent raises
it, so nothing hangs.

    results = run_ranks(fn, 4, arg)     # fn(rank, world_size, arg) on 4 ranks
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import traceback
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_PRELOAD: tuple[str, ...] = ("torch", "torch.distributed", "transformers", "hybridflow.engines.train")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn: Callable, rank: int, world: int, port: int, args: tuple, results: Any) -> None:
    import torch
    import torch.distributed as dist

    # One thread per rank: several ranks share few cores; oversubscription only slows down.
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        out = fn(rank, world, *args)
        dist.barrier()
        dist.destroy_process_group()
        results.put((rank, True, out))
    except BaseException:  # report any failure to the parent instead of hanging it
        results.put((rank, False, traceback.format_exc()))


def start_ranks(
    fn: Callable, world_size: int, *args: Any, preload: Sequence[str] = DEFAULT_PRELOAD
) -> tuple[list[Any], Any]:
    """Start fn(rank, world_size, *args) on `world_size` ranks without waiting.

    Returns the processes and their result queue (keep it referenced while the processes
    start: they unpickle it). For callers that kill ranks on purpose.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, port, args, results)) for r in range(world_size)]
    for p in procs:
        p.start()
    return procs, results


def run_ranks(
    fn: Callable,
    world_size: int,
    *args: Any,
    timeout: float = 400.0,
    preload: Sequence[str] = DEFAULT_PRELOAD,
) -> list[Any]:
    """Run fn(rank, world_size, *args) on `world_size` gloo ranks; results in rank order."""
    procs, results = start_ranks(fn, world_size, *args, preload=preload)
    collected: dict[int, Any] = {}
    try:
        while len(collected) < world_size:
            try:
                rank, ok, value = results.get(timeout=timeout)
            except queue.Empty:
                missing = sorted(set(range(world_size)) - set(collected))
                raise TimeoutError(f"ranks {missing} gave no result within {timeout:.0f} s") from None
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            collected[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    return [collected[r] for r in range(world_size)]
